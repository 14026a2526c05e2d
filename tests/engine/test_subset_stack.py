"""Host `apply` with a subset of patches changing one file (issue 35.1): whichever of three
independent patches are asked for, each applies on what those before it left, and the file
ends as the release's with exactly those in."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from patchset.engine.apply import apply
from patchset.registry import load_registry
from tests.helpers.synthetic import BODY, add_patch, make_tree
from tests.image.test_switch_stack import EDITS, diff_for, expected

SUBSETS = [set(c) for n in range(1, 4) for c in itertools.combinations(sorted(EDITS), n)]


@pytest.mark.parametrize("chosen", SUBSETS, ids=lambda c: "+".join(sorted(c)))
def test_apply_a_subset_on_one_file(tmp_path: Path, chosen: set[str]) -> None:
    root = tmp_path / "patches"
    for patch_id, line in EDITS.items():
        add_patch(root, patch_id, diff=diff_for(line), targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "site", {"vllm/mod.py": BODY})
    report = apply(load_registry(root), tree, patches=sorted(chosen), compute_capability=None)
    assert sorted(r.patch for r in report.results if r.outcome == "applied") == sorted(chosen)
    assert (tree / "vllm" / "mod.py").read_text() == expected(chosen)
