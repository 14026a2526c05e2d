"""The check's report: one result per (release, patch), the signals behind it, and the
ranges the results suggest. Plain data, as `patchset check --format json` writes it."""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field, fields
from typing import Any, Literal, get_args

from patchset._plain import fields_dict, plain
from patchset.engine.evaluate import State
from patchset.errors import ExitCode
from patchset.registry import ranges
from patchset.sources.base import ReleaseInfo

Verdict = Literal["needed", "upstream", "conflict", "partial", "missing-target"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
SCHEMA = "patchset.check/1"
ATTENTION: frozenset[Verdict] = frozenset({"conflict", "partial", "missing-target"})
Explain = Literal["none", "in-range", "all"]  # which failures get the nearest-lines text
# what the memo keeps of a result and the JSON report leaves out
_MEMO_ONLY = ("shifted", "failing_hunks", "failing_sites", "missing")


@dataclass(frozen=True)
class Signals:
    forward: State  # the engine's dry run
    reverse: bool | None  # diff patches only
    probe: bool | None  # None when the patch declares no probe
    ancestry: bool | None = None  # git sources: the release's history holds upstream.commit

    def to_dict(self) -> dict[str, object]:
        return fields_dict(self)


@dataclass(frozen=True)
class CheckResult:
    """One patch against one release."""

    vllm: str
    patch: str
    revision: int
    variant: str
    verdict: Verdict
    in_range: bool
    detail: str
    signals: Signals
    disagreement: str | None = None
    locations: tuple[str, ...] = ()  # per hunk or site: where it fits or why it does not
    moved_to: tuple[str, ...] = ()
    shifted: bool = False  # needed, but it fits only at an offset or with fuzz
    # what did not fit, for pointing at the payload (e.g. a `line=` of a GitHub annotation)
    failing_hunks: tuple[tuple[str, int], ...] = ()  # (target file, hunk number from 1)
    failing_sites: tuple[str, ...] = ()  # runtime site names
    missing: tuple[str, ...] = ()  # target files not in the release

    @property
    def needs_attention(self) -> bool:
        return self.in_range and self.verdict in ATTENTION

    def to_memo(self) -> list[object]:
        """What the memo keeps: every field in the order declared (the signals as a list
        likewise), but the release and the range, given on reading (`from_memo`, `at`)."""
        signals = [getattr(self.signals, f) for f in _SIGNALS]
        return [signals if f == "signals" else plain(getattr(self, f)) for f in _MEMO_FIELDS]

    @classmethod
    def from_memo(cls, row: list[Any]) -> CheckResult:
        """A result read back from the memo (`to_memo`'s list), for no release yet: `at`
        gives it one. TypeError, ValueError or KeyError on a row that is none."""
        if len(row) != len(_MEMO_FIELDS):
            raise ValueError(f"a memo row of {len(row)} fields, not {len(_MEMO_FIELDS)}")
        data = dict(zip(_MEMO_FIELDS, row, strict=True))
        data["signals"] = _signals(*data["signals"])
        for name in _TUPLES:
            data[name] = tuple(data[name])
        data["failing_hunks"] = tuple((f, int(i)) for f, i in data["failing_hunks"])
        return cls(**data, vllm="", in_range=False)

    def at(self, vllm: str, *, in_range: bool) -> CheckResult:
        """This result for release `vllm` and the range's answer there, every other field
        shared (a memoised result met in many releases): `dataclasses.replace` without its
        walk over the fields' declarations (the fields copied as they are)."""
        return CheckResult(**{**self.__dict__, "vllm": vllm, "in_range": in_range})

    def to_dict(self) -> dict[str, object]:
        return fields_dict(self, skip=_MEMO_ONLY)


# A memo row's fields, in the order declared: all but the release and the range
_MEMO_FIELDS = tuple(f.name for f in fields(CheckResult) if f.name not in ("vllm", "in_range"))
_SIGNALS = tuple(f.name for f in fields(Signals))
_TUPLES = ("locations", "moved_to", "failing_sites", "missing")  # lists in a row


@functools.lru_cache(maxsize=256)
def _signals(
    forward: State, reverse: bool | None, probe: bool | None, ancestry: bool | None = None
) -> Signals:
    """The signals of a memo row, one object per combination (there are a few dozen)."""
    return Signals(forward, reverse, probe, ancestry)


@dataclass(frozen=True)
class CheckReport:
    registry: str
    releases: tuple[ReleaseInfo, ...]
    results: tuple[CheckResult, ...]
    suggested: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # per patch: its switch and default, lifecycle and predicate (`Patch.gates`)
    patches: dict[str, dict[str, object]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if any(r.needs_attention for r in self.results):
            return ExitCode.ATTENTION
        return ExitCode.OK

    def result(self, version: str, patch_id: str) -> CheckResult:
        for r in self.results:
            if r.vllm == version and r.patch == patch_id:
                return r
        raise KeyError((version, patch_id))

    def release_dicts(self) -> list[dict[str, object]]:
        """The releases as the JSON report lists them."""
        return [
            {
                "vllm": r.version,
                "origin": r.origin,
                "sha256": r.digest,
                "artifact": dict(r.details) if r.details is not None else None,
            }
            for r in self.releases
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "registry": self.registry,
            "releases": self.release_dicts(),
            "results": [r.to_dict() for r in self.results],
            "suggested_ranges": {k: list(v) for k, v in self.suggested.items()},
            "patches": self.patches,
            "exit_code": self.exit_code,
        }


def suggest_ranges(
    results: Iterable[CheckResult], versions: list[str]
) -> dict[str, tuple[str, ...]]:
    """Per patch, where it is `needed`, as PEP 440 ranges that close only on evidence.

    A range starts at a release where the patch is `needed` and closes (``<X``) only at a
    later release X whose verdict is `upstream` (the reverse applies, the probe matches, git
    history holds the fix). A `conflict`, `partial` or `missing-target` release leaves it
    open (``>=first``): nothing says the fix is upstream there, so the patch stays in range
    and a CI check keeps failing on it until it is refreshed, or its range closed by hand.
    """
    needed: dict[str, set[str]] = {}
    upstream: dict[str, set[str]] = {}
    for r in results:
        needed.setdefault(r.patch, set())
        upstream.setdefault(r.patch, set())
        if r.verdict == "needed":
            needed[r.patch].add(r.vllm)
        elif r.verdict == "upstream":
            upstream[r.patch].add(r.vllm)
    return {
        patch_id: ranges.runs(hits, versions, closing=upstream[patch_id])
        for patch_id, hits in needed.items()
    }
