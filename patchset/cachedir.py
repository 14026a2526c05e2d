"""Where patchset keeps its cache: one folder for the package index's files, the check's memo
and the forge's answers.

``$PATCHSET_CACHE_DIR`` when set, else the user cache folder `platformdirs` names for
patchset (``$XDG_CACHE_HOME/patchset`` or ``~/.cache/patchset`` on Linux).
"""

from __future__ import annotations

import os
from pathlib import Path

from patchset.errors import SourceError


def cache_root() -> Path:
    """Where the cache lives: ``$PATCHSET_CACHE_DIR``, else the platform's user cache."""
    return cache_location()[0]


def cache_location() -> tuple[Path, str]:
    """The cache root and the setting that chose it."""
    if explicit := os.environ.get("PATCHSET_CACHE_DIR"):
        return Path(explicit).expanduser(), "$PATCHSET_CACHE_DIR"
    import platformdirs  # noqa: PLC0415 -- only when no override is set

    return platformdirs.user_cache_path("patchset", appauthor=False), "platformdirs (user cache)"


def write_error(dest: Path, reason: str | None, *, full: bool) -> SourceError:
    """A write in the cache that failed (`full`: the disk or a quota is full; else a
    read-only or unusable folder): one line, exit 3, saying what to do."""
    why = f" ({reason})" if reason else ""
    if full:
        return SourceError(
            f"the cache's disk is full: cannot write {dest}{why}; free some space,"
            " `patchset cache prune`, or set $PATCHSET_CACHE_DIR to another disk"
        )
    return SourceError(
        f"cannot write {dest} in the cache{why}; set $PATCHSET_CACHE_DIR to a writable folder"
    )


def folder_error(folder: Path, reason: object) -> SourceError:
    """A cache folder that cannot be written in (a read-only or unusable one): one line,
    exit 3."""
    return SourceError(
        f"cannot write in the cache folder {folder} ({reason});"
        " set $PATCHSET_CACHE_DIR to a writable folder"
    )
