"""How vLLM's files are written: the one home of the rules every write path follows.

Three paths write vLLM's files: the engine's transaction (`patchset apply`/`revert`), the
image entrypoint (a container start) and the image build (a build context laid out for
`COPY`, deletions as a shell line). They share these rules, and call this module for them:

- a replaced file keeps its mode and owner; a new one gets its folder's owner and the
  folder's read/write bits (a 755 folder gives 644), plus execute bits where it has read bits
  when the payload says it is executable (git's mode 755);
- a created folder gets its parent's owner, group and permission bits, outermost first;
- the folders a deletion leaves empty are removed deepest first, as git removes them; never
  the tree's root nor `vllm/` itself;
- new bytes go to a temporary name beside the file (one that always fits the file system's
  name limit), and every written file is read back and compared by sha256.

Standard library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import stat
import time
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

NAME_MAX = 255  # bytes in one file name (Linux, macOS)
_PLAIN = re.compile(r"vllm/[A-Za-z0-9_.\-/]+")  # ASCII, under vllm/: checked without pathlib
KEPT = frozenset({"", ".", "vllm"})  # folders a deletion never removes
FOLDER_MODE = 0o755  # a folder's mode where the real one cannot be read (an image's, at build)

Changes = Mapping[str, bytes | None]  # relpath -> new bytes, None to delete


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def digest(data: bytes | None) -> str:
    """A file's sha256 as manifests record it: "" for no file."""
    return "" if data is None else sha256(data)


def file_mode(current: int | None, *, executable: bool = False, folder: int = FOLDER_MODE) -> int:
    """The permission bits a written file gets: `current` (its mode) kept when it exists;
    else its folder's read/write bits (never writable by others, never executable), with
    execute bits where it has read bits when `executable`."""
    if current is not None:
        return stat.S_IMODE(current)
    mode = stat.S_IMODE(folder) & 0o664 | 0o600  # 0o755 -> 0o644, 0o700 -> 0o600
    return mode | (mode & 0o444) >> 2 if executable else mode


@dataclass(frozen=True)
class Attributes:
    """Mode and owner a written file should have."""

    mode: int
    uid: int
    gid: int


def attributes_for(dest: Path, *, mode: int | None = None, executable: bool = False) -> Attributes:
    """What `dest` should look like once written: the mode and owner of the file it replaces,
    or, when there is none, its folder's owner and the mode `file_mode` gives. `mode`
    overrides the mode only."""
    try:
        info: os.stat_result | None = dest.lstat()
    except FileNotFoundError:
        info = None
    if info is not None and stat.S_ISREG(info.st_mode):
        keep = file_mode(info.st_mode)
        return Attributes(keep if mode is None else mode, info.st_uid, info.st_gid)
    folder = dest.parent.stat()
    new_mode = file_mode(None, executable=executable, folder=folder.st_mode)
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


def temp_name(name: str, suffix: str) -> str:
    """The hidden name beside `name` its new bytes (or its original) are written to: the name
    with `suffix`, or, when that would not fit `NAME_MAX`, a digest of the name with it."""
    candidate = f".{name}{suffix}"
    if len(os.fsencode(candidate)) <= NAME_MAX:
        return candidate
    return f".{sha256(os.fsencode(name))[:24]}{suffix}"


def relpath_problem(relpath: str) -> str | None:
    """What makes `relpath` unusable as a path of vLLM's files, or None: it must be relative,
    under vllm/, free of `..` and backslashes, written plainly, each name fitting."""
    parts = relpath.split("/")
    if _PLAIN.fullmatch(relpath) and all(0 < len(p) <= 200 and p not in (".", "..") for p in parts):
        return None  # the common case, without pathlib (a manifest holds thousands)
    pure = PurePosixPath(relpath)
    if not relpath or "\\" in relpath or not relpath.isprintable():
        return "not a usable path"
    if pure.is_absolute():
        return "absolute paths are refused"
    if ".." in pure.parts:
        return "'..' is refused"
    if pure.parts[0] != "vllm" or len(pure.parts) < 2:
        return "targets must lie under vllm/"
    if not name_fits(relpath):
        return f"a name longer than {NAME_MAX} bytes"
    if pure.as_posix() != relpath:
        return f"write it plainly, as {pure.as_posix()}"
    return None


def name_fits(relpath: str) -> bool:
    """Every part of `relpath` fits the file system's name limit."""
    return all(len(os.fsencode(part)) <= NAME_MAX for part in PurePosixPath(relpath).parts)


def create_exclusive(
    path: Path, data: bytes, *, like: Path, executable: bool = False, durable: bool = True
) -> None:
    """Create `path` afresh with `data` and the attributes `like` would get (see
    `attributes_for`): a leftover, or a symlink planted at `path`, is removed, never
    followed (O_EXCL | O_NOFOLLOW). fsynced unless not `durable` (a container's own layer,
    rewritten at the next start anyway); the caller renames it."""
    attrs = attributes_for(like, executable=executable)
    path.unlink(missing_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(data)
        fh.flush()
        if durable:
            os.fsync(fh.fileno())
        set_attributes(fh.fileno(), attrs)


def put(staged: Path, path: Path) -> None:
    """Rename a file staged beside `path` over it (atomic on one file system): the one rename
    that writes vLLM's files, for the entrypoint here and the host's transaction."""
    os.replace(staged, path)


def make_folder(path: Path) -> None:
    """Create one folder with its parent's owner, group and permission bits."""
    parent = path.parent.stat()
    path.mkdir()
    follow_folder_owner(path, path.parent)
    path.chmod(stat.S_IMODE(parent.st_mode) & 0o777)


def created_folders(changes: Changes, exists: Callable[[str], bool]) -> list[str]:
    """The folders to create for the new files in `changes`, outermost first; `exists`
    tells whether a folder (a relpath) is there already."""
    found: list[str] = []
    for rel, data in changes.items():
        if data is None:
            continue
        chain = []
        for folder in PurePosixPath(rel).parents:
            name = folder.as_posix()
            if name == "." or exists(name):
                break
            chain.append(name)
        found += [f for f in reversed(chain) if f not in found]
    return found


def removable(folder: str) -> bool:
    """May a deletion that empties `folder` remove it? Not the tree's root, not `vllm/`."""
    return folder not in KEPT


def emptied_candidates(deleted: Iterable[str]) -> list[str]:
    """The folders deleting the files `deleted` may leave empty, deepest first: each one is
    removed only if empty once the ones before it are gone (how `rmdir` in this order, and
    git, remove them)."""
    folders = {p.as_posix() for rel in deleted for p in PurePosixPath(rel).parents}
    return sorted((f for f in folders if removable(f)), key=lambda f: (-f.count("/"), f))


Entries = Callable[[str], Collection[str] | None]


def emptied_folders(changes: Changes, entries: Entries) -> list[str]:
    """The folders the deletions in `changes` leave empty, deepest first. `entries` lists a
    folder's entries as relpaths (None: not a real folder, e.g. a symlink: never removed)."""
    gone = {rel for rel, data in changes.items() if data is None}
    removed: list[str] = []
    for folder in emptied_candidates(gone):
        names = entries(folder)
        if names is not None and all(n in gone or n in removed for n in names):
            removed.append(folder)
    return removed


def folder_entries(root: Path, locate: Callable[[str], Path] | None = None) -> Entries:
    """`emptied_folders`'s `entries` for a tree on disk; `locate` finds a folder's path from
    its relpath (default: under `root`; the engine passes its symlink guard)."""

    def entries(folder: str) -> Collection[str] | None:
        path = root / folder if locate is None else locate(folder)
        if path.is_symlink() or not path.is_dir():
            return None
        return [f"{folder}/{entry.name}" for entry in path.iterdir()]

    return entries


def remove_emptied(root: Path, folders: Iterable[str]) -> None:
    """Remove `folders` (from `emptied_folders`/`emptied_candidates`, deepest first) where
    they are empty; a folder that is not is left."""
    for folder in folders:
        with contextlib.suppress(OSError):
            (root / folder).rmdir()


def read_back(changes: Changes, read: Callable[[str], bytes | None]) -> str | None:
    """The first file of `changes` that does not read back as written (by sha256), or None."""
    for rel, data in changes.items():
        if digest(read(rel)) != digest(data):
            return rel
    return None


class WriteRefusedError(Exception):
    """A planned write cannot be done (not writable, read back different); one line."""


def write_all(
    root: Path,
    changes: Changes,
    original: Mapping[str, bytes | None],
    *,
    executable: Collection[str] = (),
    suffix: str = ".patchset-new",
) -> None:
    """Write `changes` under `root` by these rules, all or none, without a journal (the
    image entrypoint: a container's own files, a start that fails leaves them as they were):
    the new bytes beside each file first (not fsynced: nothing here outlives the container's
    layer, and a start that dies is redone by the next), then the renames and deletions, the
    read-back, and the folders that leaves empty; a failure puts back `original` where a file
    was renamed or removed, and removes the folders it created."""
    for rel in changes:
        path = root / rel
        folder = next(p for p in path.parents if p.exists())
        if not os.access(folder, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
            raise WriteRefusedError(f"{path} is not writable by uid {os.getuid()}")
    created = created_folders(changes, lambda folder: (root / folder).exists())
    emptied = emptied_folders(changes, folder_entries(root))

    def temp(path: Path) -> Path:
        return path.with_name(temp_name(path.name, suffix))

    made: list[Path] = []
    temps: dict[str, Path] = {}
    done: list[str] = []
    try:
        for name in created:
            make_folder(root / name)
            made.append(root / name)
        for rel, data in changes.items():
            if data is not None:
                temps[rel] = temp(root / rel)
                create_exclusive(
                    temps[rel], data, like=root / rel, executable=rel in executable, durable=False
                )
        for rel, data in changes.items():
            if data is None:
                (root / rel).unlink(missing_ok=True)
            else:
                put(temps.pop(rel), root / rel)
            done.append(rel)
        differs = read_back(changes, lambda rel: read_file(root / rel))
        if differs is not None:
            raise WriteRefusedError(f"{root / differs}: read back differs after writing")
    except BaseException:
        for leftover in temps.values():
            leftover.unlink(missing_ok=True)
        for rel in done:
            path, data = root / rel, original.get(rel)
            if data is None:
                path.unlink(missing_ok=True)
            else:
                create_exclusive(temp(path), data, like=path)
                put(temp(path), path)
        for folder in reversed(made):
            folder.rmdir()
        raise
    remove_emptied(root, emptied)


def unique_suffix(suffix: str) -> str:
    """`suffix` made this process's own (a random token: two containers on one volume may
    both be pid 1), for temp names two writers of one tree never share."""
    return f"{suffix}-{os.urandom(4).hex()}"


class TreeLockedError(Exception):
    """Another process held the tree's lock for longer than the wait; one line."""


@contextlib.contextmanager
def locked(folder: Path, *, timeout: float = 300.0) -> Iterator[None]:
    """Hold an exclusive lock on `folder` (flock on the folder itself: no file is added to
    the tree); a second holder on the same tree (another start, another container on the
    same volume) waits for it, up to `timeout` seconds."""
    import fcntl  # noqa: PLC0415 - POSIX only; the image entrypoint's

    fd = os.open(folder, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | os.O_NOFOLLOW)
    try:
        deadline = time.monotonic() + timeout
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TreeLockedError(
                        f"{folder} is locked by another start for over {timeout:g} s"
                    ) from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)  # releases the lock


def read_file(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


__all__ = [
    "KEPT",
    "NAME_MAX",
    "Attributes",
    "TreeLockedError",
    "WriteRefusedError",
    "attributes_for",
    "create_exclusive",
    "created_folders",
    "digest",
    "emptied_candidates",
    "emptied_folders",
    "file_mode",
    "folder_entries",
    "follow_folder_owner",
    "locked",
    "make_folder",
    "name_fits",
    "read_back",
    "read_file",
    "relpath_problem",
    "removable",
    "remove_emptied",
    "set_attributes",
    "sha256",
    "temp_name",
    "unique_suffix",
    "write_all",
]
