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
import dataclasses
import functools
import hashlib
import json
import os
import platform
import sqlite3
import sys
import time
import zlib
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchset._fs import cache_secret, seal
from patchset.cachedir import cache_root
from patchset.cli.output import Encoded, dumps, encoded
from patchset.errors import ExitCode

if TYPE_CHECKING:
    from patchset.registry import Patch, Registry
    from patchset.release_check import CheckReport
    from patchset.sources.base import ReleaseSource

FORMAT = 2  # 2: a report is kept in parts, beside the key without the registry's files
KEPT = 8  # reports kept (a few registries, option sets or branches checked in turn)
RACY = 2.0  # seconds: a registry file younger than this keeps its report from being kept
EDITED_MOST = 4  # patches edited since the kept report that are checked alone (more: all)
_SCHEMA = (
    "CREATE TABLE IF NOT EXISTS reports (key TEXT PRIMARY KEY, base TEXT NOT NULL,"
    " value BLOB NOT NULL, seal TEXT NOT NULL, stamp REAL NOT NULL)"
)
_PACKAGE = Path(__file__).resolve().parent.parent


@dataclass(frozen=True)
class Files:
    """The registry folder as `files_state` found it: a digest of every file's and folder's
    path and status, the newest modification or change time among them (seconds), and a
    digest of each entry at its top (``name/`` for a folder: all it holds)."""

    digest: str
    newest: float
    tops: dict[str, str]


@dataclass(frozen=True)
class Parts:
    """A check's JSON report in parts (each value already `encoded` where it stands), with
    what an edit of one patch must leave alone for the report to be brought up to date by
    checking that patch only: every patch's digest (the registry's digest is made of them),
    what decides each checked patch's relations to the others (`facts`), the patches others
    name, and the registry folder's `Files.tops` when the report was made, with a digest of
    each one's content (an entry whose status changed but not its bytes, as a checkout or a
    restore leaves it, is not an edit)."""

    schema: str
    registry: str
    versions: tuple[str, ...]
    releases: str
    order: tuple[str, ...]  # the patches checked, in the report's order
    results: tuple[tuple[str, ...], ...]  # per release, one per patch of `order`
    attention: dict[str, int]  # per patch, its results that need attention
    suggested: dict[str, str]
    gates: dict[str, str]
    digests: tuple[tuple[str, str], ...]  # every patch of the registry: id, digest
    support: tuple[tuple[str, str], ...]  # every support package: name, digest
    facts: dict[str, str]
    referenced: tuple[str, ...]
    tops: dict[str, str]
    contents: dict[str, str] = dataclasses.field(default_factory=dict)  # `content_digests`

    @property
    def code(self) -> int:
        return ExitCode.ATTENTION if any(self.attention.values()) else ExitCode.OK

    def text(self) -> str:
        """The report's JSON, as `dumps(report.to_dict())` writes it, and a line end."""
        return (
            dumps(
                {
                    "schema": self.schema,
                    "registry": self.registry,
                    "releases": Encoded(self.releases),
                    "results": [Encoded(text) for each in self.results for text in each],
                    "suggested_ranges": {k: Encoded(v) for k, v in self.suggested.items()},
                    "patches": {k: Encoded(v) for k, v in self.gates.items()},
                    "exit_code": int(self.code),
                }
            )
            + "\n"
        )


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


def files_state(root: Path) -> Files:
    """Every file and folder under `root` (links not followed), by path, size, times and
    inode, as a whole and by the entry at the top they are in."""
    whole = hashlib.sha256()
    tops: dict[str, hashlib._Hash] = {}
    newest = 0
    base = len(str(root)) + 1
    for folder, dirs, names in os.walk(root):
        dirs.sort()
        rel = folder[base:]
        top = rel.split("/", 1)[0] + "/" if rel else ""
        links = [d for d in dirs if Path(folder, d).is_symlink()]  # not walked into
        for name in ("", *sorted(names), *links):
            path = f"{folder}/{name}" if name else folder
            try:
                st = os.lstat(path)
            except OSError:
                line = f"{path[base:]}\0-\n"
            else:
                newest = max(newest, st.st_mtime_ns, st.st_ctime_ns)
                line = (
                    f"{path[base:]}\0{st.st_mode}\0{st.st_size}\0{st.st_mtime_ns}"
                    f"\0{st.st_ctime_ns}\0{st.st_ino}\0{st.st_dev}\n"
                )
            data = line.encode("utf-8", "surrogateescape")
            whole.update(data)
            own = top or (name if name else "")
            tops.setdefault(own, hashlib.sha256()).update(data)
    return Files(whole.hexdigest(), newest / 1e9, {k: h.hexdigest() for k, h in tops.items()})


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


# -- parts ------------------------------------------------------------------------------------


def facts(patch: Patch) -> str:
    """What of a patch decides the registry's checks across patches and the files a check of
    it rests on (an edit changing none of it may be checked alone): its id, relations,
    switch names, modules, files read and names touched."""
    switch = (patch.switch.env, patch.switch.aliases) if patch.switch is not None else None
    said = (
        patch.id,
        patch.requires,
        patch.conflicts,
        patch.lifecycle.superseded_by,
        switch,
        patch.modules_needed(),
        patch.reads,
        patch.touches,
    )
    return hashlib.sha256(repr(said).encode("utf-8", "surrogateescape")).hexdigest()


def parts_of(report: CheckReport, registry: Registry, files: Files) -> Parts | None:
    """`report` (of `registry`, whose folder `files` is) in parts; None when its results are
    not one per checked patch in every release, in the same order (then it is not kept)."""
    versions = tuple(r.version for r in report.releases)
    count = len(report.results) // len(versions) if versions else 0
    order = tuple(r.patch for r in report.results[:count])
    if not versions or count * len(versions) != len(report.results) or len(set(order)) < count:
        return None
    results: list[tuple[str, ...]] = []
    attention = dict.fromkeys(order, 0)
    for i, version in enumerate(versions):
        mine = report.results[i * count : (i + 1) * count]
        if tuple(r.patch for r in mine) != order or any(r.vllm != version for r in mine):
            return None
        results.append(tuple(encoded(r.to_dict(), 2) for r in mine))
        for r in mine:
            attention[r.patch] += r.needs_attention
    data = report.to_dict()
    referenced = {
        other
        for p in registry.patches
        for other in (*p.requires, *p.conflicts, p.lifecycle.superseded_by)
        if other
    }
    by_id = {p.id: p for p in registry.patches}
    return Parts(
        schema=str(data["schema"]),
        registry=report.registry,
        versions=versions,
        releases=encoded(data["releases"], 1),
        order=order,
        results=tuple(results),
        attention=attention,
        suggested={k: encoded(list(v), 2) for k, v in report.suggested.items()},
        gates={k: encoded(v, 2) for k, v in report.patches.items()},
        digests=tuple((p.id, p.digest) for p in registry.patches),
        support=tuple((s.name, s.digest) for s in registry.support),
        facts={i: facts(by_id[i]) for i in order},
        referenced=tuple(sorted(referenced)),
        tops=files.tops,
    )


def _parts_data(parts: Parts) -> dict[str, Any]:
    return {f.name: getattr(parts, f.name) for f in fields(Parts)}


def _parts(data: Any) -> Parts | None:
    """Parts from their stored form; None for anything else."""
    try:
        made = Parts(
            schema=str(data["schema"]),
            registry=str(data["registry"]),
            versions=tuple(map(str, data["versions"])),
            releases=str(data["releases"]),
            order=tuple(map(str, data["order"])),
            results=tuple(tuple(map(str, each)) for each in data["results"]),
            attention={str(k): int(v) for k, v in data["attention"].items()},
            suggested={str(k): str(v) for k, v in data["suggested"].items()},
            gates={str(k): str(v) for k, v in data["gates"].items()},
            digests=tuple((str(i), str(d)) for i, d in data["digests"]),
            support=tuple((str(n), str(d)) for n, d in data["support"]),
            facts={str(k): str(v) for k, v in data["facts"].items()},
            referenced=tuple(map(str, data["referenced"])),
            tops={str(k): str(v) for k, v in data["tops"].items()},
            contents={str(k): str(v) for k, v in data["contents"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    regular = len(made.results) == len(made.versions) and all(
        len(each) == len(made.order) for each in made.results
    )
    return made if regular else None


def edited(parts: Parts, files: Files, root: Path) -> tuple[list[str], dict[str, str]] | None:
    """The patches whose folders' content changed since `parts` were made (entries whose
    status changed are read again: one whose bytes did not is not an edit), with every
    entry's content digest now, when a check of them alone may bring the report up to date:
    nothing else under the registry changed (the same patch folders, the support packages
    and other files as they were), at most `EDITED_MOST` of them, each checked in the report
    and named by no other patch. None: the whole check runs."""
    before, now = parts.tops, files.tops
    if before.keys() != now.keys() or before.keys() != parts.contents.keys():
        return None
    touched = [name for name in now if now[name] != before[name]]
    contents = {**parts.contents, **content_digests(root, touched)}
    changed = [name for name in touched if contents[name] != parts.contents[name]]
    folders = [name[:-1] for name in changed]
    if (
        len(changed) > EDITED_MOST
        or not all(name.endswith("/") and name[:1] not in "._" for name in changed)
        or not all(f in parts.facts and f not in parts.referenced for f in folders)
    ):
        return None
    return folders, contents


def updated(
    parts: Parts,
    patches: Sequence[Patch],
    report: CheckReport,
    files: Files,
    contents: dict[str, str],
) -> Parts | None:
    """`parts` with each of `patches` (edited, loaded again, each as `facts` said before)
    and its results in `report` (a check of those patches alone, of the same releases) in
    place of what they were; None when the report's releases are not those of `parts`."""
    from patchset.registry.load import registry_digest

    if tuple(r.version for r in report.releases) != parts.versions:
        return None
    mine = {p.id: p for p in patches}
    count = len(patches)
    order = [r.patch for r in report.results[:count]]
    if set(order) != set(mine) or len(report.results) != count * len(parts.versions):
        return None
    at = {patch_id: i for i, patch_id in enumerate(parts.order)}
    results = [list(each) for each in parts.results]
    attention = dict(parts.attention)
    for patch_id in mine:
        attention[patch_id] = 0
    for k, version in enumerate(parts.versions):
        for r in report.results[k * count : (k + 1) * count]:
            if r.vllm != version or r.patch not in mine:
                return None
            results[k][at[r.patch]] = encoded(r.to_dict(), 2)
            attention[r.patch] += r.needs_attention
    suggested = dict(parts.suggested)
    for patch_id, ranges in report.suggested.items():
        suggested[patch_id] = encoded(list(ranges), 2)
    gates = dict(parts.gates)
    for patch_id, patch in mine.items():
        if patch_id in gates:
            gates[patch_id] = encoded(patch.gates(), 2)
    digests = tuple((i, mine[i].digest if i in mine else d) for i, d in parts.digests)
    return dataclasses.replace(
        parts,
        registry=registry_digest(digests, parts.support),
        results=tuple(tuple(each) for each in results),
        attention=attention,
        suggested=suggested,
        gates=gates,
        digests=digests,
        tops=files.tops,
        contents=contents,
    )


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
        parts = _parts(record["parts"])
    except (ValueError, KeyError, TypeError, zlib.error):
        return None
    if parts is None or not all(isinstance(w, str) for w in warned):
        return None
    return Stored(parts, code, tuple(warned))


def put(report_key: str, base: str, stored: Stored) -> None:
    """Keep `stored` under `report_key` (best effort: a cache that cannot be written only
    costs the speed); the oldest beyond `KEPT` go."""
    record = {
        "parts": _parts_data(stored.parts),
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


def settled(files: Files, root: Path, started: float) -> bool:
    """Whether a report made from the registry `files` (taken at `started`) may be kept:
    the files are as they were, and none was written within `RACY` seconds of `started`."""
    return files.newest < started - RACY and files_state(root).digest == files.digest


__all__ = [
    "Files",
    "Parts",
    "Stored",
    "base_key",
    "code_digest",
    "content_digests",
    "edited",
    "eligible",
    "facts",
    "files_state",
    "get",
    "key",
    "latest",
    "listing_now",
    "listing_used",
    "parts_of",
    "put",
    "settled",
    "updated",
]
