"""`apply` and `revert`: every selected patch checked first, then one all-or-nothing write."""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

from packaging.version import InvalidVersion, Version

from patchset.adapters import gpu
from patchset.engine import order, transaction
from patchset.engine.evaluate import Evaluation, evaluate, evaluate_revert
from patchset.errors import ExitCode, TargetError, UsageError
from patchset.kernel import vllm
from patchset.kernel.capability import in_scope
from patchset.registry import Patch, Registry

Outcome = Literal[
    "applied",
    "already-applied",
    "conflict",
    "partial",  # some hunks or sites fit and others do not: nothing was written
    "missing-target",
    "out-of-range",
    "reverted",
    "not-applied",  # revert: nothing of the patch is in the tree to take out
    "plugin",  # a python patch: written into no file, vLLM's plugin hook runs it
    "skipped",
    "upstream",
    "blocked",  # it fits, but another patch's outcome stopped the run: nothing was written
]

SCHEMA = "patchset.apply/1"  # the JSON of apply and revert: patchset/schemas/apply.json

# The exit code of a run is that of its most serious outcome, in this order. Without
# `strict`, a run whose every selected patch ends as asked (present after apply, absent after
# revert) exits 0 whatever it took: offsets and fuzz are shown as warnings, "already" is fine.
# `plugin`, `skipped` and `blocked` count for nothing (a blocked row's stopper counts).
_SEVERITY: tuple[tuple[Outcome, int], ...] = (
    ("conflict", ExitCode.ATTENTION),
    ("partial", ExitCode.ATTENTION),
    ("missing-target", ExitCode.MISSING_TARGET),
    ("out-of-range", ExitCode.OUT_OF_RANGE),
    ("upstream", ExitCode.UPSTREAM),
)
# With `strict`, after those: a written patch with warnings (7), then nothing to do (6).
_NOTHING_TO_DO: tuple[Outcome, ...] = ("already-applied", "not-applied")
# The outcomes that stop a run: nothing is written when one of them is among the results.
STOPPERS: frozenset[Outcome] = frozenset(
    ("conflict", "partial", "missing-target", "out-of-range", "upstream")
)
DETECT: Literal["detect"] = "detect"  # find this machine's GPU with nvidia-smi


@dataclass(frozen=True)
class PatchResult:
    patch: str
    revision: int
    variant: str | None
    outcome: Outcome
    details: tuple[str, ...] = ()  # per hunk or site, and failures with the nearest lines
    warnings: tuple[str, ...] = ()
    files: tuple[str, ...] = ()  # the files this patch changed (or would change)

    def to_dict(self) -> dict[str, object]:
        return {
            "patch": self.patch,
            "revision": self.revision,
            "variant": self.variant,
            "outcome": self.outcome,
            "details": list(self.details),
            "warnings": list(self.warnings),
            "files": list(self.files),
        }


@dataclass(frozen=True)
class ApplyReport:
    operation: Literal["apply", "revert"]
    target: Path
    vllm: str | None
    registry: str
    dry_run: bool
    written: bool
    results: tuple[PatchResult, ...]
    # Files rolled back from an interrupted earlier run (a dry run: to be rolled back, and
    # the report shows the tree as it will be then).
    recovered: tuple[str, ...] = ()
    strict: bool = False  # keep the distinct exit codes 6 (already) and 7 (warnings)
    compute_capability: str | None = None  # the GPU the hardware scopes were read against

    @property
    def exit_code(self) -> int:
        seen: set[str] = {r.outcome for r in self.results}
        for outcome, code in _SEVERITY:
            if outcome in seen:
                return code
        if not self.strict:
            return ExitCode.OK
        if any(r.warnings for r in self.results if r.outcome in ("applied", "reverted")):
            return ExitCode.APPLIED_WITH_WARNINGS
        if seen.intersection(_NOTHING_TO_DO):
            return ExitCode.ALREADY_APPLIED
        return ExitCode.OK

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "operation": self.operation,
            "target": str(self.target),
            "vllm": self.vllm,
            "registry": self.registry,
            "dry_run": self.dry_run,
            "written": self.written,
            "recovered": list(self.recovered),
            "strict": self.strict,
            "compute_capability": self.compute_capability,
            "exit_code": self.exit_code,
            "results": [r.to_dict() for r in self.results],
        }


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
        capability=_capability(compute_capability),
        strict=strict,
        served={} if served is None else served,
        force=force,
    )


def revert(
    registry: Registry,
    target: Path | str | None,
    *,
    patches: list[str] | tuple[str, ...] | None = None,
    dry_run: bool = False,
    version: str | None = None,
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
        capability=None,
        strict=strict,
    )


def _capability(given: Capability) -> tuple[int, int] | None:
    if given == DETECT:
        return gpu.compute_capability()
    assert not isinstance(given, str)
    return given


def _select(
    operation: Literal["apply", "revert"],
    registry: Registry,
    ids: list[str] | tuple[str, ...] | None,
    *,
    release: str | None,
    capability: tuple[int, int] | None,
    ignore_range: bool,
) -> tuple[tuple[Patch, ...], list[PatchResult]]:
    """The patches to run and the `skipped` results of those that do not fit this tree
    (a revert looks at ranges only: taking out what is there is safe on any GPU)."""
    by_id = {p.id: p for p in registry.patches}
    if ids:
        # Apply: those and the patches they require; revert: those and the patches stacked on
        # them (taken out first, so each one's context is there when it goes).
        wanted = order.closure(ids, by_id) if operation == "apply" else order.dependents(ids, by_id)
        return _ordered(operation, registry.select(wanted)), []
    scoped = operation == "apply" and not ignore_range
    chosen: list[Patch] = []
    skipped: list[PatchResult] = []
    for patch in registry.patches:
        reason = None
        if (scoped or operation == "revert") and release and not patch.in_range(release):
            reason = f"vLLM {release} is outside this patch's range {patch.vllm}"
        elif scoped and not _allows(patch, capability):
            reason = _scope_text(patch, capability)
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


def _refuse_pairs(
    selected: Sequence[Patch],
    results: list[PatchResult],
    read: transaction.Reader,
    *,
    release: str | None,
    max_fuzz: int,
    by_id: dict[str, Patch],
) -> list[PatchResult]:
    """`results` with both patches of a pair that cannot go together turned into conflicts:
    declared in `conflicts`, or changing the same lines of a file while neither requires the
    other (each evaluated alone on the tree as it is)."""
    why: dict[str, list[str]] = {}
    for a, b in order.declared_conflicts(selected):
        why.setdefault(a.id, []).append(f"conflicts with {b.id} (declared in patch.toml)")
        why.setdefault(b.id, []).append(f"conflicts with {a.id} (declared in patch.toml)")
    spans: dict[str, dict[str, list[order.Span]]] = {}
    files: dict[str, set[str]] = {}
    for patch in selected:
        variant = patch.variant_for(release) or patch.variants[0]
        files[patch.id] = set(variant.files)
    shared = {
        f for a in selected for b in selected if a.id < b.id for f in files[a.id] & files[b.id]
    }
    if shared:
        for patch in selected:
            if not files[patch.id] & shared:
                continue
            variant = patch.variant_for(release) or patch.variants[0]
            ev = evaluate(patch, variant, read, max_fuzz=max_fuzz)
            if ev.state != "applies":
                continue
            spans[patch.id] = {
                f: order.changed_spans(read(f), new) for f, new in ev.changes.items() if f in shared
            }
    for i, a in enumerate(selected):
        for b in selected[i + 1 :]:
            if a.id not in spans or b.id not in spans or order.related(a, b, by_id):
                continue
            for file in sorted(spans[a.id].keys() & spans[b.id].keys()):
                where = order.spans_meet(spans[a.id][file], spans[b.id][file])
                if where is None:
                    continue
                line = f"{file} line {where[0] + 1}"
                hint = "apply one of them, or say `requires` in the one that goes on top"
                why.setdefault(a.id, []).append(
                    f"changes the same lines as {b.id} ({line}): {hint}"
                )
                why.setdefault(b.id, []).append(
                    f"changes the same lines as {a.id} ({line}): {hint}"
                )
                break
    if not why:
        return results
    return [
        PatchResult(r.patch, r.revision, r.variant, "conflict", (*why[r.patch], *r.details))
        if r.patch in why
        else r
        for r in results
    ]


def _allows(patch: Patch, capability: tuple[int, int] | None) -> bool:
    """Whether the patch's `[hardware] compute_capability` holds this GPU (the one evaluator,
    shared with the image entrypoint)."""
    scope = patch.hardware.compute_capability
    return in_scope(str(scope) if scope is not None else None, capability)


def _scope_text(patch: Patch, capability: tuple[int, int] | None) -> str:
    scope = f"its hardware scope is compute_capability {patch.hardware.compute_capability}"
    if capability is None:
        return f"no GPU found (nvidia-smi) and {scope}; give --compute-capability X.Y"
    return f"compute capability {capability[0]}.{capability[1]} is outside it: {scope}"


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
    capability: tuple[int, int] | None,
    strict: bool,
    served: Mapping[str, str] | None = None,
    force: bool = False,
) -> ApplyReport:
    if max_fuzz < 0:
        raise UsageError(f"--fuzz {max_fuzz}: give 0 or more context lines to drop")
    root = _target_root(target)
    recovered: list[str] = []
    pending: dict[str, bytes | None] = {}  # a dry run's view of a roll-back still to come
    if dry_run:
        pending = transaction.pending_originals(root)
        recovered = list(pending)
    elif os.path.lexists(root / transaction.JOURNAL):
        if not _lock_used(root):  # no run can be writing: refuse a bad journal before locking
            transaction.check_journal(root)
        with transaction.locked(root):
            recovered = transaction.recover(root)
    found = vllm.read_version(root)
    release = version or (found[0] if found else None)
    if release is not None:
        _check_version(release, given=version is not None, root=root)
    selected, skipped = _select(
        operation, registry, ids, release=release, capability=capability, ignore_range=ignore_range
    )
    asked = operation == "apply" and bool(ids)
    by_id = {p.id: p for p in registry.patches}

    def plan() -> tuple[list[PatchResult], dict[str, bytes | None], set[str]]:
        overlay: dict[str, bytes | None] = {}  # relpath: new bytes, or None to delete
        executable: set[str] = set()  # new files to create executable (git mode 755)

        def read(rel: str) -> bytes | None:
            if rel in overlay:
                return overlay[rel]
            return read_tree(rel)

        def read_tree(rel: str) -> bytes | None:  # as the tree is, before this run's edits
            if rel in pending:
                return pending[rel]
            path = transaction.resolve_inside(root, rel)
            return path.read_bytes() if path.is_file() else None

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
                scope_note=_scope_note(patch, capability) if asked else None,
                served=served,
                force=force,
            )
            for patch in selected
        ]
        if operation == "apply" and len(selected) > 1:

            def base(rel: str) -> bytes | None:
                if rel in pending:
                    return pending[rel]
                path = transaction.resolve_inside(root, rel)
                return path.read_bytes() if path.is_file() else None

            results = _refuse_pairs(
                selected, results, base, release=release, max_fuzz=max_fuzz, by_id=by_id
            )
        return results, overlay, executable

    blocked: set[str] = set(STOPPERS)
    results, overlay, executable = plan()
    if not dry_run and any(r.outcome in blocked for r in results) and _lock_used(root):
        # Another run may be writing just now, and a half-written tree reads as a conflict:
        # wait for it and look again before saying so.
        with transaction.locked(root):
            results, overlay, executable = plan()
    written = False
    if not dry_run and overlay and not any(r.outcome in blocked for r in results):
        transaction.check_writable(root, list(overlay))  # before the lock file appears
        with transaction.locked(root):
            # again under the lock: another run may have written
            results, overlay, executable = plan()
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


def _scope_note(patch: Patch, capability: tuple[int, int] | None) -> str | None:
    """A patch asked for by id runs whatever the GPU; say so when its scope does not hold."""
    if _allows(patch, capability):
        return None
    return f"asked for by id: {_scope_text(patch, capability)}"


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
    scope_note: str | None,
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
        (*_details(ev), *([scope_note] if scope_note else ())),
        (*forced, *ev.warnings) if outcome == "applied" else ev.warnings,
        (*ev.changes, *ev.removed),
    )


def _left_out_by_when(ev: Evaluation) -> bool:
    """Whether a runtime patch's every site was skipped for its `when` (none applies, none
    is only an optional site whose anchor is gone)."""
    return bool(ev.sites) and all(s.status == "skipped" and not s.optional for s in ev.sites)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")
