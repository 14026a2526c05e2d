"""Real vLLM release files for tests: fetched from the package index through patchset's own
IndexSource (sha256-checked, cached under $PATCHSET_CACHE_DIR: in a test run, the run's own
cache, tests/conftest.py), then laid out as a small folder holding a vllm/ package."""

from __future__ import annotations

import difflib
import hashlib
from pathlib import Path

from patchset.sources.package_index import IndexSource
from tests.helpers.synthetic import add_patch

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


FLA = "vllm/model_executor/layers/fla/ops/utils.py"


def stacked_series(registry: Path, version: str, *, bottom: str, top: str) -> tuple[str, str]:
    """Two diff patches on the release's FLA utils, 'a-stack-top' stacked on 'z-stack-bottom'
    (its context holds the bottom's line; the alphabet would put them the wrong way round),
    added to `registry`; applied at `bottom` and `top`. Returns the file after each."""
    with IndexSource().open(version) as tree:
        data = tree.read(FLA)
    assert data is not None
    original = data.decode()
    anchor = "FLA_CHUNK_SIZE = 64\n"
    assert original.count(anchor) == 1
    once = original.replace(anchor, anchor + "FLA_STACK_BOTTOM = True\n")
    twice = once.replace(
        "FLA_STACK_BOTTOM = True\n", "FLA_STACK_BOTTOM = True\nFLA_STACK_TOP = FLA_STACK_BOTTOM\n"
    )
    for patch_id, when, old, new in (
        ("z-stack-bottom", bottom, original, once),
        ("a-stack-top", top, once, twice),
    ):
        folder = add_patch(registry, patch_id, diff="", targets=[FLA], when=when)
        diff = difflib.unified_diff(
            old.splitlines(keepends=True),
            new.splitlines(keepends=True),
            f"a/{FLA}",
            f"b/{FLA}",
        )
        (folder / "patch.diff").write_text("".join(diff))
    toml = registry / "a-stack-top" / "patch.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]", 'requires = ["z-stack-bottom"]\n\n[upstream]')
    )
    return once, twice
