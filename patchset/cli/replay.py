"""`patchset check --format json` answered from the report it printed last time, when nothing
that decides the report has changed: the registry's files, the releases the index lists, the
command's options, patchset's own code and the Python running it.

A warm check of an unchanged registry is then one look-up: the registry is not loaded, no
release is opened. Anything else (a patch edited, a new release listed, the index's list due
for asking again, another option) misses, and the check runs as always (its memo answering
what it can) and keeps its report for the next time.

What the key holds:

- the registry folder's files: each one's path, size, modification and change times (in
  nanoseconds) and inode. Writing a file changes its change time, which no program can set;
  a report is not kept while any of its files is younger than `RACY` seconds (a file system
  whose clock ticks coarsely could see a write within the same tick), nor when the files
  changed while the check ran;
- the index's list of vLLM files as the release source reads it (a fresh cached answer:
  the releases checked and the sha256 of each artifact read are all in it), and the
  index's address (offline, the releases come from the cache: no report is kept);
- the options that decide the report (`--vllm`, `--since`, `--pre`, `--patch`, `--fuzz`,
  `--explain`, `--served`, `--artifact`, `--verify-full`; not `--jobs`: the report
  does not depend on it);
- a digest of every module of patchset, Python's version and the machine's architecture
  (which wheel a release is read from).

Reports live in the memo's folder (``<cache>/memo/reports-1.sqlite``: removing the memo
removes them), compressed, the newest `KEPT` only, each sealed like the memo's rows (an HMAC
keyed by the memo's secret): a row that is not believed is a miss. Only the package index
source and the JSON format are answered this way; `-v` (which logs the run) never is.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
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

if TYPE_CHECKING:
    from patchset.sources.base import ReleaseSource

FORMAT = 1
KEPT = 8  # reports kept (a few registries, option sets or branches checked in turn)
RACY = 2.0  # seconds: a registry file younger than this keeps its report from being kept
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reports"
    " (key TEXT PRIMARY KEY, value BLOB NOT NULL, seal TEXT NOT NULL, stamp REAL NOT NULL)"
)
_PACKAGE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Stored:
    """A report as it was printed: its JSON text, the exit code, the warnings said first."""

    text: str
    code: int
    warnings: tuple[str, ...] = ()


@dataclass(frozen=True)
class Files:
    """The registry folder's files as `files_state` found them: a digest of every file's
    path and status, and the newest modification or change time among them (seconds)."""

    digest: str
    newest: float


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


def files_state(root: Path) -> Files:
    """Every file under `root` (links not followed), by path, size, times and inode."""
    h = hashlib.sha256()
    newest = 0
    base = len(str(root)) + 1
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        for name in sorted(names):
            path = f"{folder}/{name}"
            try:
                st = os.lstat(path)
            except OSError:
                st = None
            if st is None:
                h.update(f"{path[base:]}\0-\n".encode("utf-8", "surrogateescape"))
                continue
            newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
            h.update(
                f"{path[base:]}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_ctime_ns}"
                f"\0{st.st_ino}\0{st.st_dev}\n".encode("utf-8", "surrogateescape")
            )
    return Files(h.hexdigest(), newest / 1e9)


def code_digest() -> str:
    """A digest of every module of patchset (what decides, checks and prints a report)."""
    h = hashlib.sha256()
    for path in sorted(_PACKAGE.rglob("*.py")):
        with contextlib.suppress(OSError):
            h.update(f"{path.relative_to(_PACKAGE)}\0".encode() + path.read_bytes() + b"\0")
    return h.hexdigest()


def key(args: argparse.Namespace, files: Files, listing: str) -> str:
    """The key of this check's report: its options, registry files, index list and code."""
    served = sorted(args.served.items()) if args.served is not None else None
    parts = (
        FORMAT,
        code_digest(),
        sys.version,
        platform.machine(),
        str(Path(args.registry).resolve()),
        files.digest,
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
        bool(args.offline),
    )
    return hashlib.sha256(repr(parts).encode("utf-8", "surrogateescape")).hexdigest()


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


@contextlib.contextmanager
def _db() -> Iterator[tuple[sqlite3.Connection, bytes] | None]:
    folder = cache_root() / "memo"
    path = folder / f"reports-{FORMAT}.sqlite"
    db = None
    try:
        secret = cache_secret(folder)
        if path.is_symlink() or (path.exists() and not path.is_file()):
            yield None
            return
        db = sqlite3.connect(path, timeout=5, isolation_level=None)
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
    with _db() as opened:
        if opened is None:
            return None
        db, secret = opened
        try:
            row = db.execute(
                "SELECT value, seal FROM reports WHERE key = ?", (report_key,)
            ).fetchone()
        except sqlite3.Error:
            return None
    if row is None:
        return None
    value, said = row
    if not isinstance(value, bytes) or said != seal(secret, report_key, _sum(value)):
        return None
    try:
        record = json.loads(zlib.decompress(value))
        text, code, warned = record["text"], int(record["code"]), record["warnings"]
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
    if not isinstance(text, str) or not all(isinstance(w, str) for w in warned):
        return None
    return Stored(text, code, tuple(warned))


def put(report_key: str, stored: Stored) -> None:
    """Keep `stored` under `report_key` (best effort: a cache that cannot be written only
    costs the speed); the oldest beyond `KEPT` go."""
    record = {"text": stored.text, "code": stored.code, "warnings": list(stored.warnings)}
    value = zlib.compress(json.dumps(record).encode("utf-8", "surrogateescape"), 1)
    with _db() as opened:
        if opened is None:
            return
        db, secret = opened
        sealed = seal(secret, report_key, _sum(value))
        with contextlib.suppress(sqlite3.Error), db:
            db.execute("BEGIN IMMEDIATE")
            db.execute(
                "INSERT OR REPLACE INTO reports VALUES (?, ?, ?, ?)",
                (report_key, value, sealed, time.time()),
            )
            db.execute(
                "DELETE FROM reports WHERE key NOT IN"
                " (SELECT key FROM reports ORDER BY stamp DESC LIMIT ?)",
                (KEPT,),
            )


def _sum(value: bytes) -> str:
    return hashlib.sha256(value).hexdigest()


def settled(files: Files, root: Path, started: float) -> bool:
    """Whether a report made from the registry `files` (taken at `started`) may be kept:
    the files are as they were, and none was written within `RACY` seconds of `started`."""
    return files.newest < started - RACY and files_state(root).digest == files.digest


__all__ = [
    "Files",
    "Stored",
    "code_digest",
    "eligible",
    "files_state",
    "get",
    "key",
    "listing_now",
    "listing_used",
    "put",
    "settled",
]
