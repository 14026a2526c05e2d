"""Path rules shared by the registry and the engine: relative, under vllm/, no `..`.

(The symlink guard of a target tree, `resolve_inside`, is a file-system rule: `patchset._fs`.)
"""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from patchset.errors import PayloadError
from patchset.kernel.tree import NAME_MAX, name_fits


def check_relpath(relpath: str, *, file: Path | str) -> str:
    """A payload path must be relative, inside vllm/, free of '..' and backslashes."""
    pure = PurePosixPath(relpath)
    if not relpath or "\\" in relpath or not relpath.isprintable():
        raise PayloadError(f"{relpath!r}: not a usable path", path=file)
    if pure.is_absolute():
        raise PayloadError(f"{relpath}: absolute paths are refused", path=file)
    if ".." in pure.parts:
        raise PayloadError(f"{relpath}: '..' is refused", path=file)
    if pure.parts[0] != "vllm" or len(pure.parts) < 2:
        raise PayloadError(f"{relpath}: targets must lie under vllm/", path=file)
    if not name_fits(relpath):  # no file system holds it: refused before anything is written
        raise PayloadError(f"{relpath}: a name longer than {NAME_MAX} bytes", path=file)
    if pure.as_posix() != relpath:  # `vllm/./x.py`, `vllm//x.py`: one file, two spellings
        raise PayloadError(f"{relpath}: write it plainly, as {pure.as_posix()}", path=file)
    return relpath
