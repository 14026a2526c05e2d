"""`apply` and `revert`: every selected patch checked first, then one all-or-nothing write."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from patchset.engine import gates, order, pairs, reverting, transaction
from patchset.engine.evaluate import Evaluation, evaluate, evaluate_revert
from patchset.engine.gates import DETECT
from patchset.engine.results import SCHEMA, STOPPERS, ApplyReport, Outcome, PatchResult
from patchset.errors import TargetError, UsageError
from patchset.kernel import vllm
from patchset.kernel.predicates import Facts
from patchset.kernel.switchnames import Names, check_start, prefixes
from patchset.registry import Patch, Registry


def _details(ev: Evaluation) -> tuple[str, ...]:
    if ev.state == "already-applied" and ev.reverse:
        return tuple(
            f"{f}: hunk #{h.index} already present"
            + (f" at line {h.line}" if h.line is not None else f" ({h.detail})")
            for f, h in ev.reverse
        )
    lines = [f"{f}: {h.describe()}" for f, h in ev.hunks]
    lines += [s.describe() for s in ev.sites]
    lines += [f"{m}: file not found" for m in ev.missing]
    lines += [ev.broken] if ev.broken else []
    if ev.skipped_optional:
        lines.append(f"{ev.skipped_optional} optional site(s) skipped: no anchor of theirs matches")
    for f, h in ev.hunks:
        if h.status == "failed" and h.nearest:
            lines.append(f"{f}: nearest lines to hunk #{h.index} from line {h.nearest_line}:")
            lines += [f"    {text}" for text in h.nearest[:6]]
    return tuple(lines)


Capability = tuple[int, int] | Literal["detect"] | None


def apply(
    registry: Registry,
    target: Path | str | None,
    *,
    patches: list[str] | tuple[str, ...] | None = None,
    dry_run: bool = False,
    version: str | None = None,
    ignore_range: bool = False,
    max_fuzz: int = 0,
    compute_capability: Capability = DETECT,
    strict: bool = False,
    served: Mapping[str, str] | None = None,
    force: bool = False,
    environ: Mapping[str, str] | None = None,
) -> ApplyReport:
    """Apply the selected patches to the tree at `target`.

    With no `patches`, the selection is every patch that fits: its range holds the tree's
    release and its hardware scope holds `compute_capability` (this machine's GPU, found with
    nvidia-smi, by default); the others are reported `skipped`. `patches` means exactly those.
    Nothing is written unless every selected patch is applicable or already applied.
    `target=None` patches the vLLM this interpreter would import. A patch whose upstream
    probe matches the tree is `upstream` and blocks the write, unless `force` (then it is
    applied with a warning). `served` is the served configuration sites' `when` reads (an
    empty mapping: nothing is known, so every site with `when` is skipped).

    Without `patches`, a patch is also left out (`skipped`, saying why) when it is retired,
    its `[switch]` is off in `environ` (default: this process's environment; an alias its
    `[switch] aliases` name switches it as at container start: `switch_environ`), or its
    `[applies]` predicate is false or cannot be known here (the unknown leaves are named);
    a patch asked for by id runs anyway, with a note (a retired one never runs).
    """
    return _run(
        "apply",
        registry=registry,
        target=target,
        ids=patches,
        dry_run=dry_run,
        version=version,
        ignore_range=ignore_range,
        max_fuzz=max_fuzz,
        gpu=gates.hardware(compute_capability),
        strict=strict,
        served={} if served is None else served,
        force=force,
        environ=switch_environ(registry, environ),
    )


def revert(
    registry: Registry,
    target: Path | str | None,
    *,
    patches: list[str] | tuple[str, ...] | None = None,
    version: str | None = None,
    dry_run: bool = False,
    strict: bool = False,
) -> ApplyReport:
    """Take the selected patches out again; the same all-or-nothing rules as `apply`. With no
    `patches`, those whose range holds the tree's release (the others are `skipped`)."""
    return _run(
        "revert",
        registry=registry,
        target=target,
        ids=patches,
        dry_run=dry_run,
        version=version,
        ignore_range=True,
        max_fuzz=0,
        gpu=gates.Hardware(None, None, None),
        strict=strict,
    )


def _select(
    operation: Literal["apply", "revert"],
    registry: Registry,
    ids: list[str] | tuple[str, ...] | None,
    *,
    release: str | None,
    capability: tuple[int, int] | None,
    known: Facts,
    environ: Mapping[str, str] | None,
    ignore_range: bool,
) -> tuple[tuple[Patch, ...], list[PatchResult]]:
    """The patches to run and the `skipped` results of those that do not fit this tree
    (a revert looks at ranges only: taking out what is there is safe on any GPU)."""
    by_id = {p.id: p for p in registry.patches}
    skipped: list[PatchResult] = []
    if ids:
        # Apply: those and the patches they require; revert: those and the patches stacked on
        # them (taken out first, so each one's context is there when it goes).
        wanted = order.closure(ids, by_id) if operation == "apply" else order.dependents(ids, by_id)
        chosen = list(registry.select(wanted))
        if operation == "apply":  # a retired patch never goes in, even asked for by id
            for patch in [p for p in chosen if p.lifecycle.retired(release)]:
                why = f"retired ({patch.lifecycle.describe(release)}): never applied"
                skipped.append(PatchResult(patch.id, patch.revision, None, "skipped", (why,)))
                chosen.remove(patch)
        return _ordered(operation, chosen), skipped
    scoped = operation == "apply" and not ignore_range
    chosen = []
    for patch in registry.patches:
        reason: str | None = None
        if operation == "revert":
            if release and not patch.in_range(release):
                reason = f"vLLM {release} is outside this patch's range {patch.vllm}"
        else:
            reason = gates.skip_reason(
                patch,
                release=release if scoped else None,
                scoped=scoped,
                capability=capability,
                known=known,
                environ=environ,
            )
        if reason is None:
            chosen.append(patch)
        else:
            skipped.append(PatchResult(patch.id, patch.revision, None, "skipped", (reason,)))
    while True:  # a patch requiring a skipped one cannot go in either
        out = {r.patch for r in skipped}
        held = [p for p in chosen if out.intersection(order.closure([p.id], by_id)[1:])]
        if not held:
            break
        for patch in held:
            missing = sorted(out.intersection(order.closure([patch.id], by_id)))
            reason = f"requires {', '.join(missing)}, skipped here"
            skipped.append(PatchResult(patch.id, patch.revision, None, "skipped", (reason,)))
            chosen.remove(patch)
    return _ordered(operation, chosen), skipped


def _ordered(operation: Literal["apply", "revert"], patches: Sequence[Patch]) -> tuple[Patch, ...]:
    """Apply: required patches first; revert: the other way round."""
    ordered = order.in_order(patches)
    return ordered if operation == "apply" else ordered[::-1]


def _target_root(target: Path | str | None) -> Path:
    try:
        return vllm.target_root(target)
    except vllm.NotATargetError as exc:
        hint = "" if exc.path is not None else "; pass --target DIR"
        raise TargetError(exc.message + hint, path=exc.path) from None


def _run(
    operation: Literal["apply", "revert"],
    *,
    registry: Registry,
    target: Path | str | None,
    ids: list[str] | tuple[str, ...] | None,
    dry_run: bool,
    version: str | None,
    ignore_range: bool,
    max_fuzz: int,
    gpu: gates.Hardware,
    strict: bool,
    served: Mapping[str, str] | None = None,
    force: bool = False,
    environ: Mapping[str, str] | None = None,
) -> ApplyReport:
    if max_fuzz < 0:
        raise UsageError(f"--fuzz {max_fuzz}: give 0 or more context lines to drop")
    root = _target_root(target)
    recovered, pending = _recover(root, dry_run=dry_run)
    found = vllm.read_version(root)
    release = version or (found[0] if found else None)
    if release is not None:
        _check_version(release, given=version is not None, root=root)
    capability = gpu.capability
    known = gates.facts(root, served, gpu, this_python=target is None)
    selected, skipped = _select(
        operation,
        registry,
        ids,
        release=release,
        capability=capability,
        known=known,
        environ=environ,
        ignore_range=ignore_range,
    )
    asked = operation == "apply" and bool(ids)
    by_id = {p.id: p for p in registry.patches}

    seen: dict[str, bytes | None] = {}  # what the last plan read of the tree, by path

    def read_tree(rel: str) -> bytes | None:  # as the tree is, before this run's edits
        if rel in pending:
            return pending[rel]
        if rel not in seen:
            seen[rel] = _read_file(root, rel)
        return seen[rel]

    def plan() -> tuple[list[PatchResult], dict[str, bytes | None], set[str]]:
        seen.clear()
        overlay: dict[str, bytes | None] = {}  # relpath: new bytes, or None to delete
        executable: set[str] = set()  # new files to create executable (git mode 755)

        def read(rel: str) -> bytes | None:
            if rel in overlay:
                return overlay[rel]
            return read_tree(rel)

        results = [
            _one(
                operation,
                patch,
                release=release,
                read=read,
                read_tree=read_tree,
                overlay=overlay,
                executable=executable,
                ignore_range=ignore_range,
                max_fuzz=max_fuzz,
                notes=gates.asked_notes(patch, capability=capability, known=known, environ=environ)
                if asked
                else (),
                served=served,
                force=force,
            )
            for patch in selected
        ]
        if operation == "revert":  # what the tree holds decides (engine/reverting.py)
            results = reverting.settle(results, ids, by_id=by_id, read=read, release=release)
        if operation == "apply" and len(selected) > 1:
            results = pairs.refuse_pairs(
                selected, results, read_tree, release=release, max_fuzz=max_fuzz, by_id=by_id
            )
        if operation == "apply":  # `conflicts` with what the tree already holds
            results = pairs.refuse_held(
                selected, results, read_tree, registry=registry, release=release
            )
        return results, overlay, executable

    def replan() -> tuple[list[PatchResult], dict[str, bytes | None], set[str]]:
        """Under the lock: the plan made before it again, unless a file it read has changed
        meanwhile (another run wrote): a plan reads the tree only through `read_tree`."""
        if all(_read_file(root, rel) == data for rel, data in list(seen.items())):
            return results, overlay, executable
        return plan()

    blocked: set[str] = set(STOPPERS)
    results, overlay, executable = plan()
    if not dry_run and any(r.outcome in blocked for r in results) and _lock_used(root):
        # Another run may be writing just now, and a half-written tree reads as a conflict:
        # wait for it and look again before saying so.
        with transaction.locked(root):
            results, overlay, executable = replan()
    written = False
    if not dry_run and overlay and not any(r.outcome in blocked for r in results):
        transaction.check_writable(root, list(overlay))  # before the lock file appears
        with transaction.locked(root):
            # again under the lock: another run may have written
            results, overlay, executable = replan()
            if overlay and not any(r.outcome in blocked for r in results):
                transaction.check_writable(root, list(overlay))
                transaction.commit(root, overlay, executable=executable)
                written = True
    if not dry_run and not written:
        results = _not_written(results, blocked)
    return ApplyReport(
        operation=operation,
        target=root,
        vllm=release,
        registry=registry.digest,
        dry_run=dry_run,
        written=written,
        results=(*results, *skipped),
        recovered=tuple(recovered),
        strict=strict,
        compute_capability=None if capability is None else f"{capability[0]}.{capability[1]}",
    )


def switch_environ(
    registry: Registry, environ: Mapping[str, str] | None
) -> Mapping[str, str] | None:
    """`environ` (None: this process's) with each alias a switch of `registry` declares, when
    set, standing for its switch where the switch itself is not set: the start's mapping
    (`kernel.switchnames.check_start`). UsageError (one line) for an alias whose value is no
    switch word, or one set the other way than its switch."""
    switches = {p.switch.env: p.id for p in registry.patches if p.switch is not None}
    aliases = {
        alias: p.switch.env
        for p in registry.patches
        if p.switch is not None
        for alias in p.switch.aliases
    }
    source = os.environ if environ is None else environ
    if not any(alias in source for alias in aliases):
        return environ
    names = Names(tuple(prefixes([*switches, *aliases])), aliases)
    set_here = {k: v for k, v in source.items() if k in aliases or k in switches}
    try:
        _lines, mapped = check_start(names, switches, set_here)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    return {**source, **mapped}


def _recover(root: Path, *, dry_run: bool) -> tuple[list[str], dict[str, bytes | None]]:
    """Roll back what an interrupted earlier run left (a dry run: only read what it would
    put back, the tree's view until then)."""
    if dry_run:
        pending = transaction.pending_originals(root)
        return list(pending), pending
    recovered: list[str] = []
    if os.path.lexists(root / transaction.JOURNAL):
        if not _lock_used(root):  # no run can be writing: refuse a bad journal before locking
            transaction.check_journal(root)
        with transaction.locked(root):
            recovered = transaction.recover(root)
    return recovered, {}


def _not_written(results: list[PatchResult], blocked: set[str]) -> list[PatchResult]:
    """Rows that fit but were not written, because others stopped the run, say so."""
    stoppers = [r.patch for r in results if r.outcome in blocked]
    if not stoppers:
        return results
    note = f"fits, but nothing was written: {', '.join(stoppers)} stopped the run"
    return [
        replace(r, outcome="blocked", details=(note, *r.details))
        if r.outcome in ("applied", "reverted")
        else r
        for r in results
    ]


def _check_version(release: str, *, given: bool, root: Path) -> None:
    try:
        Version(release)
    except InvalidVersion:
        if given:
            raise UsageError(f"--vllm-version {release!r} is not a PEP 440 version") from None
        raise TargetError(
            f"the tree says it is vLLM {release!r}, which is not a PEP 440 version;"
            " pass --vllm-version",
            path=root,
        ) from None


def _read_file(root: Path, rel: str) -> bytes | None:
    path = transaction.resolve_inside(root, rel)
    return path.read_bytes() if path.is_file() else None


def _lock_used(root: Path) -> bool:
    """Whether some run has taken this tree's lock before (its file is left in place)."""
    return (root / transaction.LOCK).is_file() and os.access(root / transaction.LOCK, os.W_OK)


def _one(
    operation: Literal["apply", "revert"],
    patch: Patch,
    *,
    release: str | None,
    read: transaction.Reader,
    read_tree: transaction.Reader | None = None,
    overlay: dict[str, bytes | None],
    executable: set[str] | None = None,
    ignore_range: bool,
    max_fuzz: int,
    notes: tuple[str, ...] = (),
    served: Mapping[str, str] | None = None,
    force: bool = False,
) -> PatchResult:
    if release is not None and not ignore_range and not patch.in_range(release):
        return PatchResult(
            patch.id,
            patch.revision,
            None,
            "out-of-range",
            (f"vLLM {release} is outside this patch's range {patch.vllm}",),
        )
    variant = patch.variant_for(release) or patch.variants[0]
    if patch.kind == "python":  # nothing to write: vLLM's plugin hook runs it in its processes
        return PatchResult(
            patch.id,
            patch.revision,
            variant.name,
            "plugin",
            (
                "a python patch is not written into files: it reaches vLLM as a plugin"
                " (patchset build, patchset runtime export)",
            ),
        )
    forced: tuple[str, ...] = ()
    if operation == "apply":
        ev = evaluate(patch, variant, read, max_fuzz=max_fuzz, served=served)
        probe = patch.upstream.probe
        if (
            probe is not None
            and ev.state != "already-applied"
            # The tree as it is, as `check` sees a release: not another patch's edit of it.
            and probe.matches(_text((read_tree or read)(probe.file)))
        ):
            found = f"the upstream fix is in the tree: {probe.describe()}"
            if not force:
                return PatchResult(
                    patch.id, patch.revision, variant.name, "upstream", (found, *_details(ev))
                )
            forced = (f"--force: applied although {found}",)
        mapping: dict[str, Outcome] = {
            "applies": "applied",
            "already-applied": "already-applied",
            "partial": "partial",
            "missing-target": "missing-target",
        }
    else:
        ev = evaluate_revert(patch, variant, read)
        mapping = {
            "applies": "reverted",
            "already-applied": "not-applied",
            "partial": "partial",
            "missing-target": "missing-target",
        }
    outcome = mapping.get(ev.state, "conflict")
    if operation == "apply" and _left_out_by_when(ev):
        # Every site is for another served configuration: nothing to do here, not a failure.
        return PatchResult(
            patch.id,
            patch.revision,
            variant.name,
            "skipped",
            ("every site's `when` leaves it out of the served configuration", *_details(ev)),
        )
    overlay.update(ev.changes)
    overlay.update(dict.fromkeys(ev.removed))
    if executable is not None:
        executable.difference_update(ev.removed)
        executable.update(ev.executable)
    return PatchResult(
        patch.id,
        patch.revision,
        variant.name,
        outcome,
        (*_details(ev), *notes),
        (*forced, *ev.warnings) if outcome == "applied" else ev.warnings,
        (*ev.changes, *ev.removed),
    )


def _left_out_by_when(ev: Evaluation) -> bool:
    """Whether a runtime patch's every site was skipped for its `when` (none applies, none
    is only an optional site whose anchor is gone)."""
    return bool(ev.sites) and all(s.status == "skipped" and not s.optional for s in ev.sites)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


__all__ = ["DETECT", "SCHEMA", "ApplyReport", "Outcome", "PatchResult", "apply", "revert"]
