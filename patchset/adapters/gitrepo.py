"""The one wrapper around gitpython: read a clone's tags and blobs; merge in a scratch repo.

`GitRepo` never checks anything out; blobs are read from the object database, so a clone's
working tree is never touched. `ScratchRepo` is a throwaway repository (refresh's three-way
merges), run with no user or system git configuration, hooks or templates, so a person's
settings cannot change a merge. Use both as context managers: gitpython keeps
``git cat-file`` processes alive until the repository is closed.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported where used: `patchset` starts without gitpython
    import git

from patchset.adapters.closing import Closing
from patchset.errors import SourceError

_LINK_MODE = 0o120000  # a symlink's tree-entry mode
_BLOB = "blob"


class _Handle(Closing):
    """A gitpython repository held open; closed on `close()` or leaving a `with` block."""

    def __init__(self, repo: git.Repo, path: Path) -> None:
        self._repo = repo
        self.path = path

    def close(self) -> None:
        self._repo.close()


class GitRepo(_Handle):
    """A read-only view of a local clone."""

    def tags(self) -> list[str]:
        """Every tag name, unsorted."""
        return [ref.name for ref in self._repo.tags]

    def is_ancestor(self, ancestor: str, rev: str) -> bool | None:
        """Whether commit `ancestor` is in the history of `rev`; None if either is unknown."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            first, second = self._repo.commit(ancestor), self._repo.commit(rev)
        except (git.BadName, git.BadObject, ValueError):
            return None
        return bool(self._repo.is_ancestor(first, second))

    def tags_containing(self, commit: str) -> list[str] | None:
        """The tags whose history holds `commit` (``git tag --contains``); None when the clone
        does not have the commit."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        if self.commit(commit) is None:
            return None
        try:
            out = self._repo.git.tag("--contains", commit)
        except git.GitCommandError:
            return None
        return [line.strip() for line in str(out).splitlines() if line.strip()]

    def describe(self, rev: str) -> tuple[str, int, str] | None:
        """The nearest tag like ``v0.33.0`` in the history of `rev`, the number of commits
        since it and `rev`'s hex sha (``git describe --tags --long``); None when no such tag
        is in the history (none fetched, or a shallow clone cut before it)."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            out = str(self._repo.git.describe("--tags", "--long", "--match", "v[0-9]*", rev))
            sha = str(self._repo.commit(rev).hexsha)
        except (git.GitCommandError, git.BadName, git.BadObject, ValueError):
            return None
        tag, _, rest = out.strip().rpartition("-g")[0].rpartition("-")
        return (tag, int(rest), sha) if tag and rest.isdigit() else None

    def committed(self, rev: str) -> int | None:
        """When `rev`'s commit was made (seconds since the epoch), or None."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            return int(self._repo.commit(rev).committed_date)
        except (git.BadName, git.BadObject, ValueError):
            return None

    def commit(self, rev: str) -> str | None:
        """The hex sha of the commit `rev` names (a tag is peeled), or None."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

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
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

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
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            return self._repo.commit(rev).tree
        except (git.BadName, git.BadObject, ValueError):
            raise SourceError(f"no revision {rev!r} here", path=self.path) from None


def open_repo(path: Path | str) -> GitRepo:
    """Open the clone at `path`; one SourceError line when it is not a git repository."""
    import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

    folder = Path(path)
    if not folder.exists():
        raise SourceError("no such folder", path=folder)
    try:
        repo = git.Repo(folder)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise SourceError("not a git repository", path=folder) from None
    return GitRepo(repo, folder)


def toplevel(path: Path | str) -> Path | None:
    """The top folder of the git work tree holding `path`; None outside one."""
    import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

    try:
        repo = git.Repo(Path(path).resolve(), search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return None
    with repo:
        top = repo.working_tree_dir
    return Path(top) if top else None


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
    import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

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


# -- scratch repositories --------------------------------------------------------------------

_SCRATCH_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "patchset",
    "GIT_AUTHOR_EMAIL": "patchset@localhost",
    "GIT_AUTHOR_DATE": "2000-01-01T00:00:00+00:00",
    "GIT_COMMITTER_NAME": "patchset",
    "GIT_COMMITTER_EMAIL": "patchset@localhost",
    "GIT_COMMITTER_DATE": "2000-01-01T00:00:00+00:00",
    "GIT_TERMINAL_PROMPT": "0",
}
_SCRATCH_CONFIG = {
    "core.autocrlf": "false",
    "core.safecrlf": "false",
    "core.hooksPath": os.devnull,
    "merge.conflictStyle": "diff3",  # the base's lines between the two sides
    "diff.renames": "false",
    "commit.gpgsign": "false",
}
_OURS, _BASE, _THEIRS, _SPLIT = "<<<<<<<", "|||||||", ">>>>>>>", "======="


@dataclass(frozen=True)
class MergeLabels:
    """What conflict markers call the two sides and their base (git says HEAD and a sha)."""

    ours: str
    base: str
    theirs: str


class ScratchRepo(_Handle):
    """A throwaway repository to merge files in; paths are POSIX paths inside it."""

    def _git(self, *args: str) -> str:
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            return str(self._repo.git.execute(["git", *args]))
        except git.GitCommandError as exc:
            raise SourceError(f"git {args[0]} failed: {_stderr(exc)}", path=self.path) from None

    def commit_files(self, files: Mapping[str, bytes | None], message: str) -> str:
        """Write (None: delete) files, commit them on the current branch; the commit's sha."""
        for rel, data in files.items():
            path = self.path / _clean(rel)
            if data is None:
                path.unlink(missing_ok=True)
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        self._git("add", "--all")
        self._git("commit", "--quiet", "--allow-empty", "--no-verify", "-m", message)
        return self._git("rev-parse", "HEAD").strip()

    def branch(self, name: str, at: str) -> None:
        """Create branch `name` at the commit `at` and check it out."""
        self._git("checkout", "--quiet", "-b", name, at)

    def merge(self, branch: str, labels: MergeLabels) -> tuple[str, ...]:
        """Merge `branch` into the current one; the paths left with conflicts (none: clean).

        A conflicted file keeps git's markers, relabelled with `labels`; nothing is committed.
        """
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            self._repo.git.execute(
                ["git", "merge", "--no-ff", "--no-edit", "--quiet", "-m", f"merge {branch}", branch]
            )
        except git.GitCommandError as exc:
            conflicted = tuple(
                line
                for line in self._git("diff", "--name-only", "--diff-filter=U").splitlines()
                if line.strip()
            )
            if not conflicted:
                raise SourceError(f"git merge failed: {_stderr(exc)}", path=self.path) from None
            for rel in conflicted:
                path = self.path / rel
                if path.is_file():
                    path.write_bytes(_relabel(path.read_bytes(), branch, labels))
            return conflicted
        return ()

    def read(self, rel: str) -> bytes | None:
        """A file of the working tree, or None when it is absent."""
        path = self.path / _clean(rel)
        return path.read_bytes() if path.is_file() else None

    def diff(self, old: str, new: str, paths: list[str] | tuple[str, ...]) -> bytes:
        """`git diff old new -- paths` with a/ and b/ prefixes, as bytes (empty: no change)."""
        import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

        try:
            out = self._repo.git.execute(
                [
                    "git",
                    "diff",
                    "--no-color",
                    "--no-ext-diff",
                    "--no-renames",
                    "--src-prefix=a/",
                    "--dst-prefix=b/",
                    old,
                    new,
                    "--",
                    *paths,
                ],
                stdout_as_string=False,
                strip_newline_in_stdout=False,
            )
        except git.GitCommandError as exc:
            raise SourceError(f"git diff failed: {_stderr(exc)}", path=self.path) from None
        return bytes(out)


def scratch_repo(path: Path | str) -> ScratchRepo:
    """A new repository in the empty folder `path`, with branch `base` and no commits."""
    import git  # noqa: PLC0415 -- gitpython takes 25 ms to import: on use

    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    try:
        cmd = git.Git(str(folder))
        cmd.update_environment(**_SCRATCH_ENV)
        cmd.execute(["git", "init", "--quiet", "--template=", str(folder)])
        repo = git.Repo(folder)
    except git.GitCommandNotFound:
        raise SourceError("git is not installed (refresh merges with git)") from None
    except git.GitCommandError as exc:
        raise SourceError(f"git init failed: {_stderr(exc)}", path=folder) from None
    repo.git.update_environment(**_SCRATCH_ENV)
    scratch = ScratchRepo(repo, folder)
    for key, value in _SCRATCH_CONFIG.items():
        scratch._git("config", key, value)
    scratch._git("symbolic-ref", "HEAD", "refs/heads/base")
    return scratch


def conflict_lines(data: bytes) -> list[int]:
    """1-based numbers of the lines that open or close a conflict (git's markers)."""
    found = []
    for number, line in enumerate(data.splitlines(), start=1):
        if line.startswith((_OURS.encode(), _THEIRS.encode())) and line[7:8] in (b"", b" "):
            found.append(number)
    return found


def _relabel(data: bytes, branch: str, labels: MergeLabels) -> bytes:
    """Name git's sides: `<<<<<<< HEAD`, `||||||| <sha>` and `>>>>>>> branch` become labels."""
    out = []
    inside = False
    for line in data.splitlines(keepends=True):
        body = line.rstrip(b"\r\n")
        eol = line[len(body) :]
        if not inside and body == f"{_OURS} HEAD".encode():
            inside = True
            body = f"{_OURS} {labels.ours}".encode()
        elif inside and body.startswith(f"{_BASE} ".encode()):
            body = f"{_BASE} {labels.base}".encode()
        elif inside and body == f"{_THEIRS} {branch}".encode():
            inside = False
            body = f"{_THEIRS} {labels.theirs}".encode()
        out.append(body + eol)
    return b"".join(out)


def _stderr(exc: git.GitCommandError) -> str:
    text = str(exc.stderr or exc.stdout or exc).strip().replace("\n", " ")
    return text.removeprefix("stderr: ").strip(" '")
