"""The release-source protocol: every way of reading a vLLM release's files fits it."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

DownloadProgress = Callable[[str, int, int], None]
"""Called with (version, bytes received, bytes expected or 0) while a release downloads."""


@dataclass(frozen=True)
class ReleaseInfo:
    """Where a release tree came from; shown in reports."""

    version: str  # PEP 440 version of the vLLM release, e.g. "0.19.1"
    origin: str  # e.g. "index sdist vllm-0.19.1.tar.gz sha256:1a2b..", "git tag v0.19.1 @ab12cd"
    digest: str | None = None  # sha256 of the artifact when there is one
    # What was read and how it was checked (index: the artifact, the members checked, a
    # fallback taken); shown as `artifact` in the check's JSON. Not part of equality.
    details: Mapping[str, object] | None = field(default=None, compare=False)

    @staticmethod
    def joined(infos: Sequence[ReleaseInfo]) -> ReleaseInfo:
        """One release as several processes of a check read it (`release_check.parallel`):
        the first's info, its files ``checked`` those any of them checked (sorted by path)."""
        first = infos[0]
        lists = [i.details.get("checked") for i in infos if i.details is not None]
        if len(infos) == 1 or first.details is None or not all(isinstance(c, list) for c in lists):
            return first
        checked = {entry["path"]: entry for c in lists if isinstance(c, list) for entry in c}
        details = {**first.details, "checked": [checked[p] for p in sorted(checked)]}
        return dataclasses.replace(first, details=details)


@runtime_checkable
class ReleaseTree(Protocol):
    """A read-only view of one release's files.

    Paths are POSIX paths relative to the folder that holds the ``vllm`` package,
    e.g. ``vllm/model_executor/layers/fla/ops/utils.py``.
    """

    info: ReleaseInfo  # which release this is and where it came from

    def read(self, relpath: str) -> bytes | None:
        """The file's bytes, or None when the release has no such file."""
        ...

    def paths(self) -> Iterable[str]:
        """Every file path under ``vllm/`` in the release (used to find moved files)."""
        ...

    def contains_commit(self, commit: str) -> bool | None:
        """Whether the release's history holds `commit`; None when the tree cannot say (the
        default: only a git clone's trees know their history)."""
        return None


class ReleaseSource(Protocol):
    """A place releases come from: the package index, a folder, a git clone, an image.

    The sources subclass it, so they get the defaults below where they have nothing to add.
    """

    name: str  # "index", "folder", "git", "image"
    offline: bool = False  # reads only what is already here (the cache); nothing downloads
    # Whether a release named but not in `versions()` may still open: the index's list leaves
    # out pre-releases unless asked (and offline lists only the cache), so a named release is
    # asked for when opened; a folder, clone or image holds only what it lists.
    named_on_trust: bool = False
    # Whether a forked child may open and read its releases while the parent does (a check
    # split among processes: release_check/parallel.py): no connection, process or pipe of
    # the parent's is used by both. The index (its connection pools reset in a child) and a
    # folder are; a git clone (gitpython's cat-file processes) and an image (the engine's
    # connection) are not, and are checked in one process.
    fork_safe: bool = False

    def versions(self) -> list[str]:
        """The release versions this source can provide, oldest first."""
        ...

    def open(self, version: str) -> AbstractContextManager[ReleaseTree]:
        """A context manager yielding the release's tree; raises SourceError if unavailable."""
        ...

    def cached_versions(self) -> list[str]:
        """The releases it holds without downloading anything (default: all of them)."""
        return self.versions()

    def default_versions(self) -> list[str]:
        """The releases a check takes when none is named: by default all it holds (a folder's
        or image's one release); a git clone its newest tag; the index none (name them)."""
        return self.versions()

    def prefetch(
        self,
        versions: Iterable[str],
        *,
        paths: Sequence[str] | None = None,
        progress: DownloadProgress | None = None,
        also: Sequence[str] | None = None,
    ) -> Mapping[str, Path]:
        """Make `versions` local ahead of `open` (in parallel where it can), with `paths` of
        each where the source fetches file by file (and the files a moved-file search reads
        for one a release lacks), and `also` where a release has them (no search for them);
        where each is kept, for a source that keeps files. The default has nothing to fetch
        (and ignores `paths` and `also`)."""
        return {}

    def settle(self) -> None:
        """Wait for what the source runs in the background of its own (a check forks next,
        and forks only with no other thread running). The default runs nothing."""
        return


@dataclass(frozen=True)
class MemoryTree(ReleaseTree):
    """A ReleaseTree held in memory; used by tests and as the common in-cache form."""

    info: ReleaseInfo
    files: dict[str, bytes]

    def read(self, relpath: str) -> bytes | None:
        return self.files.get(relpath)

    def paths(self) -> Iterator[str]:
        return iter(sorted(self.files))


@runtime_checkable
class KnowsDigests(Protocol):
    """A tree whose file list holds each file's sha256, so it is known without reading the
    file (the index's wheels: RECORD's, against which a file is checked when it is read)."""

    def listed_digest(self, relpath: str) -> str | None:
        """The file's sha256 (hex) as listed, "-" when the release has no such file, None
        when the list cannot say without reading it."""
        ...

    def read_listed(self, relpath: str, digest: str) -> bytes | None:
        """The file whose listed sha256 is known to be `digest` (a memo of this release's
        list): read by that digest, checked against it, as `read` would give it."""
        ...

    def listed_size(self, relpath: str) -> int | None:
        """The file's size in bytes as listed; None when the list does not say."""
        ...


@runtime_checkable
class ReadsMany(Protocol):
    """A tree that reads several files faster together than one by one (the index's wheels:
    one round of range requests instead of one request per file)."""

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes | None]:
        """Each file's bytes, or None when the release has no such file."""
        ...
