"""Genesis's registry: `PATCH_REGISTRY` read with `ast` only, and each entry's metadata
mapped to patch.toml's keys (switch, range, `[applies]` gates, lifecycle, upstream).

The facts of the collection this relies on are in `patchset.importers.genesis`.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

from patchset.importers.genesis.state import pr_state
from patchset.importers.model import Collection
from patchset.registry.write import TomlData

REGISTRY_FILE = "sndr/dispatcher/registry.py"
PATCHES_DIR = "sndr/engines/vllm/patches"
PACKAGE = "sndr"
PINS_MODULE = "sndr.engines.vllm.detection.guards"
GENESIS = Collection("genesis", "Genesis", "Sandermage/genesis-vllm-patches", "genesis")
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


def metadata(
    gid: str, entry: dict[str, object], ids: dict[str, str], lost: list[str], floor: str
) -> TomlData:
    title = str(entry.get("title") or gid)
    credit = entry.get("credit")
    meta: TomlData = {
        "id": ids[gid],
        "title": f"Genesis {gid}: {title}"[:200],
        "description": f"Imported from Genesis ({GENESIS.repository}) patch {gid}: {title}\n",
        "revision": 1,
        "apply": "startup",
        "origin": f"Genesis {gid} ({GENESIS.repository})",
        "credit": ["Sandermage (Genesis)", *([str(credit)] if credit else [])],
    }
    x: dict[str, object] = {"genesis_id": gid}
    switch = _switch(entry, x, lost)
    if switch is not None:
        meta["switch"] = switch
    vllm, applies = _gates(entry.get("applies_to"), lost)
    top_range = entry.get("vllm_version_range")
    if top_range:  # both bound the entry (PN110: applies_to >=0.20.0,<0.23.0 and top <0.23.0)
        clauses = [c for r in (vllm, _range(top_range) or "") for c in r.split(",") if c]
        vllm = ",".join(dict.fromkeys(clauses))
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
    meta["upstream"] = _upstream(entry, x, lost)
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


_NOT_THE_FIX = {"counter_regression": "counters", "intentional_inverse": "reverts"}


def _switch(
    entry: dict[str, object], x: dict[str, object], lost: list[str]
) -> dict[str, object] | None:
    """The entry's `[switch]`: its enable flag and default, and the other flags the collection
    accepts for it as aliases (the start maps them); what cannot be kept is a noted loss."""
    env = entry.get("env_flag")
    if not (isinstance(env, str) and _ENV.match(env)):
        lost.append(f"env_flag {env!r} is not a variable name: no switch")
        switch = None
    else:
        switch = {"env": env, "default": bool(entry.get("default_on", False))}
    aliases = entry.get("env_flag_aliases")
    named = [str(a) for a in aliases] if isinstance(aliases, list) else [str(aliases or "")]
    kept = [a for a in dict.fromkeys(named) if _ENV.match(a) and a != env]
    if kept and switch is not None:
        switch["aliases"] = kept
    if aliases and (switch is None or len(kept) < len(named)):
        lost.append(f"env_flag_aliases {aliases!r}: only variable names other than env kept")
        x["env_flag_aliases"] = named
    return switch


def _upstream(entry: dict[str, object], x: dict[str, object], lost: list[str]) -> dict[str, object]:
    pr = entry.get("upstream_pr")
    relationship = entry.get("upstream_pr_relationship")
    issue = entry.get("upstream_issue")
    notes = []
    if relationship:
        notes.append(f"Genesis: {relationship}")
    if issue:
        notes.append(f"upstream issue {issue}")
    if isinstance(pr, int) and not isinstance(pr, bool):
        read = pr_state(entry, pr)
        up: dict[str, object] = {"pr": f"vllm-project/vllm#{pr}", "state": read.state}
        if read.commit:
            up["commit"] = read.commit
        if read.superseded_by is not None:
            up["superseded_by"] = f"vllm-project/vllm#{read.superseded_by}"
        if read.problem:
            lost.append(read.problem)
            notes.append("state unclear in the collection's text (open assumed)")
        elif read.evidence:
            notes.append(f"state from the collection's text: {read.evidence[:120]!r}")
        else:
            notes.append("state as the collection gives it: unknown (open assumed)")
        if relationship in _NOT_THE_FIX:
            notes.append(
                f"the PR is the upstream change this patch {_NOT_THE_FIX[str(relationship)]},"
                " not its fix: its merge does not make the patch redundant"
            )
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
    elif isinstance(value, list | tuple) and all(isinstance(v, str | None) for v in value):
        parts = [str(v) for v in value if v]  # (">=0.20.0", None): an open upper end
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
