"""Writing files whole and hashing them: the one home for both.

A file is written to a temporary file beside its destination (so the rename is atomic),
flushed and fsynced, given the mode and owner of the file it replaces (or, for a new file,
those its folder gives: the folder's owner and group, the folder's read and write bits), and
renamed into place only then; on any failure the temporary file is removed and the
destination is untouched. patchset often runs as root on a tree owned by a user (a venv):
what it writes stays the user's, so the user can still revert it.

The engine's transaction writes its new bytes with `create_exclusive` (never following a
symlink planted at the temporary name) and renames them itself, after its journal.
The in-image runtime (`image/runtime/entrypoint.py`) keeps its own standard-library copy.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

_CHUNK = 1 << 20


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def file_sha256(path: Path) -> str:
    """The sha256 of a file's bytes, read in chunks (sdists are tens of megabytes)."""
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


@dataclass(frozen=True)
class Attributes:
    """Mode and owner a written file should have."""

    mode: int
    uid: int
    gid: int


def attributes_for(dest: Path, *, mode: int | None = None) -> Attributes:
    """What `dest` should look like once written: the mode and owner of the file it replaces,
    or, when there is none, its folder's owner and the folder's read/write bits (never
    writable by others, never executable). `mode` overrides the mode only."""
    try:
        info = dest.lstat()
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISREG(info.st_mode):
        keep = stat.S_IMODE(info.st_mode)
        return Attributes(keep if mode is None else mode, info.st_uid, info.st_gid)
    folder = dest.parent.stat()
    new_mode = stat.S_IMODE(folder.st_mode) & 0o664 | 0o600  # 0o755 -> 0o644, 0o700 -> 0o600
    return Attributes(new_mode if mode is None else mode, folder.st_uid, folder.st_gid)


def set_attributes(fd: int, attrs: Attributes) -> None:
    """Give an open file `attrs`: the owner first (chown clears set-id bits), then the mode.
    A user who may not give a file away keeps it (only root, or a group member, may)."""
    info = os.fstat(fd)
    if (info.st_uid, info.st_gid) != (attrs.uid, attrs.gid):
        with contextlib.suppress(PermissionError):
            os.fchown(fd, attrs.uid, attrs.gid)
    os.fchmod(fd, attrs.mode)


def follow_folder_owner(path: Path, folder: Path) -> None:
    """Give `path` (a file or folder patchset created, not following a symlink) the owner
    and group of `folder`, when they differ and this process may."""
    want = folder.stat()
    info = path.lstat()
    if (info.st_uid, info.st_gid) != (want.st_uid, want.st_gid):
        with contextlib.suppress(PermissionError):
            os.chown(path, want.st_uid, want.st_gid, follow_symlinks=False)


@contextlib.contextmanager
def atomic_file(
    dest: Path, *, mode: int | None = None, suffix: str = ".tmp"
) -> Iterator[IO[bytes]]:
    """A file to write (read/write, seekable) that replaces `dest` in one rename when the
    block ends without error, with `dest`'s mode and owner (see `attributes_for`), and
    vanishes when it raises."""
    attrs = attributes_for(dest, mode=mode)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "w+b") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
            set_attributes(out.fileno(), attrs)
        os.replace(name, dest)
    finally:
        Path(name).unlink(missing_ok=True)


def write_atomic(dest: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace `dest` with `data` (readers see the old bytes or the new), then fsync its
    folder so the rename itself is on disk."""
    with atomic_file(dest, mode=mode) as out:
        out.write(data)
    sync_folder(dest.parent)


def write_json_atomic(dest: Path, data: object) -> None:
    write_atomic(dest, json.dumps(data).encode("utf-8"))


def sync_folder(folder: Path) -> None:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def create_exclusive(path: Path, data: bytes, *, like: Path) -> None:
    """Create `path` afresh with `data` and the attributes `like` would get (see
    `attributes_for`): a leftover, or a symlink planted at `path`, is removed, never
    followed (O_EXCL | O_NOFOLLOW). fsynced; the caller renames it."""
    attrs = attributes_for(like)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        os.fsync(fh.fileno())
        set_attributes(fh.fileno(), attrs)


def make_folder(path: Path) -> None:
    """Create one folder with its parent's owner, group and permission bits."""
    parent = path.parent.stat()
    path.mkdir()
    follow_folder_owner(path, path.parent)
    path.chmod(stat.S_IMODE(parent.st_mode) & 0o777)
