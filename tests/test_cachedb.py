"""The cache's SQLite files (patchset/cachedb.py): written without fsync, so a file SQLite
finds damaged (what a crash of the machine may leave) is removed and made again, never an
error; anything but a regular file at its place is removed first."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from patchset import cachedb
from patchset.release_check.memo import Memo

SCHEMA = ("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v TEXT)",)


def _filled(path: Path, rows: int = 2000) -> None:
    db = cachedb.open_db(path, SCHEMA, timeout=5)
    with db:
        db.execute("BEGIN")
        db.executemany("INSERT INTO t VALUES (?, ?)", [(f"k{i}", "v" * 200) for i in range(rows)])
    db.close()  # checkpointed: the rows in the file itself


def test_a_cache_file_is_written_without_fsync_in_wal(tmp_path: Path) -> None:
    db = cachedb.open_db(tmp_path / "c.sqlite", SCHEMA, timeout=5)
    assert db.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert db.execute("PRAGMA synchronous").fetchone() == (0,)
    db.close()


def test_a_file_that_is_not_a_database_is_made_again(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    path.write_bytes(b"torn by a crash " * 100)
    db = cachedb.open_db(path, SCHEMA, timeout=5)
    assert db.execute("SELECT count(*) FROM t").fetchone() == (0,)
    db.close()


def test_a_damaged_page_met_later_discards_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    _filled(path)
    data = bytearray(path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\xff" * 8192  # pages in the middle
    path.write_bytes(bytes(data))
    db = cachedb.open_db(path, SCHEMA, timeout=5)  # the first page is whole: opens
    with pytest.raises(sqlite3.DatabaseError) as caught:
        db.execute("SELECT count(*), sum(length(v)) FROM t").fetchone()
    db.close()
    assert cachedb.damaged(caught.value)
    cachedb.discard_if_damaged(path, caught.value)
    assert not path.exists()
    cachedb.discard_if_damaged(path, sqlite3.OperationalError("database is locked"))


def test_what_is_not_a_regular_file_at_its_place_is_removed(tmp_path: Path) -> None:
    path = tmp_path / "c.sqlite"
    path.mkdir()
    (tmp_path / "c.sqlite-wal").symlink_to(tmp_path / "elsewhere")
    db = cachedb.open_db(path, SCHEMA, timeout=5)
    db.close()
    assert path.is_file() and not (tmp_path / "elsewhere").exists()


def test_a_damaged_memo_is_started_again_not_an_error(tmp_path: Path) -> None:
    """The memo meeting a damaged page reads as a miss, and the next run starts afresh."""
    folder = tmp_path / "memo"
    memo = Memo(folder)
    memo.put_digests("r1", {f"vllm/m{i}.py": "d" * 64 for i in range(3000)})
    memo.close()
    data = bytearray(memo.path.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 8192] = b"\xff" * 8192
    memo.path.write_bytes(bytes(data))
    with Memo(folder) as damaged:
        assert damaged.digests("r1") == {}  # damaged: a miss
    with Memo(folder) as again:
        again.put_digests("r1", {"vllm/a.py": "aa"})
    with Memo(folder) as after:
        assert after.digests("r1") == {"vllm/a.py": "aa"}
