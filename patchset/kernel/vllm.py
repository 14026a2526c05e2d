"""Where the `vllm` package is, and which release it holds: the one locator and version reader.

Used on the host (the apply engine's target, a folder source) and inside images: the image
source and the image build send this module's own source to the image's python3 and run
`locate()`, and the image entrypoint imports it as `patchset_kernel.vllm`. So it is standard
library only, never imports vLLM and never runs its files (they are parsed), and raises only
`NotATargetError`, which its callers turn into their own errors.
"""

from __future__ import annotations

import ast
import importlib.util
import os
import re
import sys
from pathlib import Path
from typing import Any

_FOLDER_NAME = re.compile(r"^vllm-(\d[^/]*)$")


class NotATargetError(Exception):
    """No usable `vllm` package where one was looked for; `path` names the place, if any."""

    def __init__(self, message: str, path: Path | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.path = path


def find_installed() -> Path:
    """The folder holding the `vllm` package this interpreter would import, without importing it.

    `find_spec` on a top-level package reads the import path only, so this works in
    dist-packages (Debian, the official images) and site-packages alike.
    """
    try:
        spec = importlib.util.find_spec("vllm")
    except (ImportError, ValueError):
        spec = None
    if spec is None or not spec.submodule_search_locations:
        raise NotATargetError("no vllm package is importable here")
    return Path(next(iter(spec.submodule_search_locations))).parent


def target_root(path: Path | str | None) -> Path:
    """A folder to patch: `path` must hold a `vllm/` package; None means the importable one."""
    if path is None:
        return find_installed()
    root = Path(path)
    if not root.exists():
        raise NotATargetError("target folder does not exist", root)
    if not root.is_dir():
        raise NotATargetError("target is not a folder", root)
    if not (root / "vllm" / "__init__.py").is_file():
        hint = " (pass its parent folder)" if root.name == "vllm" else ""
        raise NotATargetError(f"no vllm/ package in this folder{hint}", root)
    return root


def read_version(root: Path) -> tuple[str, str] | None:
    """The release in `root` (the folder holding `vllm/`) and where it was read, or None.

    In order: the string assigned to ``__version__`` in vllm/_version.py (setuptools-scm) or
    vllm/version.py, parsed and never run; a ``vllm-*.dist-info`` (or egg-info) beside the
    package; the folder's own name when it is an unpacked sdist such as ``vllm-0.17.0``.
    """
    for module in ("_version.py", "version.py"):
        path = root / "vllm" / module
        found = _assigned_version(path)
        if found:
            return found, str(path)
    infos = sorted(root.glob("vllm-*.dist-info")) + sorted(root.glob("vllm-*.egg-info"))
    if infos:  # imported here: it costs the image entrypoint 60 ms at every container start
        import importlib.metadata  # noqa: PLC0415
    for info in infos:
        version = importlib.metadata.Distribution.at(info).version
        if version:
            return version, str(info)
    match = _FOLDER_NAME.match(root.resolve().name)
    return (match.group(1), f"the folder name {root.resolve().name}") if match else None


def _assigned_version(path: Path) -> str | None:
    """A string literal assigned to ``__version__`` (``__version__ = version = '0.19.1'``)."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return None
    for node in tree.body:
        if isinstance(node, ast.Assign):
            targets = node.targets
        elif isinstance(node, ast.AnnAssign):
            targets = [node.target]
        else:
            continue
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        value = node.value
        if "__version__" in names and isinstance(value, ast.Constant):
            return value.value if isinstance(value.value, str) else None
    return None


def locate() -> dict[str, Any]:
    """What an image's python3 says about its vllm (run there through `locate_script()`).

    ``root``: the folder holding the package as found on the path; ``folder``: the package's
    real path (symlinks resolved); ``version`` and ``via``: `read_version(root)`; all None
    when no vllm is importable.
    """
    out: dict[str, Any] = {"python": sys.version.split()[0], "root": None, "folder": None}
    out.update(version=None, via=None)
    try:
        root = find_installed()
    except NotATargetError:
        return out
    out["root"], out["folder"] = str(root), os.path.realpath(root / "vllm")
    found = read_version(root)
    if found is not None:
        out["version"], out["via"] = found
    return out


def locate_script() -> str:
    """Python source for ``python3 -c``: this module, then print `locate()` as one JSON line."""
    return Path(__file__).read_text(encoding="utf-8") + (
        "\n\nif __name__ == '__main__':\n    import json\n\n    print(json.dumps(locate()))\n"
    )
