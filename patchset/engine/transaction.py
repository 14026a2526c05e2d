"""All-or-nothing writes to a target tree: lock, writability check, journal, rename, verify.

Every file is first written beside its original as a temp file. Before the first rename a
journal (`.patchset-journal/` in the target) holds the originals; the journal is removed only
after every rename has been made and read back. A process killed in between leaves the
journal, and the next run rolls the tree back from it before doing anything else.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from filelock import FileLock, Timeout

from patchset.errors import LockedError, TargetError
from patchset.paths import resolve_inside

JOURNAL = ".patchset-journal"
LOCK = ".patchset.lock"


@contextmanager
def locked(root: Path, *, timeout: float = 30.0) -> Iterator[None]:
    """Hold the tree's lock; a second apply on the same tree waits, then refuses."""
    try:
        lock = FileLock(str(root / LOCK), timeout=timeout)
        with lock:
            yield
    except Timeout:
        raise LockedError(
            f"another patchset process holds {LOCK} (waited {timeout:.0f} s)", path=root
        ) from None
    except PermissionError:
        raise TargetError("not writable: cannot create the lock file", path=root) from None


def check_writable(root: Path, relpaths: list[str]) -> None:
    """Open every file to be changed for writing, and its folder for a new file."""
    for rel in relpaths:
        path = resolve_inside(root, rel)
        try:
            if path.exists():
                with path.open("r+b"):
                    pass
            with tempfile.NamedTemporaryFile(dir=path.parent, prefix=".patchset-probe-"):
                pass
        except OSError as exc:
            raise TargetError(f"{rel}: not writable ({exc.strerror})", path=root) from None


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def recover(root: Path) -> list[str]:
    """Roll back an interrupted write from its journal; the files restored."""
    journal = root / JOURNAL
    index = journal / "index.json"
    if not journal.exists():
        return []
    restored: list[str] = []
    if index.is_file():
        entries = json.loads(index.read_text(encoding="utf-8"))
        for entry in entries:
            path = resolve_inside(root, entry["path"])
            backup = journal / entry["backup"]
            if entry["existed"]:
                tmp = path.with_name(f".{path.name}.patchset-restore")
                shutil.copy2(backup, tmp)
                os.replace(tmp, path)
            elif path.exists():
                path.unlink()
            restored.append(entry["path"])
    shutil.rmtree(journal)
    return restored


def commit(root: Path, changes: dict[str, bytes]) -> None:
    """Write `changes` (relpath -> new bytes) so that either all land or none do."""
    if not changes:
        return
    journal = root / JOURNAL
    temps: dict[str, Path] = {}
    try:
        for rel, data in changes.items():
            path = resolve_inside(root, rel)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
                fh.flush()
                os.fsync(fh.fileno())
            if path.exists():
                shutil.copymode(path, name)
            temps[rel] = Path(name)
        journal.mkdir()
        entries = []
        for number, rel in enumerate(changes):
            path = resolve_inside(root, rel)
            backup = f"{number}.orig"
            if path.exists():
                shutil.copy2(path, journal / backup)
            entries.append({"path": rel, "backup": backup, "existed": path.exists()})
        _write_json(journal / "index.json", entries)
        for rel, tmp in temps.items():
            os.replace(tmp, resolve_inside(root, rel))
        temps.clear()
        for rel, data in changes.items():
            if _sha(resolve_inside(root, rel).read_bytes()) != _sha(data):
                raise TargetError(f"{rel}: read back differs from what was written", path=root)
    except BaseException:
        for tmp in temps.values():
            tmp.unlink(missing_ok=True)
        recover(root)
        raise
    shutil.rmtree(journal)


def _write_json(path: Path, data: object) -> None:
    tmp = path.with_suffix(".tmp")
    with tmp.open("w", encoding="utf-8") as fh:
        json.dump(data, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


Reader = Callable[[str], bytes | None]

__all__ = [
    "JOURNAL",
    "LOCK",
    "Reader",
    "check_writable",
    "commit",
    "locked",
    "recover",
    "resolve_inside",
]
