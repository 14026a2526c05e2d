"""What a revert decides from the tree itself: which of the patches it takes out are there.

A patch is present when its reverse fits the tree (a diff's lines, a runtime patch's
markers). A patch stacked on one asked for (pulled in so that it goes first) that was never
applied here, or whose files the tree lacks, is not in the way: its row says so and the
revert goes on. A patch asked for whose required patches stay applied says which, and how to
take them out too. A patch that does not fit either way whose required patch is itself not in
the tree (its own row `not-applied`) was never applied either (what it is stacked on is not
there): not in the way of a whole-tree revert, or of one of another patch.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace

from patchset.engine import order
from patchset.engine.evaluate import evaluate_revert
from patchset.engine.results import PatchResult
from patchset.engine.transaction import Reader
from patchset.registry import Patch


def settle(
    results: list[PatchResult],
    asked: Sequence[str] | None,
    *,
    by_id: Mapping[str, Patch],
    read: Reader,
    release: str | None,
) -> list[PatchResult]:
    """The revert's rows with the patches that are not in the tree out of the way, and each
    patch asked for told which of its required patches stay applied."""
    wanted = set(asked or ())
    settled = [
        _settle_one(r, wanted, asked=bool(asked), by_id=by_id, read=read, release=release)
        for r in results
    ]
    return _unstacked(settled, wanted, by_id)


def _unstacked(
    results: list[PatchResult], wanted: set[str], by_id: Mapping[str, Patch]
) -> list[PatchResult]:
    """Each conflicting row not asked for whose required patch is not in the tree (its row
    `not-applied`) made `not-applied`, said; again until none changes (a series of three)."""
    changed = True
    while changed:
        changed = False
        absent = {r.patch for r in results if r.outcome == "not-applied"}
        for i, r in enumerate(results):
            patch = by_id.get(r.patch)
            if r.outcome != "conflict" or r.patch in wanted or patch is None:
                continue
            missing = [p for p in patch.requires if p in absent]
            if missing:
                why = (
                    f"never applied here: it is stacked on {', '.join(missing)}, which is not"
                    " in the tree either; not in the way"
                )
                results[i] = replace(r, outcome="not-applied", details=(why, *r.details), files=())
                changed = True
    return results


def _settle_one(
    r: PatchResult,
    wanted: set[str],
    *,
    asked: bool,
    by_id: Mapping[str, Patch],
    read: Reader,
    release: str | None,
) -> PatchResult:
    if r.outcome == "missing-target" and r.patch not in wanted:
        why = "not in the tree: its files are missing here, so it was never applied; not in the way"
        return replace(r, outcome="not-applied", details=(why, *r.details), files=())
    if r.outcome == "not-applied" and r.patch not in wanted and asked:
        why = "never applied here (its change is not in the tree): not in the way"
        return replace(r, details=(why, *r.details))
    if r.outcome == "reverted" and r.patch in wanted:
        left = _required_left(by_id[r.patch], by_id, read, release, wanted)
        if left:
            how = " ".join(f"--patch {p}" for p in left)
            note = (
                f"requires {', '.join(left)}, which stay(s) applied: `patchset revert {how}`"
                " takes them out too"
            )
            return replace(r, details=(*r.details, note))
    return r


def _required_left(
    patch: Patch,
    by_id: Mapping[str, Patch],
    read: Reader,
    release: str | None,
    wanted: set[str],
) -> list[str]:
    """The patches `patch` requires (transitively) that are in the tree and not reverted."""
    left = []
    for required in order.required_chain(patch, by_id):
        if required.id in wanted or required.kind == "python":
            continue
        variant = (required.variant_for(release) if release else None) or required.variants[0]
        if evaluate_revert(required, variant, read).state == "applies":
            left.append(required.id)
    return left
