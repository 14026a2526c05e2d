"""The user cache: each release's file list, the members read from it, the index's answers.

Where it is: ``$PATCHSET_CACHE_DIR`` when set, else the user cache folder `platformdirs`
names for patchset (``$XDG_CACHE_HOME/patchset`` or ``~/.cache/patchset`` on Linux).
Layout under that root::

    manifests/<artifact>.json   one artifact's file list: for a wheel, its central directory
                                with RECORD's sha256 per member; for an sdist, every file's
                                sha256. A header line names the artifact, the index's sha256
                                of it, what was verified, and the sha256 of the list below it
    blobs.sqlite                the members read (raw deflate), by the sha256 of their bytes
                                (`blobs`: one file, not one a member)
    index/<key>.json            an index's answer for vllm, with a digest of its content
    downloads/                  whole artifacts while they are read (--verify-full, the
                                sdist fallback), in files of no name: gone once read
    locks/<name>.lock           file locks taken around building one artifact's entry

Everything is checked by content when read: a manifest against the digest in its header, a
member against its name, an index answer against its digest. What does not check out is
deleted and built again, never believed. Every write goes to a temporary file renamed into
place (the members: a row of an SQLite file), so several processes can share a cache and a
reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import hashlib
import json
import logging
import os
import shutil
import stat
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from patchset._fs import atomic_file
from patchset.cachedir import cache_location, cache_root, folder_error, write_error
from patchset.errors import LockedError, SourceError
from patchset.registry import ranges
from patchset.sources.package_index import blobs, packing
from patchset.sources.package_index.packing import Manifest

LOG = logging.getLogger(__name__)
T = TypeVar("T")

LOCK_TIMEOUT = 900.0  # seconds; another process may be downloading a 45 MB sdist
ANSWER_FORMAT = "patchset-answer/2"
_STALE_TEMP = 3600.0  # seconds after which a temporary file is an orphan
_HEAD = 1 << 16  # a manifest's header line is within its first bytes (a few hundred of them)


@dataclasses.dataclass(frozen=True)
class Cache:
    """Paths, checked reads and atomic writes in one cache root."""

    root: Path

    @classmethod
    def default(cls) -> Cache:
        return cls(cache_root())

    def manifest_path(self, artifact: str) -> Path:
        return self.root / "manifests" / f"{_plain_name(artifact)}.json"

    def index_path(self, key: str) -> Path:
        return self.root / "index" / f"{_plain_name(key)}.json"

    @property
    def downloads(self) -> Path:
        return self.root / "downloads"

    @contextlib.contextmanager
    def scratch_file(self) -> Iterator[IO[bytes]]:
        """A file of no name in `downloads` to write and read (a whole artifact), gone when
        the block ends or the process dies; a `cache clear` meanwhile does not reach it."""
        with _made_in(self.downloads, lambda: tempfile.TemporaryFile(dir=self.downloads)) as out:
            yield out

    @contextlib.contextmanager
    def lock(self, name: str, *, wait: bool = True) -> Iterator[bool]:
        """Hold the file lock `name`; writers of the same files take the same name.

        With ``wait=False`` a busy lock is not waited for: the context then yields False.
        """
        import filelock  # noqa: PLC0415 - only a writer locks: a warm check takes no lock

        path = self.root / "locks" / f"{_plain_name(name)}.lock"
        _mkdir(path.parent, check=True)  # filelock does not make it if it went away
        try:
            with filelock.FileLock(path, timeout=LOCK_TIMEOUT if wait else 0):
                yield True
                return
        except filelock.Timeout:
            if wait:
                raise LockedError(
                    f"another patchset process has held {path} for {LOCK_TIMEOUT:.0f}s"
                ) from None
        yield False

    # -- the index's answers -------------------------------------------------------------

    def load_json(self, key: str) -> tuple[float, Any] | None:
        """The answer stored under `key` and when it was fetched, if present and intact.

        One whose content does not match its digest is deleted (and logged).
        """
        path = self.index_path(key)
        try:
            raw = read_entry(path)
            if raw is None:
                return None
            record = json.loads(raw)
            data = record["data"]
            intact = record["format"] == ANSWER_FORMAT and record["sha256"] == _digest(data)
            fetched = float(record["fetched_at"])
        except OSError:  # absent, or the cache folder is unusable (said when writing)
            return None
        except (ValueError, KeyError, TypeError):
            intact, data, fetched = False, None, 0.0
        if not intact:
            LOG.info("%s: the cached index answer is damaged; it is asked for again", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        return fetched, data

    def has_fresh_answer(self, max_age: float) -> bool:
        """Whether some index answer was stored less than `max_age` seconds ago (by its
        file's time: a hint, before the index, hence the answer's key, is known)."""
        now = time.time()
        folder = self.root / "index"
        try:
            return any(now - p.stat().st_mtime < max_age for p in folder.glob("*.json"))
        except OSError:
            return False

    def store_json(self, key: str, data: Any, *, source: str) -> None:
        record = {
            "format": ANSWER_FORMAT,
            "fetched_at": time.time(),
            "source": source,
            "sha256": _digest(data),
            "data": data,
        }
        with _entry_file(self.index_path(key)) as out:
            out.write(json.dumps(record).encode())

    def drop_json(self, key: str) -> None:
        with contextlib.suppress(OSError):
            self.index_path(key).unlink(missing_ok=True)

    # -- manifests -----------------------------------------------------------------------

    def load_manifest(self, artifact: str, *, later: bool = False) -> Manifest | None:
        """The artifact's manifest if cached and intact; a damaged one is deleted. `later`:
        only its header read now, its file list when first used (checked then: `DamagedListError`
        when it does not match, and deleted: `IndexTree.listed` builds it again)."""
        path = self.manifest_path(artifact)
        if later:
            manifest = self._manifest_head(path)
            if manifest is not None and manifest.artifact == artifact:
                with contextlib.suppress(OSError):
                    os.utime(path)  # last use, for `cache prune --older-than`
                return manifest
        raw = read_entry(path)
        if raw is None:
            return None
        manifest = packing.decode(raw)
        if manifest is None or manifest.artifact != artifact:
            LOG.info("%s: damaged (its content does not match its digest); rebuilding", path)
            with contextlib.suppress(OSError):
                path.unlink()
            return None
        if packing.written_before(manifest):
            with contextlib.suppress(OSError):  # written by an older format: kept in today's form
                self.store_manifest(manifest)
        with contextlib.suppress(OSError):
            os.utime(path)  # last use, for `cache prune --older-than`
        return manifest

    @staticmethod
    def _manifest_head(path: Path) -> Manifest | None:
        """The manifest at `path` from its header line, its list read when first used; None
        when the header is not one of today's (read whole then, as before)."""
        head = read_entry(path, at_most=_HEAD)
        end = head.find(b"\n") if head is not None else -1
        if head is None or end < 0:
            return None

        def body() -> bytes | None:
            raw = read_entry(path)
            if raw is None or not raw.startswith(head[: end + 1]):
                with contextlib.suppress(OSError):
                    path.unlink()  # built again (`IndexTree.listed`): never believed
                return None
            return raw[end + 1 :]

        manifest = packing.decode_head(head[:end], body)
        if manifest is None or packing.written_before(manifest):
            return None
        return manifest

    def store_manifest(self, manifest: Manifest) -> Manifest:
        """Store `manifest`; returned as a load would give it (its list kept packed, decoded
        when first used: a third of the memory of a list of lists, for a wheel's thousands
        of members, in a cold check's every process)."""
        raw = packing.encode(manifest)
        with _entry_file(self.manifest_path(manifest.artifact)) as out:
            out.write(raw)
        return packing.decode(raw) or manifest

    def drop_manifest(self, artifact: str) -> None:
        with contextlib.suppress(OSError):
            self.manifest_path(artifact).unlink(missing_ok=True)

    def manifests(self) -> list[Manifest]:
        """Every intact manifest in the cache (unordered)."""
        folder = self.root / "manifests"
        found = []
        for path in folder.glob("*.json") if folder.is_dir() else []:
            raw = read_entry(path)
            manifest = packing.decode(raw) if raw is not None else None
            if manifest is not None:
                found.append(manifest)
        return found

    def cached_tree_versions(self) -> list[str]:
        """Versions with a manifest (unsorted; the caller knows how to order them)."""
        return sorted({m.version for m in self.manifests()})

    # -- blobs ---------------------------------------------------------------------------

    @property
    def blobs(self) -> blobs.Blobs:
        """The members (`blobs.for_root`: this process's connection to ``blobs.sqlite``)."""
        return blobs.for_root(self.root)

    def read_blob(self, sha256: str) -> bytes | None:
        """The bytes named `sha256`, checked; None when absent or damaged (then deleted)."""
        return self.blobs.read(sha256)

    def has_blob(self, sha256: str) -> bool:
        """Whether a member is there to read (it is checked when read)."""
        return self.blobs.has(sha256)

    def store_blob(self, sha256: str, deflated: bytes) -> None:
        """Store a member's raw deflate stream under the sha256 of its inflated bytes."""
        self.blobs.store(sha256, deflated)

    # -- maintenance ---------------------------------------------------------------------

    def usage(self) -> tuple[int, int]:
        """(bytes, files) under the root."""
        total = count = 0
        for path in _files(self.root):
            with contextlib.suppress(OSError):
                total += path.stat().st_size
                count += 1
        return total, count

    def prune(self, older_than: float) -> tuple[int, int]:
        """Drop manifests unused for `older_than` seconds, then the blobs no manifest names,
        index answers as old, leftovers of interrupted writes and of older cache formats.
        Returns (files removed, bytes freed)."""
        now = time.time()
        removed = freed = 0

        def drop(path: Path) -> None:
            nonlocal removed, freed
            with contextlib.suppress(OSError):
                size = path.stat().st_size
                path.unlink()
                removed += 1
                freed += size

        for folder in ("manifests", "index", "settings"):
            for path in _files(self.root / folder):
                with contextlib.suppress(OSError):
                    if now - path.stat().st_mtime > older_than:
                        drop(path)
        named: set[str] = set()
        for manifest in self.manifests():
            named.update(entry[0] for entry in manifest.members.values())
        unnamed = [  # a member stored just now may await its manifest
            sha for sha, stored in self.blobs.stored() if sha not in named and now - stored > 60
        ]
        freed += self.blobs.delete(unnamed)
        removed += len(unnamed)
        for path in _files(self.root):
            with contextlib.suppress(OSError):
                orphan = path.name.endswith((".tmp", ".part")) or path.parent == self.downloads
                if orphan and now - path.stat().st_mtime > _STALE_TEMP:
                    drop(path)
        for old in ("sdists", "trees", "blobs"):  # before manifests; members as files
            for path in _files(self.root / old):
                drop(path)
        return removed, freed

    def clear(self) -> tuple[int, int]:
        """Remove everything but the locks folder. Returns (files removed, bytes freed)."""
        freed, removed = self.usage()
        blobs.remove(self.root)
        for child in self.root.iterdir() if self.root.is_dir() else []:
            if child.name == "locks":
                continue
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child, ignore_errors=True)
            else:
                with contextlib.suppress(OSError):
                    child.unlink()
        return removed, freed


def _digest(data: Any) -> str:
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _files(folder: Path) -> Iterator[Path]:
    if not folder.is_dir():
        return
    for base, _, names in os.walk(folder):
        for name in names:
            yield Path(base) / name


_MADE: set[Path] = set()  # cache folders made (or found) by this process


def _mkdir(folder: Path, *, check: bool = False) -> None:
    """Make `folder` (once a process, unless `check`: a cold check writes hundreds of
    files into a few folders)."""
    if folder in _MADE and not check:
        return
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((p for p in (folder, *folder.parents) if p.is_file()), folder)
        raise SourceError(
            f"the cache path {blocker} is a file, not a folder; set $PATCHSET_CACHE_DIR to a folder"
        ) from None
    except OSError as exc:
        raise SourceError(
            f"cannot create the cache folder {folder} ({exc.strerror});"
            " set $PATCHSET_CACHE_DIR to a writable folder"
        ) from None
    _MADE.add(folder)


@contextlib.contextmanager
def _entry_file(dest: Path) -> Iterator[IO[bytes]]:
    """`_fs.atomic_file` for a cache entry: 0o644 whatever the umask (readable by the users of
    a shared cache), not fsynced (everything here is checked by content when read); a folder
    in the entry's place is removed; an unusable cache folder is one clear error."""
    if dest.is_dir() and not dest.is_symlink():
        shutil.rmtree(dest, ignore_errors=True)
    with contextlib.ExitStack() as stack:
        out = _made_in(
            dest.parent,
            lambda: stack.enter_context(atomic_file(dest, mode=0o644, durable=False)),
        )
        try:
            with stack:
                yield out
        except FileNotFoundError as exc:
            if not _renamed_to(exc, dest):
                raise _write_error(dest, exc) from None
            # The entry, written whole, found gone with its folder when renamed into place: a
            # `cache clear` ran meanwhile. Not kept, as if cleared a moment later; what was
            # read and written stands (a cache entry is never counted on to be there).
            LOG.info("%s: the cache was cleared while it was written; not kept", dest)
        except OSError as exc:
            raise _write_error(dest, exc) from None


def _made_in(folder: Path, make: Callable[[], T]) -> T:
    """`make()`, which creates a file in `folder`: the folder made first (and again, once,
    when a `cache clear` removed it meanwhile); an unusable folder is one clear error."""
    _mkdir(folder)
    try:
        try:
            return make()
        except FileNotFoundError:  # the folder went away meanwhile (a `cache clear`)
            _MADE.discard(folder)
            _mkdir(folder)
            return make()
    except OSError as exc:
        raise folder_error(folder, exc.strerror) from None


def _renamed_to(exc: FileNotFoundError, dest: Path) -> bool:
    """Whether `exc` is the rename into `dest` failing (its second path is `dest`)."""
    return exc.filename2 is not None and os.fspath(exc.filename2) == os.fspath(dest)


def _write_error(dest: Path, exc: OSError) -> SourceError:
    """A write in the cache that failed (a full disk, a quota, a read-only folder): one line,
    exit 3; what was written is gone, the cache as it was."""
    return write_error(dest, exc.strerror, full=exc.errno in (errno.ENOSPC, errno.EDQUOT))


def read_entry(path: Path | str, *, at_most: int | None = None) -> bytes | None:
    """A cache entry's bytes (its first `at_most` at most), if it is a regular file (or a
    link to one); None when absent. Anything else in its place (a folder, a FIFO, a device)
    is removed, and None: the entry is fetched again. Opened without blocking, so a FIFO
    never hangs the read; read with plain reads of the size it has (no buffered file
    object: a check reads a thousand)."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError:  # a link to nowhere it may open, a socket: not an entry
        _remove(Path(path))
        return None
    try:
        found = os.fstat(fd)
        if stat.S_ISREG(found.st_mode):
            if at_most is not None:
                return os.read(fd, at_most)
            return _read_all(fd, found.st_size)
    except OSError:  # unreadable: as if damaged
        pass
    finally:
        os.close(fd)
    _remove(Path(path))
    return None


def _read_all(fd: int, size: int) -> bytes:
    """Everything from `fd` to its end, `size` bytes expected (a file that is shorter or
    longer is read as it is: what it holds is checked by content)."""
    data = os.read(fd, size + 1)
    more = os.read(fd, 1 << 16) if data else b""
    if not more:  # the common case: all of it in one read, then the end
        return data
    parts = [data, more]
    while chunk := os.read(fd, 1 << 16):
        parts.append(chunk)
    return b"".join(parts)


def _remove(path: Path) -> None:
    """Take what is not a cache entry out of an entry's place (logged): fetched again."""
    LOG.info("%s: not a regular file; removed, and fetched again", path)
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        with contextlib.suppress(OSError):
            path.unlink()


def _plain_name(name: str) -> str:
    """Cache file names come from index data: keep them to one plain path component."""
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\x00" in name:
        raise SourceError(f"{name!r} cannot name a cache file")
    return name


@dataclasses.dataclass(frozen=True)
class CacheSummary:
    """What `patchset cache info` shows."""

    root: Path
    chosen_by: str
    bytes: int
    files: int
    releases: tuple[str, ...]  # artifacts with a manifest, e.g. "0.19.1 (wheel)"


def summary() -> CacheSummary:
    """The default cache: where it is, which setting chose it, its size and releases."""
    root, chosen_by = cache_location()
    cache = Cache(root)
    size, files = cache.usage()
    releases = tuple(
        f"{m.version} ({m.kind}, {m.artifact})"
        for m in sorted(
            cache.manifests(), key=lambda m: (ranges.version_key(m.version), m.artifact)
        )
    )
    return CacheSummary(root, chosen_by, size, files, releases)
