"""Values of a collection's Python read statically: `ast`, never an import or a run.

A collection builds the text of its patches in module-level constants, concatenations and
f-strings of constants, names imported from its other modules, and a few string methods
(`textwrap.dedent`, `.replace`, `.strip`, `.format`, `"".join`). `Scope.value` evaluates
such an expression; whatever depends on run time raises `Unresolved` with the reason.
"""

from __future__ import annotations

import ast
import re
import textwrap
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

Value = object  # str, int, bool, None, or lists / tuples / dicts of them


class Unresolved(Exception):  # noqa: N818 - a signal, caught where a value is optional
    """An expression whose value is known only at run time; `str()` says why."""


@dataclass
class Package:
    """The collection's modules under `root`, parsed once each (a syntax error kept)."""

    root: Path
    _scopes: dict[str, Scope | None] = field(default_factory=dict)
    broken: dict[str, str] = field(default_factory=dict)  # relative file -> why it does not parse

    def file_of(self, module: str) -> Path | None:
        base = self.root.joinpath(*module.split("."))
        for candidate in (base.with_suffix(".py"), base / "__init__.py"):
            if candidate.is_file():
                return candidate
        return None

    def scope(self, module: str) -> Scope | None:
        if module in self._scopes:
            return self._scopes[module]
        path = self.file_of(module)
        scope = None
        if path is not None:
            try:
                tree = ast.parse(path.read_bytes(), filename=str(path))
            except (SyntaxError, ValueError) as exc:
                self.broken[str(path.relative_to(self.root))] = f"does not parse: {exc}"
            else:
                scope = Scope(module, tree, self, path)
        self._scopes[module] = scope
        return scope


class Scope:
    """One module's top-level names and the imports that bring in names of the package."""

    def __init__(self, module: str, tree: ast.Module, package: Package, path: Path) -> None:
        self.module = module
        self.tree = tree
        self.package = package
        self.path = path
        self.assigned: dict[str, ast.expr] = {}
        self.imported: dict[str, tuple[str, str | None]] = {}  # name -> (module, attr or None)
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        is_package = path.name == "__init__.py"
        for node in tree.body:
            self.assigned.update(_assignments(node))
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                self.functions[node.name] = node
            if isinstance(node, ast.ImportFrom):
                base = _absolute(module, node, is_package=is_package)
                for alias in node.names:
                    self.imported[alias.asname or alias.name] = (base, alias.name)
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        self.imported[alias.asname] = (alias.name, None)
        self._busy: set[str] = set()

    def value(self, node: ast.expr, local: dict[str, ast.expr] | None = None) -> Value:
        return _Eval(self, local or {}).eval(node)

    def string(self, node: ast.expr, local: dict[str, ast.expr] | None = None) -> str:
        found = self.value(node, local)
        if not isinstance(found, str):
            raise Unresolved(f"line {node.lineno}: not a string ({type(found).__name__})")
        return found

    def name_value(self, name: str, line: int) -> Value:
        if name in self._busy:
            raise Unresolved(f"line {line}: {name} refers to itself")
        if name in self.assigned:
            self._busy.add(name)
            try:
                return self.value(self.assigned[name])
            finally:
                self._busy.discard(name)
        if name in self.imported:
            module, attr = self.imported[name]
            other = self.package.scope(module)
            if attr is not None:
                sub = self.package.scope(f"{module}.{attr}")
                if sub is not None and other is None:
                    raise Unresolved(f"line {line}: {name} is a module")
                if other is not None:
                    return other.name_value(attr, line)
            raise Unresolved(f"line {line}: {name} comes from {module}, outside the collection")
        raise Unresolved(f"line {line}: {name} is set at run time")


def _absolute(module: str, node: ast.ImportFrom, *, is_package: bool) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    keep = len(parts) - node.level + (1 if is_package else 0)
    base = parts[:keep]
    return ".".join([*base, *([node.module] if node.module else [])])


def _assignments(node: ast.stmt) -> list[tuple[str, ast.expr]]:
    if isinstance(node, ast.Assign) and len(node.targets) == 1:
        target = node.targets[0]
        if isinstance(target, ast.Name):
            return [(target.id, node.value)]
    if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and node.value:
        return [(node.target.id, node.value)]
    return []


def local_assignments(func: ast.AST) -> dict[str, ast.expr]:
    """A function's own `name = value` lines (the last one of each name), nested blocks too."""
    found: dict[str, ast.expr] = {}
    for node in ast.walk(func):
        if isinstance(node, ast.stmt):
            found.update(_assignments(node))
    return found


_STR_METHODS: dict[str, Callable[..., Value]] = {
    "strip": str.strip,
    "lstrip": str.lstrip,
    "rstrip": str.rstrip,
    "replace": str.replace,
    "format": str.format,
    "join": str.join,
    "lower": str.lower,
    "upper": str.upper,
    "removeprefix": str.removeprefix,
    "removesuffix": str.removesuffix,
}


def _as_list(value: Value) -> Value:
    return list(cast("Iterable[object]", value))


def _as_tuple(value: Value) -> Value:
    return tuple(cast("Iterable[object]", value))


def _as_sorted(value: Value) -> Value:
    return sorted(cast("Iterable[Any]", value))


_BUILTINS: dict[str, Callable[[Value], Value]] = {
    "str": str,
    "list": _as_list,
    "tuple": _as_tuple,
    "sorted": _as_sorted,
    "repr": repr,
}


class _Eval:
    def __init__(self, scope: Scope, local: dict[str, ast.expr]) -> None:
        self.scope = scope
        self.local = local
        self.busy: set[str] = set()

    def eval(self, node: ast.expr) -> Value:
        if isinstance(node, ast.Constant):
            return node.value
        if isinstance(node, ast.JoinedStr):
            return "".join(self._fstring_part(v) for v in node.values)
        if isinstance(node, ast.BinOp):
            left, right = self.eval(node.left), self.eval(node.right)
            try:
                if isinstance(node.op, ast.Add):
                    return left + right  # type: ignore[operator]
                if isinstance(node.op, ast.Mod) and isinstance(left, str):
                    return left % right
                if isinstance(node.op, ast.Mult):
                    return left * right  # type: ignore[operator]
            except TypeError as exc:
                raise Unresolved(f"line {node.lineno}: {exc}") from None
            raise Unresolved(f"line {node.lineno}: operator {type(node.op).__name__}")
        if isinstance(node, ast.Name):
            if node.id in self.local and node.id not in self.busy:
                self.busy.add(node.id)
                try:
                    return self.eval(self.local[node.id])
                finally:
                    self.busy.discard(node.id)
            return self.scope.name_value(node.id, node.lineno)
        if isinstance(node, ast.List | ast.Tuple):
            items: list[Value] = []
            for element in node.elts:
                if isinstance(element, ast.Starred):
                    items.extend(cast("Iterable[object]", self.eval(element.value)))
                else:
                    items.append(self.eval(element))
            return items if isinstance(node, ast.List) else tuple(items)
        if isinstance(node, ast.Dict):
            return {
                cast("Any", self.eval(k) if k is not None else None): self.eval(v)
                for k, v in zip(node.keys, node.values, strict=True)
            }
        if isinstance(node, ast.Attribute):
            return self._attribute(node)
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Subscript):
            base = self.eval(node.value)
            index = self.eval(node.slice)
            try:
                return base[index]  # type: ignore[index]
            except (TypeError, KeyError, IndexError) as exc:
                raise Unresolved(f"line {node.lineno}: {exc}") from None
        raise Unresolved(f"line {node.lineno}: {type(node).__name__} is computed at run time")

    def _fstring_part(self, part: ast.expr) -> str:
        if isinstance(part, ast.Constant):
            return str(part.value)
        if isinstance(part, ast.FormattedValue):
            value = self.eval(part.value)
            if part.conversion == ord("r"):
                value = repr(value)
            spec = "" if part.format_spec is None else str(self.eval(part.format_spec))
            return format(value, spec)
        raise Unresolved(f"line {part.lineno}: f-string part")

    def _attribute(self, node: ast.Attribute) -> Value:
        if isinstance(node.value, ast.Name) and node.value.id in self.scope.imported:
            module, attr = self.scope.imported[node.value.id]
            name = module if attr is None else f"{module}.{attr}"
            other = self.scope.package.scope(name)
            if other is not None:
                return other.name_value(node.attr, node.lineno)
        raise Unresolved(f"line {node.lineno}: attribute {node.attr} is read at run time")

    def _call(self, node: ast.Call) -> Value:
        func = node.func
        if node.keywords and not (isinstance(func, ast.Attribute) and func.attr == "format"):
            raise Unresolved(f"line {node.lineno}: a call with keywords")
        if isinstance(func, ast.Name) and func.id in _BUILTINS and len(node.args) == 1:
            return _BUILTINS[func.id](self.eval(node.args[0]))
        if isinstance(func, ast.Attribute) and func.attr == "dedent" and len(node.args) == 1:
            return textwrap.dedent(str(self.eval(node.args[0])))
        if isinstance(func, ast.Name) and func.id == "dedent" and len(node.args) == 1:
            return textwrap.dedent(str(self.eval(node.args[0])))
        if isinstance(func, ast.Attribute) and func.attr in _STR_METHODS:
            base = self.eval(func.value)
            if isinstance(base, str):
                args = [self.eval(a) for a in node.args]
                kwargs = {k.arg: self.eval(k.value) for k in node.keywords if k.arg}
                try:
                    return _STR_METHODS[func.attr](base, *args, **kwargs)
                except (TypeError, ValueError, KeyError, IndexError) as exc:
                    raise Unresolved(f"line {node.lineno}: {exc}") from None
        if isinstance(func, ast.Name) and func.id in self.scope.functions:
            returned = returned_expr(self.scope.functions[func.id])
            if returned is not None:
                expr, local = returned
                bound = bind_params(self.scope.functions[func.id], node)
                values = {k: constant(self.eval(v), v) for k, v in bound.items()}
                return _Eval(self.scope, {**local, **values}).eval(expr)
        name = ast.unparse(func)
        raise Unresolved(f"line {node.lineno}: {name}() runs at run time")


def constant(value: Value, like: ast.expr) -> ast.expr:
    """`value` as an expression node, at the place of `like`."""
    return ast.copy_location(ast.Constant(cast("Any", value)), like)


def returned_expr(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
) -> tuple[ast.expr, dict[str, ast.expr]] | None:
    """What a small helper returns: its one `return` at the end of straight-line code (its
    own `name = value` lines kept as locals), or None."""
    body = [
        n for n in func.body if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant))
    ]
    if not body or not isinstance(body[-1], ast.Return) or body[-1].value is None:
        return None
    local: dict[str, ast.expr] = {}
    for node in body[:-1]:
        pairs = _assignments(node)
        if not pairs:
            return None
        local.update(pairs)
    return body[-1].value, local


def bind_params(
    func: ast.FunctionDef | ast.AsyncFunctionDef, call: ast.Call
) -> dict[str, ast.expr]:
    """The parameters of `func` bound to the arguments of `call` (defaults where not given)."""
    args = func.args
    positional = [a.arg for a in [*args.posonlyargs, *args.args]]
    bound: dict[str, ast.expr] = dict(
        zip(positional[len(positional) - len(args.defaults) :], args.defaults, strict=True)
    )
    bound |= {a.arg: d for a, d in zip(args.kwonlyargs, args.kw_defaults, strict=True) if d}
    for name, arg in zip(positional, call.args, strict=False):
        bound[name] = arg
    for keyword in call.keywords:
        if keyword.arg:
            bound[keyword.arg] = keyword.value
    return bound


def call_name(node: ast.Call) -> str:
    """The name a call calls: `f` of `f(...)` and of `x.f(...)`; "" for anything else."""
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


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
        elif isinstance(node, ast.Call) and call_name(node) == "setattr" and len(node.args) >= 2:
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
