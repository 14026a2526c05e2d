"""Genesis's text patches: each `TextPatcher(...)` and its `TextPatch` sub-patches, read
statically, mapped to one runtime site per sub-patch (`sites.toml`).

The facts of the collection this relies on are in `patchset.importers.genesis`.
"""

from __future__ import annotations

import ast
import contextlib
import itertools
import re
import tomllib
from dataclasses import dataclass, field

from patchset.importers.common import imported_modules
from patchset.importers.genesis.oneof import required_groups
from patchset.importers.genesis.registry import PACKAGE
from patchset.importers.model import Draft, Skipped
from patchset.importers.pystatic import (
    Scope,
    Unresolved,
    bind_params,
    call_name,
    local_assignments,
    returned_expr,
)
from patchset.registry.write import TomlData, toml_text


@dataclass
class Sub:
    name: str
    anchor: str
    replacement: str
    required: bool
    markers: list[str]
    line: int
    # appended to the list under an `if` of its own: Genesis adds it only in some states of
    # the file (another patch applied first, an upstream shape), so patchset's site is optional
    conditional: bool = False


@dataclass
class Patcher:
    file: str  # relative to the folder holding vllm/
    marker: str
    subs: list[Sub]
    drift: list[str]
    line: int
    other_files: list[str] = field(default_factory=list)
    # one of the patchers a factory returns by which file the release has (`if new: return
    # TextPatcher(new...)`, `if legacy: return TextPatcher(legacy...)`): Genesis builds one
    either: list[str] = field(default_factory=list)  # the files of the others
    # sub-patches of which the module's own `apply()` requires one to apply (each list two or
    # more optional ones: upstream shapes of one edit, `_at_least_one`)
    one_of: list[list[int]] = field(default_factory=list)  # indices into `subs`


def _arg(node: ast.Call, index: int, name: str) -> ast.expr | None:
    for keyword in node.keywords:
        if keyword.arg == name:
            return keyword.value
    return node.args[index] if len(node.args) > index else None


def read_patchers(scope: Scope) -> tuple[list[Patcher], list[str]]:
    """Every TextPatcher the module builds, in source order, and why others are unreadable."""
    found: list[Patcher] = []
    unresolved: list[str] = []
    owner = _enclosing(scope.tree)
    calls = [
        n for n in ast.walk(scope.tree) if isinstance(n, ast.Call) and call_name(n) == "TextPatcher"
    ]
    for call in sorted(calls, key=lambda c: (c.lineno, c.col_offset)):
        func = owner.get(id(call), scope.tree)
        if isinstance(func, ast.FunctionDef) and "manifest" in func.name:
            continue  # the collection's anchor-manifest tooling, not its patch
        try:
            contexts = _contexts(scope, func, owner)
        except Unresolved as exc:
            unresolved.append(f"{scope.path.name}:{call.lineno}: {exc}")
            continue
        for local, caller in contexts:
            try:
                made = _patcher(scope, call, func, local)
                if not _covered(made, found):  # one factory, two callers; an alias of a bundle
                    found.append(made)
            except Unresolved as exc:
                text = str(exc)
                if "fixture" in text or "pristine" in text:
                    continue  # a test or manifest fixture path, not the patch
                if _helper_only(scope.tree, caller):
                    continue  # a test/lint helper passing its own argument, never called here
                unresolved.append(f"{scope.path.name}:{call.lineno}: {exc}")
    _either(scope.tree, owner, found)
    _at_least_one(scope, found)
    return found, unresolved


def _either(tree: ast.Module, owner: dict[int, ast.AST], found: list[Patcher]) -> None:
    """Mark the patchers one function returns in turn on different files (one is built)."""
    returned: dict[int, list[int]] = {}  # function -> the lines of its `return TextPatcher(`
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Return)
            and isinstance(node.value, ast.Call)
            and call_name(node.value) == "TextPatcher"
        ):
            returned.setdefault(id(owner.get(id(node), tree)), []).append(node.value.lineno)
    for lines in returned.values():
        group = [p for p in found if p.line in lines]
        if len({p.file for p in group}) > 1:
            for patcher in group:
                patcher.either = [p.file for p in group if p.file != patcher.file]


def _at_least_one(scope: Scope, found: list[Patcher]) -> None:
    """Mark each group of optional sub-patches of one patcher, two or more, of which the
    module requires one (`oneof.required_groups`): one site and its alternatives."""
    for members in required_groups(scope):
        for patcher in found:
            group = [i for i, s in enumerate(patcher.subs) if s.name in members and not s.required]
            if len(group) > 1 and group not in patcher.one_of:
                patcher.one_of.append(group)


def _helper_only(tree: ast.Module, caller: ast.AST | None) -> bool:
    """Whether `caller` is a function other than `apply` that takes arguments and that
    nothing in the module calls or names: Genesis's test and lint helpers
    (`_make_patcher_for_source(source, target_file)`) build a patcher on a path they are
    given; the patch is what `apply()` builds."""
    if not isinstance(caller, ast.FunctionDef | ast.AsyncFunctionDef) or caller.name == "apply":
        return False
    if not (caller.args.args or caller.args.posonlyargs or caller.args.kwonlyargs):
        return False
    return not any(
        (isinstance(node, ast.Name) and node.id == caller.name)
        or (isinstance(node, ast.Attribute) and node.attr == caller.name)
        for node in ast.walk(tree)
    )


Context = tuple[dict[str, ast.expr], ast.AST | None]  # local names, the caller binding them


def _contexts(scope: Scope, func: ast.AST, owner: dict[int, ast.AST]) -> list[Context]:
    """The local names of `func` for each way it is called: its own assignments, and its
    parameters bound from each call in the module (a `for` over a constant list expanded),
    each with the function making that call."""
    base = local_assignments(func) if func is not scope.tree else {}
    if not isinstance(func, ast.FunctionDef):
        return [(base, None)]
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
    if not params:
        return [(base, None)]
    calls = [
        c
        for c in ast.walk(scope.tree)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == func.name
    ]
    defaults = bind_params(func, ast.Call(func=ast.Name(func.name), args=[], keywords=[]))
    contexts: list[Context] = []
    for call in calls:
        caller = owner.get(id(call), scope.tree)
        caller_local = local_assignments(caller) if caller is not scope.tree else {}
        given = bind_params(func, call)
        for loop in _loops(caller, call):
            for names in loop:
                context = {**defaults, **base}
                for name, expr in given.items():
                    if name in base and name in defaults and expr is defaults[name]:
                        continue  # a default its body replaces
                    context[name] = _rebind(expr, {**caller_local, **names})
                contexts.append((context, caller))
    if not contexts:
        return [({**defaults, **base}, None)]
    return contexts


def _rebind(expr: ast.expr, local: dict[str, ast.expr]) -> ast.expr:
    """An argument as the callee sees it: `str(x)` unwrapped, a caller's local name replaced
    by what it was set to."""
    for _ in range(3):
        if isinstance(expr, ast.Call) and call_name(expr) == "str" and len(expr.args) == 1:
            expr = expr.args[0]
        if isinstance(expr, ast.Name) and expr.id in local and local[expr.id] is not expr:
            expr = local[expr.id]
    return expr


def _loops(caller: ast.AST, call: ast.Call) -> list[list[dict[str, ast.expr]]]:
    """The bindings of `for` loops around `call` over constant lists (one empty binding
    when there is none)."""
    for node in ast.walk(caller):
        if (
            isinstance(node, ast.For)
            and any(c is call for c in ast.walk(node))
            and isinstance(node.iter, ast.List | ast.Tuple)
        ):
            out = []
            for item in node.iter.elts:
                if isinstance(node.target, ast.Name):
                    out.append({node.target.id: item})
                elif isinstance(node.target, ast.Tuple) and isinstance(item, ast.Tuple):
                    out.append(
                        {
                            t.id: v
                            for t, v in zip(node.target.elts, item.elts, strict=False)
                            if isinstance(t, ast.Name)
                        }
                    )
            return [out]
    return [[{}]]


def _covered(made: Patcher, found: list[Patcher]) -> bool:
    """Whether every sub-patch of `made` is one an earlier patcher of the same file has."""
    have = {(s.name, s.anchor) for p in found if p.file == made.file for s in p.subs}
    return all((s.name, s.anchor) in have for s in made.subs)


def _enclosing(tree: ast.Module) -> dict[int, ast.AST]:
    """Each node's innermost enclosing function (the module for top-level code)."""
    owner: dict[int, ast.AST] = {}

    def visit(node: ast.AST, func: ast.AST) -> None:
        for child in ast.iter_child_nodes(node):
            owner[id(child)] = func
            inner = child if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef) else func
            visit(child, inner)

    visit(tree, tree)
    return owner


def _patcher(scope: Scope, call: ast.Call, func: ast.AST, local: dict[str, ast.expr]) -> Patcher:
    target = _arg(call, 1, "target_file")
    marker = _arg(call, 2, "marker")
    subs = _arg(call, 3, "sub_patches")
    if target is None or marker is None or subs is None:
        raise Unresolved(
            f"line {call.lineno}: TextPatcher without target_file, marker or sub_patches"
        )
    files = _target(scope, target, func, local)
    drift_node = _arg(call, 4, "upstream_drift_markers")
    drift = scope.value(drift_node, local) if drift_node is not None else []
    if not isinstance(drift, list | tuple) or not all(isinstance(d, str) for d in drift):
        raise Unresolved(f"line {call.lineno}: upstream_drift_markers is not a list of strings")
    return Patcher(
        file=files[0],
        marker=scope.string(marker, local),
        subs=_subs(scope, subs, func, local),
        drift=[str(d) for d in drift],
        line=call.lineno,
        other_files=files[1:],
    )


def _target(scope: Scope, node: ast.expr, func: ast.AST, local: dict[str, ast.expr]) -> list[str]:
    """The file(s) `target_file` names: resolve_vllm_file("x") (first of an `or` chain)."""
    if isinstance(node, ast.Call) and call_name(node) == "str" and len(node.args) == 1:
        return _target(scope, node.args[0], func, local)
    if isinstance(node, ast.Name):
        if node.id in local:
            rest = {k: v for k, v in local.items() if k != node.id}
            values = _assigned_in_turn(func, node.id)
            if len(values) > 1:  # `t = f("new")`, `if t is None: t = f("legacy")`: a fallback
                turns: list[str] = []
                for value in values:
                    with contextlib.suppress(Unresolved):
                        turns += _target(scope, value, func, rest)
                if turns:
                    return list(dict.fromkeys(turns))
            return _target(scope, local[node.id], func, rest)
        calls = [
            c.args[0]
            for c in ast.walk(func)
            if isinstance(c, ast.Call) and call_name(c) == "resolve_vllm_file" and c.args
        ]
        paths = []
        for arg in calls:
            try:
                paths.append("vllm/" + scope.string(arg, local).lstrip("/"))
            except Unresolved:
                continue
        paths = list(dict.fromkeys(paths))
        if paths:
            return paths
        raise Unresolved(f"line {node.lineno}: target_file {node.id} is found at run time")
    if isinstance(node, ast.Call) and call_name(node) == "resolve_vllm_file" and node.args:
        return ["vllm/" + scope.string(node.args[0], local).lstrip("/")]
    if isinstance(node, ast.BoolOp) and isinstance(node.op, ast.Or):
        out: list[str] = []
        for value in node.values:
            try:
                out += _target(scope, value, func, local)
            except Unresolved:
                continue
        if out:
            return out
    if isinstance(node, ast.IfExp):
        return _target(scope, node.body, func, local) + _target(scope, node.orelse, func, local)
    raise Unresolved(f"line {node.lineno}: target_file {ast.unparse(node)} is found at run time")


def _assigned_in_turn(func: ast.AST, name: str) -> list[ast.expr]:
    """Every `name = value` of `func`, in source order: a name set again under `if name is
    None:` is the file Genesis falls back to."""
    found = [
        node
        for node in ast.walk(func)
        if isinstance(node, ast.Assign)
        and len(node.targets) == 1
        and isinstance(node.targets[0], ast.Name)
        and node.targets[0].id == name
    ]
    return [n.value for n in sorted(found, key=lambda n: (n.lineno, n.col_offset))]


def _subs(scope: Scope, node: ast.expr, func: ast.AST, local: dict[str, ast.expr]) -> list[Sub]:
    items: list[ast.expr]
    conditional: set[int] = set()
    if isinstance(node, ast.List | ast.Tuple):
        items = list(node.elts)
    elif isinstance(node, ast.Name) and (node.id in local or node.id in scope.assigned):
        value = local.get(node.id) or scope.assigned[node.id]
        if not isinstance(value, ast.List | ast.Tuple):
            raise Unresolved(f"line {node.lineno}: sub_patches {node.id} is built at run time")
        items = list(value.elts)
        holder = func if node.id in local else scope.tree
        appended = _appended(holder, node.id)
        items += appended
        conditional = {id(a) for a in appended if _under_own_if(holder, a, value)}
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in scope.functions
        and (built := _built_list(scope.functions[node.func.id])) is not None
    ):
        items, local, conditional = built[0], {**local, **built[1]}, built[2]
    else:
        raise Unresolved(f"line {node.lineno}: sub_patches is built at run time")
    subs = []
    for item in items:
        call = item
        if isinstance(item, ast.Name):
            call = local.get(item.id) or scope.assigned.get(item.id) or item
        if not (isinstance(call, ast.Call) and call_name(call) == "TextPatch"):
            raise Unresolved(f"line {item.lineno}: a sub-patch built at run time")
        sub = _sub(scope, call, local)
        sub.conditional = id(item) in conditional
        subs.append(sub)
    if not subs:
        raise Unresolved(f"line {node.lineno}: no sub-patch")
    return subs


def _built_list(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
) -> tuple[list[ast.expr], dict[str, ast.expr], set[int]] | None:
    """The items a helper returns as a list: `return [...]`, or a local list it appends to
    and returns (with the ids of those appended under an `if` of their own)."""
    returned = returned_expr(func)
    local = local_assignments(func)
    value = returned[0] if returned else None
    if value is None:
        last = func.body[-1] if func.body else None
        if isinstance(last, ast.Return) and last.value is not None:
            value = last.value
    if isinstance(value, ast.Name) and value.id in local:
        name, value = value.id, local[value.id]
        if isinstance(value, ast.List | ast.Tuple):
            appended = _appended(func, name)
            conditional = {id(a) for a in appended if _under_own_if(func, a, value)}
            return [*value.elts, *appended], local, conditional
    if isinstance(value, ast.List | ast.Tuple):
        return list(value.elts), local, set()
    return None


def _appended(holder: ast.AST, name: str) -> list[ast.expr]:
    """What `name.append(x)` adds to the list `name` in `holder`, in source order."""
    calls = [
        call
        for call in ast.walk(holder)
        if isinstance(call, ast.Call)
        and isinstance(call.func, ast.Attribute)
        and call.func.attr == "append"
        and isinstance(call.func.value, ast.Name)
        and call.func.value.id == name
        and call.args
    ]
    return [c.args[0] for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset))]


def _under_own_if(holder: ast.AST, item: ast.expr, start: ast.expr) -> bool:
    """Whether `item` is appended inside an `if` that does not also hold the list's start."""
    return any(
        isinstance(node, ast.If)
        and any(n is item for n in ast.walk(node))
        and not any(n is start for n in ast.walk(node))
        for node in ast.walk(holder)
    )


def _sub(scope: Scope, call: ast.Call, local: dict[str, ast.expr]) -> Sub:
    parts = [_arg(call, i, n) for i, n in enumerate(("name", "anchor", "replacement", "required"))]
    if parts[0] is None or parts[1] is None or parts[2] is None:
        raise Unresolved(f"line {call.lineno}: TextPatch without name, anchor or replacement")
    required = scope.value(parts[3], local) if parts[3] is not None else False
    markers_node = _arg(call, 4, "upstream_merged_markers")
    markers = scope.value(markers_node, local) if markers_node is not None else []
    if not isinstance(markers, list | tuple):
        raise Unresolved(f"line {call.lineno}: upstream_merged_markers is not a list")
    return Sub(
        name=scope.string(parts[0], local),
        anchor=scope.string(parts[1], local),
        replacement=scope.string(parts[2], local),
        required=bool(required),
        markers=[str(m) for m in markers],
        line=call.lineno,
    )


def _site_name(raw: str, taken: set[str]) -> str:
    base = re.sub(r"[^A-Za-z0-9_.-]+", "-", raw).strip("-") or "site"
    name, n = base, 2
    while name in taken:
        name, n = f"{base}-{n}", n + 1
    taken.add(name)
    return name


def runtime_patch(
    pid: str,
    gid: str,
    patchers: list[Patcher],
    meta: TomlData,
    lost: list[str],
    *,
    drift_in_sites: bool = False,
) -> tuple[dict[str, str], list[str]]:
    sites: list[dict[str, object]] = []
    names: set[str] = set()
    markers: set[str] = set()
    modules: list[str] = []
    for patcher in patchers:
        if patcher.other_files:
            lost.append(
                f"{patcher.file}: the collection falls back to {', '.join(patcher.other_files)}"
                " where it is missing; only the first is a target"
            )
        # A drift marker makes that file's patcher obsolete (read before any of its edits).
        # The first file's are the patch's `[upstream.probe]`: weighed on the file as it is,
        # after "already applied", so one that the patch's own text holds (Genesis's banner
        # as residue detection, the very function it adds) cannot fire on patchset's own
        # edit, and one file's drift makes the whole patch upstream, as Genesis's modules
        # skip it whole. A later patcher's are its sites' probes, read (as Genesis reads them)
        # on the file as the patchers before it leave it; one that an earlier site of the same
        # patcher inserts would fire there where Genesis, reading once before that patcher's
        # first edit, does not: left out of the later sites.
        if patcher.either:
            lost.append(
                f"{patcher.file}: the collection patches it or {', '.join(patcher.either)},"
                " whichever the release has; patchset targets each, their sites optional"
            )
        first = patcher is patchers[0] and not drift_in_sites
        drift = patcher.drift if not first else []
        if first and patcher.drift:
            up = meta["upstream"]
            assert isinstance(up, dict)
            up["probe"] = {"file": patcher.file, "any": list(dict.fromkeys(patcher.drift))}
        grouped = {i: group for group in patcher.one_of for i in group}
        for index, sub in enumerate(patcher.subs):
            group = grouped.get(index, [index])
            if index != group[0]:
                continue  # an alternative of the group's first site
            members = [patcher.subs[i] for i in group]
            before = [s.replacement for s in patcher.subs[:index]]
            file_probe = [m for m in drift if not any(m in t for t in before)]
            if not all(m.anchor.strip() for m in members):
                raise Skipped(f"sub-patch {sub.name!r} has an empty anchor")
            marker = f"Genesis {gid} {patcher.marker} :: {sub.name}".replace("\n", " ")
            while marker in markers:
                marker += "'"
            markers.add(marker)
            site: dict[str, object] = {
                "name": _site_name(sub.name, names),
                "file": patcher.file,
                "action": "replace",
                "marker": marker,
                "anchor": sub.anchor,
                "text": sub.replacement,
                "optional": (not sub.required and len(members) == 1)
                or any(m.conditional for m in members)
                or bool(patcher.either),
            }
            if len(members) > 1:  # the module requires one of them: one site, its shapes
                site["alternatives"] = [
                    {"anchor": m.anchor, "text": m.replacement} for m in members[1:]
                ]
            for member in members:
                if member.conditional:
                    lost.append(
                        f"sub-patch {member.name}: the module adds it only under an `if` (a"
                        " state of the file); optional here"
                    )
                modules += imported_modules(member.replacement, PACKAGE)
            probe = [m for member in members for m in [*member.markers, *file_probe] if m]
            if probe:
                site["probe"] = {"any": list(dict.fromkeys(probe))}
            sites.append(site)
    targets = list(dict.fromkeys(p.file for p in patchers))
    meta["kind"] = "runtime"
    meta["targets"] = targets
    header = f"Imported from Genesis {gid} by patchset import genesis; one site per TextPatch."
    return {"sites.toml": toml_text({"site": sites}, header=header)}, list(dict.fromkeys(modules))


def stacked_anchors(drafts: list[Draft]) -> None:
    """An anchor that holds the text a patch it `requires` inserts (PN388 reads P34's edit):
    patchset writes that site's marker comment above its text, so the anchor gets the marker
    line there too, its own shape kept as the alternative (the text as Genesis's own patcher
    leaves it, with its marker at the top of the file)."""
    by_id = {d.id: d for d in drafts}
    for draft in drafts:
        required = draft.meta.get("requires")
        if not isinstance(required, list) or "sites.toml" not in draft.payloads:
            continue
        beneath = [
            site
            for rid in required
            if rid in by_id and "sites.toml" in by_id[rid].payloads
            for site in tomllib.loads(by_id[rid].payloads["sites.toml"])["site"]
            if site["action"] == "replace"
        ]
        text = draft.payloads["sites.toml"]
        data = tomllib.loads(text)
        changed = False
        for site in data["site"]:
            anchor = str(site["anchor"])
            for below in beneath:
                block = str(below["text"]).strip("\n")
                at = anchor.find(block)
                if not block or at < 0 or (at > 0 and anchor[at - 1] != "\n"):
                    continue
                indent = block[: len(block) - len(block.lstrip(" \t"))]
                anchor = f"{anchor[:at]}{indent}# {below['marker']}\n{anchor[at:]}"
            if anchor != site["anchor"]:
                alternatives = [{"anchor": site["anchor"]}, *site.get("alternatives", [])]
                site["anchor"], site["alternatives"] = anchor, alternatives
                changed = True
        if changed:
            top = itertools.takewhile(lambda line: line.startswith("#"), text.splitlines())
            header = "\n".join(line[2:] for line in top)
            draft.payloads["sites.toml"] = toml_text(data, header=header)
