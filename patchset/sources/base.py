"""The release-source protocol: every way of reading a vLLM release's files fits it."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class ReleaseInfo:
    """Where a release tree came from; shown in reports."""

    version: str  # PEP 440 version of the vLLM release, e.g. "0.19.1"
    origin: str  # e.g. "index sdist vllm-0.19.1.tar.gz sha256:1a2b..", "git tag v0.19.1 @ab12cd"
    digest: str | None = None  # sha256 of the artifact when there is one
    # What was read and how it was checked (index: the artifact, the members checked, a
    # fallback taken); shown as `artifact` in the check's JSON. Not part of equality.
    details: Mapping[str, object] | None = field(default=None, compare=False)


@runtime_checkable
class ReleaseTree(Protocol):
    """A read-only view of one release's files.

    Paths are POSIX paths relative to the folder that holds the ``vllm`` package,
    e.g. ``vllm/model_executor/layers/fla/ops/utils.py``.
    """

    @property
    def info(self) -> ReleaseInfo:
        """Which release this is and where it came from."""
        ...

    def read(self, relpath: str) -> bytes | None:
        """The file's bytes, or None when the release has no such file."""
        ...

    def paths(self) -> Iterable[str]:
        """Every file path under ``vllm/`` in the release (used to find moved files)."""
        ...


class ReleaseSource(Protocol):
    """A place releases come from: the package index, a folder, a git clone, an image."""

    name: str  # "index", "folder", "git", "image"

    def versions(self) -> list[str]:
        """The release versions this source can provide, oldest first."""
        ...

    def open(self, version: str) -> AbstractContextManager[ReleaseTree]:
        """A context manager yielding the release's tree; raises SourceError if unavailable."""
        ...


@dataclass(frozen=True)
class MemoryTree:
    """A ReleaseTree held in memory; used by tests and as the common in-cache form."""

    info: ReleaseInfo
    files: dict[str, bytes]

    def read(self, relpath: str) -> bytes | None:
        return self.files.get(relpath)

    def paths(self) -> Iterator[str]:
        return iter(sorted(self.files))


@runtime_checkable
class ReadsMany(Protocol):
    """A tree that reads several files faster together than one by one (the index's wheels:
    one round of range requests instead of one request per file)."""

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes | None]:
        """Each file's bytes, or None when the release has no such file."""
        ...
