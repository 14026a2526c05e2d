"""Pairs of selected patches that cannot go in together: declared in `conflicts`, or changing
the same lines of a file while neither requires the other."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from patchset.engine import order, transaction
from patchset.engine.evaluate import evaluate
from patchset.engine.results import PatchResult
from patchset.registry import Patch, Registry


def refuse_pairs(
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
    files: dict[str, set[str]] = {}
    for patch in selected:
        variant = patch.variant_for(release) or patch.variants[0]
        files[patch.id] = set(variant.files)
    shared = {
        f for a in selected for b in selected if a.id < b.id for f in files[a.id] & files[b.id]
    }
    spans: dict[str, dict[str, Sequence[order.Span]]] = {}
    if shared:
        # Each alone, first without the compile check (the costly part, and it only takes a
        # patch out): a patch found in a pair is then evaluated in full, as it always was.
        for patch in selected:
            if files[patch.id] & shared:
                found = _spans(patch, read, shared, release=release, max_fuzz=max_fuzz)
                if found is not None:
                    spans[patch.id] = found
        paired = {p for pair in _meeting(selected, spans, by_id) for p in (pair[0].id, pair[1].id)}
        for patch in selected:
            if (
                patch.id in paired
                and _spans(
                    patch, read, shared, release=release, max_fuzz=max_fuzz, compile_check=True
                )
                is None
            ):
                del spans[patch.id]
    for a, b, file, where in _meeting(selected, spans, by_id):
        line = f"{file} line {where[0] + 1}"
        hint = "apply one of them, or say `requires` in the one that goes on top"
        why.setdefault(a.id, []).append(f"changes the same lines as {b.id} ({line}): {hint}")
        why.setdefault(b.id, []).append(f"changes the same lines as {a.id} ({line}): {hint}")
    return _conflicted(results, why)


def _spans(
    patch: Patch,
    read: transaction.Reader,
    shared: set[str],
    *,
    release: str | None,
    max_fuzz: int,
    compile_check: bool = False,
) -> dict[str, Sequence[order.Span]] | None:
    """The spans of each shared file's own lines the patch changes, evaluated alone on the
    tree as it is (None: it does not apply there). A runtime patch's come from where its
    sites edit; a diff's from a line diff of the file before and after."""
    variant = patch.variant_for(release) or patch.variants[0]
    ev = evaluate(
        patch, variant, read, max_fuzz=max_fuzz, compile_check=compile_check, nearest=False
    )
    if ev.state != "applies":
        return None
    return {
        f: ev.spans[f] if f in ev.spans else order.changed_spans(read(f), new)
        for f, new in ev.changes.items()
        if f in shared
    }


def _meeting(
    selected: Sequence[Patch],
    spans: Mapping[str, Mapping[str, Sequence[order.Span]]],
    by_id: dict[str, Patch],
) -> list[tuple[Patch, Patch, str, order.Span]]:
    """Each pair of patches (neither requiring the other) changing the same lines: the first
    file in order where they meet, and where."""
    out: list[tuple[Patch, Patch, str, order.Span]] = []
    on_file: dict[str, list[int]] = {}  # file: the places of the patches changing it
    for i, patch in enumerate(selected):
        for file in spans.get(patch.id, ()):
            on_file.setdefault(file, []).append(i)
    for i, a in enumerate(selected):
        if a.id not in spans:
            continue
        later = sorted({j for file in spans[a.id] for j in on_file[file] if j > i})
        for b in (selected[j] for j in later):  # those sharing a file with `a`, in order
            if order.related(a, b, by_id):
                continue
            for file in sorted(spans[a.id].keys() & spans[b.id].keys()):
                where = order.spans_meet(spans[a.id][file], spans[b.id][file])
                if where is not None:
                    out.append((a, b, file, where))
                    break
    return out


def refuse_held(
    selected: Sequence[Patch],
    results: list[PatchResult],
    read: transaction.Reader,
    *,
    registry: Registry,
    release: str | None,
) -> list[PatchResult]:
    """`results` with each patch to be written that conflicts (either side's `conflicts`) with
    a patch of the registry the tree already holds, and that this run does not select, turned
    into a conflict: `conflicts` holds across runs, not only within one. What the tree holds
    is read from it (a diff's reverse applies, a runtime patch's markers and edits stand)."""
    chosen = {p.id for p in selected}
    why: dict[str, list[str]] = {}
    held: dict[str, bool] = {}
    for result in results:
        if result.outcome != "applied":
            continue
        patch = registry.get(result.patch)
        for other in registry.patches:
            if other.id in chosen or not (
                other.id in patch.conflicts or patch.id in other.conflicts
            ):
                continue
            if other.id not in held:
                variant = other.variant_for(release) or other.variants[0]
                state = "" if other.kind == "python" else evaluate(other, variant, read).state
                held[other.id] = state == "already-applied"
            if held[other.id]:
                why.setdefault(patch.id, []).append(
                    f"conflicts with {other.id}, which the tree holds (declared in patch.toml):"
                    f" revert {other.id} first"
                )
    return _conflicted(results, why)


def _conflicted(results: list[PatchResult], why: dict[str, list[str]]) -> list[PatchResult]:
    """`results` with each patch `why` names turned into a conflict, its reasons first."""
    if not why:
        return results
    return [
        PatchResult(r.patch, r.revision, r.variant, "conflict", (*why[r.patch], *r.details))
        if r.patch in why
        else r
        for r in results
    ]
