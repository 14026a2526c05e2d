"""Finding the folder that holds the `vllm` package, and the release it is."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

from patchset.errors import TargetError

_VERSION = re.compile(
    r"""^__version__\s*(?::[^=\n]*)?=\s*(?:version\s*=\s*)?['"]([^'"]+)['"]""", re.M
)


def find_installed() -> Path:
    """The folder holding the `vllm` package this interpreter would import, without importing it.

    `find_spec` on a top-level package reads the import path only, so this works in
    dist-packages (Debian, the official images) and site-packages alike.
    """
    spec = importlib.util.find_spec("vllm")
    if spec is None or not spec.submodule_search_locations:
        raise TargetError("no vllm package is importable here; pass --target DIR")
    return Path(next(iter(spec.submodule_search_locations))).parent


def vllm_root(path: Path | str | None) -> Path:
    """Validate a target folder: it must hold a `vllm/` package (an __init__.py inside)."""
    if path is None:
        return find_installed()
    root = Path(path)
    if not root.exists():
        raise TargetError("target folder does not exist", path=root)
    if not root.is_dir():
        raise TargetError("target is not a folder", path=root)
    if not (root / "vllm" / "__init__.py").is_file():
        hint = " (pass its parent folder)" if root.name == "vllm" else ""
        raise TargetError(f"no vllm/ package in this folder{hint}", path=root)
    return root


def read_version(root: Path) -> str | None:
    """The release in `root`: vllm/_version.py (setuptools-scm), else dist-info, else None."""
    scm = root / "vllm" / "_version.py"
    if scm.is_file():
        match = _VERSION.search(scm.read_text(encoding="utf-8", errors="replace"))
        if match:
            return match.group(1)
    for info in sorted(root.glob("vllm-*.dist-info")):
        metadata = info / "METADATA"
        if metadata.is_file():
            for line in metadata.read_text(encoding="utf-8", errors="replace").splitlines():
                if line.startswith("Version:"):
                    return line.split(":", 1)[1].strip()
    return None
