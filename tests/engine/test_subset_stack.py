"""Host `apply` with a subset of patches changing one file (issue 35.1): whichever of three
independent patches are asked for, each applies on what those before it left, and the file
ends as the release's with exactly those in."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest

from patchset.engine.apply import apply
from patchset.errors import UsageError
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


SWITCHED = '\n[switch]\nenv = "PS_ENABLE_{n}"\ndefault = {d}\n{more}'
ALIAS = 'aliases = ["PS_ENABLE_OLD_A"]\n'


def switched_registry(tmp_path: Path) -> tuple[Path, Path]:
    """`a` off by default, switched by PS_ENABLE_A or its alias PS_ENABLE_OLD_A; `b` on."""
    root = tmp_path / "patches"
    (a, b) = sorted(EDITS)[:2]
    add_patch(root, a, diff=diff_for(EDITS[a]), targets=["vllm/mod.py"],
              tail=SWITCHED.format(n="A", d="false", more=ALIAS))  # fmt: skip
    add_patch(root, b, diff=diff_for(EDITS[b]), targets=["vllm/mod.py"],
              tail=SWITCHED.format(n="B", d="true", more=""))  # fmt: skip
    return root, make_tree(tmp_path / "site", {"vllm/mod.py": BODY})


@pytest.mark.parametrize(
    ("environ", "on"),
    [
        ({}, {"b"}),
        ({"PS_ENABLE_OLD_A": "1"}, {"a", "b"}),  # the alias switches its patch, as at start
        ({"PS_ENABLE_OLD_A": "yes", "PS_ENABLE_A": "on"}, {"a", "b"}),
        ({"PS_ENABLE_OLD_A": "0", "PS_ENABLE_B": "0"}, set()),
    ],
)
def test_apply_maps_a_switch_alias_onto_its_patch(
    tmp_path: Path, environ: dict[str, str], on: set[str]
) -> None:
    root, tree = switched_registry(tmp_path)
    (a, b) = sorted(EDITS)[:2]
    ids = {"a": a, "b": b}
    report = apply(load_registry(root), tree, compute_capability=None, environ=environ)
    assert {r.patch for r in report.results if r.outcome == "applied"} == {ids[x] for x in on}
    assert (tree / "vllm" / "mod.py").read_text() == expected({ids[x] for x in on})


def test_apply_refuses_an_alias_set_against_its_switch(tmp_path: Path) -> None:
    root, tree = switched_registry(tmp_path)
    registry = load_registry(root)
    with pytest.raises(UsageError, match="set the same switch both ways"):
        apply(registry, tree, environ={"PS_ENABLE_OLD_A": "1", "PS_ENABLE_A": "0"})
    with pytest.raises(UsageError, match="PS_ENABLE_OLD_A='maybe' is not a switch value"):
        apply(registry, tree, environ={"PS_ENABLE_OLD_A": "maybe"})
    assert (tree / "vllm" / "mod.py").read_text() == BODY
