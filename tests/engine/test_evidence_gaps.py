"""Issue 36 item 4, the issue's own shape: `revert --patch X` after a whole-tree `apply`, beside a
dependent of X that the whole-tree apply never applied (out of its range there) and whose file
the tree lacks. Before, the dependent's missing file stopped the revert (exit 4); now it is
not in the way, the applied dependent goes out first, the tree is back to its bytes. And a
patch stacked on one that is not in the tree (so never applied either) is not in the way of a
whole-tree revert; one edited by hand over what it is stacked on still is."""

from __future__ import annotations

import json
from pathlib import Path

from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode
from patchset.registry import load_registry
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    ON_TOP,
    OTHER,
    OTHER_DIFF,
    add_keys,
    add_patch,
)
from tests.helpers.synthetic import make_tree as tree_of

GONE_DIFF = OTHER_DIFF.replace("vllm/other.py", "vllm/gone.py")


def _registry(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    add_patch(root, "p27", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "stacked", diff=ON_TOP, targets=["vllm/mod.py"])
    add_keys(root, "stacked", 'requires = ["p27"]')
    # a dependent for a later release: its file is not in 0.19.1, the whole-tree apply skips it
    add_patch(root, "later", diff=GONE_DIFF, targets=["vllm/gone.py"], vllm=">=0.20")
    add_keys(root, "later", 'requires = ["p27"]')
    return root


def test_revert_one_patch_after_a_whole_tree_apply(tmp_path: Path) -> None:
    root = _registry(tmp_path)
    tree = tree_of(tmp_path / "t", {"vllm/mod.py": BODY})
    applied = run_cli("--registry", root, "apply", "--target", tree, "--format", "json")
    assert applied.returncode == ExitCode.OK, applied.stdout + applied.stderr
    outcomes = {r["patch"]: r["outcome"] for r in json.loads(applied.stdout)["results"]}
    assert outcomes["p27"] == "applied" and outcomes["stacked"] == "applied"
    assert outcomes["later"] != "applied"
    done = run_cli(
        "--registry", root, "revert", "--target", tree, "--patch", "p27", "--format", "json"
    )
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    rows = {r["patch"]: r for r in json.loads(done.stdout)["results"]}
    assert rows["p27"]["outcome"] == "reverted" and rows["stacked"]["outcome"] == "reverted"
    assert rows["later"]["outcome"] == "not-applied"
    assert (tree / "vllm" / "mod.py").read_text() == BODY
    assert not (tree / "vllm" / "gone.py").exists()


def test_whole_tree_revert_with_a_stacked_patch_never_applied(tmp_path: Path) -> None:
    """Only p27 was applied: the whole-tree revert takes it out; `stacked` (never applied)
    and `later` (files missing) are not in the way."""
    root = _registry(tmp_path)
    tree = tree_of(tmp_path / "t", {"vllm/mod.py": BODY})
    registry = load_registry(root)
    assert apply(registry, tree, patches=["p27"]).written
    report = revert(registry, tree)
    got = {r.patch: r.outcome for r in report.results}
    assert got["p27"] == "reverted", report.results
    assert got["stacked"] == "not-applied" and got["later"] in ("not-applied", "skipped")
    assert report.exit_code == ExitCode.OK and report.written
    assert (tree / "vllm" / "mod.py").read_text() == BODY


def _with_other(tmp_path: Path) -> tuple[Path, Path]:
    root = _registry(tmp_path)
    other = OTHER_DIFF.replace("vllm/other.py", "vllm/other.txt")
    add_patch(root, "other", diff=other, targets=["vllm/other.txt"])
    tree = tree_of(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.txt": OTHER})
    return root, tree


def test_a_stacked_patch_on_an_absent_one_is_not_in_the_way(tmp_path: Path) -> None:
    """Neither p27 nor `stacked` (stacked on it) was applied, `other` was: the whole-tree
    revert takes `other` out. Before, `stacked` (fitting neither way, as what it is stacked
    on is not there) read `conflict` and stopped the run (exit 1, nothing written)."""
    root, tree = _with_other(tmp_path)
    registry = load_registry(root)
    assert apply(registry, tree, patches=["other"]).written
    report = revert(registry, tree)
    got = {r.patch: r for r in report.results}
    assert got["other"].outcome == "reverted", report.results
    assert got["stacked"].outcome == "not-applied"
    assert "stacked on p27, which is not in the tree either" in got["stacked"].details[0]
    assert report.written and report.exit_code == ExitCode.OK
    assert (tree / "vllm" / "other.txt").read_text() == OTHER
    done = run_cli("--registry", root, "revert", "--target", tree)  # a stock tree now
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr


def test_a_stacked_patch_edited_by_hand_still_stops_the_revert(tmp_path: Path) -> None:
    """p27 and `stacked` applied, then `stacked`'s line edited by hand: p27 is in the tree,
    so `stacked` is a real conflict, nothing is written."""
    root, tree = _with_other(tmp_path)
    registry = load_registry(root)
    assert apply(registry, tree, patches=["stacked"]).written
    mod = tree / "vllm" / "mod.py"
    mod.write_text(mod.read_text().replace("line 12 patched too", "line 12 edited by hand"))
    before = mod.read_text()
    report = revert(registry, tree)
    got = {r.patch: r.outcome for r in report.results}
    assert got["stacked"] == "conflict" and not report.written, report.results
    assert mod.read_text() == before
