"""Issue 36 item 5: `add --diff` of a diff made inside the vllm/ package (paths without the
`vllm/` folder), in a fresh project whose release cache is empty: the source is asked for its
newest release (a fake index on 127.0.0.1), whose few members it needs are read, and the
diff's root is found there, instead of the refusal "no release was at hand"."""

from __future__ import annotations

import json
from pathlib import Path

from patchset.authoring.tree import unified
from patchset.registry import load_registry
from tests.authoring.test_runtime_sites import FILE, NEXT, ORIGINAL
from tests.helpers.cli import cli
from tests.helpers.fake_index import FakeIndex


def test_a_package_relative_diff_with_an_empty_cache(
    tmp_path: Path, fake_index: FakeIndex, tmp_cache: object
) -> None:
    fake_index.add_release("0.27.0", {FILE: ORIGINAL.encode()})
    fake_index.add_release("0.27.1", {FILE: NEXT.encode()})
    registry = tmp_path / "patches"
    registry.mkdir()
    inner = FILE.removeprefix("vllm/")  # made inside the package: model_executor/layer.py
    text = unified(FILE, NEXT, NEXT.replace("import os", "import sys"))
    diff = tmp_path / "dflash2.patch"
    diff.write_text(text.replace(f"a/{FILE}", f"a/{inner}").replace(f"b/{FILE}", f"b/{inner}"))
    assert f"/{FILE}" not in diff.read_text()
    done = cli(
        "--registry",
        registry,
        "add",
        "dflash2",
        "--diff",
        diff,
        "--index-url",
        fake_index.index_url,
        "--format",
        "json",
    )
    assert done.code == 0, done.err
    assert "no release was at hand" not in done.err
    assert "relative to the vllm/ package" in done.err and "0.27.1" in done.err
    out = json.loads(done.out)
    assert out["detected_root"] == "vllm" and out["targets"] == [FILE]
    patch = load_registry(registry).get("dflash2")
    assert patch.targets == (FILE,)
    assert f"--- a/{FILE}" in (registry / "dflash2" / "patch.diff").read_text()
    # only the newest release was asked for (the older one's files never fetched)
    assert fake_index.server.hits[fake_index.sdist_path("0.27.0")] == 0
    assert fake_index.server.hits[fake_index.wheel_path("0.27.0")] == 0
