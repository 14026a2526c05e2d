"""Helpers for the hardening tests: exact snapshots of folders, and the CLI as a user runs it."""

from __future__ import annotations

import contextlib
import errno
import hashlib
import io
import os
import stat
import subprocess
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli

REPO = Path(__file__).resolve().parents[2]
LOCK = ".patchset.lock"  # the one file patchset leaves in a target it wrote to, by design

Snapshot = dict[str, str]


def snapshot(root: Path, *, ignore: Iterable[str] = ()) -> Snapshot:
    """Every entry under `root` (not following symlinks): file bytes and mode, link targets,
    folders, FIFOs. Two equal snapshots mean nothing in the folder changed."""
    skip = set(ignore)
    found: Snapshot = {}
    if not root.exists() and not root.is_symlink():
        return found
    for folder, dirs, files in os.walk(root, followlinks=False):
        for name in [*dirs, *files]:
            path = Path(folder, name)
            rel = path.relative_to(root).as_posix()
            if rel in skip:
                continue
            info = path.lstat()
            mode = stat.S_IMODE(info.st_mode)
            if stat.S_ISLNK(info.st_mode):
                found[rel] = f"link -> {path.readlink()}"
            elif stat.S_ISDIR(info.st_mode):
                found[rel] = f"dir {mode:o}"
            elif stat.S_ISREG(info.st_mode):
                digest = hashlib.sha256(path.read_bytes()).hexdigest()
                found[rel] = f"file {mode:o} {digest}"
            else:
                found[rel] = f"special {stat.S_IFMT(info.st_mode):o}"
    return found


def changed(before: Snapshot, after: Snapshot) -> list[str]:
    """The entries that differ between two snapshots, for assertion messages."""
    return sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))


def cli(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m patchset ARGS` in a fresh process, as a user would run it."""
    return run_cli(*args, env=env, timeout=timeout)


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    """The one error line a failed command printed; no traceback, no second line."""
    assert "Traceback" not in proc.stderr, proc.stderr
    lines = proc.stderr.strip("\n").splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("patchset: error: "), lines[0]
    assert "\x1b" not in lines[0], "control characters must be shown escaped"
    return lines[0]


def full_disk_under(
    monkeypatch: pytest.MonkeyPatch, folder: Path, *, skip: int = 0, folders: bool = False
) -> None:
    """A full disk under `folder`: every file opened for writing there (`os.fdopen` of a
    temp file, `open`/`Path.write_text`; from the `skip`-th on) is swapped for /dev/full,
    whose writes fail with the kernel's own ENOSPC; with `folders`, a new folder there
    (`os.mkdir`, so `tempfile.mkdtemp` and `Path.mkdir` too) fails with ENOSPC as well, as
    it does on a disk with no block left for its entries. A small real file system needs
    root to mount, so the disk fills where the bytes go (`small_disk` mounts one where it
    may)."""
    if folders:
        real_mkdir = os.mkdir

        def mkdir(path: object, mode: int = 0o777, *args: object, **kwargs: object) -> None:
            if Path(path).resolve().is_relative_to(folder.resolve()):  # type: ignore[arg-type]
                raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(path))
            real_mkdir(path, mode, *args, **kwargs)  # type: ignore[arg-type]

        monkeypatch.setattr(os, "mkdir", mkdir)
    real_fdopen = os.fdopen
    opened = [0]

    def fdopen(fd: int, mode: str = "r", *args: object, **kwargs: object) -> object:
        inside = Path(f"/proc/self/fd/{fd}").readlink().is_relative_to(folder.resolve())
        if "w" in mode and inside:
            opened[0] += 1
            if opened[0] > skip:
                os.close(fd)
                return open("/dev/full", "wb")  # noqa: PTH123 -- the caller closes it
        return real_fdopen(fd, mode, *args, **kwargs)  # type: ignore[call-overload]

    real_open = io.open

    def open_(file: object, mode: str = "r", *args: object, **kwargs: object) -> object:
        writing = isinstance(file, str | Path) and any(c in mode for c in "wax")
        writing = writing and not Path(file).is_dir()  # type: ignore[arg-type] # O_TMPFILE
        if writing and Path(file).resolve().is_relative_to(folder.resolve()):  # type: ignore[arg-type]
            opened[0] += 1
            if opened[0] > skip:
                real_open(file, mode, *args, **kwargs).close()  # type: ignore[call-overload]
                return real_open("/dev/full", "wb" if "b" in mode else "w")
        return real_open(file, mode, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr(os, "fdopen", fdopen)
    monkeypatch.setattr(io, "open", open_)


@contextlib.contextmanager
def small_disk(folder: Path, size: str = "1m") -> Iterator[Path]:
    """A real file system of `size` (tmpfs) mounted on `folder`, unmounted afterwards; the
    test is skipped, with the reason, where mounting is not permitted (not root, or no
    CAP_SYS_ADMIN in a container)."""
    folder.mkdir(parents=True, exist_ok=True)
    mount = ["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(folder)]
    try:
        done = subprocess.run(mount, capture_output=True, text=True, check=False, timeout=30)
    except OSError as exc:  # no mount program
        pytest.skip(f"cannot mount a small file system here: {exc}")
    if done.returncode != 0:
        pytest.skip(f"cannot mount a small file system here: {done.stderr.strip()}")
    try:
        yield folder
    finally:
        subprocess.run(["umount", str(folder)], capture_output=True, check=False, timeout=30)
