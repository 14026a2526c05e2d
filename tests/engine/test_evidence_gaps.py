"""Issue 36 item 4, the issue's own shape: `revert --patch X` after a whole-tree `apply`, beside a
dependent of X that the whole-tree apply never applied (out of its range there) and whose file
the tree lacks. Before, the dependent's missing file stopped the revert (exit 4); now it is
not in the way, the applied dependent goes out first, the tree is back to its bytes."""

from __future__ import annotations

import json
from pathlib import Path

from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode
from patchset.registry import load_registry
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import BODY, MOD_DIFF, ON_TOP, OTHER_DIFF, add_keys, add_patch
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
