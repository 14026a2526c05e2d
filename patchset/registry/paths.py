"""Path rules shared by the registry and the engine: relative, under vllm/, never outside."""

from __future__ import annotations

from pathlib import Path, PurePosixPath

from patchset.errors import PayloadError, TargetError


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
    if pure.as_posix() != relpath:  # `vllm/./x.py`, `vllm//x.py`: one file, two spellings
        raise PayloadError(f"{relpath}: write it plainly, as {pure.as_posix()}", path=file)
    return relpath


def resolve_inside(root: Path, relpath: str) -> Path:
    """The real path of `relpath` under `root`; a symlink leading outside `root` is refused."""
    real_root = root.resolve()
    candidate = (root / relpath).resolve()
    if candidate != real_root and real_root not in candidate.parents:
        raise TargetError(f"{relpath}: leads outside the target through a symlink", path=root)
    return candidate
