"""docs/coming-from.md, run as it is: every ```sh block, in order, with `set -e`, against a
collection made from the real 0.19.1 file and the repository's real patch."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.authoring.tree import unified
from patchset.engine.apply import apply
from patchset.registry import load_registry
from tests.helpers.releases import materialize, tree_digest

REPO = Path(__file__).parents[2]
PAGE = REPO / "docs" / "coming-from.md"
TMA_FILE = "vllm/model_executor/layers/fla/ops/utils.py"
PROSE = """\
Caps TMA at compute capability 12: on consumer Blackwell (sm_12x) the Triton autotuner
runs out of memory in solve_tril's merge kernel otherwise. Upstream: vllm-project/vllm#36325.

Install: cd /usr/local/lib/python3.12/dist-packages/vllm && patch -p1 --forward < this
"""


def blocks() -> list[str]:
    return re.findall(r"^```sh\n(.*?)^```", PAGE.read_text(), flags=re.S | re.M)


def package_relative(diff: str) -> str:
    """A diff as `cd vllm && diff -u` makes it: a/model_executor/..., b/model_executor/..."""
    return diff.replace("--- a/vllm/", "--- a/").replace("+++ b/vllm/", "+++ b/")


def collection(tmp_path: Path) -> tuple[Path, Path]:
    site = materialize("0.19.1", tmp_path / "site-packages", [TMA_FILE])
    pristine = (site / TMA_FILE).read_text()
    work = tmp_path / "work"
    shutil.copytree(site, work)
    assert apply(load_registry(REPO / "patches"), work, patches=["fla-tma-sm12x"]).written
    fixed = (work / TMA_FILE).read_text()
    coll = tmp_path / "collection"
    (coll / "quilt" / "patches").mkdir(parents=True)
    (coll / "overlays").mkdir()
    first = package_relative(unified(TMA_FILE, pristine, fixed))
    (coll / "fla-tma.patch").write_text(PROSE + "\n" + first)
    moved = fixed.replace("[0] < 12", "[0] < 13")
    assert moved != fixed
    (coll / "fla-tma-v2.patch").write_text(package_relative(unified(TMA_FILE, pristine, moved)))
    (coll / "quilt" / "patches" / "0001-fla-tma.patch").write_text(first)
    on_top = package_relative(unified(TMA_FILE, fixed, moved))
    (coll / "quilt" / "patches" / "0002-tma-13.patch").write_text("On top of 0001.\n\n" + on_top)
    (coll / "quilt" / "patches" / "series").write_text("0001-fla-tma.patch\n0002-tma-13.patch\n")
    (coll / "overlays" / "utils.py").write_text(fixed)
    return coll, site


@pytest.mark.network
def test_the_page_runs_as_written(tmp_path: Path) -> None:
    coll, site = collection(tmp_path)
    pristine = tree_digest(site)
    env = {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "COLLECTION": str(coll),
        "SITE": str(site),
    }
    env.pop("PATCHSET_REGISTRY", None)
    found = blocks()
    assert len(found) >= 6
    for number, block in enumerate(found, start=1):
        proc = subprocess.run(
            ["bash", "-euo", "pipefail", "-c", block],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
        assert proc.returncode == 0, f"block {number}:\n{block}\n{proc.stdout}\n{proc.stderr}"
        if number == 1:
            assert "relative to the vllm/ package" in proc.stderr
            assert "Caps TMA at compute capability 12" in proc.stdout  # the preamble, kept
    after = {k: v for k, v in tree_digest(site).items() if k != ".patchset.lock"}
    assert after == pristine  # applied, re-applied, reverted
    quilt = load_registry(tmp_path / "from-quilt" / "patches")
    assert quilt.get("tma-13").requires == ("fla-tma",)
    edits = load_registry(tmp_path / "from-edits" / "patches").get("tma-in-place")
    assert edits.targets == (TMA_FILE,)
    overlay = (tmp_path / "from-overlays" / "patches" / "fla-tma" / "patch.diff").read_text()
    assert overlay == unified(TMA_FILE, *_sides(site, coll))


def _sides(site: Path, coll: Path) -> tuple[str, str]:
    return (site / TMA_FILE).read_text(), (coll / "overlays" / "utils.py").read_text()


@pytest.mark.network
def test_the_readme_library_example_runs(tmp_path: Path) -> None:
    """README's "As a library" block, on a real installed-like 0.19.1: a plain dry run of the
    repository's registry exits 0 (what does not fit is skipped, not a failure)."""
    text = (REPO / "README.md").read_text()
    code = re.search(r"## As a library\n\n```python\n(.*?)```", text, flags=re.S)
    assert code is not None
    site = materialize("0.19.1", tmp_path / "dist-packages", [TMA_FILE])
    block = code.group(1).replace("/usr/local/lib/python3.12/dist-packages", str(site))
    assert str(site) in block
    proc = subprocess.run(
        [sys.executable, "-c", block],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "skipped" in proc.stdout or "applied" in proc.stdout
