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

Reports live in the memo's folder (``<cache>/memo/reports-2.sqlite``: removing the memo
removes them), in parts (`patchset.cli.report_parts`: a report kept for the same check and
another state of the registry is brought up to date for a few edited patches), compressed,
the newest `KEPT` only, each sealed like the memo's rows (an HMAC keyed by the memo's
secret): a row that is not believed is a miss. Only the package index source and the JSON
format are answered this way; `-v` (which logs the run) never is.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import hashlib
import json
import platform
import sqlite3
import sys
import time
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchset._fs import cache_secret, seal
from patchset.cachedir import cache_root
from patchset.cli import report_parts
from patchset.cli.registry_state import Files
from patchset.cli.report_parts import Parts

if TYPE_CHECKING:
    from patchset.sources.base import ReleaseSource

FORMAT = 2  # 2: a report is kept in parts, beside the key without the registry's files
KEPT = 8  # reports kept (a few registries, option sets or branches checked in turn)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reports (key TEXT PRIMARY KEY, base TEXT NOT NULL,"
    " value BLOB NOT NULL, seal TEXT NOT NULL, stamp REAL NOT NULL)"
)
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
        platform.machine(),
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
    """The index's list of vLLM files as a check would read it now without asking the
    index (fresh in the cache), as a digest with the index's address; None when the check
    would ask the index (or the list is not to be had)."""
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
        return None
    return _listing_digest(index.where(), cached[1].get("files"))


def listing_used(source: ReleaseSource) -> str | None:
    """The digest `listing_now` gives, of the list the check that just ran read."""
    index = getattr(source, "index", None)
    files = getattr(index, "_files", None)
    if index is None or files is None:
        return None
    from dataclasses import asdict

    return _listing_digest(index.where(), [asdict(f) for f in files])


def _listing_digest(where: str, files: Any) -> str:
    text = json.dumps(files, sort_keys=True, separators=(",", ":"), default=str)
    return hashlib.sha256(f"{where}\0{text}".encode("utf-8", "surrogateescape")).hexdigest()


# -- storage ----------------------------------------------------------------------------------


@contextlib.contextmanager
def _db() -> Iterator[tuple[sqlite3.Connection, bytes] | None]:
    folder = cache_root() / "memo"
    path = folder / f"reports-{FORMAT}.sqlite"
    db = None
    try:
        secret = cache_secret(folder)
        if any(
            p.is_symlink() or (p.exists() and not p.is_file())
            for p in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm"))
        ):
            yield None
            return
        db = sqlite3.connect(path, timeout=5, isolation_level=None)
        db.execute("PRAGMA journal_mode=WAL")  # as the memo's: a cache, no fsync per report
        db.execute("PRAGMA synchronous=NORMAL")
        db.execute(_SCHEMA)
    except (OSError, sqlite3.Error):
        if db is not None:
            db.close()
        yield None
        return
    try:
        yield db, secret
    finally:
        db.close()


def get(report_key: str) -> Stored | None:
    """The report kept under `report_key`, if there is one and its seal holds."""
    return _one("SELECT key, base, value, seal FROM reports WHERE key = ?", report_key)


def latest(base: str) -> Stored | None:
    """The newest report kept under the `base_key` `base` (of another registry state)."""
    query = "SELECT key, base, value, seal FROM reports WHERE base = ? ORDER BY stamp DESC"
    return _one(query, base)


def _one(query: str, wanted: str) -> Stored | None:
    with _db() as opened:
        if opened is None:
            return None
        db, secret = opened
        try:
            row = db.execute(query, (wanted,)).fetchone()
        except sqlite3.Error:
            return None
    if row is None:
        return None
    report_key, base, value, said = row
    if not isinstance(value, bytes) or said != seal(secret, report_key, base, _sum(value)):
        return None
    try:
        record = _unpacked(zlib.decompress(value))
        code, warned = int(record["code"]), record["warnings"]
        parts = report_parts.from_data(record["parts"])
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
    if parts is None or not all(isinstance(w, str) for w in warned):
        return None
    return Stored(parts, code, tuple(warned))


def put(report_key: str, base: str, stored: Stored) -> None:
    """Keep `stored` under `report_key` (best effort: a cache that cannot be written only
    costs the speed); the oldest beyond `KEPT` go."""
    record = {
        "parts": report_parts.to_data(stored.parts),
        "code": stored.code,
        "warnings": list(stored.warnings),
    }
    value = zlib.compress(_packed(record), 1)
    with _db() as opened:
        if opened is None:
            return
        db, secret = opened
        sealed = seal(secret, report_key, base, _sum(value))
        with contextlib.suppress(sqlite3.Error), db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT OR REPLACE INTO reports VALUES (?, ?, ?, ?, ?)",
                (report_key, base, value, sealed, time.time()),
            )
            db.execute(
                "DELETE FROM reports WHERE key NOT IN"
                " (SELECT key FROM reports ORDER BY stamp DESC LIMIT ?)",
                (KEPT,),
            )


# A stored record: the length of its JSON head (8 hex digits), the head, then every result's
# text (`Parts.results`, release by release) joined by NUL (encoded JSON holds none): the
# bulk of a report read and written without JSON escaping it again.
def _packed(record: dict[str, Any]) -> bytes:
    parts = dict(record["parts"])
    body = "\0".join(text for each in parts.pop("results") for text in each)
    head = json.dumps({**record, "parts": parts}).encode("utf-8", "surrogateescape")
    return b"%08x" % len(head) + head + body.encode("utf-8", "surrogateescape")


def _unpacked(data: bytes) -> dict[str, Any]:
    size = int(data[:8], 16)
    record: dict[str, Any] = json.loads(data[8 : 8 + size])
    parts = record["parts"]
    texts = data[8 + size :].decode("utf-8", "surrogateescape").split("\0")
    count = len(parts["order"])
    if not count or len(texts) != count * len(parts["versions"]):
        raise ValueError("the results are not one per patch and release")
    parts["results"] = [texts[i : i + count] for i in range(0, len(texts), count)]
    return record


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
