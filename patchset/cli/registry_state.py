"""What the registry folder holds, as a kept report (`patchset.cli.replay`) compares it: every
file's and folder's status (path, size, modification and change times in nanoseconds, inode),
by the entry at the top of the folder it is in, and on demand each entry's content.

Writing a file changes its change time, which no program can set: two states whose statuses
are the same hold the same bytes, except for a write within one tick of a coarse clock, which
`settled` rules out for a state about to be kept. Statuses differ where bytes may not (a
checkout or a restore rewrites a file as it was): `content_digests` then tells.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

RACY = 2.0  # seconds: a registry file younger than this keeps its report from being kept


@dataclass(frozen=True)
class Files:
    """The registry folder as `files_state` found it: a digest of every file's and folder's
    path and status, the newest modification or change time among them (seconds), and a
    digest of each entry at its top (``name/`` for a folder: all it holds)."""

    digest: str
    newest: float
    tops: dict[str, str]


def files_state(root: Path) -> Files:
    """Every file and folder under `root` (links not followed), by path, size, times and
    inode, as a whole and by the entry at the top they are in: a folder, then its files and
    links in name order, then each of its folders in turn (top-down, as `os.walk` goes)."""
    every: list[str] = []  # a line per file and folder, in that order
    by_top: dict[str, list[str]] = {}
    newest = 0

    def add(rel: str, top: str, st: os.stat_result | None) -> None:
        nonlocal newest
        if st is None:
            line = f"{rel}\0-\n"
        else:
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
            line = (
                f"{rel}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}"
                f"\0{st.st_ctime_ns}\0{st.st_ino}\0{st.st_dev}\n"
            )
        every.append(line)
        by_top.setdefault(top, []).append(line)

    def walk(path: str, rel: str, top: str, st: os.stat_result | None) -> None:
        add(rel, top, st)
        try:
            with os.scandir(path) as listing:
                entries = sorted(listing, key=lambda e: e.name)
        except OSError:
            return
        folders: list[os.DirEntry[str]] = []
        links: list[os.DirEntry[str]] = []  # folders by a link: listed, not walked into
        for entry in entries:
            if not _is_dir(entry):
                add(f"{rel}/{entry.name}" if rel else entry.name, top or entry.name, _lstat(entry))
            else:
                (links if entry.is_symlink() else folders).append(entry)
        for entry in links:
            add(f"{rel}/{entry.name}" if rel else entry.name, top or entry.name, _lstat(entry))
        for entry in folders:
            inner = f"{rel}/{entry.name}" if rel else entry.name
            walk(entry.path, inner, top or f"{entry.name}/", _lstat(entry))

    try:
        own: os.stat_result | None = os.lstat(root)
    except OSError:
        own = None
    walk(str(root), "", "", own)
    tops = {k: _digest(lines) for k, lines in by_top.items()}
    return Files(_digest(every), newest / 1e9, tops)


def _is_dir(entry: os.DirEntry[str]) -> bool:
    try:
        return entry.is_dir()  # a link to a folder too (listed with the files, not walked)
    except OSError:
        return False


def _lstat(entry: os.DirEntry[str]) -> os.stat_result | None:
    try:
        return entry.stat(follow_symlinks=False)
    except OSError:
        return None


def _digest(lines: list[str]) -> str:
    return hashlib.sha256("".join(lines).encode("utf-8", "surrogateescape")).hexdigest()


def content_digests(root: Path, tops: Iterable[str]) -> dict[str, str]:
    """A digest of the content of each of `tops` (`Files.tops` names) under `root`: a
    folder's entries (their paths, and each file's bytes or link's target), a file's bytes,
    and for "" (the folder itself) the names in it."""
    found: dict[str, str] = {}
    for top in tops:
        h = hashlib.sha256()
        if not top:
            with contextlib.suppress(OSError):
                names = sorted(p.name for p in root.iterdir())
                h.update("\0".join(names).encode("utf-8", "surrogateescape"))
        else:
            for rel, path in (
                _entries(root / top.rstrip("/")) if top.endswith("/") else [("", root / top)]
            ):
                h.update(f"{rel}\0".encode("utf-8", "surrogateescape") + _content(path) + b"\0")
        found[top] = h.hexdigest()
    return found


def _entries(folder: Path) -> list[tuple[str, Path]]:
    """Every entry under `folder` (links not walked into), by relative path, in order."""
    out: list[tuple[str, Path]] = []
    for where, dirs, names in os.walk(folder):
        for name in (*dirs, *names):
            path = Path(where, name)
            out.append((path.relative_to(folder).as_posix(), path))
    return sorted(out)


def _content(path: Path) -> bytes:
    """A link's target, a file's bytes, a folder's mark (what a content digest reads)."""
    try:
        if path.is_symlink():
            return b"L" + str(path.readlink()).encode("utf-8", "surrogateescape")
        if path.is_dir():
            return b"D"
        return b"F" + path.read_bytes()
    except OSError:
        return b"?"


def settled(files: Files, root: Path, started: float, *, again: bool = True) -> bool:
    """Whether a report made from the registry `files` (taken at `started`) may be kept:
    none was written within `RACY` seconds of `started`, and (`again`) the files are as
    they were. A report whose every entry's content digest was read before the check ran
    needs no second look: an entry written meanwhile has another status next time, and its
    content is compared with the digest kept, which is of what was there before."""
    if files.newest >= started - RACY:
        return False
    return not again or files_state(root).digest == files.digest


__all__ = ["RACY", "Files", "content_digests", "files_state", "settled"]
