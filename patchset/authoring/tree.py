"""A diff from files: an edited vLLM tree against its pristine release (`--from-tree`), or
whole-file overlays against the release they were copied from, found by content (`--overlay`).
"""

from __future__ import annotations

import difflib
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from patchset.errors import UsageError
from patchset.registry import ranges
from patchset.sources.base import ReadsMany, ReleaseSource, ReleaseTree

SKIP_DIRS = {"__pycache__"}
MIN_LIKENESS = 0.6  # an overlay less alike than this to every candidate matches no release
CLOSE = 0.02  # files of one name this close in likeness: which one is meant is not clear


def unified(path: str, old: str | None, new: str | None, *, executable: bool = False) -> str:
    """The registry's form of one file's diff (`--- a/path`, `+++ b/path`, three lines of
    context), with `\\ No newline at end of file` where a side ends without one; `new` None
    deletes the file (git's form: `deleted file mode`, `+++ /dev/null`); a file created
    `executable` says so as git does (`new file mode 100755`)."""
    old_lines = [] if old is None else lines_of(old)
    new_lines = [] if new is None else lines_of(new)
    out = [f"--- {'/dev/null' if old is None else 'a/' + path}\n", f"+++ b/{path}\n"]
    if old is None and executable:
        out = [f"diff --git a/{path} b/{path}\n", "new file mode 100755\n", *out]
    if new is None:
        out = [f"diff --git a/{path} b/{path}\n", "deleted file mode 100644\n"]
        out += [f"--- a/{path}\n", "+++ /dev/null\n"] if old_lines else []
    out += [
        line if line.endswith("\n") else line + "\n\\ No newline at end of file\n"
        for line in list(difflib.unified_diff(old_lines, new_lines, n=3))[2:]
    ]
    return "".join(out)


def lines_of(text: str) -> list[str]:
    """`text`'s lines, each with its `\\n`, split on `\\n` only as diff and patch do (not on
    form feeds, lone carriage returns or the other breaks `str.splitlines` knows)."""
    parts = text.split("\n")
    lines = [part + "\n" for part in parts[:-1]]
    if parts[-1]:
        lines.append(parts[-1])
    return lines


def tree_root(folder: Path) -> Path:
    """The folder holding `vllm/`: `folder` itself, or its parent when it is the package."""
    if (folder / "vllm" / "__init__.py").is_file():
        return folder
    if folder.name == "vllm" and (folder / "__init__.py").is_file():
        return folder.parent
    if not folder.is_dir():
        raise UsageError("--from-tree: no such folder", path=folder)
    raise UsageError(
        "--from-tree: no vllm/ package in this folder; give a site-packages folder, a vLLM"
        " checkout, or the vllm/ folder itself",
        path=folder,
    )


@dataclass(frozen=True)
class TreeDiff:
    text: str  # the payload, in the registry's form
    files: tuple[str, ...]  # changed, deleted or (with --file) created
    unreadable: tuple[str, ...] = ()  # differing files that are not UTF-8 text, left out
    deleted: tuple[str, ...] = ()  # files of the release absent from the edited tree
    not_held: tuple[str, ...] = ()  # folders of the release the edited tree has not at all
    absent: tuple[str, ...] = ()  # files of the release the edited tree lacks, not deleted
    edits: tuple[tuple[str, str | None, str | None], ...] = ()  # path, release's text, new


def diff_tree(
    folder: Path,
    pristine: ReleaseTree,
    files: Sequence[str] = (),
    *,
    deletions: bool = False,
) -> TreeDiff:
    """The difference between the edited tree at `folder` and `pristine`: every file of the
    release that differs or is gone from the edited tree (deleted), or only `files` (a file
    named there but not in the release is created). Files only in the edited tree (compiled
    modules, caches) are not looked at.

    A release file is proposed for deletion only when the edited tree holds its folder: a
    checkout or an sdist has no built or vendored folders (`vllm/third_party/...` of a
    wheel), and what it does not hold it does not delete (those folders are `not_held`; name
    a file with `files` to delete it). Even then, a file the edited tree lacks is deleted only
    with `deletions` (else it is `absent`): whatever the tree's origin, a missing file is far
    more often one the tree never had (a wheel's built or vendored file) than one the user
    deleted. Every file read must be a regular file inside the
    edited vllm/ package: a symlink leading out of it, or a FIFO, is refused (UsageError)."""
    root = tree_root(folder)
    package = (root / "vllm").resolve()
    wanted = [_relpath(f) for f in files]
    names = wanted or sorted(p for p in pristine.paths() if p.startswith("vllm/"))
    parts: list[str] = []
    changed: list[str] = []
    unreadable: list[str] = []
    deleted: list[str] = []
    edits: list[tuple[str, str | None, str | None]] = []
    not_held: dict[str, None] = {}
    absent: list[str] = []
    for rel in names:
        edited = _edited(root, package, rel)
        parent = PurePosixPath(rel).parent.as_posix()
        if edited is None and not wanted and not (root / parent).is_dir():
            not_held[_missing_folder(root, parent)] = None
            continue
        if edited is None and not wanted and not deletions:
            absent.append(rel)
            continue
        old_bytes = pristine.read(rel)
        new_bytes = None if edited is None else _read(edited, rel, root)
        if new_bytes is None and old_bytes is None:
            raise UsageError(
                f"--file {rel}: neither in the edited tree nor in the release", path=root
            )
        if old_bytes == new_bytes:
            continue
        try:
            new = None if new_bytes is None else new_bytes.decode("utf-8")
            old = None if old_bytes is None else old_bytes.decode("utf-8")
        except UnicodeDecodeError:
            unreadable.append(rel)
            continue
        executable = old is None and edited is not None and bool(edited.stat().st_mode & 0o100)
        parts.append(unified(rel, old, new, executable=executable))
        edits.append((rel, old, new))
        changed.append(rel)
        if new is None:
            deleted.append(rel)
    return TreeDiff(
        "".join(parts),
        tuple(changed),
        tuple(unreadable),
        tuple(deleted),
        tuple(not_held),
        tuple(absent),
        tuple(edits),
    )


def _edited(root: Path, package: Path, rel: str) -> Path | None:
    """The real path of `rel` in the edited tree, None when it has no such entry; refused
    when it is not a regular file or a symlink (of it or a folder above it) leads out of the
    edited vllm/ package."""
    path = root / rel
    if not os.path.lexists(path):
        return None
    real = Path(os.path.realpath(path))
    if not real.is_relative_to(package):
        raise UsageError(f"{rel}: a symlink leading out of the edited tree ({real})", path=root)
    try:
        mode = real.stat().st_mode
    except OSError:  # a link to nothing
        raise UsageError(f"{rel}: a symlink to nothing in the edited tree", path=root) from None
    if not stat.S_ISREG(mode):
        raise UsageError(f"{rel}: not a regular file in the edited tree", path=root)
    return real


def _read(path: Path, rel: str, root: Path) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise UsageError(f"{rel}: cannot be read ({exc.strerror})", path=root) from None


def _missing_folder(root: Path, parent: str) -> str:
    """The outermost folder of `parent` the edited tree lacks, as `vllm/a/b/`."""
    parts = PurePosixPath(parent).parts
    for depth in range(1, len(parts) + 1):
        here = "/".join(parts[:depth])
        if not (root / here).is_dir():
            return here + "/"
    return parent + "/"


def _relpath(name: str) -> str:
    path = PurePosixPath(name.replace(os.sep, "/"))
    if path.is_absolute() or ".." in path.parts or not path.parts or path.parts[0] != "vllm":
        raise UsageError(f"--file {name!r}: give a path under vllm/, e.g. vllm/config/vllm.py")
    return path.as_posix()


def _release_path(name: str, overlay: Path) -> str:
    """`OVERLAY=vllm/PATH`'s path, checked: a relative path under vllm/ (bad input, exit 2)."""
    path = PurePosixPath(name.replace(os.sep, "/"))
    if path.is_absolute() or ".." in path.parts or len(path.parts) < 2 or path.parts[0] != "vllm":
        raise UsageError(
            f"--overlay {overlay}={name}: give the path of a file of the release, under vllm/"
            " (e.g. vllm/config/vllm.py)",
            path=overlay,
        )
    return path.as_posix()


@dataclass(frozen=True)
class OverlayMatch:
    overlay: Path
    target: str  # the vLLM file it stands for
    version: str  # the release it was copied from (the newest of the best)
    likeness: float  # 1.0: identical lines apart from the fix
    same: tuple[str, ...]  # every release that matched as well
    compared: int = 1  # the release's files of that name compared by content
    next_best: tuple[str, float] | None = None  # the most alike other file of that name


def match_overlay(
    overlay: Path,
    text: str,
    source: ReleaseSource,
    versions: Iterable[str],
    target: str | None = None,
) -> tuple[OverlayMatch, str]:
    """The release file `overlay` is a copy of (with a fix): among `versions`, the file named
    `target`, else, by content, the file with the overlay's name most alike by lines (vLLM has
    many `__init__.py` and `utils.py`). Returns the match and the pristine text; UsageError
    when nothing is alike enough, or when other files of that name are about as alike (each
    listed: name the one meant with `target`)."""
    name = overlay.name
    if target is not None:
        target = _release_path(target, overlay)
    by_path: dict[str, tuple[float, list[str], str]] = {}  # likeness, its releases, text
    looked = 0
    for version in versions:
        looked += 1
        with source.open(version) as tree:
            paths = [target] if target else _same_name(tree, name)
            many = tree.read_many(paths) if isinstance(tree, ReadsMany) and paths else None
            for path in paths:
                data = many.get(path) if many is not None else tree.read(path)
                if data is None:
                    continue
                old = data.decode("utf-8", errors="replace")
                likeness = _likeness(old, text)
                known = by_path.get(path)
                if known is None or likeness > known[0] + 1e-9:
                    by_path[path] = (likeness, [version], old)
                elif abs(likeness - known[0]) <= 1e-9:
                    known[1].append(version)
    ranked = sorted(by_path.items(), key=lambda item: (-item[1][0], item[0]))
    if not ranked or ranked[0][1][0] < MIN_LIKENESS:
        where = target or f"a file named {name}"
        seen = f"{looked} release{'s' if looked != 1 else ''}"
        raise UsageError(
            f"--overlay: matches no release ({where} in {seen}"
            + (f"; at best {ranked[0][1][0]:.0%} alike" if ranked else "")
            + "); give --vllm X and OVERLAY=vllm/path/of/file.py",
            path=overlay,
        )
    path, (likeness, ties, old) = ranked[0]
    close = [(p, alike) for p, (alike, _, _) in ranked if likeness - alike <= CLOSE]
    if len(close) > 1:
        listed = ", ".join(f"{p} ({alike:.0%})" for p, alike in close[:6])
        more = f" and {len(close) - 6} more" if len(close) > 6 else ""
        raise UsageError(
            f"--overlay: {len(close)} files named {name} are about as alike: {listed}{more};"
            f" say which it stands for: {overlay}=vllm/PATH",
            path=overlay,
        )
    newest = max(ties, key=ranges.version_key)
    runner = (ranked[1][0], ranked[1][1][0]) if len(ranked) > 1 else None
    return OverlayMatch(overlay, path, newest, likeness, tuple(ties), len(ranked), runner), old


def _same_name(tree: ReleaseTree, name: str) -> list[str]:
    return [p for p in tree.paths() if p.startswith("vllm/") and p.rsplit("/", 1)[-1] == name]


def _likeness(old: str, new: str) -> float:
    matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    if matcher.real_quick_ratio() < MIN_LIKENESS or matcher.quick_ratio() < MIN_LIKENESS:
        return matcher.quick_ratio() * 0.5
    return matcher.ratio()
