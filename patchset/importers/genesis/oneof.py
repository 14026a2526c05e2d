"""Genesis's "at least one of these sub-patches must apply": optional `TextPatch`es, one per
upstream shape of one edit, and an `apply()` that fails when none of them applied (read
statically, as the rest of the module). `patchset.importers.genesis.text` makes each group
one site, not optional, the other shapes its alternatives.
"""

from __future__ import annotations

import ast

from patchset.importers.pystatic import Scope, Unresolved, call_name


def required_groups(scope: Scope) -> list[set[str]]:
    """The groups of sub-patch names of which the module requires one to apply, read where a
    function that returns ``"failed", ...`` asks it of a patcher's `applied_sub_patches`:
    `applied.intersection(NAMES)` or `[n for n in p.applied_sub_patches if n in NAMES]`, NAMES
    a module-level tuple (list, set) of sub-patch names (PN351's "at least one launch variant
    must have fired": its upstream shapes of one call; P88's, P107's, PN380's and P62's two),
    and ``for base in NAMES: if base not in applied and f"{base}_dev748" not in applied`` (one
    pair per name: the successor's P100)."""
    groups: list[set[str]] = []
    for func in ast.walk(scope.tree):
        if not isinstance(func, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        nodes = list(ast.walk(func))
        if not any(_reads_applied(n) for n in nodes) or not any(_returns_failed(n) for n in nodes):
            continue
        for node in nodes:
            groups += _groups_asked(scope, node)
    return groups


def _reads_applied(node: ast.AST) -> bool:
    return isinstance(node, ast.Attribute) and node.attr == "applied_sub_patches"


def _groups_asked(scope: Scope, node: ast.AST) -> list[set[str]]:
    """The groups of sub-patch names `node` asks whether one of applied (see `required_groups`)."""
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "intersection"
        and len(node.args) == 1
        and isinstance(node.args[0], ast.Name)
    ):
        return [_names_listed(scope, node.args[0].id)]
    if isinstance(node, ast.comprehension) and _reads_applied(node.iter):
        return [
            _names_listed(scope, test.comparators[0].id)
            for test in node.ifs
            if isinstance(test, ast.Compare)
            and len(test.ops) == 1
            and isinstance(test.ops[0], ast.In)
            and isinstance(test.comparators[0], ast.Name)
        ]
    if isinstance(node, ast.For) and isinstance(node.target, ast.Name):
        if not isinstance(node.iter, ast.Name):
            return []
        suffixes = _pair_suffixes(node, node.target.id)
        names = _names_listed(scope, node.iter.id) if suffixes else set()
        return [{base, *(base + suffix for suffix in suffixes)} for base in names]
    return []


def _pair_suffixes(loop: ast.For, var: str) -> list[str]:
    """The suffixes of ``if var not in A and f"{var}<suffix>" not in A: return "failed"`` in
    the `for` loop over `var`: each name and those names with a suffix are one group."""
    suffixes: list[str] = []
    for node in ast.walk(loop):
        if not (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.BoolOp)
            and isinstance(node.test.op, ast.And)
            and any(_returns_failed(n) for b in node.body for n in ast.walk(b))
        ):
            continue
        bare, found = False, []
        for test in node.test.values:
            if not (
                isinstance(test, ast.Compare)
                and len(test.ops) == 1
                and isinstance(test.ops[0], ast.NotIn)
            ):
                break
            left = test.left
            if isinstance(left, ast.Name) and left.id == var:
                bare = True
            elif (
                isinstance(left, ast.JoinedStr)
                and len(left.values) == 2
                and isinstance(left.values[0], ast.FormattedValue)
                and isinstance(left.values[0].value, ast.Name)
                and left.values[0].value.id == var
                and left.values[0].conversion == -1
                and left.values[0].format_spec is None
                and isinstance(left.values[1], ast.Constant)
                and isinstance(left.values[1].value, str)
            ):
                found.append(left.values[1].value)
            else:
                break
        else:
            if bare and found:
                suffixes += found
    return suffixes


def _returns_failed(node: ast.AST) -> bool:
    """Whether `node` is a `return "failed", ...`."""
    value = node.value if isinstance(node, ast.Return) else None
    return (
        isinstance(value, ast.Tuple)
        and bool(value.elts)
        and isinstance(value.elts[0], ast.Constant)
        and value.elts[0].value == "failed"
    )


def _names_listed(scope: Scope, name: str) -> set[str]:
    """The strings a module-level tuple, list or set of strings named `name` holds (none for
    anything else)."""
    node = scope.assigned.get(name)
    if isinstance(node, ast.Call) and call_name(node) in ("frozenset", "set") and node.args:
        node = node.args[0]
    if not isinstance(node, ast.Tuple | ast.List | ast.Set):
        return set()
    try:
        values = [scope.value(item, {}) for item in node.elts]
    except Unresolved:
        return set()
    if not all(isinstance(v, str) for v in values):
        return set()
    return {str(v) for v in values}


__all__ = ["required_groups"]
