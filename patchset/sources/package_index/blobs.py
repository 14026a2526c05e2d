"""The release cache's members, in one SQLite file: ``<cache root>/blobs.sqlite``.

One row a member: its sha256 (of the inflated bytes), its raw deflate stream as the wheel
holds it, and when it was stored (`Cache.prune` drops the rows no manifest names). A cold
check stores some 3,500 members; as a file each (the layout before this one, ``blobs/``)
their creation cost it about 2 s of system time on the 2-core machine of the benchmarks
(``benchmarks/check_collections.py``), as rows about 0.15 s.

Each process opens the file once (a forked child opens its own: a connection is never used
across a fork), threads share it under a lock. Written as the cache's other SQLite files are
(`patchset.cachedb`: WAL, no fsync, one that SQLite finds damaged made again). A row is
checked when read: it inflates to bytes of its sha256, or it is deleted and fetched again.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import logging
import os
import sqlite3
import threading
import time
import zlib
from collections.abc import Iterator
from pathlib import Path

from patchset.cachedb import discard, discard_if_damaged, open_db
from patchset.cachedir import folder_error, write_error
from patchset.errors import SourceError

LOG = logging.getLogger(__name__)

NAME = "blobs.sqlite"
TIMEOUT = 60.0  # seconds a write waits for another process's
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS blobs"
    " (sha256 TEXT PRIMARY KEY, deflated BLOB NOT NULL, stored REAL NOT NULL)",
)
_FULL = frozenset({sqlite3.SQLITE_FULL})
# Small pages: a member (9 KB deflated on average) ends in a part-filled page, and with 4 KB
# pages those ends added 8% to the file (the cache's size is a benchmark target, < 50 MB).
PAGE_SIZE = 512


class Blobs:
    """The members of one cache root, for this process (`for_root`)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._db: sqlite3.Connection | None = None
        self._lock = threading.Lock()

    def read(self, sha256: str) -> bytes | None:
        """The member named `sha256`, checked; None when absent or damaged (then deleted)."""
        with self._lock:
            row = self._ask("SELECT deflated FROM blobs WHERE sha256 = ?", (sha256,))
        if row is None:
            return None
        raw = row[0]
        try:
            data = zlib.decompress(raw, -zlib.MAX_WBITS) if isinstance(raw, bytes) else None
        except zlib.error:
            data = None
        if data is None or hashlib.sha256(data).hexdigest() != sha256:
            LOG.info("%s: member %s damaged; it is fetched again", self.path, sha256)
            self.delete([sha256])
            return None
        return data

    def has(self, sha256: str) -> bool:
        """Whether a member is there to read (it is checked when read)."""
        with self._lock:
            return self._ask("SELECT 1 FROM blobs WHERE sha256 = ?", (sha256,)) is not None

    def store(self, sha256: str, deflated: bytes) -> None:
        """Keep a member's raw deflate stream under the sha256 of its inflated bytes (a row
        already there is kept). Best-effort, as a cache is: a file removed or locked meanwhile
        (`cache clear`, another process) is opened again once, and else the member is not
        kept (this run has it in memory; the next fetches it again). A full disk is one line."""
        with self._lock:
            for _ in range(2):
                try:
                    self._conn().execute(
                        "INSERT OR IGNORE INTO blobs VALUES (?, ?, ?)",
                        (sha256, deflated, time.time()),
                    )
                except sqlite3.Error as exc:
                    if getattr(exc, "sqlite_errorcode", None) in _FULL:
                        raise write_error(self.path, str(exc), full=True) from None
                    LOG.info("%s: %s; opened again", self.path, exc)
                    discard_if_damaged(self.path, exc)
                    self._forget()
                except SourceError as exc:  # the file cannot be opened (a folder made unusable)
                    LOG.info("%s; member %s not kept", exc, sha256)
                    return
                else:
                    return

    def delete(self, names: list[str]) -> int:
        """Drop these members; the bytes freed. A file that cannot be opened is one line
        (`SourceError`), as any other cache write that cannot be made."""
        if not names:
            return 0
        freed = 0
        with self._lock:
            try:
                db = self._conn()
                for name in names:
                    row = db.execute(
                        "SELECT length(deflated) FROM blobs WHERE sha256 = ?", (name,)
                    ).fetchone()
                    if row is not None:
                        db.execute("DELETE FROM blobs WHERE sha256 = ?", (name,))
                        freed += row[0] or 0
            except sqlite3.Error as exc:
                LOG.info("%s: %s; members not dropped", self.path, exc)
                discard_if_damaged(self.path, exc)
                self._forget()
        return freed

    def stored(self) -> Iterator[tuple[str, float]]:
        """Each member's name and when it was stored (none when the file is not there)."""
        if not self.path.is_file():
            return iter(())
        with self._lock:
            try:
                return iter(self._conn().execute("SELECT sha256, stored FROM blobs").fetchall())
            except sqlite3.Error as exc:
                discard_if_damaged(self.path, exc)
                self._forget()
                return iter(())

    def _ask(self, query: str, args: tuple[object, ...]) -> tuple[object, ...] | None:
        """One row of `query`, None when there is none or the file cannot be read (a damaged
        file is removed: what it held is fetched again)."""
        if self._db is None and not self.path.is_file():
            return None  # nothing stored yet: no file made for a question
        try:
            row: tuple[object, ...] | None = self._conn().execute(query, args).fetchone()
        except (sqlite3.Error, OSError, SourceError) as exc:
            LOG.info("%s: %s; read as empty", self.path, exc)
            discard_if_damaged(self.path, exc)
            self._forget()
            return None
        return row

    def _conn(self) -> sqlite3.Connection:
        if self._db is None:
            try:
                self._db = open_db(
                    self.path, _SCHEMA, timeout=TIMEOUT, threads=True, page_size=PAGE_SIZE
                )
            except (OSError, sqlite3.Error) as exc:
                reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else exc
                raise folder_error(self.path.parent, reason) from None
        return self._db

    def _forget(self) -> None:
        if self._db is not None:
            with contextlib.suppress(sqlite3.Error):
                self._db.close()
            self._db = None


_OPEN: dict[tuple[str, int], Blobs] = {}
_OPENING = threading.Lock()


def for_root(root: Path) -> Blobs:
    """The members of the cache at `root`, as this process reads and writes them (one
    connection a process and root: a forked child makes its own, and leaves its parent's
    alone)."""
    key = (str(root), os.getpid())
    with _OPENING:
        found = _OPEN.get(key)
        if found is None:
            found = _OPEN[key] = Blobs(root / NAME)
    return found


def remove(root: Path) -> None:
    """The members' file removed (`cache clear`), its connections in this process closed."""
    with _OPENING:
        for key in [k for k in _OPEN if k[0] == str(root)]:
            _OPEN.pop(key)._forget()
    discard(root / NAME)


def _close_all() -> None:
    """Before a fork: no connection to a members' file is open (SQLite's locks are not to be
    shared with a child); each process opens its own again when it next asks. At exit: the
    last connection closed folds the write-ahead log into the file and removes it (left
    open, the log stayed beside the file, up to 4 MB)."""
    for found in list(_OPEN.values()):
        found._forget()


os.register_at_fork(before=_close_all)
atexit.register(_close_all)
