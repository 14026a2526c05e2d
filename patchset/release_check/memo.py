"""A memo of check results, keyed by content: re-checking an unchanged registry against known
releases is a lookup, and editing one patch re-evaluates that patch only.

One SQLite file under the cache root, in a folder of its own: ``<cache root>/memo/check-4.sqlite``
(the ``4`` is `FORMAT`; a new format starts a new file, the old one is simply no longer read).
Three tables:

- ``results``: key -> one result, a JSON array of its fields in the order `CheckResult`
  declares them (`CheckResult.to_memo`), but the release and the range, which the reader
  gives. The key is a sha256 over the memo format, a digest of
  the code that decides verdicts, the patch's digest (patch.toml and every payload), the
  variant meant for the release, the fuzz allowed, whether nearest lines were computed, and
  the sha256 of every file the patch reads (each variant's targets and the probe's file, absent
  files marked). A stacked patch's key adds, for every patch in its requires chain (in
  order, transitively), its id, digest and the variant applied, and the sha256 of every file
  those read: editing a required patch re-evaluates its dependents. A result with a missing
  target also depends on the rest of the tree (where the file went), so its key adds the
  release's own digest.
- ``releases``: release digest -> the sha256 of each of its files a check has asked for (one
  JSON object, path -> sha256, "-" for a file the release lacks), for releases whose digest
  pins their content (the package index's, checked against the index): a warm check then
  reads no file, and takes a release's digests with one row.
- ``facts``: key -> a fact about one source (`patchset.kernel.kept`), as JSON compressed with
  zlib (the seal over the JSON): what compiling
  it told (kind ``known``, `pycompile.known_plain`: where its defs and classes start and end,
  its ``global`` lines, its ``__future__`` flags, or its compile error), for each file an edit
  was judged against (a release's file, or what a required patch made of it); the names its
  module binds (kind ``scope``, `touches`), for each module a python patch's names were
  looked up in. The key is a sha256 over the memo format, the digest of the modules that
  work the facts out (`_FACT_MAKERS`: an upgrade leaving them as they were keeps the facts),
  the Python, the kind and a digest of the source's bytes. An edited patch's check then judges
  its edits of a large file without compiling the release's file again (the units its edit
  changes only), and looks its names up without reading the module again. Written with each
  release's results; a check whose memo holds no fact asks for none.

Every key covers the Python that runs the check: whether a file compiles, and the compiler's
message, are that Python's.

A key met again in a later release of the same check (the files it reads have the same bytes
there) is answered from the rows already read, neither fetched nor decoded again; a row whose
text was already decoded under another key (the same outcome) is not decoded again.

Every row carries a seal (an HMAC over its fields, keyed by a secret made with the memo,
`.seal-key`, 0600) checked when it is read: a row rewritten
or torn is dropped and computed again, never believed. A folder or FIFO where the file should
be is removed first (sqlite would fail on the one and hang on the other).

Results from git clones (whose history is a signal) are never memoised. Writes are best-effort:
a cache that cannot be written (read-only, locked for too long) only costs the speed.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import sqlite3
import sys
import zlib
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path

from patchset import cachedb
from patchset._fs import cache_secret, seal
from patchset.cachedir import cache_root
from patchset.release_check.report import CheckResult

# 2: each row carries `seal`, a sha256 over the row, checked when read; 3: a result is a JSON
# array in its fields' order (an object before), the key a sha256 over the repr of its parts;
# 4: a release's file digests are one row of table `releases` (a row per file of `files`)
FORMAT = 4
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS results (key TEXT PRIMARY KEY, value TEXT NOT NULL, seal TEXT)",
    "CREATE TABLE IF NOT EXISTS releases"
    " (release TEXT PRIMARY KEY, digests TEXT NOT NULL, seal TEXT)",
    "CREATE TABLE IF NOT EXISTS facts (key TEXT PRIMARY KEY, value TEXT NOT NULL, seal TEXT)",
)
# The modules whose code decides a verdict: a change to any of them starts a fresh memo.
_DECIDERS = (
    "kernel/hunks.py",
    "kernel/sites.py",
    "kernel/filelines.py",
    "kernel/served.py",
    "kernel/pycompile.py",
    "kernel/pyunits.py",
    "kernel/indents.py",
    "kernel/touches.py",
    "kernel/kept.py",
    "engine/evaluate.py",
    "engine/order.py",
    "release_check/report.py",
    "release_check/run.py",
    "release_check/verdicts.py",
    "release_check/landed.py",
    "release_check/moves.py",
)

# The modules that work out the facts kept in table `facts` (`kernel/kept.py`): their digest,
# not the whole deciding code's, keys a fact, so an upgrade of patchset that leaves them as
# they were keeps what was worked out about release files (every kernel module they import
# is here: a test holds it).
_FACT_MAKERS = (
    "kernel/kept.py",
    "kernel/pycompile.py",
    "kernel/pyunits.py",
    "kernel/indents.py",
    "kernel/touches.py",
)


def memo_dir() -> Path:
    return cache_root() / "memo"


def _code_digest(modules: tuple[str, ...] = _DECIDERS) -> str:
    root = Path(__file__).resolve().parent.parent
    h = hashlib.sha256()
    for rel in modules:
        path = root / rel
        h.update(rel.encode() + b"\0" + (path.read_bytes() if path.is_file() else b""))
    return h.hexdigest()


def file_digest(data: bytes | None) -> str:
    return "-" if data is None else hashlib.sha256(data).hexdigest()


_SECRETS: dict[Path, bytes] = {}


def _secret(folder: Path) -> bytes:
    if folder not in _SECRETS:
        _SECRETS[folder] = cache_secret(folder)
    return _SECRETS[folder]


def _seal(folder: Path, *fields: str) -> str:
    """A row's seal, stored beside it: an HMAC keyed by the memo's own secret (made with the
    memo, 0600), so a row rewritten with a recomputed digest, or torn, is not believed; it is
    dropped and its result computed again."""
    return seal(_secret(folder), *fields)


class Memo:
    """The memo's file, opened on first use; every method is safe to call when it cannot be."""

    def __init__(self, folder: Path | None = None) -> None:
        self.path = (folder or memo_dir()) / f"check-{FORMAT}.sqlite"
        self._db: sqlite3.Connection | None = None
        self._broken = False
        self.code = _code_digest()
        # the Python too: whether a file compiles, and the compiler's message, are its own
        python = f"{sys.implementation.name}-{sys.version}"
        self._base = hashlib.sha256(f"{FORMAT}\0{self.code}\0{python}\0".encode())
        makers = _code_digest(_FACT_MAKERS)
        self._facts_base = hashlib.sha256(f"{FORMAT}\0facts\0{makers}\0{python}\0".encode())
        self._read: dict[str, CheckResult] = {}  # the rows read this run, by key
        self._values: dict[str, CheckResult] = {}  # and by their text
        self._absent: set[str] = set()  # the keys asked for this run and not found
        self.hits = 0  # results `get` answered
        self.misses = 0  # and those it did not
        self._facts: bool | None = None  # whether table `facts` has a row (None: not asked)
        self._new_facts: dict[str, str] = {}  # key -> value, written with the next results

    def _conn(self) -> sqlite3.Connection | None:
        if self._db is None and not self._broken:
            try:
                db = cachedb.open_db(self.path, _SCHEMA, timeout=30)
            except (OSError, sqlite3.Error):
                self._broken = True
                return None
            try:
                _secret(self.path.parent)  # made with the memo: no secret, no memo
            except OSError:
                db.close()
                self._broken = True
                return None
            self._db = db
        return self._db

    def _failed(self, exc: sqlite3.Error) -> None:
        """Carry on without the memo (read-only, locked); one SQLite finds damaged is
        removed, to start again next run."""
        self._broken = True
        cachedb.discard_if_damaged(self.path, exc)

    def key(self, *parts: object) -> str:
        """A sha256 over the memo format, the deciding code's digest and the repr of `parts`
        (strings, numbers, booleans, None, and lists and tuples of them: a repr that tells
        them apart)."""
        h = self._base.copy()
        h.update(repr(parts).encode("utf-8", "surrogateescape"))
        return h.hexdigest()

    def get(self, key: str | None) -> CheckResult | None:
        """The result memoised under `key` (for no release yet, as `get_many` gives it),
        counted as a hit; None when there is none, or `key` is None (a result not to be
        memoised), counted as a miss. A key `get_many` asked for is not read again."""
        found = self._read.get(key) if key is not None else None
        if found is None and key is not None and key not in self._absent:
            found = self.get_many([key]).get(key)
        if found is None:
            self.misses += 1
        else:
            self.hits += 1
        return found

    def get_many(self, keys: Iterable[str]) -> dict[str, CheckResult]:
        """The memoised result of each key found, for no release yet (`CheckResult.at`
        gives it its release and range); a key read earlier by this memo is not read again.
        Not counted: `get` counts (a check reads a release's keys here first, in one query)."""
        wanted = list(dict.fromkeys(keys))
        known = {k: self._read[k] for k in wanted if k in self._read}
        wanted = [k for k in wanted if k not in known]
        db = self._conn() if wanted else None
        if db is None:
            return known
        found = dict(known)
        bad: list[str] = []
        try:
            for start in range(0, len(wanted), 500):
                chunk = wanted[start : start + 500]
                marks = ",".join("?" * len(chunk))
                query = f"SELECT key, value, seal FROM results WHERE key IN ({marks})"  # noqa: S608 - only ?s
                for key, value, seal in db.execute(query, chunk):
                    result = None
                    if seal == _seal(
                        self.path.parent, key, value
                    ):  # the same row under many keys: decoded once
                        result = self._values.get(value) or _decoded(value)
                    if result is None:
                        bad.append(key)
                    else:
                        found[key] = self._read[key] = self._values[value] = result
        except sqlite3.Error as exc:
            if cachedb.damaged(exc):
                self._failed(exc)
            return known
        self._absent.update(k for k in wanted if k not in found)
        if bad:
            self._write(db, "DELETE FROM results WHERE key = ?", [(k,) for k in bad])
        return found

    def put_many(self, items: dict[str, CheckResult]) -> None:
        """Keep `items` (key -> result), and the files' facts kept since the last call."""
        db = self._conn()
        if db is None:
            return
        if self._new_facts:  # each compressed (a module's names: 3 KB of JSON, 0.7 KB so)
            folder = self.path.parent
            facts = [
                (k, zlib.compress(v.encode(), 1), _seal(folder, k, v))
                for k, v in self._new_facts.items()
            ]
            self._new_facts.clear()
            self._write(
                db, "INSERT OR REPLACE INTO facts (key, value, seal) VALUES (?, ?, ?)", facts
            )
        if not items:
            return
        self._absent.difference_update(items)  # read again if met again
        values = {k: json.dumps(r.to_memo(), separators=(",", ":")) for k, r in items.items()}
        rows = [(k, v, _seal(self.path.parent, k, v)) for k, v in values.items()]
        self._write(db, "INSERT OR REPLACE INTO results (key, value, seal) VALUES (?, ?, ?)", rows)

    def fact(self, kind: str, key: bytes) -> object | None:
        """The fact of `kind` kept for the source of digest `key` (`kernel.kept.Store`), as
        JSON's values, if kept and sealed (its kind's module checks the rest); a row whose
        seal fails is dropped. A memo with no fact is asked once."""
        db = self._conn() if self._facts is not False else None
        if db is None:
            return None
        row_key = self._fact_key(kind, key)
        try:
            if self._facts is None:
                self._facts = db.execute("SELECT 1 FROM facts LIMIT 1").fetchone() is not None
                if not self._facts:
                    return None
            query = "SELECT value, seal FROM facts WHERE key = ?"
            row = db.execute(query, (row_key,)).fetchone()
        except sqlite3.Error as exc:
            if cachedb.damaged(exc):
                self._failed(exc)
            return None
        if row is None:
            return None
        value, seal = row
        with contextlib.suppress(zlib.error, UnicodeDecodeError, ValueError, RecursionError):
            text = zlib.decompress(value).decode() if isinstance(value, bytes) else None
            if text is not None and seal == _seal(self.path.parent, row_key, text):
                found: object = json.loads(text)
                return found
        self._write(db, "DELETE FROM facts WHERE key = ?", [(row_key,)])
        return None

    def keep_fact(self, kind: str, key: bytes, value: object) -> None:
        """Keep `value` (JSON's values) as the fact of `kind` for the source of digest `key`
        (written with the next `put_many`)."""
        self._new_facts[self._fact_key(kind, key)] = json.dumps(value, separators=(",", ":"))

    def _fact_key(self, kind: str, key: bytes) -> str:
        """A fact's row: a sha256 over the memo format, the digest of the code that works the
        facts out (`_FACT_MAKERS`), the Python, the kind and the source's digest."""
        h = self._facts_base.copy()
        h.update(f"{kind}\0{key.hex()}".encode())
        return h.hexdigest()

    def digests(self, release: str) -> dict[str, str]:
        """The file digests already known for a release (by its own digest)."""
        db = self._conn()
        if db is None:
            return {}
        try:
            return self._digests(db, release)
        except sqlite3.Error as exc:
            if cachedb.damaged(exc):
                self._failed(exc)
            return {}

    def put_digests(self, release: str, digests: dict[str, str]) -> None:
        """Add `digests` to those known for `release` (read and written in one transaction:
        two checks of the same release keep both their files)."""
        db = self._conn()
        if db is None or not digests:
            return
        try:
            with db:
                db.execute("BEGIN IMMEDIATE")
                known = {**self._digests(db, release), **digests}
                value = json.dumps(known, sort_keys=True, separators=(",", ":"))
                row = (release, value, _seal(self.path.parent, release, value))
                db.execute("INSERT OR REPLACE INTO releases VALUES (?, ?, ?)", row)
        except sqlite3.Error as exc:
            self._failed(exc)

    def _digests(self, db: sqlite3.Connection, release: str) -> dict[str, str]:
        """The release's row, if sealed and a mapping of texts; a row that is not is dropped
        (its digests are taken again)."""
        query = "SELECT digests, seal FROM releases WHERE release = ?"
        row = db.execute(query, (release,)).fetchone()
        if row is None:
            return {}
        value, seal = row
        try:
            sealed = isinstance(value, str) and seal == _seal(self.path.parent, release, value)
            known = json.loads(value) if sealed else None
        except ValueError:
            known = None
        if isinstance(known, dict) and all(
            type(p) is str and type(d) is str for p, d in known.items()
        ):
            return known
        db.execute("DELETE FROM releases WHERE release = ?", (release,))
        return {}

    def _write(
        self, db: sqlite3.Connection, sql: str, rows: Sequence[Sequence[str | bytes]]
    ) -> None:
        try:
            with db:
                db.execute("BEGIN")
                db.executemany(sql, rows)
        except sqlite3.Error as exc:
            self._failed(exc)

    def __enter__(self) -> Memo:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        """Write the facts kept since the last results and close the file (a later use opens
        it again)."""
        self.put_many({})  # the facts kept since the last results
        self._read.clear()
        self._values.clear()
        self._absent.clear()
        if self._db is not None:
            self._db.close()
            self._db = None


def _decoded(value: str) -> CheckResult | None:
    """A row's result (for no release yet); None for one that is not a result's row."""
    try:
        return CheckResult.from_memo(json.loads(value))
    except (ValueError, TypeError, KeyError, IndexError):
        return None


def clear(folder: Path | None = None) -> None:
    """Forget every memoised result (the benchmark's "no memo" run), and the reports the
    command line keeps beside them (`patchset.cli.replay`)."""
    base = folder or memo_dir()
    for pattern in (f"check-{FORMAT}.sqlite*", "reports-*.sqlite*"):
        for path in base.glob(pattern):
            path.unlink(missing_ok=True)


Reader = Callable[[str], bytes | None]
