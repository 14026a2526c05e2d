"""`patchset import genesis DIR`: Genesis's registry and patch modules, read with `ast` only.

Facts of the collection this relies on (its own code is never imported or run):
- `sndr/dispatcher/registry.py` holds `PATCH_REGISTRY`, a dict literal of id -> entry with
  `title`, `env_flag` (the full variable name), `default_on`, `lifecycle`, `credit`,
  `upstream_pr` (a vLLM pull request number) and `upstream_pr_relationship`, `applies_to`
  (profile key -> allowed values, `vllm_version_range` a pair of specifiers), a top-level
  `vllm_version_range`, `requires_patches`, `conflicts_with`, `composes_with`,
  `superseded_by` (free text) and `apply_module` (the dotted module with its `apply()`).
- A text patch module builds `TextPatcher(patch_name, target_file, marker, sub_patches,
  upstream_drift_markers)` with `target_file` from `resolve_vllm_file("<path under vllm/>")`
  and `sub_patches` a list of `TextPatch(name, anchor, replacement, required=False,
  upstream_merged_markers=[...])`. Each sub-patch replaces its anchor, which must occur once;
  one not `required` is skipped alone when its anchor is missing; a sub-patch whose upstream
  marker is in the file is skipped alone; a drift marker in the file makes the whole file's
  patcher obsolete. The patcher writes `# [Genesis wiring marker: <marker>]` at the top.
- A module without a TextPatcher is import-time wiring: its `apply()` rebinds vLLM names.
"""

from __future__ import annotations

import ast
import contextlib
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset.importers.common import imported_modules, origin_of
from patchset.importers.model import Collected, CollectionError, Draft, Entry, Support, patch_id
from patchset.importers.pystatic import (
    Package,
    Scope,
    Unresolved,
    bind_params,
    local_assignments,
    returned_expr,
)
from patchset.importers.tomlout import dumps

NAME = "genesis"
REPOSITORY = "Sandermage/genesis-vllm-patches"
REGISTRY_FILE = "sndr/dispatcher/registry.py"
PATCHES_DIR = "sndr/engines/vllm/patches"
PACKAGE = "sndr"
PINS_MODULE = "sndr.engines.vllm.detection.guards"
PREFIX = "genesis"
_LIFECYCLE = {
    "experimental": "experimental",
    "stable": "stable",
    "deprecated": "deprecated",
    "retired": "retired",
    "legacy": "deprecated",
    "research": "experimental",
    "coordinator": "experimental",
}
_SPEC_KEYS = ("spec_method", "spec_decode_method", "spec_method_any")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass
class Sub:
    name: str
    anchor: str
    replacement: str
    required: bool
    markers: list[str]
    line: int


@dataclass
class Patcher:
    file: str  # relative to the folder holding vllm/
    marker: str
    subs: list[Sub]
    drift: list[str]
    line: int
    other_files: list[str] = field(default_factory=list)


def detect(folder: Path) -> Path:
    registry = folder / REGISTRY_FILE
    ok = registry.is_file() and (folder / PATCHES_DIR).is_dir()
    if ok:
        try:
            ok = "PATCH_REGISTRY" in registry.read_text(errors="replace")
        except OSError:
            ok = False
    if not ok:
        raise CollectionError(
            f"{folder}: not a Genesis checkout (looked for {REGISTRY_FILE} holding"
            f" PATCH_REGISTRY and {PATCHES_DIR}/)"
        )
    return registry


def read_registry(path: Path) -> tuple[dict[str, dict[str, object]], dict[str, int], str | None]:
    """PATCH_REGISTRY's entries, the line of each, and why the file could not be read."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (SyntaxError, ValueError) as exc:
        return {}, {}, f"does not parse: {exc}"
    for node in tree.body:
        target: ast.expr | None = None
        value: ast.expr | None = None
        if isinstance(node, ast.AnnAssign):
            target, value = node.target, node.value
        elif isinstance(node, ast.Assign) and len(node.targets) == 1:
            target, value = node.targets[0], node.value
        if not (isinstance(target, ast.Name) and target.id == "PATCH_REGISTRY"):
            continue
        if not isinstance(value, ast.Dict):
            return {}, {}, "PATCH_REGISTRY is not a dict literal (an unknown layout)"
        entries: dict[str, dict[str, object]] = {}
        lines: dict[str, int] = {}
        for key, item in zip(value.keys, value.values, strict=True):
            if not isinstance(key, ast.Constant) or not isinstance(key.value, str):
                continue
            try:
                data = ast.literal_eval(item)
            except ValueError:
                data = None
            entries[key.value] = data if isinstance(data, dict) else {"__unreadable__": True}
            lines[key.value] = key.lineno
        return entries, lines, None
    return {}, {}, "no PATCH_REGISTRY assignment (an unknown layout)"


def collect(folder: Path, *, only: set[str] | None = None) -> Collected:
    registry_file = detect(folder)
    entries, lines, problem = read_registry(registry_file)
    if problem is not None:
        if "unknown layout" in problem:
            raise CollectionError(f"{registry_file}: {problem}")
        return Collected(NAME, REPOSITORY, None, [], [], broken={REGISTRY_FILE: problem})
    repository, commit = origin_of(folder, REPOSITORY)
    package = Package(folder)
    ids = {gid: patch_id(PREFIX, gid) for gid in entries}
    drafts: list[Draft] = []
    skipped: list[Entry] = []
    done_modules: dict[str, str] = {}
    switches: dict[str, str] = {}  # variable -> the patch it switches
    for gid, entry in entries.items():
        if only and gid not in only and ids[gid] not in only:
            continue
        where = {"repository": repository, "commit": commit, "line": lines[gid]}
        try:
            draft = _draft(gid, entry, ids, package, where, done_modules)
        except _Skip as why:
            skipped.append(Entry(gid, "not-imported", reasons=[str(why)]))
            continue
        _own_switch(draft, switches)
        drafts.append(draft)
    supports = []
    if any(PACKAGE in d.support for d in drafts):
        supports.append(
            Support(
                name=PACKAGE,
                meta={"name": PACKAGE, "modules": [PACKAGE], "path": "src"},
                source=str(folder / PACKAGE),
                package=PACKAGE,
            )
        )
    _drop_dangling(drafts)
    return Collected(NAME, repository, commit, drafts, skipped, supports, dict(package.broken))


def _floor(package: Package) -> str:
    """The range of an entry that gives none: from the oldest release Genesis validates
    (`KNOWN_GOOD_VLLM_PINS`, read statically), its X.Y.0; every release when unreadable."""
    scope = package.scope(PINS_MODULE)
    try:
        pins = scope.name_value("KNOWN_GOOD_VLLM_PINS", 0) if scope is not None else ()
    except Unresolved:
        pins = ()
    versions = []
    for pin in pins if isinstance(pins, list | tuple) else ():
        with contextlib.suppress(InvalidVersion):
            versions.append(Version(str(pin)))
    if not versions:
        return ">=0.0"
    oldest = min(versions)
    return f">={oldest.major}.{oldest.minor}.0"


def _own_switch(draft: Draft, switches: dict[str, str]) -> None:
    """patchset gives each patch its own switch: a variable Genesis shares between entries
    switches the first; the others get one of their own (said as a loss)."""
    switch = draft.meta.get("switch")
    if not isinstance(switch, dict):
        return
    env = str(switch["env"])
    if env in switches:
        own = f"{env}__{re.sub(r'[^A-Z0-9]+', '_', draft.source_id.upper())}"[:120]
        draft.lost.append(
            f"Genesis switches it with {env}, as {switches[env]}: its own switch is {own}"
        )
        switch["env"] = own
        env = own
    switches[env] = draft.id


class _Skip(Exception):  # noqa: N818 - a reason, not an error
    pass


def _draft(  # noqa: PLR0917 - one entry and what it is read against
    gid: str,
    entry: dict[str, object],
    ids: dict[str, str],
    package: Package,
    where: Mapping[str, object],
    done_modules: dict[str, str],
) -> Draft:
    if entry.get("__unreadable__"):
        raise _Skip("its PATCH_REGISTRY entry is not a literal")
    module = entry.get("apply_module")
    if not isinstance(module, str) or not module:
        raise _Skip("no apply_module: nothing to apply")
    if module in done_modules:
        raise _Skip(f"its apply_module is imported as {done_modules[module]} already")
    path = package.file_of(module)
    if path is None:
        raise _Skip(f"apply_module {module} has no file in the checkout")
    scope = package.scope(module)
    rel = str(path.relative_to(package.root))
    if scope is None:
        raise _Skip(f"{rel} does not parse (skipped)")
    pid = ids[gid]
    lost: list[str] = []
    meta = _metadata(gid, entry, ids, lost, _floor(package))
    meta["provenance"] = {
        "collection": NAME,
        "repository": where["repository"],
        **({"commit": where["commit"]} if where["commit"] else {}),
        "file": REGISTRY_FILE,
        "line": where["line"],
    }
    patchers, unresolved = _patchers(scope)
    support: tuple[str, ...] = ()
    if patchers or unresolved:
        if unresolved and not patchers:
            raise _Skip(f"{rel}: text built at run time: {unresolved[0]}")
        if unresolved:
            raise _Skip(
                f"{rel}: {len(unresolved)} of {len(patchers) + len(unresolved)} text patchers"
                f" built at run time: {unresolved[0]}"
            )
        payloads, modules = _runtime(pid, gid, patchers, meta, lost)
        if modules:
            meta["requires_modules"] = modules
            support = (PACKAGE,)
        first = min(p.line for p in patchers)
        meta["provenance"] = {**meta["provenance"], "file": rel, "line": first}  # type: ignore[dict-item]
    else:
        payloads = _python(gid, module, scope, meta, lost)
        meta["requires_modules"] = [module]
        support = (PACKAGE,)
        meta["provenance"] = {**meta["provenance"], "file": rel, "line": 1}  # type: ignore[dict-item]
    meta["x"] = {**meta.get("x", {}), "genesis_registry_line": where["line"]}  # type: ignore[dict-item]
    done_modules[module] = pid
    return Draft(pid, gid, _ordered(meta), payloads, lost, support)


_ORDER = (
    "id",
    "title",
    "description",
    "kind",
    "revision",
    "vllm",
    "apply",
    "targets",
    "touches",
    "origin",
    "credit",
    "payload",
    "requires",
    "conflicts",
    "requires_modules",
    "switch",
    "applies",
    "failure",
    "lifecycle",
    "upstream",
    "hardware",
    "provenance",
    "x",
)


def _ordered(meta: dict[str, object]) -> dict[str, object]:
    return {k: meta[k] for k in _ORDER if k in meta} | {
        k: v for k, v in meta.items() if k not in _ORDER
    }


def _metadata(
    gid: str, entry: dict[str, object], ids: dict[str, str], lost: list[str], floor: str
) -> dict[str, object]:
    title = str(entry.get("title") or gid)
    credit = entry.get("credit")
    meta: dict[str, object] = {
        "id": ids[gid],
        "title": f"Genesis {gid}: {title}"[:200],
        "description": f"Imported from Genesis ({REPOSITORY}) patch {gid}: {title}\n",
        "revision": 1,
        "apply": "startup",
        "origin": f"Genesis {gid} ({REPOSITORY})",
        "credit": ["Sandermage (Genesis)", *([str(credit)] if credit else [])],
    }
    x: dict[str, object] = {"genesis_id": gid}
    env = entry.get("env_flag")
    if isinstance(env, str) and _ENV.match(env):
        meta["switch"] = {"env": env, "default": bool(entry.get("default_on", False))}
    else:
        lost.append(f"env_flag {env!r} is not a variable name: no switch")
    aliases = entry.get("env_flag_aliases")
    if aliases:
        lost.append(f"env_flag_aliases {aliases!r}: one switch variable only")
        x["env_flag_aliases"] = (
            [str(a) for a in aliases] if isinstance(aliases, list) else str(aliases)
        )
    vllm, applies = _gates(entry.get("applies_to"), lost)
    top_range = entry.get("vllm_version_range")
    if top_range:
        vllm = _range(top_range) or vllm
    meta["vllm"] = vllm or floor
    if applies is not None:
        meta["applies"] = applies
    state = str(entry.get("lifecycle") or "stable")
    lifecycle: dict[str, object] = {"state": _LIFECYCLE.get(state, "experimental")}
    if state not in _LIFECYCLE:
        lost.append(f"lifecycle {state!r} has no equal: experimental")
    elif _LIFECYCLE[state] != state:
        x["genesis_lifecycle"] = state
    superseded = entry.get("superseded_by")
    if isinstance(superseded, str):
        if superseded in ids:
            lifecycle["superseded_by"] = ids[superseded]
        else:
            x["superseded_by"] = superseded
    meta["lifecycle"] = lifecycle
    meta["upstream"] = _upstream(entry, x)
    for key, ours in (("requires_patches", "requires"), ("conflicts_with", "conflicts")):
        named = entry.get(key) or []
        if isinstance(named, list):
            mapped = [ids[str(n)] for n in named if str(n) in ids and str(n) != gid]
            gone = [str(n) for n in named if str(n) not in ids]
            if gone:
                lost.append(f"{key} names {', '.join(gone)}, not in the registry")
            if mapped:
                meta[ours] = mapped
    composes = entry.get("composes_with")
    if isinstance(composes, list) and composes:
        x["composes_with"] = [ids.get(str(c), str(c)) for c in composes]
    for key in ("family", "category", "implementation_status", "source", "retired_reason"):
        if entry.get(key) is not None:
            x[key] = str(entry[key])
    meta["x"] = x
    return meta


def _upstream(entry: dict[str, object], x: dict[str, object]) -> dict[str, object]:
    pr = entry.get("upstream_pr")
    relationship = entry.get("upstream_pr_relationship")
    issue = entry.get("upstream_issue")
    notes = []
    if relationship:
        notes.append(f"Genesis: {relationship}")
    if issue:
        notes.append(f"upstream issue {issue}")
    if isinstance(pr, int) and not isinstance(pr, bool):
        up: dict[str, object] = {"pr": f"vllm-project/vllm#{pr}", "state": "open"}
        notes.append("state as the collection gives it: unknown (open assumed)")
    else:
        up = {"state": "unsubmitted"}
        if pr:
            x["upstream_pr"] = str(pr)
    if relationship:
        x["upstream_pr_relationship"] = str(relationship)
    if notes:
        up["note"] = "; ".join(notes)
    return up


def _range(value: object) -> str | None:
    """A range as a PEP 440 specifier (a local version `+g<sha>` dropped: `<` refuses it)."""
    if isinstance(value, str):
        parts = [value]
    elif isinstance(value, list | tuple) and all(isinstance(v, str) for v in value):
        parts = [str(v) for v in value if v]
    else:
        return None
    return ",".join(re.sub(r"\+[\w.]+$", "", p.replace(" ", "")) for p in parts)


def _globs(value: object) -> list[str]:
    items = value if isinstance(value, list | tuple | set) else [value]
    return [str(v) for v in items]


def _gates(applies_to: object, lost: list[str]) -> tuple[str, dict[str, object] | None]:
    """The range and the `[applies]` predicate of an `applies_to` (flat keys, all of them)."""
    vllm = ""
    leaves: list[dict[str, object]] = []
    if not isinstance(applies_to, dict):
        return vllm, None
    for key, value in applies_to.items():
        if key == "vllm_version_range":
            vllm = _range(value) or vllm
        elif key in ("model_arch", "architectures"):
            archs = _globs(value)
            if "*" not in archs:
                leaves.append({"architecture": archs})
        elif key == "model_class":
            globs: list[str] = []
            for cls in _globs(value):
                globs += [f"{cls}*", f"{cls.replace('_', '')}*"]
            leaves.append({"architecture": list(dict.fromkeys(globs))})
            lost.append("model_class gate read as architecture name patterns")
        elif key == "is_turboquant":
            wanted = True in _globs_bool(value)
            leaf: dict[str, object] = {"kv_cache_family": "turboquant"}
            leaves.append(leaf if wanted else {"not": leaf})
        elif key == "kv_cache_dtype":
            leaves.append({"kv_cache_dtype": _globs(value)})
        elif key == "tool_call_parser":
            leaves.append({"tool_call_parser": _globs(value)})
        elif key in _SPEC_KEYS:
            leaves.append({"speculative": _globs(value)})
        elif key == "quant_format":
            leaves.append({"quantization": [_quant(q) for q in _globs(value)]})
            lost.append("quant_format gate read as --quantization name patterns")
        elif key == "device_capability":
            leaves.append({"compute_capability": f"=={value}"})
        elif key == "sm_min" and isinstance(value, list | tuple):
            leaves.append({"compute_capability": f">={value[0]}.{value[1]}"})
        elif key == "sm_max" and isinstance(value, list | tuple):
            leaves.append({"compute_capability": f"<{value[0]}.{value[1]}"})
        elif key == "platform" and value == "cuda":
            continue  # patchset patches a CUDA vLLM
        else:
            lost.append(f"applies_to.{key} = {value!r} has no predicate leaf")
    if not leaves:
        return vllm, None
    if len(leaves) == 1:
        return vllm, leaves[0]
    return vllm, {"all": leaves}


def _globs_bool(value: object) -> list[object]:
    return list(value) if isinstance(value, list | tuple) else [value]


def _quant(name: str) -> str:
    """Genesis's quant_format names as patterns over vLLM's --quantization."""
    base = name.split("_int", maxsplit=1)[0].split("_w", maxsplit=1)[0]
    return {"autoround": "auto*round*", "compressed_tensors": "compressed*tensors"}.get(
        base, f"{base}*"
    )


# -- text patches ------------------------------------------------------------------------


def _call_name(node: ast.Call) -> str:
    func = node.func
    if isinstance(func, ast.Name):
        return func.id
    if isinstance(func, ast.Attribute):
        return func.attr
    return ""


def _arg(node: ast.Call, index: int, name: str) -> ast.expr | None:
    for keyword in node.keywords:
        if keyword.arg == name:
            return keyword.value
    return node.args[index] if len(node.args) > index else None


def _patchers(scope: Scope) -> tuple[list[Patcher], list[str]]:
    """Every TextPatcher the module builds, in source order, and why others are unreadable."""
    found: list[Patcher] = []
    unresolved: list[str] = []
    owner = _enclosing(scope.tree)
    calls = [
        n
        for n in ast.walk(scope.tree)
        if isinstance(n, ast.Call) and _call_name(n) == "TextPatcher"
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
        for local in contexts:
            try:
                made = _patcher(scope, call, func, local)
                if not _covered(made, found):  # one factory, two callers; an alias of a bundle
                    found.append(made)
            except Unresolved as exc:
                text = str(exc)
                if "fixture" in text or "pristine" in text:
                    continue  # a test or manifest fixture path, not the patch
                unresolved.append(f"{scope.path.name}:{call.lineno}: {exc}")
    return found, unresolved


def _contexts(scope: Scope, func: ast.AST, owner: dict[int, ast.AST]) -> list[dict[str, ast.expr]]:
    """The local names of `func` for each way it is called: its own assignments, and its
    parameters bound from each call in the module (a `for` over a constant list expanded)."""
    base = local_assignments(func) if func is not scope.tree else {}
    if not isinstance(func, ast.FunctionDef):
        return [base]
    params = [a.arg for a in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]]
    if not params:
        return [base]
    calls = [
        c
        for c in ast.walk(scope.tree)
        if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and c.func.id == func.name
    ]
    defaults = bind_params(func, ast.Call(func=ast.Name(func.name), args=[], keywords=[]))
    contexts: list[dict[str, ast.expr]] = []
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
                contexts.append(context)
    if not contexts:
        return [{**defaults, **base}]
    return contexts


def _rebind(expr: ast.expr, local: dict[str, ast.expr]) -> ast.expr:
    """An argument as the callee sees it: `str(x)` unwrapped, a caller's local name replaced
    by what it was set to."""
    for _ in range(3):
        if isinstance(expr, ast.Call) and _call_name(expr) == "str" and len(expr.args) == 1:
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
    if isinstance(node, ast.Call) and _call_name(node) == "str" and len(node.args) == 1:
        return _target(scope, node.args[0], func, local)
    if isinstance(node, ast.Name):
        if node.id in local:
            return _target(
                scope, local[node.id], func, {k: v for k, v in local.items() if k != node.id}
            )
        calls = [
            c.args[0]
            for c in ast.walk(func)
            if isinstance(c, ast.Call) and _call_name(c) == "resolve_vllm_file" and c.args
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
    if isinstance(node, ast.Call) and _call_name(node) == "resolve_vllm_file" and node.args:
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


def _subs(scope: Scope, node: ast.expr, func: ast.AST, local: dict[str, ast.expr]) -> list[Sub]:
    items: list[ast.expr]
    if isinstance(node, ast.List | ast.Tuple):
        items = list(node.elts)
    elif isinstance(node, ast.Name) and (node.id in local or node.id in scope.assigned):
        value = local.get(node.id) or scope.assigned[node.id]
        if not isinstance(value, ast.List | ast.Tuple):
            raise Unresolved(f"line {node.lineno}: sub_patches {node.id} is built at run time")
        items = list(value.elts)
        holder = func if node.id in local else scope.tree
        for call in ast.walk(holder):
            if (
                isinstance(call, ast.Call)
                and isinstance(call.func, ast.Attribute)
                and call.func.attr == "append"
                and isinstance(call.func.value, ast.Name)
                and call.func.value.id == node.id
                and call.args
            ):
                items.append(call.args[0])
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in scope.functions
        and (built := _built_list(scope.functions[node.func.id])) is not None
    ):
        items, local = built[0], {**local, **built[1]}
    else:
        raise Unresolved(f"line {node.lineno}: sub_patches is built at run time")
    subs = []
    for item in items:
        call = item
        if isinstance(item, ast.Name):
            call = local.get(item.id) or scope.assigned.get(item.id) or item
        if not (isinstance(call, ast.Call) and _call_name(call) == "TextPatch"):
            raise Unresolved(f"line {item.lineno}: a sub-patch built at run time")
        subs.append(_sub(scope, call, local))
    if not subs:
        raise Unresolved(f"line {node.lineno}: no sub-patch")
    return subs


def _built_list(
    func: ast.FunctionDef | ast.AsyncFunctionDef,
) -> tuple[list[ast.expr], dict[str, ast.expr]] | None:
    """The items a helper returns as a list: `return [...]`, or a local list it appends to
    and returns."""
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
            items = list(value.elts)
            for call in ast.walk(func):
                if (
                    isinstance(call, ast.Call)
                    and isinstance(call.func, ast.Attribute)
                    and call.func.attr == "append"
                    and isinstance(call.func.value, ast.Name)
                    and call.func.value.id == name
                    and call.args
                ):
                    items.append(call.args[0])  # noqa: PERF401 - one walk, in source order
            return items, local
    if isinstance(value, ast.List | ast.Tuple):
        return list(value.elts), local
    return None


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


def _runtime(
    pid: str, gid: str, patchers: list[Patcher], meta: dict[str, object], lost: list[str]
) -> tuple[dict[str, str], list[str]]:
    sites: list[dict[str, object]] = []
    names: set[str] = set()
    markers: set[str] = set()
    modules: list[str] = []
    texts = [sub.replacement for p in patchers for sub in p.subs]
    for patcher in patchers:
        if patcher.other_files:
            lost.append(
                f"{patcher.file}: the collection falls back to {', '.join(patcher.other_files)}"
                " where it is missing; only the first is a target"
            )
        # A drift marker makes that file's patcher obsolete (read before any of its edits),
        # the others going on. One that its own inserted text holds (Genesis's banner as
        # "residue" detection) would fire on patchset's own edit: left out. With one patcher
        # they are the patch's probe; with several, each patcher's sites carry its own.
        drift = [m for m in patcher.drift if not any(m in t for t in texts)]
        file_probe: list[str] = []
        if drift and len(patchers) == 1:
            up = meta["upstream"]
            assert isinstance(up, dict)
            up["probe"] = {"file": patcher.file, "any": list(dict.fromkeys(drift))}
        elif drift:
            file_probe = drift
        for sub in patcher.subs:
            if not sub.anchor.strip():
                raise _Skip(f"sub-patch {sub.name!r} has an empty anchor")
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
                "optional": not sub.required,
            }
            probe = [m for m in [*sub.markers, *file_probe] if m]
            if probe:
                site["probe"] = {"any": list(dict.fromkeys(probe))}
            sites.append(site)
            modules += imported_modules(sub.replacement, PACKAGE)
    targets = list(dict.fromkeys(p.file for p in patchers))
    meta["kind"] = "runtime"
    meta["targets"] = targets
    header = f"Imported from Genesis {gid} by patchset import genesis; one site per TextPatch."
    return {"sites.toml": dumps({"site": sites}, header=header)}, list(dict.fromkeys(modules))


# -- import-time wiring ------------------------------------------------------------------


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


def _drop_dangling(drafts: list[Draft]) -> None:
    """`requires`/`conflicts` naming a patch that is not imported are left out (and said)."""
    have = {d.id for d in drafts}
    for draft in drafts:
        for key in ("requires", "conflicts"):
            named = draft.meta.get(key)
            if not isinstance(named, list):
                continue
            kept = [n for n in named if n in have]
            gone = [n for n in named if n not in have]
            if gone:
                draft.lost.append(f"{key} {', '.join(gone)}: not imported")
            if kept:
                draft.meta[key] = kept
            else:
                del draft.meta[key]
        lifecycle = draft.meta.get("lifecycle")
        if isinstance(lifecycle, dict) and lifecycle.get("superseded_by") not in (None, *have):
            draft.lost.append(f"superseded_by {lifecycle['superseded_by']}: not imported")
            del lifecycle["superseded_by"]
