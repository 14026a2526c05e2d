"""Writing files whole and hashing them: the one home for both.

A file is written to a temporary file beside its destination (so the rename is atomic),
flushed and fsynced, given the mode and owner of the file it replaces (or, for a new file,
those its folder gives: the folder's owner and group, the folder's read and write bits), and
renamed into place only then; on any failure the temporary file is removed and the
destination is untouched. patchset often runs as root on a tree owned by a user (a venv):
what it writes stays the user's, so the user can still revert it.

The rules for vLLM's files (modes, owners, created and emptied folders, temporary names) live
in `patchset.kernel.tree`, which ships into images; this module re-exports the ones the host
uses and adds what only the host needs: atomic replacement of patchset's own files, the
symlink guard of a target tree, and swapping a staged folder in.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import hmac
import json
import logging
import os
import secrets
import shutil
import stat
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

from patchset.errors import TargetError
from patchset.kernel.tree import (
    Attributes,
    attributes_for,
    create_exclusive,
    follow_folder_owner,
    make_folder,
    set_attributes,
)
from patchset.kernel.tree import sha256 as sha256_hex

LOG = logging.getLogger(__name__)


@contextlib.contextmanager
def _hidden_file(
    dest: Path, *, mode: int | None, suffix: str, durable: bool = True
) -> Iterator[tuple[IO[bytes], Path]]:
    """A hidden file beside `dest` (the shape `registry.leftovers` sweeps) to write, fsynced
    when the block ends (unless not `durable`), with the mode and owner `dest` will have (see
    `attributes_for`); removed when the block raises."""
    attrs = attributes_for(dest, mode=mode)
    fd, name = tempfile.mkstemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=suffix)
    try:
        with os.fdopen(fd, "w+b") as out:
            yield out, Path(name)
            out.flush()
            if durable:
                os.fsync(out.fileno())
            set_attributes(out.fileno(), attrs)
    except BaseException:
        Path(name).unlink(missing_ok=True)
        raise


@contextlib.contextmanager
def atomic_file(
    dest: Path, *, mode: int | None = None, suffix: str = ".tmp", durable: bool = True
) -> Iterator[IO[bytes]]:
    """A file to write (read/write, seekable) that replaces `dest` in one rename when the
    block ends without error, with `dest`'s mode and owner (see `attributes_for`), and
    vanishes when it raises. fsynced before the rename unless not `durable` (files checked
    by content when read, such as the cache's: a torn one is fetched again, and a cold check
    writes hundreds, where an fsync each costs seconds)."""
    with _hidden_file(dest, mode=mode, suffix=suffix, durable=durable) as (out, name):
        yield out
    try:
        os.replace(name, dest)
    finally:
        name.unlink(missing_ok=True)


def staged_file(dest: Path, data: bytes) -> Path:
    """`data` in a hidden file beside `dest`, fsynced, with the mode and owner `dest` will
    have: the caller renames it in or removes it."""
    with _hidden_file(dest, mode=None, suffix=".tmp") as (out, name):
        out.write(data)
    return name


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


def resolve_inside(root: Path, relpath: str) -> Path:
    """The real path of `relpath` under `root`; a symlink leading outside `root` is refused."""
    real_root = root.resolve()
    candidate = (root / relpath).resolve()
    if candidate != real_root and real_root not in candidate.parents:
        raise TargetError(f"{relpath}: leads outside the target through a symlink", path=root)
    return candidate


SECRET_FILE = ".seal-key"  # noqa: S105 - a file's name


def cache_secret(folder: Path) -> bytes:
    """The secret a cache in `folder` seals its entries with (an HMAC key): 32 random bytes
    made when the cache is, in a file of its owner's that only the owner may read (0600),
    linked into place whole (never seen half-written). A key file that is not such a file is
    replaced (what it sealed is then not believed). OSError when it cannot be had (a full
    disk: the cache is then not used)."""
    path = folder / SECRET_FILE
    folder.mkdir(parents=True, exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        found = _read_secret(path)
        if found is not None:
            return found
        path.unlink()
    secret = os.urandom(32)
    fd, name = tempfile.mkstemp(dir=folder, prefix=f"{SECRET_FILE}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as out:  # mkstemp's mode: 0600
            out.write(secret)
            out.flush()
            os.fsync(out.fileno())
        os.link(name, path)
    except FileExistsError:  # another process made it first: theirs
        found = _read_secret(path)
        if found is None:
            raise OSError(f"{path}: not a cache's seal key") from None
        return found
    finally:
        Path(name).unlink(missing_ok=True)
    return secret


def _read_secret(path: Path) -> bytes | None:
    fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        info = os.fstat(fd)
        data = os.read(fd, 64)
    finally:
        os.close(fd)
    mine = info.st_uid == os.geteuid() and not info.st_mode & 0o077
    return data if len(data) == 32 and mine and stat.S_ISREG(info.st_mode) else None


def seal(secret: bytes, *fields: str) -> str:
    """An HMAC-SHA256 of `fields` under `secret` (see `cache_secret`)."""
    data = "\0".join(fields).encode("utf-8", "surrogateescape")
    return hmac.new(secret, data, hashlib.sha256).hexdigest()


def _swap_names(final: Path) -> tuple[Path, Path]:
    """The journal of a folder swap into `final`, and the name the old folder has meanwhile."""
    return final.with_name(f".{final.name}.swap"), final.with_name(f".{final.name}.old")


def replace_folder(staging: Path, final: Path) -> None:
    """Put the folder `staging` (written beside `final`, on its file system) in the place of
    `final`, whole, journaled: the journal (`.<final>.swap`, naming `staging`) is on disk
    before the first rename, `final` is renamed aside, `staging` in, the old one removed, the
    journal last. A failure puts the old one back; a kill at any point leaves the old folder
    or the new one, and `recover_folder` (the next writer) finishes or undoes the swap.
    `staging` is gone afterwards either way (renamed in, or removed)."""
    journal, old = _swap_names(final)
    recover_folder(final)
    if not os.path.lexists(final):  # a new folder: one rename, nothing to journal
        try:
            staging.rename(final)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
        return
    if os.path.lexists(old):
        shutil.rmtree(old)
    write_json_atomic(journal, {"staging": str(staging), "old": str(old)})
    sync_folder(final.parent)
    try:
        if os.path.lexists(final):
            final.rename(old)
        staging.rename(final)
        sync_folder(final.parent)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        if os.path.lexists(old) and not os.path.lexists(final):
            old.rename(final)
        journal.unlink(missing_ok=True)
        raise
    shutil.rmtree(old, ignore_errors=True)
    journal.unlink(missing_ok=True)


def recover_folder(final: Path) -> str | None:
    """Finish or undo a swap into `final` that a kill stopped (see `replace_folder`): what
    was done, or None when no swap was under way."""
    journal, old = _swap_names(final)
    if not os.path.lexists(journal):
        return None
    try:
        data = json.loads(journal.read_bytes())
        staging = Path(data["staging"]) if isinstance(data, dict) else None
    except (OSError, ValueError, KeyError, TypeError):
        staging = None
    if not os.path.lexists(final) and old.is_dir():
        old.rename(final)  # stopped between the renames: the old folder back
        said = f"a swap stopped between its renames: the folder before it put back ({old.name})"
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
    elif staging is not None and staging.is_dir():
        shutil.rmtree(staging, ignore_errors=True)  # stopped before it began
        said = f"a swap stopped before it began: its new copy {staging} removed"
    else:
        shutil.rmtree(old, ignore_errors=True)  # stopped after: the new folder is in
        said = f"a swap stopped after its renames: the folder before it ({old.name}) removed"
    journal.unlink(missing_ok=True)
    sync_folder(final.parent)
    return said


@dataclass(frozen=True)
class Swap:
    """A file renamed over another, and how to put the other back."""

    path: Path
    old: Path | None  # a second name of the file it replaced (a hard link)
    before: bytes | None = None  # the file it replaced, where no link could be made


def swap_in(dest: Path, staged: Path) -> Swap:
    """Rename `staged` over `dest`, keeping the file it replaces under a second name (a hard
    link: no data written), so putting it back is a rename that a full disk cannot fail."""
    old: Path | None = None
    before: bytes | None = None
    if dest.is_file() and not dest.is_symlink():
        old = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.link(dest, old)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            old, before = None, dest.read_bytes()  # a file system without hard links
    try:
        os.replace(staged, dest)
    except BaseException:
        if old is not None:
            old.unlink(missing_ok=True)
        raise
    return Swap(dest, old, before)


def undo_swaps(swapped: list[Swap]) -> None:
    """Put back every file swapped in, newest first: renames and unlinks only."""
    for swap in reversed(swapped):
        try:
            if swap.old is not None:
                os.replace(swap.old, swap.path)
            elif swap.before is not None:
                os.replace(staged_file(swap.path, swap.before), swap.path)
            else:
                swap.path.unlink(missing_ok=True)
        except OSError:  # pragma: no cover -- the folder turned read-only mid-way
            LOG.warning("could not put back %s", swap.path)


__all__ = [
    "Attributes",
    "Swap",
    "atomic_file",
    "attributes_for",
    "cache_secret",
    "create_exclusive",
    "follow_folder_owner",
    "make_folder",
    "recover_folder",
    "replace_folder",
    "resolve_inside",
    "seal",
    "set_attributes",
    "sha256_hex",
    "staged_file",
    "swap_in",
    "sync_folder",
    "undo_swaps",
    "write_atomic",
    "write_json_atomic",
]
