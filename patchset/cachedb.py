"""The cache's SQLite files (the check's memo, the kept reports, the release members), opened
alike.

They are caches: every row is sealed and checked when read, and a row missing only costs the
time to compute it again. So they are written as caches are, with no fsync (WAL, and
``synchronous=OFF``: a commit or a checkpoint hands its pages to the system and goes on; each
fsync cost a one-patch check ~15 ms). A crash of patchset leaves them whole (WAL); a crash of
the machine may leave one that SQLite cannot read, which is then removed and made again
(`open_db`, `discard_if_damaged`), never an error.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Iterable
from pathlib import Path

_DAMAGED = frozenset({sqlite3.SQLITE_CORRUPT, sqlite3.SQLITE_NOTADB})


def open_db(
    path: Path,
    schema: Iterable[str],
    *,
    timeout: float,
    threads: bool = False,
    page_size: int | None = None,
) -> sqlite3.Connection:
    """`path` opened as a cache file (autocommit, WAL, no fsync) with the tables `schema`
    creates; one that SQLite finds damaged is removed and made again, and anything but a
    regular file at its place (or its ``-wal``/``-shm``) removed first (a folder or a FIFO
    would hang SQLite). `threads`: the connection may be used from any thread (the caller
    takes turns under a lock of its own). `page_size`: the page size a new file is made
    with (an existing one keeps its own). Raises OSError or sqlite3.Error when it cannot be
    opened."""
    path.parent.mkdir(parents=True, exist_ok=True)
    for part in _parts(path):
        _only_regular(part)
    try:
        return _open(path, tuple(schema), timeout, threads, page_size)
    except sqlite3.DatabaseError as exc:
        if not damaged(exc):
            raise
        discard(path)
        return _open(path, tuple(schema), timeout, threads, page_size)


def damaged(exc: BaseException) -> bool:
    """Whether `exc` is SQLite saying a file is not a database, or a damaged one."""
    code = getattr(exc, "sqlite_errorcode", None)  # set by SQLite, not on one made by hand
    return isinstance(exc, sqlite3.DatabaseError) and code in _DAMAGED


def discard_if_damaged(path: Path, exc: BaseException) -> None:
    """Remove the cache file at `path` when `exc` (met while using it) says it is damaged:
    the next run starts it again."""
    if damaged(exc):
        discard(path)


def discard(path: Path) -> None:
    """Remove the cache file at `path` with its ``-wal`` and ``-shm``."""
    for part in _parts(path):
        part.unlink(missing_ok=True)


def _open(
    path: Path, schema: tuple[str, ...], timeout: float, threads: bool, page_size: int | None
) -> sqlite3.Connection:
    db = sqlite3.connect(path, timeout=timeout, isolation_level=None, check_same_thread=not threads)
    try:
        if page_size is not None:  # before WAL: a file in WAL mode keeps the size it has
            db.execute(f"PRAGMA page_size={int(page_size)}")
        db.execute("PRAGMA journal_mode=WAL")
        db.execute("PRAGMA synchronous=OFF")
        for statement in schema:
            db.execute(statement)
    except BaseException:
        db.close()
        raise
    return db


def _parts(path: Path) -> tuple[Path, Path, Path]:
    return path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")


def _only_regular(path: Path) -> None:
    """Remove what is at `path` unless it is a regular file (or nothing)."""
    if path.is_symlink() or (path.exists() and not path.is_file()):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)


__all__ = ["damaged", "discard", "discard_if_damaged", "open_db"]
