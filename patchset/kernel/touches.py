"""What a `python` patch touches: module and attribute names, found in a release's files.

A python patch rebinds or wraps names in vLLM at run time (through vLLM's plugin hook), so it
edits no file; it declares ``touches = ["vllm.envs:is_set", "vllm.x.y:Class.method"]``
instead. Whether those names still exist is read from the release's source with `ast`
(nothing is imported or run), so the host check and an image's own Python agree.
Standard library only: the image entrypoint uses it at container start.
"""

from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable

# a release file's text by its relative path (None: absent)
Reader = Callable[[str], bytes | str | None]

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_touch(spec: str) -> tuple[str, str]:
    """``"vllm.envs:is_set"`` as ``("vllm.envs", "is_set")``; ValueError when malformed."""
    module, sep, attr = spec.partition(":")
    if not sep or not _MODULE.match(module) or not _ATTR.match(attr):
        raise ValueError(f"{spec!r}: expected module:attribute, e.g. 'vllm.envs:is_set'")
    return module, attr


def module_files(module: str) -> tuple[str, str]:
    """The two files a module can be: ``a/b.py`` and ``a/b/__init__.py``."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def touch_files(touch: str) -> tuple[str, ...]:
    """Every file `resolve` may read for `touch` (``module:attr``): the module's two, and for
    each leading part of the attribute path the two of that submodule (``a/b/c.py``,
    ``a/b/c/__init__.py`` for ``a.b:c.X``). ValueError when malformed."""
    module, attr = parse_touch(touch)
    parts = attr.split(".")
    files: list[str] = []
    for n in range(len(parts) + 1):
        files += module_files(".".join([module, *parts[:n]]))
    return tuple(files)


def _module(module: str, read: Reader) -> tuple[str, bytes | str, bool] | None:
    """The file `module` is imported from (a package's ``__init__.py`` first, as Python's path
    finder looks), its source and whether it is a package; None when neither is there."""
    plain, package = module_files(module)
    for rel, is_package in ((package, True), (plain, False)):
        data = read(rel)
        if data is not None:
            return rel, data, is_package
    return None


def resolve(touch: str, read: Reader) -> tuple[str | None, str | None]:
    """Where `touch` (``module:attr``) is found as Python's import system resolves it: the
    module (``a/b.py`` or the package ``a/b/__init__.py``), then each part of the attribute
    path bound in it (a class's body for the next part), or else, in a package, a submodule
    of that name (``...schemes:compressed_tensors_w8a8_fp8``, and ``pkg:sub.Class`` inside
    it). Returns (the file the name was found in, None), or (None, what is missing: the
    module's file, or ``file: name`` for a name it does not bind). ValueError when
    malformed."""
    module, attr = parse_touch(touch)
    found = _module(module, read)
    if found is None:
        return None, module_files(module)[0]
    rel, source, package = found
    parts = attr.split(".")
    for i, part in enumerate(parts):
        rest = ".".join(parts[i:])
        if defines(source, rest):
            return rel, None
        sub = _module(f"{module}.{part}", read) if package else None
        if sub is None:
            return None, f"{rel}: {rest}"
        module, (rel, source, package) = f"{module}.{part}", sub
    return rel, None  # the whole path is submodules: the last one is there


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a block binds at its own level, looking into if/try/with blocks (where vLLM puts
    optional imports), with the node that binds each (a class, to look inside)."""
    names: dict[str, ast.AST] = {}
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names[node.name] = node
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                for sub in ast.walk(target):
                    if isinstance(sub, ast.Name):
                        names.setdefault(sub.id, node)
        elif isinstance(node, ast.Import | ast.ImportFrom):
            for alias in node.names:
                names.setdefault((alias.asname or alias.name).split(".")[0], node)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                for name, bound in _bound_names(block).items():
                    names.setdefault(name, bound)
    return names


@functools.lru_cache(maxsize=4)
def parsed(source: bytes | str) -> ast.Module | None:
    """A module's tree, parsed once for every name asked of it (a check asks many)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def defines(source: bytes | str, attr: str) -> bool:
    """Whether the module source binds `attr` (``"Class.method"`` looks inside the class)."""
    tree = parsed(source)
    if tree is None:
        return False
    body: list[ast.stmt] = tree.body
    parts = attr.split(".")
    for depth, part in enumerate(parts):
        node = _bound_names(body).get(part)
        if node is None:
            return False
        if depth < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True
