"""A release in a folder: a checkout, an unpacked sdist or a site-packages folder.

Its version is the one the folder says (`patchset.kernel.vllm.read_version`), else, in a git
checkout, its nearest release tag with the commit (``0.33.0+g1a2b3c4``, see
`patchset.sources.git`), else the caller's (``--source-version``); with none of them the
folder is refused (exit 2), since a release nobody can place is checked against no range.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path, PurePosixPath

from packaging.version import InvalidVersion, Version

from patchset.errors import SourceError, UsageError
from patchset.kernel.vllm import read_version
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

UNKNOWN = "unknown"
_SKIP_DIRS = {"__pycache__"}  # bytecode is no part of a release


class FolderTree(ReleaseTree):
    """Files under a folder, read in place; a path that resolves outside it is refused."""

    def __init__(self, info: ReleaseInfo, root: Path) -> None:
        self.info = info
        self.root = root
        self._real_root = root.resolve()

    def read(self, relpath: str) -> bytes | None:
        path = self._inside(relpath)
        try:
            return path.read_bytes() if path.is_file() else None
        except OSError as exc:
            raise SourceError(
                f"{relpath}: cannot be read ({exc.strerror})", path=self.root
            ) from None

    def paths(self) -> Iterator[str]:
        found: list[str] = []
        for folder, dirs, files in os.walk(self.root / "vllm"):
            dirs[:] = sorted(d for d in dirs if d not in _SKIP_DIRS)
            base = Path(folder)
            for name in files:
                path = base / name
                if path.is_symlink() and not self._resolves_inside(path):
                    continue
                found.append(path.relative_to(self.root).as_posix())
        return iter(sorted(found))

    def _inside(self, relpath: str) -> Path:
        pure = PurePosixPath(relpath)
        if pure.is_absolute() or ".." in pure.parts or "\x00" in relpath:
            raise SourceError(f"{relpath}: not a path inside the release", path=self.root)
        path = self.root / pure
        if not self._resolves_inside(path):
            raise SourceError(
                f"{relpath}: leads outside the folder through a symlink", path=self.root
            )
        return path

    def _resolves_inside(self, path: Path) -> bool:
        return path.resolve().is_relative_to(self._real_root)


class FolderSource(ReleaseSource):
    """Any folder that holds a ``vllm/`` package; it provides the one release it holds."""

    name = "folder"
    fork_safe = True  # plain files on disk

    def __init__(self, path: Path | str, version: str | None = None) -> None:
        self.path = Path(path)
        if not self.path.is_dir():
            raise SourceError("no such folder", path=self.path)
        if not (self.path / "vllm").is_dir():
            raise SourceError("no vllm/ package here", path=self.path)
        if version is not None:
            self.version = checked_version(version)
        else:
            found = folder_version(self.path)
            self.version = found if found != UNKNOWN else _checkout_version(self.path)

    def versions(self) -> list[str]:
        return [self.version]

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[FolderTree]:
        if not _same_version(version, self.version):
            raise SourceError(f"holds vllm {self.version}, not {version}", path=self.path)
        info = ReleaseInfo(version=self.version, origin=f"folder {self.path}")
        yield FolderTree(info, self.path)


def checked_version(text: str, option: str = "--source-version") -> str:
    """`text` as a PEP 440 version (normalised); UsageError otherwise."""
    try:
        return str(Version(text))
    except InvalidVersion:
        raise UsageError(f"{option} {text!r} is not a version (e.g. 0.20.0)") from None


def _checkout_version(root: Path) -> str:
    """The version of a git checkout at `root` (its nearest release tag, with the commit);
    UsageError, one line, when it has none or is no checkout."""
    from patchset.adapters.gitrepo import open_repo, toplevel  # noqa: PLC0415 -- gitpython: on use
    from patchset.sources.git import VERSION_HINT, checkout_version  # noqa: PLC0415

    top = toplevel(root)
    if top is None or top.resolve() != root.resolve():  # vllm/ at a checkout's top only
        why = "no version file or dist-info, and not a git checkout"
    else:
        with open_repo(top) as repo:
            found = checkout_version(repo)
        if found is not None:
            return found
        why = "a git checkout with no release tag before HEAD"
    raise UsageError(f"the vLLM version cannot be read ({why}); {VERSION_HINT}", path=root)


def folder_version(root: Path) -> str:
    """The vLLM version in `root` (`patchset.kernel.vllm.read_version`), else "unknown"."""
    found = read_version(root)
    return found[0] if found else UNKNOWN


def _same_version(wanted: str, held: str) -> bool:
    """An unknown version matches anything; otherwise compare as PEP 440 versions."""
    if held in {UNKNOWN, wanted}:
        return True
    try:
        return Version(wanted) == Version(held)
    except InvalidVersion:
        return False
