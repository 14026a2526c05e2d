"""The one wrapper around gitpython: open a clone, list its tags, read blobs at a revision.

Nothing here checks anything out; blobs are read from the object database, so a clone's
working tree is never touched. Use `open_repo` as a context manager: gitpython keeps
``git cat-file`` processes alive until the repository is closed.
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath
from types import TracebackType

import git

from patchset.errors import SourceError

_LINK_MODE = 0o120000  # a symlink's tree-entry mode
_BLOB = "blob"


class GitRepo:
    """A read-only view of a local clone."""

    def __init__(self, repo: git.Repo, path: Path) -> None:
        self._repo = repo
        self.path = path

    def __enter__(self) -> GitRepo:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._repo.close()

    def tags(self) -> list[str]:
        """Every tag name, unsorted."""
        return [ref.name for ref in self._repo.tags]

    def commit(self, rev: str) -> str | None:
        """The hex sha of the commit `rev` names (a tag is peeled), or None."""
        try:
            return str(self._repo.commit(rev).hexsha)
        except (git.BadName, git.BadObject, ValueError):
            return None

    def read_blob(self, rev: str, path: str) -> bytes | None:
        """The file's bytes at `rev`, or None when it is missing, a folder or a symlink."""
        tree = self._tree(rev)
        try:
            item = tree / _clean(path)
        except KeyError:
            return None
        if item.type != _BLOB or item.mode == _LINK_MODE:
            return None
        return bytes(item.data_stream.read())

    def list_paths(self, rev: str, prefix: str = "") -> list[str]:
        """Every regular file at `rev` under the folder `prefix` (all files when empty)."""
        tree = self._tree(rev)
        clean = _clean(prefix) if prefix.strip("/") else ""
        if clean:
            try:
                tree = tree / clean
            except KeyError:
                return []
            if tree.type != "tree":
                return []
        return sorted(
            str(item.path)
            for item in tree.traverse()
            if isinstance(item, git.Blob) and item.mode != _LINK_MODE
        )

    def has_dir(self, rev: str, path: str) -> bool:
        try:
            return bool((self._tree(rev) / _clean(path)).type == "tree")
        except KeyError:
            return False

    def _tree(self, rev: str) -> git.Tree:
        try:
            return self._repo.commit(rev).tree
        except (git.BadName, git.BadObject, ValueError):
            raise SourceError(f"no revision {rev!r} here", path=self.path) from None


def open_repo(path: Path | str) -> GitRepo:
    """Open the clone at `path`; one SourceError line when it is not a git repository."""
    folder = Path(path)
    if not folder.exists():
        raise SourceError("no such folder", path=folder)
    try:
        repo = git.Repo(folder)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SourceError("not a git repository", path=folder) from None
    return GitRepo(repo, folder)


def _clean(path: str) -> str:
    pure = PurePosixPath(path.strip("/"))
    if ".." in pure.parts or not pure.parts:
        raise SourceError(f"{path!r}: not a path inside the repository")
    return pure.as_posix()


def provenance(path: Path | str) -> tuple[str, str]:
    """(revision, source) of the checkout holding `path`, for image labels.

    The revision is the HEAD commit, with "-dirty" when tracked files changed; the source is
    the `origin` remote when there is one, else the checkout's folder. Outside a checkout:
    ("unknown", the folder).
    """
    folder = Path(path).resolve()
    try:
        repo = git.Repo(folder, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return "unknown", str(folder)
    with repo:
        try:
            revision = repo.head.commit.hexsha + ("-dirty" if repo.is_dirty() else "")
        except ValueError:  # no commit yet
            revision = "unknown"
        remotes = {r.name: r for r in repo.remotes}
        source = next(iter(remotes["origin"].urls)) if "origin" in remotes else repo.working_dir
    return revision, str(source)
