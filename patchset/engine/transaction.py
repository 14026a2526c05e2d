"""All-or-nothing writes to a target tree: lock, writability check, journal, rename, verify.

Before anything in the tree changes, a journal (`.patchset-journal/` in the target) records
every file to be written with a copy of its original and the name of the temp file the new
bytes go to (beside the file, so the rename is atomic). Then the temp files are written, the
renames made and read back, and only then is the journal removed. A process killed at any
point leaves either an untouched tree or the journal, and the next run rolls the tree back
from it (removing the temp files too) before doing anything else.

The tree may be writable by others than the user running patchset, so nothing found in it is
trusted: the lock file and journal must not be symlinks, and a journal's entries must name
files inside the tree and backups inside the journal, or nothing is restored.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
from collections.abc import Callable, Collection, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from filelock import FileLock, Timeout

from patchset._fs import resolve_inside, write_json_atomic
from patchset.errors import LockedError, PayloadError, TargetError
from patchset.kernel import tree
from patchset.kernel.tree import create_exclusive, follow_folder_owner, make_folder
from patchset.registry.paths import check_relpath

JOURNAL = ".patchset-journal"
LOCK = ".patchset.lock"
LOCK_TIMEOUT = 30.0  # seconds a second apply on the same tree waits before it refuses
TEMP_SUFFIX = ".patchset-new"  # the new bytes, beside the file, until the rename
RESTORE_SUFFIX = ".patchset-restore"  # the original, beside the file, during a roll-back
_BACKUP = re.compile(r"^[0-9]{1,9}\.orig$")


@contextmanager
def locked(root: Path, *, timeout: float | None = None) -> Iterator[None]:
    """Hold the tree's lock; a second apply on the same tree waits, then refuses."""
    wait = LOCK_TIMEOUT if timeout is None else timeout
    path = root / LOCK
    if path.is_symlink():  # an old filelock would truncate whatever the link points to
        raise TargetError(f"{LOCK} is a symlink; refusing to lock through it", path=root)
    lock = FileLock(str(path), timeout=wait)
    try:  # only the taking of the lock: errors of the work under it are not lock errors
        lock.acquire()
    except Timeout:
        raise LockedError(
            f"another patchset process holds {LOCK} (waited {wait:.0f} s)", path=root
        ) from None
    except PermissionError:
        raise TargetError("not writable: cannot create the lock file", path=root) from None
    except OSError as exc:
        raise TargetError(f"cannot lock {LOCK}: {exc.strerror}", path=root) from None
    try:
        follow_folder_owner(path, root)  # root patching a user's venv leaves the user's file
        yield
    finally:
        lock.release()


def check_writable(root: Path, relpaths: list[str]) -> None:
    """Open every file to be changed for writing, and check its folder; creates nothing (a
    probe file would be left behind by a kill). What this cannot see, `commit` rolls back."""
    _fits(root, relpaths)
    _distinct(root, relpaths)
    for rel in relpaths:
        path = resolve_inside(root, rel)
        folder = _existing_folder(root, rel)
        if not os.access(folder, os.W_OK | os.X_OK):
            raise TargetError(f"{rel}: not writable (its folder is read-only)", path=root)
        try:
            if path.exists():
                with path.open("r+b"):
                    pass
        except OSError as exc:
            raise TargetError(f"{rel}: not writable ({exc.strerror})", path=root) from None


def _distinct(root: Path, relpaths: list[str]) -> None:
    """Two payload paths that are one file through a symlink would be written twice."""
    seen: dict[Path, str] = {}
    for rel in relpaths:
        path = resolve_inside(root, rel)
        if path in seen:
            raise TargetError(
                f"{seen[path]} and {rel} are one file (a symlink); refusing to write it twice",
                path=root,
            )
        seen[path] = rel


def _existing_folder(root: Path, rel: str) -> Path:
    """The nearest folder of `rel` that exists (a new file may need new folders); something
    else than a folder in its place is refused."""
    folder = resolve_inside(root, rel).parent
    while not os.path.lexists(folder):
        folder = folder.parent
    if not folder.is_dir():
        where = folder.relative_to(root.resolve()).as_posix()
        raise TargetError(f"{rel}: {where} is not a folder", path=root)
    return folder


def _folders(root: Path, changes: Mapping[str, bytes | None]) -> tuple[list[str], list[str]]:
    """The folders `changes` creates (outermost first) and empties (deepest first), by the
    kernel's rules (`patchset.kernel.tree`), seen through the tree's symlink guard."""

    def exists(folder: str) -> bool:
        return os.path.lexists(resolve_inside(root, folder))

    entries = tree.folder_entries(root, lambda folder: _unresolved(root, folder))
    return tree.created_folders(changes, exists), tree.emptied_folders(changes, entries)


def _fits(root: Path, relpaths: Collection[str]) -> None:
    """A name the file system cannot hold is bad input, found before anything is written."""
    for rel in relpaths:
        if not tree.name_fits(rel):
            raise TargetError(
                f"{rel}: a name longer than {tree.NAME_MAX} bytes cannot be written", path=root
            )


def _damaged(why: str, root: Path) -> TargetError:
    return TargetError(
        f"{JOURNAL}: {why}; an interrupted run cannot be rolled back from it: check the"
        f" files it names and delete the folder",
        path=root,
    )


def _read_journal(root: Path, journal: Path) -> list[dict[str, Any]]:
    """The journal's entries, each checked: a path in the tree, a backup in the journal."""
    try:
        entries = json.loads((journal / "index.json").read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        raise _damaged(f"index.json is unreadable ({exc})", root) from None
    if not isinstance(entries, list):
        raise _damaged("index.json is not a list", root)
    for entry in entries:
        if isinstance(entry, dict) and set(entry) == {"folder", "created"}:
            if not isinstance(entry["folder"], str) or not isinstance(entry["created"], bool):
                raise _damaged(f"bad entry {entry!r}", root)
            try:
                check_relpath(entry["folder"], file=journal)
            except PayloadError as exc:
                raise _damaged(f"bad entry ({exc})", root) from None
            continue
        if not isinstance(entry, dict) or not isinstance(entry.get("existed"), bool):
            raise _damaged(f"bad entry {entry!r}", root)
        rel, backup, temp = entry.get("path"), entry.get("backup"), entry.get("temp")
        if not isinstance(rel, str) or not isinstance(backup, str) or not _BACKUP.match(backup):
            raise _damaged(f"bad entry {entry!r}", root)
        if temp is not None and (not isinstance(temp, str) or not temp.endswith(TEMP_SUFFIX)):
            raise _damaged(f"bad entry {entry!r}", root)
        if temp is not None and not tree.name_fits(temp):
            entry["temp"] = temp = None  # an older patchset's name too long to exist: nothing
        try:
            for name in (rel, temp) if temp else (rel,):
                check_relpath(name, file=journal)
        except PayloadError as exc:
            raise _damaged(f"bad entry ({exc})", root) from None
        if entry["existed"]:
            copy = journal / backup
            if copy.is_symlink() or not copy.is_file():
                raise _damaged(f"backup {backup} is missing", root)
    return entries


def check_journal(root: Path) -> None:
    """Raise TargetError if the tree holds a journal that cannot be trusted to roll back."""
    journal = root / JOURNAL
    if not os.path.lexists(journal):
        return
    if journal.is_symlink() or not journal.is_dir():
        raise _damaged("not a folder", root)
    if (journal / "index.json").is_file():
        _read_journal(root, journal)


def pending_originals(root: Path) -> dict[str, bytes | None]:
    """What a roll-back would put back (relpath: the original bytes, or None for no file), so
    a dry run on a tree an interrupted run left half-written sees it as the real run will."""
    journal = root / JOURNAL
    check_journal(root)
    if not os.path.lexists(journal) or not (journal / "index.json").is_file():
        return {}
    return {
        entry["path"]: (journal / entry["backup"]).read_bytes() if entry["existed"] else None
        for entry in _read_journal(root, journal)
        if "path" in entry
    }


def recover(root: Path) -> list[str]:
    """Roll back an interrupted write from its journal; the files it names, each now as it
    was before that write."""
    journal = root / JOURNAL
    if not os.path.lexists(journal):
        return []
    check_journal(root)
    restored: list[str] = []
    if (journal / "index.json").is_file():
        entries = _read_journal(root, journal)
        folders = [e for e in entries if "folder" in e]
        for entry in folders:  # removed by the write: back first, outermost first
            folder = resolve_inside(root, entry["folder"])
            if not entry["created"] and not os.path.lexists(folder):
                make_folder(folder)
        for entry in (e for e in entries if "path" in e):
            if entry.get("temp"):  # journals of patchset 0.1.0 have no temp names
                _unresolved(root, entry["temp"]).unlink(missing_ok=True)
            path = resolve_inside(root, entry["path"])
            restore = path.with_name(tree.temp_name(path.name, RESTORE_SUFFIX))
            if entry["existed"]:
                backup = journal / entry["backup"]
                if path.is_file() and path.read_bytes() == backup.read_bytes():
                    restore.unlink(missing_ok=True)  # a killed roll-back's, maybe
                else:  # renamed already: put the original back (its owner is the backup's)
                    create_exclusive(restore, backup.read_bytes(), like=backup)
                    shutil.copystat(backup, restore)  # the original's time stamps too
                    tree.put(restore, path)
            elif path.exists():
                path.unlink()
            restored.append(entry["path"])
        for entry in reversed(folders):  # created by the write: gone again, deepest first
            if entry["created"]:
                with contextlib.suppress(FileNotFoundError, OSError):
                    resolve_inside(root, entry["folder"]).rmdir()
    _remove(journal)
    return restored


def _remove(journal: Path) -> None:
    """Remove the journal, its index first: a kill halfway leaves no index naming backups
    that are gone (which would read as a damaged journal)."""
    (journal / "index.json").unlink(missing_ok=True)
    shutil.rmtree(journal)


def commit(
    root: Path, changes: Mapping[str, bytes | None], *, executable: Collection[str] = ()
) -> None:
    """Write `changes` (relpath -> new bytes, None to delete) so that all land or none do.
    A new file named in `executable` gets execute bits where its mode has read bits (git's
    mode 755, as a diff that deleted or created it records); an existing file keeps its mode."""
    if not changes:
        return
    journal = root / JOURNAL
    real_root = root.resolve()
    if os.path.lexists(journal):
        raise TargetError(
            f"{JOURNAL} is present: an interrupted run must be rolled back", path=root
        )
    _fits(root, changes)
    _distinct(root, list(changes))
    journal.mkdir()
    try:
        follow_folder_owner(journal, root)  # a kill leaves it: its owner can roll back
        created, emptied = _folders(root, changes)
        entries: list[dict[str, Any]] = [{"folder": f, "created": True} for f in created]
        entries += [{"folder": f, "created": False} for f in reversed(emptied)]
        paths: dict[str, tuple[Path, Path | None]] = {}
        for number, (rel, data) in enumerate(changes.items()):
            path = resolve_inside(root, rel)
            existed = path.exists()
            backup = f"{number}.orig"
            if existed:
                shutil.copy2(path, journal / backup)
                _same_owner(journal / backup, path)
            temp = None if data is None else path.with_name(tree.temp_name(path.name, TEMP_SUFFIX))
            paths[rel] = (path, temp)
            entries.append(
                {
                    "path": rel,
                    "backup": backup,
                    "existed": existed,
                    "temp": None if temp is None else temp.relative_to(real_root).as_posix(),
                }
            )
        write_json_atomic(journal / "index.json", entries)  # from here on, a kill rolls back
        for folder in created:
            make_folder(resolve_inside(root, folder))
        for rel, data in changes.items():
            path, temp = paths[rel]
            if temp is not None and data is not None:
                create_exclusive(temp, data, like=path, executable=rel in executable)
        for path, temp in paths.values():
            if temp is None:
                path.unlink()
            else:
                tree.put(temp, path)
        for folder in emptied:
            resolve_inside(root, folder).rmdir()
        differs = tree.read_back(changes, lambda rel: _read(resolve_inside(root, rel)))
        if differs is not None:
            raise TargetError(f"{differs}: read back differs from what was written", path=root)
    except OSError as exc:  # a full disk, a read-only folder: rolled back, then one line
        recover(root)
        where = f" ({exc.filename})" if exc.filename else ""
        raise TargetError(
            f"writing failed: {exc.strerror}{where}; rolled back", path=root
        ) from None
    except BaseException:
        recover(root)
        raise
    _remove(journal)


def _read(path: Path) -> bytes | None:
    return path.read_bytes() if path.exists() else None


def _unresolved(root: Path, relpath: str) -> Path:
    """`relpath` in the tree with its folder resolved but not its last part (a symlink there
    is the thing to remove, not what it points to)."""
    rel = Path(relpath)
    return resolve_inside(root, rel.parent.as_posix()) / rel.name


def _same_owner(copy: Path, original: Path) -> None:
    """A backup keeps its original's owner, so a roll-back gives it back too."""
    info = original.stat()
    with contextlib.suppress(PermissionError):
        os.chown(copy, info.st_uid, info.st_gid, follow_symlinks=False)


Reader = Callable[[str], bytes | None]

__all__ = [
    "JOURNAL",
    "LOCK",
    "LOCK_TIMEOUT",
    "Reader",
    "check_journal",
    "check_writable",
    "commit",
    "locked",
    "pending_originals",
    "recover",
    "resolve_inside",
]
