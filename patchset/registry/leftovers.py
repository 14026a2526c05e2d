"""Hidden files a killed write leaves in a registry: found, and removed once old enough.

`add` stages a new patch in `.add-<id>-XXXXXXXX/` beside the patches, and every atomic write
(`_fs.atomic_file`) writes `.<name>.XXXXXXXX.tmp` beside the file it replaces; both vanish
when the process ends, unless it is killed. The loader skips them (dot names); `validate`
removes those older than `STALE_AFTER` seconds (a write under way is younger) and says which.
Only names of exactly these shapes are touched, never a symlink, and only in the registry
folder and its patch folders.
"""

from __future__ import annotations

import contextlib
import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

STALE_AFTER = 600  # seconds: no write of patchset's takes that long
# tempfile's random part: 8 characters of [a-z0-9_].
_ADD = re.compile(r"\.add-[a-z0-9][a-z0-9-]*-[a-z0-9_]{8}")
_TMP = re.compile(r"\..+\.[a-z0-9_]{8}\.tmp")


@dataclass(frozen=True)
class Leftover:
    path: Path
    age: float  # seconds since it was last written


def leftovers(root: Path, *, now: float | None = None) -> list[Leftover]:
    """patchset's hidden temporary files and staging folders in `root` and its patch folders."""
    now = time.time() if now is None else now
    folders = [root, *(p for p in sorted(root.iterdir()) if _plain_dir(p))]
    found: list[Leftover] = []
    for folder in folders:
        for path in sorted(folder.iterdir()):
            info = path.lstat()
            if path.is_symlink():
                continue
            staging = folder == root and path.is_dir() and _ADD.fullmatch(path.name)
            if staging or (path.is_file() and _TMP.fullmatch(path.name)):
                found.append(Leftover(path, max(0.0, now - info.st_mtime)))
    return found


def sweep(root: Path, *, older_than: float = STALE_AFTER) -> list[Leftover]:
    """Remove the leftovers older than `older_than` seconds; the ones removed."""
    removed: list[Leftover] = []
    for item in leftovers(root):
        if item.age < older_than:
            continue
        with contextlib.suppress(FileNotFoundError):  # another sweep got there first
            if item.path.is_dir():
                shutil.rmtree(item.path)
            else:
                item.path.unlink()
        removed.append(item)
    return removed


def _plain_dir(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not path.name.startswith(".")
