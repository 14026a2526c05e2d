"""CI conveniences: `check --format github` annotations from real releases, the example
workflow in docs/, and the pre-commit hook."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

import patchset
from patchset import escape_data, escape_property, schemas, workflow_command
from tests.helpers.cli import run_cli
from tests.helpers.releases import materialize
from tests.helpers.workflow_commands import parse, read_annotations

REPO = Path(__file__).parents[2]
TMA_FILE = "vllm/model_executor/layers/fla/ops/utils.py"


def test_workflow_command_escaping() -> None:
    assert escape_data("50% a\nb\r") == "50%25 a%0Ab%0D"
    assert escape_property("a:b,c") == "a%3Ab%2Cc"
    line = workflow_command(
        "error", "two\nlines", file="patches/x/patch.diff", title="x r1: conflict, 0.20"
    )
    assert line == "::error file=patches/x/patch.diff,title=x r1%3A conflict%2C 0.20::two%0Alines"
    assert workflow_command("error", "a\nb") == "::error::a%0Ab"  # escaped with no properties


@pytest.mark.parametrize(
    "detail",
    [
        "100% sure",
        "%0A is not a newline",
        "two\nlines\r\nand a third",
        "a :: in the middle ::error::",
        "commas, colons: and = signs",
        "%25%3A%2C literally",
        "",
    ],
)
def test_hostile_details_round_trip_through_the_runners_syntax(detail: str) -> None:
    title = f"t: {detail}, again"
    line = workflow_command("warning", detail, file=f"patches/{detail}/x.diff", line=3, title=title)
    assert "\n" not in line and "\r" not in line
    cmd = parse(line)
    assert cmd is not None and cmd.name == "warning"
    assert cmd.data == detail
    assert cmd.properties == {"file": f"patches/{detail}/x.diff", "line": "3", "title": title}


def test_a_hostile_detail_stays_one_annotation_and_one_summary_line(tmp_path: Path) -> None:
    from patchset.cli import github
    from patchset.release_check import CheckReport, CheckResult, Signals
    from patchset.sources.base import ReleaseInfo

    registry = patchset.load_registry(open_ended_registry(tmp_path))
    detail = "100% off\n::error::forged\r\nand, more: text"
    result = CheckResult(
        vllm="0.20.0",
        patch="fla-tma-sm12x",
        revision=1,
        variant="patch.diff",
        verdict="conflict",
        in_range=True,
        detail=detail,
        signals=Signals("conflict", False, None),
        failing_hunks=(("vllm/model_executor/layers/fla/ops/utils.py", 1),),
    )
    report = CheckReport(registry.digest, (ReleaseInfo("0.20.0", "test"),), (result,))
    (line,) = github.workflow_commands(report, registry, root=tmp_path)
    (cmd,) = read_annotations(line)
    assert cmd.data == f"vLLM 0.20.0: {detail}"  # exactly, once unescaped
    assert cmd.properties["line"] == "3"
    summary = github.summary(report, registry, "| table |")
    (bullet,) = [x for x in summary.splitlines() if x.startswith("- ")]
    assert bullet.endswith("100% off\\n::error::forged\\r\\nand, more: text")


def open_ended_registry(tmp_path: Path) -> Path:
    """fla-tma-sm12x as a project that carries it forward: an open-ended range, no probe."""
    registry = tmp_path / "patches"
    shutil.copytree(REPO / "patches" / "fla-tma-sm12x", registry / "fla-tma-sm12x")
    toml = registry / "fla-tma-sm12x" / "patch.toml"
    text = toml.read_text().replace('vllm = ">=0.11.1,<0.20.0"', 'vllm = ">=0.19.0"')
    toml.write_text(re.sub(r"\[upstream\.probe\].*?(?=\[hardware\])", "", text, flags=re.S))
    return registry


@pytest.mark.network  # real releases from the index (only the members the check reads)
def test_github_annotations_fail_on_an_in_range_conflict(tmp_path: Path) -> None:
    open_ended_registry(tmp_path)
    summary = tmp_path / "summary.md"
    releases = ("--vllm", "0.19.1", "--vllm", "0.20.0", "--vllm", "0.21.0")
    # online first: the run's own cache then holds what the check reads (range reads of the
    # three releases), and the offline check below reads nothing else
    online = run_cli("check", *releases, "--format", "json", cwd=tmp_path)
    assert online.returncode == 1, online.stderr
    proc = run_cli(
        *("check", *releases, "--offline"),
        *("--format", "github"),
        cwd=tmp_path,
        env={"GITHUB_STEP_SUMMARY": str(summary)},
    )
    assert proc.returncode == 1, proc.stderr
    lines = proc.stdout.splitlines()
    # 0.20.0 and 0.21.0 folded into one annotation
    (error,) = [a for a in read_annotations(proc.stdout) if a.name == "error"]
    assert error.properties == {
        "file": "patches/fla-tma-sm12x/patch.diff",
        "line": "3",  # the failing hunk's @@ line in the payload
        "title": "fla-tma-sm12x r1: conflict on vLLM 0.20.0..0.21.0 (2)",
    }
    assert error.data.startswith("vLLM 0.20.0, 0.21.0: ")
    assert "hunk #1" in error.data
    assert lines[-1].endswith("; 2 in range need attention")
    text = summary.read_text()
    assert "| `fla-tma-sm12x` r1 | needed | conflict | conflict |" in text
    assert text.index("Needs attention (in range)") < text.index("<details>")


@pytest.mark.network
def test_github_warning_for_an_offset(tmp_path: Path) -> None:
    open_ended_registry(tmp_path)
    tree = materialize("0.19.1", tmp_path / "tree", [TMA_FILE])
    path = tree / TMA_FILE
    path.write_text("# a line\n# and another\n" + path.read_text())  # the hunk moves by 2
    proc = run_cli("check", "--source", str(tree), "--format", "github", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    (warning,) = read_annotations(proc.stdout)
    assert warning.name == "warning"
    assert warning.properties["file"] == "patches/fla-tma-sm12x/patch.diff"
    assert "offset" in warning.data


def load_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def test_example_workflow_checks_on_a_schedule() -> None:
    workflow = load_yaml(REPO / "docs" / "ci-example.yml")
    triggers = workflow[True] if True in workflow else workflow["on"]  # YAML 1.1 reads on: as True
    assert triggers["schedule"][0]["cron"]
    steps = [step for job in workflow["jobs"].values() for step in job["steps"]]
    commands = "\n".join(step.get("run", "") for step in steps)
    assert "patchset validate" in commands
    check = next(line for line in commands.splitlines() if "patchset check" in line)
    assert "--since" in check and "--format github" in check


def test_pre_commit_hook_runs_validate(tmp_path: Path) -> None:
    (hook,) = load_yaml(REPO / ".pre-commit-hooks.yaml")
    assert hook["id"] == "patchset-validate" and hook["language"] == "python"
    assert hook["pass_filenames"] is False
    argv = shlex.split(hook["entry"])
    assert argv[:2] == ["patchset", "validate"]
    # what pre-commit runs, in this repository and in a broken one
    assert run_cli(*argv[1:], cwd=REPO).returncode == 0
    broken = tmp_path / "patches" / "bad-patch"
    broken.mkdir(parents=True)
    (broken / "patch.toml").write_text('id = "bad-patch"\n')
    proc = run_cli(*argv[1:], cwd=tmp_path)
    assert proc.returncode == 2 and "required key is missing" in proc.stderr


def api_example() -> str:
    text = (REPO / "docs" / "api.md").read_text()
    return text.split('```python\n"""ci/check_patches.py', 1)[1].split("```", 1)[0]


@pytest.mark.network  # real releases from the index (only the members the check reads)
def test_the_documented_ci_script_runs(tmp_path: Path) -> None:
    script = tmp_path / "check_patches.py"
    script.write_text('"""ci/check_patches.py' + api_example())
    shutil.copytree(REPO / "patches", tmp_path / "patches")
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run(
        [sys.executable, str(script)],  # online: the wheels' members it needs, then cached
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr  # the real ranges hold
    verdicts = json.loads((tmp_path / "patch-verdicts.json").read_text())
    jsonschema.validate(verdicts, schemas.load("check"))
    assert verdicts["releases"][0]["vllm"] == "0.19.1"
    shutil.rmtree(tmp_path / "patches")
    open_ended_registry(tmp_path)  # a patch carried forward: newer releases conflict
    proc = subprocess.run(
        [sys.executable, str(script)],  # online: the wheels' members it needs, then cached
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    assert proc.returncode == 1
    assert "::error title=fla-tma-sm12x on 0.20.0::conflict" in proc.stdout
