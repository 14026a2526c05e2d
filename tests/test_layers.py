"""The folders are the layers: an `ast` walk over every import in `patchset/` holds the shape.

- `kernel/` (what ships into images) imports only the standard library and itself;
- `registry/` imports only the standard library, `packaging`, the two parsers it needs
  (`tomlkit` for style-kept edits, `unidiff` for diffs) and, of patchset, `kernel`, `errors`,
  `_fs` (atomic writes), `_lazy` (a package's names imported on first use) and itself;
- nothing outside `cli/` imports `rich` (not even for type checking);
- the wings `importers/`, `upstream/` and `cli/` are imported by `cli/` only (and `cli/` by
  nothing in the package but the entry point `__main__`);
- no module imports another folder's underscore names (a folder's private names stay in it);
- no module is over 600 lines; `os.replace` is called only in `_fs.py` and `kernel/`;
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
REGISTRY_PATCHSET = (
    "patchset.kernel",
    "patchset.errors",
    "patchset._fs",
    "patchset._lazy",
    "patchset.registry",
)


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


WINGS = ("patchset.importers", "patchset.upstream", "patchset.cli")
MAX_LINES = 600


def wing_violations(imports: list[Import]) -> list[str]:
    """An import of a wing (`importers/`, `upstream/`, `cli/`) from outside `cli/` (the wing's
    own modules and the entry point `patchset.__main__` aside)."""
    return [
        str(i)
        for i in imports
        for wing in WINGS
        if _under(i.target, wing)
        and not _under(i.module, wing)
        and not _under(i.module, "patchset.cli")
        and i.module != "patchset.__main__"
    ]


def _folder(module: str, is_package: bool) -> str:
    return module if is_package else module.rpartition(".")[0]


def private_name_violations(root: Path = PACKAGE) -> list[str]:
    """`from X import _name` where X lies in another folder than the importing module (a
    module's private names are its folder's; `__dunder__` names are not private)."""
    found = []
    for path in sorted(root.rglob("*.py")):
        module = _module_name(path, root)
        is_package = path.name == "__init__.py"
        here = _folder(module, is_package)
        for node in ast.walk(ast.parse(path.read_bytes(), filename=str(path))):
            if not isinstance(node, ast.ImportFrom):
                continue
            if node.level:
                base = here.split(".")
                base = base[: len(base) - node.level + 1]
                target = ".".join([*base, *([node.module] if node.module else [])])
            else:
                target = node.module or ""
            if not _under(target, "patchset"):
                continue
            target_path = root.parent / Path(*target.split("."))
            there = target if target_path.is_dir() else target.rpartition(".")[0]
            for alias in node.names:
                name = alias.name
                if name.startswith("_") and not name.startswith("__") and there != here:
                    where = f"{path.relative_to(root.parent)}:{node.lineno}"
                    found.append(f"{where} imports {name} from {target}")
    return found


def long_modules(root: Path = PACKAGE) -> list[str]:
    return [
        f"{path.relative_to(root.parent)}: {n} lines"
        for path in sorted(root.rglob("*.py"))
        if (n := len(path.read_text(encoding="utf-8").splitlines())) > MAX_LINES
    ]


def os_replace_outside_fs(root: Path = PACKAGE) -> list[str]:
    """Calls of `os.replace` (or a bare `replace` imported from os) outside `_fs.py` and
    `kernel/`: the atomic swaps have one home."""
    found = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if rel.parts[0] == "kernel" or rel == Path("_fs.py"):
            continue
        tree = ast.parse(path.read_bytes(), filename=str(path))
        from_os = {
            a.asname or a.name
            for node in ast.walk(tree)
            if isinstance(node, ast.ImportFrom) and node.module == "os"
            for a in node.names
            if a.name == "replace"
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.Call):
                continue
            f = node.func
            by_module = (
                isinstance(f, ast.Attribute)
                and f.attr == "replace"
                and isinstance(f.value, ast.Name)
                and f.value.id == "os"
            )
            if by_module or (isinstance(f, ast.Name) and f.id in from_os):
                found.append(f"{path.relative_to(root.parent)}:{node.lineno}")
    return found


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


def test_the_wings_are_imported_by_the_cli_only() -> None:
    assert wing_violations(IMPORTS) == []


def test_no_private_name_crosses_a_folder() -> None:
    assert private_name_violations() == []


def test_no_module_over_600_lines() -> None:
    assert long_modules() == []


def test_os_replace_only_in_fs_and_kernel() -> None:
    assert os_replace_outside_fs() == []


@pytest.mark.parametrize(
    ("where", "code", "rule"),
    [
        ("kernel/bad.py", "import packaging\n", kernel_violations),
        ("kernel/bad.py", "from patchset.errors import UsageError\n", kernel_violations),
        ("registry/bad.py", "from patchset.engine import apply\n", registry_violations),
        ("engine/bad.py", "from rich.console import Console\n", rich_violations),
        ("engine/bad.py", "from patchset.importers import club\n", wing_violations),
        ("image/bad.py", "from patchset.cli import main\n", wing_violations),
        ("registry/bad.py", "def f():\n    from patchset.upstream import bump\n", wing_violations),
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


@pytest.mark.parametrize(
    ("where", "code", "rule"),
    [
        ("engine/bad.py", "from patchset.kernel.sites import _private\n", private_name_violations),
        ("engine/bad.py", "from ..kernel import _private\n", private_name_violations),
        ("engine/bad.py", "x = 1\n" * (MAX_LINES + 1), long_modules),
        ("engine/bad.py", "import os\nos.replace('a', 'b')\n", os_replace_outside_fs),
        ("engine/bad.py", "from os import replace as r\nr('a', 'b')\n", os_replace_outside_fs),
    ],
)
def test_each_file_rule_sees_a_violation(
    tmp_path: Path, where: str, code: str, rule: Callable[[Path], list[str]]
) -> None:
    copy = tmp_path / "patchset"
    shutil.copytree(PACKAGE, copy, ignore=shutil.ignore_patterns("__pycache__"))
    (copy / where).write_text(code)
    assert [v for v in rule(copy) if "bad.py" in v]


def test_a_private_name_within_its_folder_is_allowed(tmp_path: Path) -> None:
    copy = tmp_path / "patchset"
    (copy / "engine").mkdir(parents=True)
    (copy / "engine" / "a.py").write_text("_x = 1\n")
    (copy / "engine" / "b.py").write_text("from .a import _x\nfrom patchset.engine.a import _x\n")
    assert private_name_violations(copy) == []


def test_a_loop_is_found(tmp_path: Path) -> None:
    copy = tmp_path / "patchset"
    (copy / "registry").mkdir(parents=True)
    (copy / "engine").mkdir()
    (copy / "registry" / "model.py").write_text("def f():\n    from patchset.engine import x\n")
    (copy / "engine" / "apply.py").write_text("from patchset.registry import model\n")
    assert package_loops(all_imports(copy)) == [["engine", "registry"]]
