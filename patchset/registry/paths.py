"""Path rules shared by the registry and the engine: relative, under vllm/, no `..`.

The rule itself is the kernel's (`patchset.kernel.tree.relpath_problem`), so an image's
entrypoint reads a manifest's paths by the same one. (The symlink guard of a target tree,
`resolve_inside`, is a file-system rule: `patchset._fs`.)
"""

from __future__ import annotations

from pathlib import Path

from patchset.errors import PayloadError
from patchset.kernel.tree import relpath_problem


def check_relpath(relpath: str, *, file: Path | str) -> str:
    """A payload path must be relative, inside vllm/, free of '..' and backslashes."""
    problem = relpath_problem(relpath)
    if problem is not None:
        shown = repr(relpath) if problem == "not a usable path" else relpath
        raise PayloadError(f"{shown}: {problem}", path=file)
    return relpath
