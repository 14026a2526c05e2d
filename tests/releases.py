"""Real vLLM release files for tests: fetched from the package index through patchset's own
IndexSource (sha256-checked, cached under $PATCHSET_CACHE_DIR or ~/.cache/patchset), then laid
out as a small folder holding a vllm/ package."""

from __future__ import annotations

import hashlib
from pathlib import Path

from patchset.sources.package_index import IndexSource

ALWAYS = ("vllm/__init__.py", "vllm/_version.py")


def materialize(version: str, dest: Path, files: tuple[str, ...] | list[str]) -> Path:
    """Write the release's `files` (plus vllm/__init__.py and _version.py) under `dest`."""
    with IndexSource().open(version) as tree:
        for rel in (*ALWAYS, *files):
            data = tree.read(rel)
            if data is None:
                continue
            path = dest / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
    return dest


def tree_digest(root: Path) -> dict[str, str]:
    """sha256 of every file under root, to prove a tree was (not) changed."""
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }
