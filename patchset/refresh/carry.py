"""`patchset refresh --all --vllm V`: every diff patch that fits release V only at an offset
or with fuzz carried onto V as a new variant that fits it exactly (what a patch bot does on
each upstream roll), so the next release starts from exact context; and every runtime patch
whose anchors no longer all match V, carried by `patchset.refresh` (new anchors where one
candidate is clearly best, as `refresh ID` proposes them).

The check picks them (verdict ``needed``, ``shifted``; a runtime patch ``partial`` or
``conflict``); a diff patch's new payload is git's diff of V's files against them as the patch
leaves them, written as `refresh` writes a variant (the old one keeps the releases before V).
A runtime site with no clear new anchor leaves its patch for hand work (`refresh ID --pick`);
python patches carry no text to move.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from patchset._plain import fields_dict
from patchset.engine.evaluate import evaluate
from patchset.errors import ExitCode, PatchsetError
from patchset.refresh import refresh
from patchset.refresh.job import Job, stacked_reader
from patchset.refresh.merge import diff_of, write_diff_variant
from patchset.refresh.record import payload_name
from patchset.registry import Registry
from patchset.release_check import check
from patchset.sources import select
from patchset.sources.base import ReleaseSource

CarryOutcome = Literal["written", "proposed", "skipped"]


@dataclass(frozen=True)
class Carried:
    patch: str
    outcome: CarryOutcome
    variant: str | None
    detail: str


@dataclass(frozen=True)
class CarryReport:
    vllm: str
    carried: tuple[Carried, ...]

    @property
    def exit_code(self) -> int:
        return ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        return {**fields_dict(self), "exit_code": int(self.exit_code)}


def refresh_shifted(
    registry: Registry, version: str, *, source: ReleaseSource, write: bool = False
) -> CarryReport:
    """Each patch `check` finds needed on `version` at an offset or with fuzz, as a new exact
    variant (written with `write`, else proposed)."""
    target = select.one(source, version)[0]
    report = check(registry, [target], source=source)
    carried = []
    for result in report.results:
        patch = registry.get(result.patch)
        if patch.kind == "runtime" and result.verdict in ("partial", "conflict"):
            carried.append(_new_anchors(registry, patch.id, target, source=source, write=write))
            continue
        if result.verdict != "needed" or not result.shifted:
            continue
        if patch.kind != "diff":
            why = f"a {patch.kind} patch: its anchors match by text, nothing to re-offset"
            carried.append(Carried(patch.id, "skipped", None, why))
            continue
        variant = next(v for v in patch.variants if v.name == result.variant)
        with source.open(target) as tree:
            read = stacked_reader(registry, patch, tree.read, target)
            files = {rel: read(rel) for rel in variant.files}
        ev = evaluate(patch, variant, files.get)
        edited = {
            rel: None if rel in ev.removed else ev.changes.get(rel, files[rel])
            for rel in variant.files
        }
        job = Job(registry, patch, variant, target, None, files, (target,))
        payload = diff_of(job, edited)
        how = "; ".join(ev.warnings) or "at an offset"
        if write:
            done = write_diff_variant(job, payload)
            carried.append(Carried(patch.id, "written", done.variant, how))
        else:
            name = payload_name(patch, target, ".diff", payload)
            carried.append(Carried(patch.id, "proposed", name, how))
    return CarryReport(target, tuple(carried))


def _new_anchors(
    registry: Registry, patch_id: str, target: str, *, source: ReleaseSource, write: bool
) -> Carried:
    """A runtime patch carried onto `target` by `patchset.refresh` (its sites' new anchors)."""
    try:
        done = refresh(registry, patch_id, target, source=source, write=write)
    except PatchsetError as exc:
        return Carried(patch_id, "skipped", None, f"refresh: {exc}")
    moved = [s.site for s in done.sites if s.anchor is not None]
    if done.outcome in ("written", "proposed"):
        outcome: CarryOutcome = "written" if done.outcome == "written" else "proposed"
        return Carried(patch_id, outcome, done.variant, f"new anchors: {', '.join(moved)}")
    why = f"a site has no clear new anchor: `patchset refresh {patch_id} --vllm {target} --pick`"
    return Carried(patch_id, "skipped", None, why)
