"""One refresh job (the patch, the variant carried forward, the releases) and its results."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from patchset._plain import fields_dict
from patchset.engine.order import on_top_of_required
from patchset.errors import ExitCode
from patchset.kernel.sites import SiteStatus
from patchset.registry import Kind, Patch, Registry, Variant
from patchset.sources.base import ReleaseSource

RefreshOutcome = Literal["written", "proposed", "conflict", "unresolved"]


@dataclass(frozen=True)
class AnchorCandidate:
    line: int  # 1-based, in the target release's file
    similarity: float
    lines: tuple[str, ...]
    unchanged: bool = False  # every line is a base-release line outside the anchor

    def to_dict(self) -> dict[str, object]:
        return {**fields_dict(self), "similarity": round(self.similarity, 3)}


@dataclass(frozen=True)
class SiteRefresh:
    """One runtime site against the target release, and the anchor proposed for it."""

    site: str
    file: str
    status: SiteStatus  # in the target release, with the old anchor
    line: int | None = None  # where the old anchor still matches
    candidates: tuple[AnchorCandidate, ...] = ()
    anchor: str | None = None  # the proposed anchor (dedented); None: unchanged or no proposal
    picked: int | None = None  # the 1-based candidate it came from
    text_follows: bool = False  # a replace site's text held the old anchor; now the new one
    reason: str = ""  # why there is no proposal

    @property
    def resolved(self) -> bool:
        # An optional site with no anchor, or one its own probe finds upstream, stays as it is.
        return self.status in ("applies", "skipped", "upstream") or self.anchor is not None

    def to_dict(self) -> dict[str, object]:
        return fields_dict(self)


@dataclass(frozen=True)
class RangeChange:
    what: str  # "vllm" (the patch's own range) or a payload file name
    old: str | None  # None: a new variant
    new: str


@dataclass(frozen=True)
class Conflict:
    file: str
    lines: tuple[int, ...]  # 1-based lines of the conflict markers in the work folder's copy


@dataclass(frozen=True)
class MovedFile:
    old: str  # the path the variant patches
    new: str  # where the target release has the file: the new variant patches this path


@dataclass(frozen=True)
class RefreshResult:
    patch: str
    kind: Kind
    vllm: str  # the target release
    from_variant: str  # the payload carried forward
    base: str | None  # the release it was written against (the merge base)
    outcome: RefreshOutcome
    variant: str | None = None  # the new payload's file name
    revision: int | None = None  # the patch's revision once written
    payload: str = ""  # diff: the new diff; runtime: the new sites file as a diff of the old
    ranges: tuple[RangeChange, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    workdir: Path | None = None
    sites: tuple[SiteRefresh, ...] = ()
    written: tuple[Path, ...] = ()
    moved: tuple[MovedFile, ...] = ()  # target files the release moved, followed

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.outcome in ("written", "proposed") else ExitCode.ATTENTION

    def to_dict(self) -> dict[str, object]:
        return {**fields_dict(self), "exit_code": self.exit_code}


@dataclass(frozen=True)
class Job:
    """One refresh: the patch, the variant carried forward, and the releases involved."""

    registry: Registry
    patch: Patch
    variant: Variant
    target: str
    base: str | None
    files: dict[str, bytes | None]  # the target release's copies, at the variant's paths
    versions: tuple[str, ...]
    moves: Mapping[str, str] = dataclasses.field(default_factory=dict)  # variant's -> release's

    def at_release_paths(self, files: Mapping[str, bytes | None]) -> dict[str, bytes | None]:
        """`files` (keyed by the variant's paths) keyed by where the target release has them."""
        return {self.moves.get(rel, rel): data for rel, data in files.items()}

    def stacked(
        self, read: Callable[[str], bytes | None], version: str
    ) -> Callable[[str], bytes | None]:
        """`read` of release `version` with the patches this patch requires applied first:
        a stacked patch is carried on top of them, as `check` evaluates it."""
        return stacked_reader(self.registry, self.patch, read, version)

    def result(self, outcome: RefreshOutcome, **fields: Any) -> RefreshResult:
        moved = tuple(MovedFile(old, new) for old, new in self.moves.items())
        return RefreshResult(
            self.patch.id,
            self.patch.kind,
            self.target,
            self.variant.name,
            self.base,
            outcome,
            moved=moved,
            **fields,
        )


def stacked_reader(
    registry: Registry, patch: Patch, read: Callable[[str], bytes | None], version: str
) -> Callable[[str], bytes | None]:
    """`read` with the patches `patch` requires applied first; one that does not fit
    `version` is refused (carry it onto the release first)."""
    by_id = {p.id: p for p in registry.patches}
    return on_top_of_required(patch, by_id, read, version, refuse=True)


def read_release(
    source: ReleaseSource, version: str, files: tuple[str, ...], *, job: Job | None = None
) -> dict[str, bytes | None]:
    """The release's `files`; with `job`, as the patches its patch requires leave them."""
    with source.open(version) as tree:
        read = tree.read if job is None else job.stacked(tree.read, version)
        return {rel: read(rel) for rel in files}
