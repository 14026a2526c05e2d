"""Releases from a local vLLM clone: the trees of its ``vX.Y.Z`` tags, read without checkout;
or one branch tip (``git:PATH@REF``), checked as the next release after its nearest tag.

A tree between releases has no version of its own. patchset reckons one from the nearest
release tag in its history (``git describe``; when none is in the history, as in a shallow
clone or on a release branch, the newest release tag made before the commit): a checkout is
``TAG+gSHA7`` (``0.33.0+g1a2b3c4``: the release with commits of its own), a branch tip is the
next release after the tag, ``TAG-with-its-last-part-bumped.devN+gSHA7``
(``0.33.1.dev45+g1a2b3c4``, as setuptools-scm names vLLM's own builds; after ``v0.34.0rc1``,
``0.34.0rc2.devN``), which sorts after the tag and before any later release, so ranges read it
as "after 0.33.0, not yet 0.33.1".
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset.adapters.gitrepo import GitRepo, open_repo
from patchset.errors import SourceError, UsageError
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

_RELEASE_TAG = re.compile(r"^v\d+(\.\d+)*")
VERSION_HINT = "say which release it holds with --source-version X"


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
    """A local clone of vLLM whose release tags are the versions; with ``PATH@REF`` (or
    `ref`), the one tree at REF, under `version` or the one reckoned from its nearest tag."""

    name = "git"

    def __init__(
        self,
        path: Path | str,
        *,
        prereleases: bool = False,
        ref: str | None = None,
        version: str | None = None,
    ) -> None:
        self.path = Path(path)
        if ref is None and not self.path.exists() and "@" in str(path):
            where, _, ref = str(path).rpartition("@")
            self.path = Path(where)
        self.prereleases = prereleases
        self.ref = ref or None
        self._tip: tuple[str, str] | None = None  # (version, commit) of REF
        with open_repo(self.path) as repo:
            if repo.commit("HEAD") is None:
                raise SourceError("the git repository has no commits", path=self.path)
            if self.ref is not None and repo.commit(self.ref) is None:
                raise UsageError(f"no revision {self.ref!r} in the clone", path=self.path)
            if not repo.has_dir(self.ref or "HEAD", "vllm"):
                raise SourceError(
                    f"no vllm/ folder at {self.ref or 'HEAD'}; not a vLLM clone?", path=self.path
                )
            self._tags = release_tags(repo.tags())
            if self.ref is not None:
                commit = repo.commit(self.ref)
                assert commit is not None  # asked above
                self._tip = (version or tip_version(repo, self.ref, self._tags), commit)
        if not self._tags and self._tip is None:
            raise SourceError("no release tags (vX.Y.Z) in the git repository", path=self.path)

    def versions(self) -> list[str]:
        if self._tip is not None:
            return [self._tip[0]]
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
        if self._tip is not None:
            label, tip = self._tip
            if version != label:
                raise SourceError(f"{self.ref} is {label}, not {version}", path=self.path)
            with open_repo(self.path) as repo:
                info = ReleaseInfo(version=label, origin=f"git {self.ref} @{tip[:12]}")
                yield GitTree(info, repo, tip)
            return
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


def nearest_release(
    repo: GitRepo, rev: str, tags: dict[Version, str] | None = None
) -> tuple[Version, int | None, str] | None:
    """The release tag `rev` comes after: (its version, commits since it or None when not
    counted, `rev`'s sha). From ``git describe``, else the newest release tag whose commit is
    no later than `rev`'s (a shallow clone, a tag on a release branch); None with no tag."""
    described = repo.describe(rev)
    if described is not None:
        tag, distance, sha = described
        found = release_tags([tag])
        if found:
            return next(iter(found)), distance, sha
    head = repo.commit(rev)
    when = repo.committed(rev)
    if head is None or when is None:
        return None
    tags = release_tags(repo.tags()) if tags is None else tags
    before = [v for v, tag in tags.items() if (repo.committed(tag) or when + 1) <= when]
    if not before:
        return None
    newest = max(before)
    return newest, 0 if repo.commit(tags[newest]) == head else None, head


def checkout_version(repo: GitRepo, rev: str = "HEAD") -> str | None:
    """A checkout's version: its nearest release, with ``+gSHA7`` when it is not the tag's
    commit (``0.33.0+g1a2b3c4``); None without a release tag."""
    found = nearest_release(repo, rev)
    if found is None:
        return None
    version, distance, sha = found
    return str(version) if distance == 0 else f"{version}+g{sha[:7]}"


def tip_version(repo: GitRepo, rev: str, tags: dict[Version, str] | None = None) -> str:
    """A branch tip as the next release after its nearest tag: the tag itself at the tag's
    commit, else the last part of the release bumped, ``.devN`` (N commits since the tag,
    0 when they cannot be counted) and ``+gSHA7``. UsageError without a release tag."""
    found = nearest_release(repo, rev, tags)
    if found is None:
        raise UsageError(
            f"{rev}: no release tag (vX.Y.Z) before it in the clone (fetch the tags:"
            f" git fetch --depth 1 origin 'refs/tags/v*:refs/tags/v*'), or {VERSION_HINT}",
            path=repo.path,
        )
    version, distance, sha = found
    if distance == 0:
        return str(version)
    parts = list(version.release)
    if version.pre is not None:  # after 0.34.0rc1 comes 0.34.0rc2
        base = f"{'.'.join(map(str, parts))}{version.pre[0]}{version.pre[1] + 1}"
    else:
        parts[-1] += 1
        base = ".".join(map(str, parts))
    return f"{base}.dev{distance or 0}+g{sha[:7]}"
