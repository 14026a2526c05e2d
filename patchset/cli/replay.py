"""`patchset check --format json` answered from the report it printed last time, when nothing
that decides the report has changed: the registry's files, the releases the index lists, the
command's options, patchset's own code and the Python running it.

A warm check of an unchanged registry is then one look-up: the registry is not loaded, no
release is opened. Anything else (a patch edited, a new release listed, the index's list due
for asking again, another option) misses, and the check runs as always (its memo answering
what it can) and keeps its report for the next time.

What the key holds:

- the registry folder's files (`patchset.cli.registry_state`): each one's path, size,
  modification and change times and inode; a report is not kept while any of its files is
  younger than `RACY` seconds, nor when the files changed while the check ran;
- the index's list of vLLM files as the release source reads it (a fresh cached answer:
  the releases checked and the sha256 of each artifact read are all in it), and the
  index's address (offline, the releases come from the cache: no report is kept);
- the options that decide the report (`--vllm`, `--since`, `--pre`, `--patch`, `--fuzz`,
  `--explain`, `--served`, `--artifact`, `--verify-full`; not `--jobs`: the report
  does not depend on it);
- a digest of every module of patchset, Python's version and the machine's architecture
  (which wheel a release is read from).

Reports live in the memo's folder (``<cache>/memo/reports-4.sqlite``: removing the memo
removes them), in parts (`patchset.cli.report_parts`: a report kept for the same check and
another state of the registry is brought up to date for a few edited patches), its results
in compressed chunks, one per patch (named by their digest and shared between the reports
they are in: an edit's report writes its patch's chunk only), the newest `KEPT` only, each
sealed like the memo's rows (an HMAC keyed by the memo's secret, over the chunks' digests;
each chunk is checked against its digest): a row or chunk that is not believed is a miss.
Only the package index source and the JSON format are answered this way; `-v` (which logs
the run) never is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import os
import sqlite3
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchset import cachedb
from patchset._fs import cache_secret, seal
from patchset.cachedir import cache_root
from patchset.cli import report_parts
from patchset.cli.registry_state import Files
from patchset.cli.report_parts import Parts
from patchset.errors import SourceError

if TYPE_CHECKING:
    from patchset.sources.base import ReleaseSource

# 2: a report is kept in parts, beside the key without the registry's files; 3: its results
# in chunks, one per patch, shared by the reports they are in (an edit writes its patch's);
# 4: the patches stacked on each (`required_by`), not those named by others
FORMAT = 4
KEPT = 8  # reports kept (a few registries, option sets or branches checked in turn)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reports (key TEXT PRIMARY KEY, base TEXT NOT NULL,"
    " head BLOB NOT NULL, chunks TEXT NOT NULL, seal TEXT NOT NULL, stamp REAL NOT NULL)",
    "CREATE TABLE IF NOT EXISTS chunks (digest TEXT PRIMARY KEY, value BLOB NOT NULL)",
)
_BATCH = 500  # digests per query (well under SQLite's bound on parameters)
_PACKAGE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stored:
    """A report as it was printed: in parts, with its exit code and the warnings said first."""

    parts: Parts
    code: int
    warnings: tuple[str, ...] = ()


def eligible(args: argparse.Namespace) -> bool:
    """Whether this `check` is one a kept report may answer (and be kept from)."""
    return (
        args.format == "json"
        and not args.build
        and not args.all_builds
        and not args.suggest_ranges
        and not args.write
        and not args.offline
        and args.verbose == 0
        and (args.source or "index").strip() in {"", "index"}
        and args.source_version is None
    )


@functools.cache
def code_digest() -> str:
    """A digest of every module of patchset (what decides, checks and prints a report)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        with contextlib.suppress(OSError):
            h.update(f"{path.relative_to(_PACKAGE)}\0".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()


def base_key(args: argparse.Namespace, listing: str) -> str:
    """What keys this check's report but the registry's files: its options, the index's
    list, the registry folder's place and patchset's code."""
    served = sorted(args.served.items()) if args.served is not None else None
    parts = (
        FORMAT,
        code_digest(),
        sys.version,
        os.uname().machine,  # platform.machine(), without importing platform
        str(Path(args.registry).resolve()),
        listing,
        list(args.vllm),
        args.since,
        bool(args.pre),
        sorted(args.patches) if args.patches else None,
        args.fuzz,
        bool(args.explain),
        served,
        args.artifact,
        bool(args.verify_full),
    )
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()


def key(base: str, files: Files) -> str:
    """The key of the report made from the registry `files` under `base_key`."""
    return hashlib.sha256(f"{base}\0{files.digest}".encode()).hexdigest()


def listing_now(args: argparse.Namespace) -> str | None:
    """The index's list of vLLM files as the check will read it, as a digest with the
    index's address: the cached list while it is fresh; once it is due, asked of the index
    now, as the check would ask for it (one page, kept in the cache for the check), so that a
    report kept from before still answers a check run hours later when the list is the same
    (a CI restoring its cache). The index's SourceError (unreachable, refusing, a bad page)
    is raised, as the check's own request would (asked once, not twice); None when the list
    is not to be had otherwise (the check itself asks, and says why)."""
    from patchset.sources.package_index.cache import Cache
    from patchset.sources.package_index.client import MAX_AGE, PackageIndex
    from patchset.sources.package_index.settings import resolve

    cache = Cache.default()
    try:
        settings = resolve(args.index_url, memo=cache.root / "settings")
    except Exception:  # any problem: the check itself says it
        return None
    index = PackageIndex(args.index_url, offline=True, cache=cache, settings=settings)
    cached = cache.load_json(index.cache_key)
    if cached is None or time.time() - cached[0] >= MAX_AGE:
        try:  # the list is due: asked for now (the check then reads it from the cache)
            PackageIndex(
                args.index_url, cache=cache, settings=settings, timeout=args.timeout
            ).files()
        except SourceError:
            raise  # unreachable, refused, a bad page: what the check would say, once asked
        except Exception:  # anything else: the check asks and says what it meets
            return None
        cached = cache.load_json(index.cache_key)
        if cached is None:
            return None
    return _listing_digest(index.where(), cached[1].get("files"))


def listing_used(source: ReleaseSource) -> str | None:
    """The digest `listing_now` gives, of the list the check that just ran read."""
    index = getattr(source, "index", None)
    files = getattr(index, "_files", None)
    if index is None or files is None:
        return None
    from patchset._plain import fields_dict  # the same dict as `asdict`: its fields are plain

    return _listing_digest(index.where(), [fields_dict(f) for f in files])


def _listing_digest(where: str, files: Any) -> str:
    text = json.dumps(files, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{where}\0{text}".encode("utf-8", "surrogateescape")).hexdigest()


# -- storage ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _db() -> Iterator[tuple[sqlite3.Connection, bytes] | None]:
    path = _path()
    try:
        secret = cache_secret(path.parent)
        db = cachedb.open_db(path, _SCHEMA, timeout=5)
    except (OSError, sqlite3.Error):
        yield None
        return
    try:
        yield db, secret
    except sqlite3.Error as exc:  # a cache: no report kept or found (a damaged file removed)
        cachedb.discard_if_damaged(path, exc)
    finally:
        db.close()


def _path() -> Path:
    return cache_root() / "memo" / f"reports-{FORMAT}.sqlite"


def get(report_key: str) -> Stored | None:
    """The report kept under `report_key`, if there is one and its seal holds."""
    return _one("SELECT key, base, head, chunks, seal FROM reports WHERE key = ?", report_key)


def latest(base: str) -> Stored | None:
    """The newest report kept under the `base_key` `base` (of another registry state)."""
    query = "SELECT key, base, head, chunks, seal FROM reports WHERE base = ? ORDER BY stamp DESC"
    return _one(query, base)


def _one(query: str, wanted: str) -> Stored | None:
    texts: list[str] | None = None  # stays None when SQLite fails (`_db` swallows its error)
    with _db() as opened:
        if opened is None:
            return None
        db, secret = opened
        db.execute("BEGIN")  # one snapshot: a row and its chunks, whoever writes meanwhile
        try:
            row = db.execute(query, (wanted,)).fetchone()
            if row is None:
                return None
            report_key, base, head, listed, said = row
            if not isinstance(head, bytes) or not isinstance(listed, str):
                return None
            if said != seal(secret, report_key, base, _sum(head), listed):
                return None
            texts = _chunk_texts(db, listed.split())
        finally:
            with contextlib.suppress(sqlite3.Error):
                db.execute("COMMIT")
    if texts is None:
        return None
    try:
        record = json.loads(zlib.decompress(head))
        data, code, warned = record["parts"], int(record["code"]), record["warnings"]
        data["releases"], columns = texts[0], [t.split("\0") for t in texts[1:]]
        if len(columns) != len(data["order"]):
            raise ValueError("not one chunk per patch")
        count = len(data["versions"])
        if any(len(column) != count for column in columns):
            raise ValueError("not one result per release in a chunk")
        data["results"] = [[column[i] for column in columns] for i in range(count)]
        parts = report_parts.from_data(data)
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
    if parts is None or not all(isinstance(w, str) for w in warned):
        return None
    return Stored(parts, code, tuple(warned))


def _chunk_texts(db: sqlite3.Connection, digests: list[str]) -> list[str] | None:
    """The text of each chunk `digests` names, in their order; None when one is missing or
    its bytes are not those its digest names (the row's seal covers the digests)."""
    found: dict[str, str] = {}
    for digest, value in _chunk_rows(db, "digest, value", digests):
        try:
            data = zlib.decompress(value)
        except (zlib.error, TypeError):
            return None
        if _sum(data) != digest:
            return None
        found[digest] = data.decode("utf-8", "surrogateescape")
    try:
        return [found[d] for d in digests]
    except KeyError:
        return None


def put(report_key: str, base: str, stored: Stored) -> None:
    """Keep `stored` under `report_key` (best effort: a cache that cannot be written only
    costs the speed); the oldest beyond `KEPT` go, with the chunks no report names."""
    data = report_parts.to_data(stored.parts)
    results, releases = data.pop("results"), data.pop("releases")
    record = {"parts": data, "code": stored.code, "warnings": list(stored.warnings)}
    head = zlib.compress(json.dumps(record).encode("utf-8", "surrogateescape"), 1)
    # the chunks: the releases, then each patch's results (one per release, NUL between:
    # encoded JSON holds none), each named by its digest and shared by the reports it is in
    texts = [releases, *("\0".join(each[i] for each in results) for i in range(len(data["order"])))]
    named = [(_sum(b), b) for b in (t.encode("utf-8", "surrogateescape") for t in texts)]
    chunks = dict(named)
    listed = " ".join(d for d, _ in named)
    with _db() as opened:
        if opened is None:
            return
        db, secret = opened
        sealed = seal(secret, report_key, base, _sum(head), listed)
        with db:  # a transaction (an error: rolled back, and swallowed by `_db`)
            db.execute("BEGIN IMMEDIATE")
            have = _present(db, list(chunks))
            db.executemany(
                "INSERT OR REPLACE INTO chunks VALUES (?, ?)",
                [(d, zlib.compress(b, 1)) for d, b in chunks.items() if d not in have],
            )
            replaced = db.execute("SELECT 1 FROM reports WHERE key = ?", (report_key,)).fetchone()
            db.execute(
                "INSERT OR REPLACE INTO reports VALUES (?, ?, ?, ?, ?, ?)",
                (report_key, base, head, listed, sealed, time.time()),
            )
            gone = db.execute(
                "DELETE FROM reports WHERE key NOT IN"
                " (SELECT key FROM reports ORDER BY stamp DESC LIMIT ?)",
                (KEPT,),
            ).rowcount
            if replaced is not None or gone:
                _collect(db)


def _present(db: sqlite3.Connection, digests: list[str]) -> set[str]:
    """Those of `digests` whose chunk is stored."""
    return {d for (d,) in _chunk_rows(db, "digest", digests)}


def _chunk_rows(db: sqlite3.Connection, columns: str, digests: list[str]) -> Iterator[Any]:
    """The rows of `chunks` (their `columns`) whose digest is one of `digests`."""
    for start in range(0, len(digests), _BATCH):
        batch = digests[start : start + _BATCH]
        marks = ", ".join("?" * len(batch))  # placeholders only: the digests are bound
        yield from db.execute(f"SELECT {columns} FROM chunks WHERE digest IN ({marks})", batch)  # noqa: S608


def _collect(db: sqlite3.Connection) -> None:
    """Remove the chunks no kept report names."""
    named = {d for (listed,) in db.execute("SELECT chunks FROM reports") for d in listed.split()}
    unused = [(d,) for (d,) in db.execute("SELECT digest FROM chunks") if d not in named]
    db.executemany("DELETE FROM chunks WHERE digest = ?", unused)


def _sum(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


__all__ = [
    "FORMAT",
    "KEPT",
    "Stored",
    "base_key",
    "code_digest",
    "eligible",
    "get",
    "key",
    "latest",
    "listing_now",
    "listing_used",
    "put",
]
