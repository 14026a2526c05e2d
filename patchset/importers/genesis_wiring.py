"""Genesis's import-time wiring: a module without a TextPatcher, whose `apply()` rebinds
vLLM names, imported as a python patch calling it.

The facts of the collection this relies on are in `patchset.importers.genesis`.
"""

from __future__ import annotations

import ast
import re

from patchset.importers.genesis_registry import PACKAGE, _Skip
from patchset.importers.genesis_text import _call_name
from patchset.importers.pystatic import (
    Scope,
)


def rebinds(scope: Scope) -> tuple[list[str], bool]:
    """`module:attribute` names of vLLM the module rebinds (`X.y = ...`, `setattr(X, "y",
    ...)` with X imported from vllm), and whether they are only the names it imports."""
    names: dict[str, tuple[str, str | None]] = {}  # local name -> (module, attr or None)
    for node in ast.walk(scope.tree):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("vllm"):
            for alias in node.names:
                names[alias.asname or alias.name] = (node.module, alias.name)
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.startswith("vllm") and alias.asname:
                    names[alias.asname] = (alias.name, None)
    touches: list[str] = []
    for node in ast.walk(scope.tree):
        chain: list[str] | None = None
        if isinstance(node, ast.Assign):
            for target in node.targets:
                if isinstance(target, ast.Attribute):
                    chain = _chain(target)
        elif isinstance(node, ast.Call) and _call_name(node) == "setattr" and len(node.args) >= 2:
            obj, attr = node.args[0], node.args[1]
            if isinstance(attr, ast.Constant) and isinstance(attr.value, str):
                base = _chain(obj)
                chain = [*base, attr.value] if base else None
        if chain and chain[0] in names:
            touch = _touch(names[chain[0]], chain[1:])
            if touch:
                touches.append(touch)
    if touches:
        return list(dict.fromkeys(touches)), False
    fallback = [t for n in names.values() if (t := _touch(n, [])) is not None]
    return list(dict.fromkeys(fallback))[:8], True


def _chain(node: ast.expr) -> list[str]:
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return []


def _touch(origin: tuple[str, str | None], rest: list[str]) -> str | None:
    module, attr = origin
    path = ([] if attr is None else [attr]) + rest
    # `from vllm.a import b; b.C.x = ...`: a lowercase name followed by more is a module
    while len(path) > 1 and path[0][:1].islower():
        module, path = f"{module}.{path[0]}", path[1:]
    if not path or not module.startswith("vllm"):
        return None
    if not re.match(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$", ".".join(path)):
        return None
    return f"{module}:{'.'.join(path)}"


def _python(
    gid: str, module: str, scope: Scope, meta: dict[str, object], lost: list[str]
) -> dict[str, str]:
    if "apply" not in scope.functions:
        raise _Skip(f"{module} defines no apply()")
    touches, approximate = rebinds(scope)
    if not touches:
        raise _Skip(f"{module}: rebinds no vLLM name that can be read statically")
    if approximate:
        lost.append("touches are the vLLM names it imports (what it rebinds is not readable)")
    meta["kind"] = "python"
    meta["touches"] = touches
    meta["targets"] = list(
        dict.fromkeys(t.partition(":")[0].replace(".", "/") + ".py" for t in touches)
    )
    plugin = f'''"""Genesis {gid}: calls the collection's own wiring, {module}.apply().

Imported by `patchset import genesis`; the collection's package comes from the registry's
support package `{PACKAGE}` (patches/_support/{PACKAGE}/).
"""

MODULE = {module!r}


def apply():
    import importlib

    result = importlib.import_module(MODULE).apply()
    status = result[0] if isinstance(result, tuple) and result else result
    if status == "failed":
        raise RuntimeError(f"Genesis {gid}: {{result[1] if isinstance(result, tuple) else result}}")
    return result
'''
    return {"plugin.py": plugin}
