"""What `apply` and `revert` report: one outcome per patch, and the run's exit code."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchset._plain import fields_dict
from patchset.errors import ExitCode

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
        return fields_dict(self)


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
            **fields_dict(self, skip=("results",)),
            "exit_code": self.exit_code,
            "results": [r.to_dict() for r in self.results],
        }
