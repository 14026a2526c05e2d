"""The folders are the layers: an `ast` walk over every import in `patchset/` holds the shape.

- `kernel/` (what ships into images) imports only the standard library and itself;
- `registry/` imports only the standard library, `packaging`, the two parsers it needs
  (`tomlkit` for style-kept edits, `unidiff` for diffs) and, of patchset, `kernel`, `errors`,
  `_fs` (atomic writes) and itself;
- nothing outside `cli/` imports `rich` (not even for type checking);
- the packages (first-level folders and modules of `patchset`) import each other without a
  loop, counting every import that runs (function-level ones too; `TYPE_CHECKING` ones and
  the root package's own re-exports do not run a loop).
"""

from __future__ import annotations

import ast
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "patchset"
STDLIB = frozenset(sys.stdlib_module_names)
REGISTRY_THIRD_PARTY = frozenset({"packaging", "tomlkit", "unidiff"})
REGISTRY_PATCHSET = ("patchset.kernel", "patchset.errors", "patchset._fs", "patchset.registry")


@dataclass(frozen=True)
class Import:
    module: str  # the importing module, e.g. "patchset.registry.model"
    target: str  # the module imported, absolute, e.g. "patchset.kernel.sites"
    line: int
    type_only: bool  # under `if TYPE_CHECKING:`

    def __str__(self) -> str:
        where = self.module.replace(".", "/") + ".py"
        return f"{where}:{self.line} imports {self.target}"


def _module_name(path: Path, root: Path) -> str:
    parts = list(path.relative_to(root.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _type_checking(node: ast.If) -> bool:
    test = node.test
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _imports(path: Path, root: Path) -> list[Import]:
    module = _module_name(path, root)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[Import] = []

    def visit(node: ast.AST, type_only: bool) -> None:
        if isinstance(node, ast.Import):
            found.extend(Import(module, a.name, node.lineno, type_only) for a in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            found.append(Import(module, target, node.lineno, type_only))
        for child in ast.iter_child_nodes(node):
            visit(child, type_only or (isinstance(node, ast.If) and _type_checking(node)))

    visit(ast.parse(path.read_bytes(), filename=str(path)), False)
    return found


def all_imports(root: Path = PACKAGE) -> list[Import]:
    return [i for path in sorted(root.rglob("*.py")) for i in _imports(path, root)]


def _top(target: str) -> str:
    return target.partition(".")[0]


def _under(target: str, prefix: str) -> bool:
    return target == prefix or target.startswith(prefix + ".")


def kernel_violations(imports: list[Import]) -> list[str]:
    return [
        str(i)
        for i in imports
        if _under(i.module, "patchset.kernel")
        and _top(i.target) not in STDLIB
        and not _under(i.target, "patchset.kernel")
    ]


def registry_violations(imports: list[Import]) -> list[str]:
    return [
        str(i)
        for i in imports
        if _under(i.module, "patchset.registry")
        and _top(i.target) not in STDLIB | REGISTRY_THIRD_PARTY
        and not any(_under(i.target, allowed) for allowed in REGISTRY_PATCHSET)
    ]


def rich_violations(imports: list[Import]) -> list[str]:
    return [
        str(i) for i in imports if _top(i.target) == "rich" and not _under(i.module, "patchset.cli")
    ]


def _package_of(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "(root)"


def package_loops(imports: list[Import]) -> list[list[str]]:
    """Every loop in the graph of packages, as the packages along it (smallest first)."""
    edges: dict[str, set[str]] = {}
    for i in imports:
        if i.type_only or not _under(i.target, "patchset") or i.module == "patchset":
            continue
        src, dst = _package_of(i.module), _package_of(i.target)
        if src != dst:
            edges.setdefault(src, set()).add(dst)
    loops: list[list[str]] = []

    def walk(path: list[str]) -> None:
        for nxt in sorted(edges.get(path[-1], ())):
            if nxt == path[0]:
                loops.append(path)
            elif nxt not in path and nxt > path[0]:  # each loop once, from its least package
                walk([*path, nxt])

    for start in sorted(edges):
        walk([start])
    return loops


IMPORTS = all_imports()


def test_the_walk_sees_the_imports() -> None:
    """A walk that found nothing would pass every rule: it must see known edges."""
    seen = {(i.module, i.target) for i in IMPORTS}
    assert ("patchset.registry.model", "patchset.kernel.sites") in seen
    assert ("patchset.kernel.sites", "patchset.kernel.hunks") in seen  # a relative import
    assert ("patchset.kernel.sites", "patchset.kernel.filelines") in seen  # split from sites
    assert ("patchset.kernel.sites", "patchset.kernel.served") in seen
    # the rules for writing vLLM's files: a kernel module, held to the kernel's rule
    assert ("patchset.kernel.gpus", "patchset.kernel.capability") in seen
    assert {("patchset._fs", "patchset.kernel.tree"), ("patchset.engine.transaction",
            "patchset.kernel")} <= seen  # fmt: skip
    assert any(i.module == "patchset.kernel.tree" for i in IMPORTS)
    assert any(_under(i.module, "patchset.cli") and _top(i.target) == "rich" for i in IMPORTS)


def test_kernel_imports_only_the_standard_library() -> None:
    assert kernel_violations(IMPORTS) == []


def test_registry_imports_only_kernel_errors_and_its_parsers() -> None:
    assert registry_violations(IMPORTS) == []


def test_only_the_cli_imports_rich() -> None:
    assert rich_violations(IMPORTS) == []


def test_no_package_level_import_loop() -> None:
    assert package_loops(IMPORTS) == []


@pytest.mark.parametrize(
    ("where", "code", "rule"),
    [
        ("kernel/bad.py", "import packaging\n", kernel_violations),
        ("kernel/bad.py", "from patchset.errors import UsageError\n", kernel_violations),
        ("registry/bad.py", "from patchset.engine import apply\n", registry_violations),
        ("engine/bad.py", "from rich.console import Console\n", rich_violations),
        (
            "engine/bad.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    import rich\n",
            rich_violations,
        ),
    ],
)
def test_each_rule_sees_a_violation(
    tmp_path: Path, where: str, code: str, rule: Callable[[list[Import]], list[str]]
) -> None:
    """The rules, run on a copy of the package with one bad import added."""
    copy = tmp_path / "patchset"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / where).write_text(code)
    assert [v for v in rule(all_imports(copy)) if "bad.py" in v]


def test_a_loop_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "patchset"
    (copy / "registry").mkdir(parents=True)
    (copy / "engine").mkdir()
    (copy / "registry" / "model.py").write_text("def f():\n    from patchset.engine import x\n")
    (copy / "engine" / "apply.py").write_text("from patchset.registry import model\n")
    assert package_loops(all_imports(copy)) == [["engine", "registry"]]
