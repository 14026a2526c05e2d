"""`check --format github` on real releases (from the cache), read with a parser of the
workflow-command syntax: file= from the repository root, line= at what failed, folding, the
per-step roll-up, the job summary and what happens when it cannot be written."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from tests.cli.test_ci import REPO, open_ended_registry
from tests.helpers.cli import run_cli
from tests.helpers.workflow_commands import read_annotations

pytestmark = pytest.mark.network  # real releases, from the cache


@pytest.fixture(scope="module", autouse=True)
def _in_the_runs_cache(tmp_path_factory: pytest.TempPathFactory) -> None:
    """What the offline checks below read, fetched into the run's own cache first (range
    reads of the releases, as the product does): no test leans on an earlier one's cache."""
    for make in (open_ended_registry, runtime_registry):
        folder = make(tmp_path_factory.mktemp("fetch"))
        online = run_cli("--registry", str(folder), "check", *RELEASES, "--format", "json")
        assert online.returncode in (0, 1), online.stderr


RELEASES = ("--vllm", "0.19.1", "--vllm", "0.20.0", "--vllm", "0.21.0")


def runtime_registry(tmp_path: Path) -> Path:
    """tolist-cudagraph carried forward with no probe: 0.21.0 makes it partial (site a gone)."""
    registry = tmp_path / "patches"
    shutil.copytree(REPO / "patches" / "tolist-cudagraph", registry / "tolist-cudagraph")
    toml = registry / "tolist-cudagraph" / "patch.toml"
    text = toml.read_text().replace('vllm = ">=0.20.0,<0.21.0"', 'vllm = ">=0.20.0"')
    toml.write_text(re.sub(r"\[upstream\.probe\].*", "", text, flags=re.S))
    return registry


def test_a_site_points_at_its_anchor_in_sites_toml(tmp_path: Path) -> None:
    runtime_registry(tmp_path)
    proc = run_cli("check", "--vllm", "0.21.0", "--offline", "--format", "github", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    (error,) = read_annotations(proc.stdout)
    assert error.properties["file"] == "patches/tolist-cudagraph/sites.toml"
    sites = (tmp_path / "patches/tolist-cudagraph/sites.toml").read_text().split("\n")
    line = int(error.properties["line"])
    assert sites[line - 1].startswith("anchor = ")
    assert "a-forward-prefill-max-seq" in "\n".join(sites[line - 6 : line])  # site a's anchor


def test_file_is_relative_to_the_workspace_not_the_working_folder(tmp_path: Path) -> None:
    open_ended_registry(tmp_path)
    sub = tmp_path / "ci" / "deep"
    sub.mkdir(parents=True)
    proc = run_cli(
        *("--registry", str(tmp_path / "patches"), "check", "--vllm", "0.20.0", "--offline"),
        *("--format", "github"),
        cwd=sub,
        env={"GITHUB_WORKSPACE": str(tmp_path)},
    )
    (error,) = read_annotations(proc.stdout)
    assert error.properties["file"] == "patches/fla-tma-sm12x/patch.diff"


def test_more_than_ten_findings_roll_up_and_the_summary_lists_them(tmp_path: Path) -> None:
    registry = open_ended_registry(tmp_path)
    for n in range(1, 12):  # twelve patches that all conflict on 0.20.0
        copy = registry / f"fla-copy-{n:02d}"
        shutil.copytree(registry / "fla-tma-sm12x", copy)
        toml = copy / "patch.toml"
        toml.write_text(toml.read_text().replace('"fla-tma-sm12x"', f'"fla-copy-{n:02d}"'))
    summary = tmp_path / "summary.md"
    proc = run_cli(
        *("check", "--vllm", "0.19.1", "--vllm", "0.20.0", "--offline", "--format", "github"),
        cwd=tmp_path,
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert proc.returncode == 1, proc.stderr
    errors = [a for a in read_annotations(proc.stdout) if a.name == "error"]
    assert len(errors) == 10  # what GitHub shows for one step
    assert all("line" in e.properties for e in errors[:9])
    assert errors[9].properties["title"] == "patchset check: 3 more errors"
    assert errors[9].data.count(": conflict on 0.20.0") == 3
    text = summary.read_text()
    attention = text.split("### Needs attention (in range)", 1)[1].split("<details>", 1)[0]
    assert len([line for line in attention.splitlines() if line.startswith("- ")]) == 12


def test_an_unwritable_summary_warns_and_keeps_the_exit_code(tmp_path: Path) -> None:
    open_ended_registry(tmp_path)
    target = tmp_path / "no-such-folder" / "summary.md"
    proc = run_cli(
        *("check", "--vllm", "0.20.0", "--offline", "--format", "github"),
        cwd=tmp_path,
        env={"GITHUB_STEP_SUMMARY": str(target)},
    )
    assert proc.returncode == 1  # the check's own answer, a conflict
    assert proc.stderr.strip() == (
        f"patchset: warning: GITHUB_STEP_SUMMARY={target}: cannot write the job summary:"
        " No such file or directory"
    )
    kinds = [(a.name, a.properties.get("title")) for a in read_annotations(proc.stdout)]
    assert ("warning", "patchset check") in kinds


def test_a_fatal_error_is_an_annotation_too(tmp_path: Path) -> None:
    open_ended_registry(tmp_path)
    proc = run_cli(
        *("check", "--vllm", "0.20.0", "--patch", "no-such-patch", "--offline"),
        *("--format", "github"),
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    (error,) = read_annotations(proc.stdout)
    assert error.name == "error" and error.properties == {"title": "patchset check"}
    assert "no-such-patch" in error.data
    assert proc.stderr.startswith("patchset: error: ")
