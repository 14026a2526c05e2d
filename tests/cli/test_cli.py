"""The command line as a user runs it: exit codes, one-line errors, JSON, nothing half-written."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import run_cli
from tests.helpers.releases import tree_digest
from tests.helpers.synthetic import make_tree

REPO = Path(__file__).parents[2]


def one_line_error(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith("patchset: error: ")
    return lines[0]


def test_list_show_validate_json() -> None:
    listed = json.loads(run_cli("list", "--format", "json").stdout)
    assert [p["id"] for p in listed["patches"]] == ["fla-tma-sm12x", "tolist-cudagraph"]
    shown = json.loads(run_cli("show", "tolist-cudagraph", "--format", "json").stdout)
    assert shown["kind"] == "runtime" and shown["apply"] == "startup"
    valid = run_cli("validate", "--format", "json")
    assert valid.returncode == 0
    assert json.loads(valid.stdout)["registry"] == listed["registry"]


def test_help_explains_exit_codes() -> None:
    out = run_cli("--help").stdout
    assert "exit codes" in out and "apply" in out and "revert" in out


def test_unknown_patch(tmp_path: Path) -> None:
    proc = run_cli("show", "fla-tma")
    assert proc.returncode == 2
    assert "did you mean 'fla-tma-sm12x'" in one_line_error(proc)


def test_malformed_registry(tmp_path: Path) -> None:
    reg = tmp_path / "patches"
    shutil.copytree(REPO / "patches", reg)
    toml = reg / "fla-tma-sm12x" / "patch.toml"
    toml.write_text(toml.read_text().replace('kind = "diff"', 'kind = "dif"'))
    proc = run_cli("--registry", str(reg), "validate")
    assert proc.returncode == 2
    line = one_line_error(proc)
    assert str(toml) in line and "kind: 'dif' is not one of diff, runtime" in line


def test_apply_no_vllm_package(tmp_path: Path) -> None:
    proc = run_cli("apply", "--target", str(tmp_path))
    assert proc.returncode == 2
    assert "no vllm/ package" in one_line_error(proc)


def test_apply_dry_run_and_exit_codes(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/model_executor/layers/fla/ops/utils.py": "x = 1\n"})
    before = tree_digest(tree)
    proc = run_cli("apply", "--target", str(tree), "--patch", "fla-tma-sm12x", "--format", "json")
    report = json.loads(proc.stdout)
    assert proc.returncode == 1 == report["exit_code"]
    assert report["results"][0]["outcome"] == "conflict"
    assert not report["written"]
    assert tree_digest(tree) == before


@pytest.mark.parametrize("bad", ["--fuzz=x", "--bogus"])
def test_bad_usage_exits_2(bad: str) -> None:
    assert run_cli("apply", bad).returncode == 2


def test_apply_without_target_finds_the_importable_vllm(tmp_path: Path) -> None:
    """No --target: the vLLM this Python would import, found without importing it."""
    site = tmp_path / "site-packages"
    make_tree(site, {"vllm/model_executor/layers/fla/ops/utils.py": "x = 1\n"})
    (site / "vllm" / "__init__.py").write_text("raise SystemExit('vllm must not be imported')\n")
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchset",
            "apply",
            "--dry-run",
            "--format",
            "json",
            "--patch",
            "fla-tma-sm12x",
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(site)},
    )
    report = json.loads(proc.stdout)
    assert report["target"] == str(site)
    assert report["results"][0]["outcome"] == "conflict"


def test_show_prints_tables_as_fields_and_no_workflow_commands(tmp_path: Path) -> None:
    """Issue 23 items 27 and 11: `upstream:` and `hardware:` as fields, not dict reprs; a
    description line a CI log would run as a workflow command is escaped."""
    registry = tmp_path / "patches"
    shutil.copytree(REPO / "patches" / "fla-tma-sm12x", registry / "fla-tma-sm12x")
    toml = registry / "fla-tma-sm12x" / "patch.toml"
    text = toml.read_text()
    head, sep, tail = text.partition('description = """')
    hostile = "::set-output name=x::owned\n  ::add-mask::secret\n"
    toml.write_text(head + sep + hostile + tail)
    out = run_cli("--registry", registry, "show", "fla-tma-sm12x").stdout
    assert "{'pr'" not in out and "'state'" not in out
    assert "  upstream:\n    pr: vllm-project/vllm#36325\n    state: open\n" in out
    assert "  hardware:\n    compute_capability: >=12.0\n" in out
    assert all(not line.lstrip().startswith("::") for line in out.splitlines()), out
    assert "\\::set-output name=x::owned" in out and "\\::add-mask::secret" in out
