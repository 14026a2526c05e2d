"""The user cache: verified sdists, a zip of each release's vllm/ tree, the index's answers.

Layout under the root (``$PATCHSET_CACHE_DIR``, else ``$XDG_CACHE_HOME/patchset``, else
``~/.cache/patchset``)::

    sdists/vllm-0.19.1.tar.gz   the sdist, sha256-checked against the index on download
    trees/0.19.1.zip            every regular file under vllm/ of that sdist; the zip comment
                                records the sdist's name and sha256
    trees/0.19.1.json           the same record plus each member's offset, for fast reads
    index/<key>.json            the project JSON of one index, with the time it was fetched
    locks/<name>.lock           file locks taken around every write

Reading a release is then opening one zip and inflating the few members asked for,
instead of gunzipping 30-45 MB. Every write goes to a temporary file that is renamed
into place while holding a file lock, so several ``patchset`` processes can share a
cache; a reader never sees a half-written file.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import struct
import tarfile
import threading
import time
import zipfile
import zlib
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import IO, Any

import filelock

from patchset._fs import atomic_file
from patchset.errors import LockedError, SourceError

LOCK_TIMEOUT = 900.0  # seconds; another process may be downloading a 45 MB sdist
TREE_FORMAT = "patchset-tree/1"
_ZIP_DATE = (1980, 1, 1, 0, 0, 0)
# A zip member's local file header (APPNOTE.TXT 4.3.7): the name and extra-field lengths
# are its last two fields; the member's data follows them.
_LOCAL_HEADER = struct.Struct("<4s2B4HL2L2H")
_LOCAL_SIGNATURE = b"PK\x03\x04"


def cache_root() -> Path:
    """Where the cache lives, from the environment."""
    if explicit := os.environ.get("PATCHSET_CACHE_DIR"):
        return Path(explicit).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg).expanduser() / "patchset"
    return Path.home() / ".cache" / "patchset"


@dataclasses.dataclass(frozen=True)
class TreeStamp:
    """What the zip comment of a tree records: which sdist the tree was made from."""

    version: str
    sdist: str
    sha256: str

    def fields(self) -> dict[str, str]:
        return {"format": TREE_FORMAT, **dataclasses.asdict(self)}

    def encode(self) -> bytes:
        return json.dumps(self.fields(), sort_keys=True).encode()

    @classmethod
    def decode(cls, comment: bytes) -> TreeStamp | None:
        try:
            fields = json.loads(comment)
            if fields.pop("format") != TREE_FORMAT:
                return None
            return cls(**fields)
        except (ValueError, TypeError, KeyError, AttributeError):
            return None


@dataclasses.dataclass(frozen=True)
class Cache:
    """Paths and locked writes in one cache root."""

    root: Path

    @classmethod
    def default(cls) -> Cache:
        return cls(cache_root())

    def sdist_path(self, filename: str) -> Path:
        return self.root / "sdists" / _plain_name(filename)

    def tree_path(self, version: str) -> Path:
        return self.root / "trees" / f"{_plain_name(version)}.zip"

    def index_path(self, key: str) -> Path:
        return self.root / "index" / f"{_plain_name(key)}.json"

    def cached_tree_versions(self) -> list[str]:
        """Versions that have a tree zip (unsorted; the caller knows how to order them)."""
        folder = self.root / "trees"
        return [p.stem for p in folder.glob("*.zip")] if folder.is_dir() else []

    @contextlib.contextmanager
    def lock(self, name: str, *, wait: bool = True) -> Iterator[bool]:
        """Hold the file lock `name`; writers of the same files take the same name.

        With ``wait=False`` a busy lock is not waited for: the context then yields False.
        """
        path = self.root / "locks" / f"{_plain_name(name)}.lock"
        path.parent.mkdir(parents=True, exist_ok=True)
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
        """The cached JSON stored under `key` and when it was fetched, if present and sound."""
        try:
            record = json.loads(self.index_path(key).read_bytes())
            return float(record["fetched_at"]), record["data"]
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def store_json(self, key: str, data: Any, *, source: str) -> None:
        record = {"fetched_at": time.time(), "source": source, "data": data}
        path = self.index_path(key)
        with self.lock(f"index-{key}"), atomic_write(path) as out:
            out.write(json.dumps(record).encode())

    def drop_json(self, key: str) -> None:
        with self.lock(f"index-{key}"):
            self.index_path(key).unlink(missing_ok=True)

    # -- release trees -------------------------------------------------------------------

    def open_tree(self, version: str) -> TreeZip | None:
        """The cached tree of `version` if it is there and sound; the caller checks its stamp.

        A tree whose member index is missing or stale gets a new one, when nobody is
        writing that release just now.
        """
        tree = TreeZip.open(self.tree_path(version))
        if tree is not None and not tree.indexed:
            with self.lock(f"release-{version}", wait=False) as locked:
                if locked:
                    _write_member_index(tree.path, tree.stamp, tree.members)
        return tree

    def build_tree(self, sdist: Path, stamp: TreeStamp) -> Path:
        """Write ``trees/<version>.zip`` and its member index from a verified sdist.

        Call with the release's lock held. The zip is renamed into place first; the index
        names the zip's size and mtime, so a reader never trusts an index of another zip.
        """
        dest = self.tree_path(stamp.version)
        with atomic_write(dest) as out:
            members = sdist_to_zip(sdist, out, comment=stamp.encode())
        _write_member_index(dest, stamp, members)
        return dest


def _write_member_index(zip_path: Path, stamp: TreeStamp, members: dict[str, list[int]]) -> None:
    stat = zip_path.stat()
    record = {**stamp.fields(), "zip": [stat.st_size, stat.st_mtime_ns], "members": members}
    with atomic_write(_index_path(zip_path)) as out:
        out.write(json.dumps(record, separators=(",", ":")).encode())


class TreeZip:
    """Reads members of a tree zip.

    Opening a zip with `zipfile` parses its whole central directory (some 8 ms for the
    2,000 files of a vLLM release). The index written beside it at build time holds each
    member's offset, so a warm read costs a JSON load and one seek per file instead. When
    the index is missing or names another zip, `zipfile` is used.
    """

    def __init__(
        self,
        path: Path,
        file: IO[bytes],
        stamp: TreeStamp,
        members: dict[str, list[int]],
        *,
        indexed: bool,
    ) -> None:
        self.path = path
        self.stamp = stamp
        self.members = members
        self.indexed = indexed  # False when read through zipfile
        self._file = file
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path) -> TreeZip | None:
        """The tree zip at `path`, or None when it is missing, unreadable or unstamped."""
        try:
            file = path.open("rb")
        except OSError:
            return None
        try:
            tree = cls._from_index(path, file) or cls._from_zipfile(path, file)
        except (OSError, zipfile.BadZipFile):
            tree = None
        if tree is None:
            file.close()
        return tree

    @classmethod
    def _from_index(cls, path: Path, file: IO[bytes]) -> TreeZip | None:
        """Trust the index only if it was written for this very file (size and mtime)."""
        try:
            record = json.loads(_index_path(path).read_bytes())
            stat = os.fstat(file.fileno())
            if record.pop("zip") != [stat.st_size, stat.st_mtime_ns]:
                return None
            members = record.pop("members")
            stamp = TreeStamp.decode(json.dumps(record).encode())
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
        if stamp is None or not isinstance(members, dict):
            return None
        return cls(path, file, stamp, members, indexed=True)

    @classmethod
    def _from_zipfile(cls, path: Path, file: IO[bytes]) -> TreeZip | None:
        with zipfile.ZipFile(file) as zf:
            stamp = TreeStamp.decode(zf.comment)
            members = _member_table(zf.infolist())
        return cls(path, file, stamp, members, indexed=False) if stamp else None

    def __enter__(self) -> TreeZip:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        self._file.close()

    def names(self) -> list[str]:
        return sorted(self.members)

    def read(self, name: str) -> bytes | None:
        """The member's bytes, or None when the release has no such file."""
        entry = self.members.get(name)
        if entry is None:
            return None
        offset, compressed, size, crc, method = entry
        with self._lock:
            self._file.seek(offset)
            header = self._file.read(_LOCAL_HEADER.size)
            if len(header) != _LOCAL_HEADER.size:
                raise self._damaged(name)
            fields = _LOCAL_HEADER.unpack(header)
            if fields[0] != _LOCAL_SIGNATURE:
                raise self._damaged(name)
            self._file.seek(offset + len(header) + fields[-2] + fields[-1])
            raw = self._file.read(compressed)
        try:
            data = zlib.decompress(raw, -zlib.MAX_WBITS) if method == zipfile.ZIP_DEFLATED else raw
        except zlib.error:
            raise self._damaged(name) from None
        if len(data) != size or zlib.crc32(data) != crc:
            raise self._damaged(name)
        return data

    def _damaged(self, name: str) -> SourceError:
        return SourceError(f"{name} is damaged in the cache; delete the file", path=self.path)


def _index_path(zip_path: Path) -> Path:
    return zip_path.with_suffix(".json")


def _member_table(infos: list[zipfile.ZipInfo]) -> dict[str, list[int]]:
    return {
        i.filename: [i.header_offset, i.compress_size, i.file_size, i.CRC, i.compress_type]
        for i in infos
        if not i.is_dir()
    }


def sdist_to_zip(sdist: Path, out: IO[bytes], *, comment: bytes = b"") -> dict[str, list[int]]:
    """Stream the tar.gz once, copying each regular file under ``<top>/vllm/`` as ``vllm/...``.

    Nothing is extracted to disk. Links and special files are skipped; a member with an
    absolute path or a ``..`` component makes the whole sdist unusable (SourceError).
    Returns the member table (name: offset, compressed size, size, crc, method).
    """
    members: dict[str, list[int]] = {}
    try:
        with (
            tarfile.open(sdist, mode="r|gz") as tar,
            zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf,
        ):
            for member in tar:
                relpath = _member_relpath(member.name, sdist)
                if relpath is None or not member.isfile():
                    continue
                handle = tar.extractfile(member)
                if handle is None:  # pragma: no cover -- isfile() members always have data
                    continue
                info = zipfile.ZipInfo(relpath, date_time=_ZIP_DATE)
                info.compress_type = zipfile.ZIP_DEFLATED
                info.external_attr = 0o644 << 16
                zf.writestr(info, handle.read())
            zf.comment = comment
            members = _member_table(zf.infolist())
    except (tarfile.TarError, EOFError, zipfile.BadZipFile) as exc:
        raise SourceError(f"unreadable sdist ({exc})", path=sdist) from None
    if not members:
        raise SourceError("the sdist holds no vllm/ package", path=sdist)
    return members


def _member_relpath(name: str, sdist: Path) -> str | None:
    """``vllm-X/vllm/a/b.py`` -> ``vllm/a/b.py``; None for members outside vllm/."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name:
        raise SourceError(f"unsafe member {name!r} in the sdist; refusing it", path=sdist)
    parts = pure.parts
    if len(parts) < 3 or parts[1] != "vllm":
        return None
    return "/".join(parts[1:])


def atomic_write(dest: Path) -> contextlib.AbstractContextManager[IO[bytes]]:
    """A file to write that replaces `dest` in one rename on success and vanishes on failure
    (0o644 as any cache file)."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    return atomic_file(dest, mode=0o644)


def _plain_name(name: str) -> str:
    """Cache file names come from index data: keep them to one plain path component."""
    if not name or name in {".", ".."} or "/" in name or "\\" in name or "\x00" in name:
        raise SourceError(f"{name!r} cannot name a cache file")
    return name
