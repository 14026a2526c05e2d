"""Releases from a local vLLM clone: the trees of its ``vX.Y.Z`` tags, read without checkout."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset.adapters.gitrepo import GitRepo, open_repo
from patchset.errors import SourceError
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

_RELEASE_TAG = re.compile(r"^v\d+(\.\d+)*")


class GitTree(ReleaseTree):
    """One tag's files, read from the object database while the repository is open."""

    def __init__(self, info: ReleaseInfo, repo: GitRepo, commit: str) -> None:
        self.info = info
        self._repo = repo
        self._commit = commit

    def read(self, relpath: str) -> bytes | None:
        return self._repo.read_blob(self._commit, relpath)

    def paths(self) -> Iterator[str]:
        return iter(self._repo.list_paths(self._commit, "vllm"))

    def contains_commit(self, commit: str) -> bool | None:
        """Whether the release's history holds `commit` (None: the clone lacks it)."""
        return self._repo.is_ancestor(commit, self._commit)


class GitSource(ReleaseSource):
    """A local clone of vLLM whose release tags are the versions."""

    name = "git"

    def __init__(self, path: Path | str, *, prereleases: bool = False) -> None:
        self.path = Path(path)
        self.prereleases = prereleases
        with open_repo(self.path) as repo:
            if repo.commit("HEAD") is None:
                raise SourceError("the git repository has no commits", path=self.path)
            if not repo.has_dir("HEAD", "vllm"):
                raise SourceError("no vllm/ folder at HEAD; not a vLLM clone?", path=self.path)
            self._tags = release_tags(repo.tags())
        if not self._tags:
            raise SourceError("no release tags (vX.Y.Z) in the git repository", path=self.path)

    def versions(self) -> list[str]:
        return [
            str(version)
            for version in sorted(self._tags)
            if self.prereleases or not version.is_prerelease
        ]

    def default_versions(self) -> list[str]:
        """The newest release tag: a clone holds every release, a check takes the last."""
        return self.versions()[-1:]

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[GitTree]:
        version, tag = self._tag_for(version)
        with open_repo(self.path) as repo:
            commit = repo.commit(tag)
            if commit is None:
                raise SourceError(f"tag {tag} does not name a commit", path=self.path)
            info = ReleaseInfo(version=version, origin=f"git tag {tag} @{commit[:12]}")
            yield GitTree(info, repo, commit)

    def _tag_for(self, version: str) -> tuple[str, str]:
        """The canonical version and the tag that carries it."""
        try:
            wanted = Version(version)
        except InvalidVersion:
            raise SourceError(f"{version!r} is not a version", path=self.path) from None
        tag = self._tags.get(wanted)
        if tag is None:
            raise SourceError(f"no tag for vllm {version} (v{wanted})", path=self.path)
        return str(wanted), tag


def release_tags(names: list[str]) -> dict[Version, str]:
    """Tags like ``v0.19.1`` or ``v0.11.0rc1`` by version; others (``nightly``) are ignored."""
    found: dict[Version, str] = {}
    for name in sorted(names):
        if not _RELEASE_TAG.match(name):
            continue
        try:
            found.setdefault(Version(name[1:]), name)
        except InvalidVersion:
            continue
    return found
