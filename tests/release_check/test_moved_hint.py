"""The moved-file hint on real releases (docs/check.md, "Moved files"): named for a file that
moved (here into a package of its own name), never for a file not written yet."""

from __future__ import annotations

import difflib
from pathlib import Path

import pytest

from patchset.registry import load_registry
from patchset.release_check import check
from patchset.release_check.moves import content_lines
from patchset.sources.package_index import IndexSource
from tests.helpers.synthetic import add_patch

pytestmark = pytest.mark.network
INC = "vllm/model_executor/layers/quantization/inc.py"  # became the package inc/ in 0.24.0
GEMMA4 = "vllm/model_executor/models/gemma4.py"  # first shipped in 0.19.0, beside gemma3.py


def _one_line_diff(rel: str, text: str) -> str:
    """A diff changing the first content line in the middle of `text`."""
    lines = text.splitlines(keepends=True)
    i = next(n for n in range(len(lines) // 2, len(lines)) if content_lines([lines[n]]))
    new = [*lines[:i], lines[i].rstrip("\n") + "  # patched\n", *lines[i + 1 :]]
    return "".join(difflib.unified_diff(lines, new, f"a/{rel}", f"b/{rel}"))


def _release_text(source: IndexSource, version: str, rel: str) -> str:
    with source.open(version) as tree:
        data = tree.read(rel)
    assert data is not None
    return data.decode()


def test_a_file_that_became_a_package_is_named_there(tmp_path: Path) -> None:
    source = IndexSource()
    diff = _one_line_diff(INC, _release_text(source, "0.23.0", INC))
    add_patch(tmp_path / "patches", "inc", diff=diff, targets=[INC], vllm=">=0.23.0")
    report = check(load_registry(tmp_path / "patches"), ["0.23.0", "0.24.0"], source=source)
    assert report.result("0.23.0", "inc").verdict == "needed"
    r = report.result("0.24.0", "inc")
    assert r.verdict == "missing-target"
    assert r.moved_to and all(m.startswith(INC[: -len(".py")] + "/") for m in r.moved_to)
    assert f"moved to {r.moved_to[0]}" in r.detail


def test_no_hint_for_a_file_not_written_yet(tmp_path: Path) -> None:
    source = IndexSource()
    diff = _one_line_diff(GEMMA4, _release_text(source, "0.19.0", GEMMA4))
    add_patch(tmp_path / "patches", "gemma4", diff=diff, targets=[GEMMA4], vllm=">=0.19.0")
    report = check(load_registry(tmp_path / "patches"), ["0.18.1", "0.19.0"], source=source)
    r = report.result("0.18.1", "gemma4")
    assert (r.verdict, r.moved_to) == ("missing-target", ())
    assert "moved" not in r.detail
    assert report.result("0.19.0", "gemma4").verdict == "needed"
