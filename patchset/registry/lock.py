"""One writer at a time per registry: the lock every command that writes one takes.

`add`, `update`, `remove`, `refresh --finish`, `upstream --write`, `check --write` (through
`RegistryChange.commit`) and `import` (from its copy of the registry to its swap) hold
`.<registry>.lock`, an `flock` on a file beside the registry folder (beside, not inside: an
import swaps the folder whole). A second writer waits for it (`LOCK_TIMEOUT` seconds), then
refuses with exit 3; nothing it planned is written over the first one's work. Taking the lock
first finishes (or undoes) a folder swap a killed writer left (`_fs.recover_folder`) and
removes the staging copies of killed imports, saying what it did.

Within one process the lock is re-entrant (an import that writes through another writer does
not wait for itself). Where neither the registry's parent nor the registry may be written
(a read-only checkout) no lock is taken: the write is refused by its own checks.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import logging
import os
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

from patchset._fs import recover_folder
from patchset.errors import LockedError, RegistryError

LOG = logging.getLogger(__name__)
LOCK_TIMEOUT = 60.0  # seconds a second writer waits before it refuses
IMPORT_STAGE = ".patchset-import-"  # + the registry's name + "-": an import's copy, beside it
_held: dict[str, int] = {}
_UNWRITABLE = (errno.EACCES, errno.EPERM, errno.EROFS)


def lock_file(root: Path) -> Path:
    return root.parent / f".{root.name}.lock"


def _open(root: Path) -> int | None:
    for path in (lock_file(root), root / ".patchset-registry.lock"):
        if path.is_symlink():
            raise RegistryError("is a symlink; refusing to lock through it", path=path)
        try:
            return os.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
        except FileNotFoundError:
            continue
        except OSError as exc:
            if exc.errno not in _UNWRITABLE:
                raise RegistryError(
                    f"cannot take the registry's lock ({exc.strerror}); nothing was changed",
                    path=path,
                ) from None
    return None


@contextlib.contextmanager
def registry_lock(root: Path, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the registry's writer lock (waiting up to `timeout`, else `LOCK_TIMEOUT`)."""
    key = str(Path(root).absolute())
    if _held.get(key):
        _held[key] += 1
        try:
            yield
        finally:
            _held[key] -= 1
        return
    fd = _open(root)
    if fd is None:
        yield
        return
    wait = LOCK_TIMEOUT if timeout is None else timeout
    deadline = time.monotonic() + wait
    try:
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockedError(
                        f"another patchset process is writing this registry (waited"
                        f" {wait:.0f} s); nothing was changed",
                        path=root,
                    ) from None
                time.sleep(0.05)
        _held[key] = 1
        try:
            _recover(root)
            yield
        finally:
            _held.pop(key, None)
    finally:
        os.close(fd)  # the lock goes with its last descriptor


def _recover(root: Path) -> None:
    """Finish what a killed writer left: a half-done folder swap, an import's staging copy."""
    said = recover_folder(root)
    if said:
        LOG.warning("%s: %s", root, said)
    if root.parent.is_dir():
        for left in sorted(root.parent.glob(f"{IMPORT_STAGE}{root.name}-*")):
            if left.is_dir() and not left.is_symlink():
                shutil.rmtree(left, ignore_errors=True)
                LOG.warning("%s: removed %s, the copy of an import that was stopped", root, left)
