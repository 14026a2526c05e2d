"""`patchset refresh --all --vllm V`: every diff patch that fits release V only at an offset
or with fuzz carried onto V as a new variant that fits it exactly (what a patch bot does on
each upstream roll), so the next release starts from exact context.

The check picks them (verdict ``needed``, ``shifted``); the new payload is git's diff of V's
files against them as the patch leaves them, written as `refresh` writes a variant (the old
one keeps the releases before V). Runtime and python patches have nothing to re-offset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from patchset._plain import fields_dict
from patchset.engine.evaluate import evaluate
from patchset.errors import ExitCode
from patchset.refresh.job import Job, stacked_reader
from patchset.refresh.merge import diff_of, write_diff_variant
from patchset.refresh.record import payload_name
from patchset.registry import Registry
from patchset.release_check import check
from patchset.sources import select
from patchset.sources.base import ReleaseSource

Outcome = Literal["written", "proposed", "skipped"]


@dataclass(frozen=True)
class Carried:
    patch: str
    outcome: Outcome
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
        if result.verdict != "needed" or not result.shifted:
            continue
        patch = registry.get(result.patch)
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
