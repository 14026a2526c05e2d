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

import contextlib
import re
from collections.abc import Mapping, Sequence
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset.importers.common import Releases, origin_of, refuse_escapes
from patchset.importers.genesis import pins as genesis_pins
from patchset.importers.genesis.files import by_release, picks_files
from patchset.importers.genesis.registry import (
    GENESIS,
    PACKAGE,
    PATCHES_DIR,
    PINS_MODULE,
    REGISTRY_FILE,
    metadata,
    read_registry,
)
from patchset.importers.genesis.text import read_patchers, runtime_patch, stacked_anchors
from patchset.importers.genesis.wiring import python_patch
from patchset.importers.model import (
    Collected,
    CollectionError,
    Draft,
    Entry,
    Skipped,
    Support,
)
from patchset.importers.probes import drop_unfixed_probes
from patchset.importers.pystatic import (
    Package,
    Unresolved,
)
from patchset.registry.write import TomlData
from patchset.sources.base import ReleaseSource


def detect(folder: Path) -> Path:
    return GENESIS.checkout_file(folder, REGISTRY_FILE, PATCHES_DIR, holding="PATCH_REGISTRY")


def collect(
    folder: Path, *, only: set[str] | None = None, sources: Sequence[ReleaseSource] = ()
) -> Collected:
    """The checkout's entries as drafts. With `sources`, a patcher that picks its file at
    run time gets a variant per run of releases that pick the same files (`files.py`)."""
    releases = Releases(sources) if sources else None
    try:
        return _collect(folder, only, releases)
    finally:
        if releases is not None:
            releases.close()


def _collect(folder: Path, only: set[str] | None, releases: Releases | None) -> Collected:
    registry_file = detect(folder)
    refuse_escapes(folder, [PACKAGE])  # read, and carried whole as the support package
    entries, lines, problem = read_registry(registry_file)
    if problem is not None:
        if "unknown layout" in problem:
            raise CollectionError(f"{registry_file}: {problem}")
        return Collected(
            GENESIS.name, GENESIS.repository, None, [], [], broken={REGISTRY_FILE: problem}
        )
    repository, commit = origin_of(folder, GENESIS.repository)
    package = Package(folder)
    ids = {gid: GENESIS.id_of(gid) for gid in entries}
    drafts: list[Draft] = []
    skipped: list[Entry] = []
    done_modules: dict[str, str] = {}
    switches: dict[str, str] = {}  # variable -> the patch it switches
    for gid, entry in entries.items():
        if only and gid not in only and ids[gid] not in only:
            continue
        where = {"repository": repository, "commit": commit, "line": lines[gid]}
        try:
            draft = _draft(gid, entry, ids, package, where, done_modules, releases)
        except Skipped as why:
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
    stacked_anchors(drafts)
    plans, notes = genesis_pins.plans(folder, package, drafts)
    if releases is not None:
        notes = [*drop_unfixed_probes(drafts, releases), *notes]
    return Collected(
        GENESIS.name,
        repository,
        commit,
        drafts,
        skipped,
        supports,
        dict(package.broken),
        notes=notes,
        plans=plans,
    )


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


def _draft(  # noqa: PLR0917 - one entry and what it is read against
    gid: str,
    entry: dict[str, object],
    ids: dict[str, str],
    package: Package,
    where: Mapping[str, object],
    done_modules: dict[str, str],
    releases: Releases | None = None,
) -> Draft:
    if entry.get("__unreadable__"):
        raise Skipped("its PATCH_REGISTRY entry is not a literal")
    module = entry.get("apply_module")
    if not isinstance(module, str) or not module:
        raise Skipped("no apply_module: nothing to apply")
    if module in done_modules:
        raise Skipped(f"its apply_module is imported as {done_modules[module]} already")
    path = package.file_of(module)
    if path is None:
        raise Skipped(f"apply_module {module} has no file in the checkout")
    scope = package.scope(module)
    rel = str(path.relative_to(package.root))
    if scope is None:
        raise Skipped(f"{rel} does not parse (skipped)")
    pid = ids[gid]
    lost: list[str] = []
    meta = metadata(gid, entry, ids, lost, _floor(package))
    meta["provenance"] = {
        "collection": GENESIS.name,
        "repository": where["repository"],
        **({"commit": where["commit"]} if where["commit"] else {}),
        "file": REGISTRY_FILE,
        "line": where["line"],
    }
    patchers, unresolved = read_patchers(scope)
    support: tuple[str, ...] = ()
    if patchers or unresolved:
        if unresolved and not patchers:
            raise Skipped(f"{rel}: text built at run time: {unresolved[0]}")
        if unresolved:
            raise Skipped(
                f"{rel}: {len(unresolved)} of {len(patchers) + len(unresolved)} text patchers"
                f" built at run time: {unresolved[0]}"
            )
        picked = None
        if releases is not None and picks_files(patchers):
            picked = by_release((pid, gid), patchers, meta, releases)
        payloads, modules = picked or runtime_patch(pid, gid, patchers, meta, lost)
        if modules:
            meta["requires_modules"] = modules
            support = (PACKAGE,)
        first = min(p.line for p in patchers)
        meta["provenance"] = {**meta["provenance"], "file": rel, "line": first}
    else:
        payloads = python_patch(gid, module, scope, meta, lost)
        meta["requires_modules"] = [module]
        support = (PACKAGE,)
        meta["provenance"] = {**meta["provenance"], "file": rel, "line": 1}
    meta["x"] = {**meta.get("x", {}), "genesis_registry_line": where["line"]}
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
    "variants",
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


def _ordered(meta: TomlData) -> TomlData:
    return {k: meta[k] for k in _ORDER if k in meta} | {
        k: v for k, v in meta.items() if k not in _ORDER
    }


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
