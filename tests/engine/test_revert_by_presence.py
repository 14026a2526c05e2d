"""Issue 36 item 4: revert decides from the tree which patches are there. A patch stacked on
the one asked for that was never applied (its file is not in the tree) is no obstacle; a
revert of a stacked patch says which required patch stays applied, and how to take it out."""

from __future__ import annotations

from pathlib import Path

from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode
from patchset.registry import load_registry
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    ON_TOP,
    OTHER_DIFF,
    add_keys,
    add_patch,
    make_tree,
)

GONE_DIFF = OTHER_DIFF.replace("vllm/other.py", "vllm/gone.py")


def registry_at(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    add_patch(root, "z-first", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "a-second", diff=ON_TOP, targets=["vllm/mod.py"])
    add_keys(root, "a-second", 'requires = ["z-first"]')
    add_patch(root, "never", diff=GONE_DIFF, targets=["vllm/gone.py"])  # the tree lacks it
    add_keys(root, "never", 'requires = ["z-first"]')
    return root


def test_a_never_applied_dependent_is_not_in_the_way(tmp_path: Path) -> None:
    root = registry_at(tmp_path)
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    registry = load_registry(root)
    assert apply(registry, tree, patches=["z-first"]).written
    report = revert(registry, tree, patches=["z-first"])
    got = {r.patch: r.outcome for r in report.results}
    assert got == {"z-first": "reverted", "a-second": "not-applied", "never": "not-applied"}
    never = next(r for r in report.results if r.patch == "never")
    assert "its files are missing here" in never.details[0]
    assert report.written and report.exit_code == ExitCode.OK
    assert (tree / "vllm" / "mod.py").read_text() == BODY
    # the CLI too: exit 0, where it was exit 4 (missing-target) before
    assert apply(registry, tree, patches=["z-first"]).written
    done = run_cli("--registry", root, "revert", "--target", tree, "--patch", "z-first")
    assert done.returncode == 0, done.stdout + done.stderr
    assert (tree / "vllm" / "mod.py").read_text() == BODY


def test_a_revert_names_the_required_patch_left_applied(tmp_path: Path) -> None:
    root = registry_at(tmp_path)
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    registry = load_registry(root)
    applied = apply(registry, tree, patches=["a-second"])  # pulls z-first in
    assert {r.patch for r in applied.results if r.outcome == "applied"} == {"z-first", "a-second"}
    report = revert(registry, tree, patches=["a-second"])
    (second,) = [r for r in report.results if r.patch == "a-second"]
    assert second.outcome == "reverted"
    assert (
        "requires z-first, which stay(s) applied: `patchset revert --patch z-first` takes them"
        " out too"
    ) in second.details
    assert "line 11 patched" in (tree / "vllm" / "mod.py").read_text()  # z-first stays
    again = revert(registry, tree, patches=["z-first"])
    assert again.written and (tree / "vllm" / "mod.py").read_text() == BODY
