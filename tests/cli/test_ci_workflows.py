"""The workflows docs/ci.md gives (daily against vLLM main, weekly upstream audit, the
scheduled bump): each parses, runs on a schedule, and its patchset steps are the ones the
docs describe; the main job's check step is run as written, twice, on a real clone."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.helpers import gitrepos
from tests.helpers.gitrepos import GIT_ENV, git
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

REPO = Path(__file__).resolve().parents[2]


def workflows() -> dict[str, dict[str, Any]]:
    """Every ```yaml block of docs/ci.md that starts with `# .github/workflows/NAME`."""
    text = (REPO / "docs" / "ci.md").read_text()
    found = {}
    for block in re.findall(r"```yaml\n(.*?)```", text, flags=re.S):
        first = block.splitlines()[0]
        if first.startswith("# .github/workflows/"):
            found[first.split("/")[-1]] = yaml.safe_load(block)
    return found


def steps(workflow: dict[str, Any]) -> list[dict[str, Any]]:
    return [step for job in workflow["jobs"].values() for step in job["steps"]]


def on_schedule(workflow: dict[str, Any]) -> None:
    loose: dict[Any, Any] = workflow
    triggers = loose[True] if True in loose else loose["on"]  # YAML 1.1 reads on: as True
    assert triggers["schedule"][0]["cron"]


def test_the_documented_workflows_parse_and_run_on_a_schedule() -> None:
    found = workflows()
    assert {"vllm-main.yml", "vllm-upstream.yml", "vllm-bump.yml"} <= set(found)
    for workflow in found.values():
        on_schedule(workflow)
    main = steps(found["vllm-main.yml"])
    runs = "\n".join(step.get("run", "") for step in main)
    assert "--depth 1" in runs and "patchset check --source git:vllm-main@origin/main" in runs
    (cache,) = [step for step in main if step.get("uses", "").startswith("actions/cache")]
    assert {"vllm-main", "main-report.json"} <= set(cache["with"]["path"].split())
    upstream = steps(found["vllm-upstream.yml"])
    (audit,) = [step for step in upstream if "patchset upstream" in step.get("run", "")]
    assert "--format github" in audit["run"] and audit["env"]["GITHUB_TOKEN"]
    bump = "\n".join(step.get("run", "") for step in steps(found["vllm-bump.yml"]))
    line = next(row for row in bump.splitlines() if "patchset bump" in row)
    assert all(word in line for word in ("--to latest", "--write", "--format markdown"))
    assert "gh pr create" in bump and "--body-file body.md" in bump
    assert found["vllm-bump.yml"]["permissions"]["pull-requests"] == "write"


def commit(repo: Path, body: str, tag: str | None = None) -> None:
    gitrepos.commit(repo, {"vllm/mod.py": body}, tag)


def run_step(script: str, project: Path) -> subprocess.CompletedProcess[str]:
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, **GIT_ENV, "PATH": f"{bin_dir}{os.pathsep}{os.environ['PATH']}"}
    env["PATCHSET_CACHE_DIR"] = str(project / "cache")
    return subprocess.run(
        ["bash", "-e", "-c", script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


@pytest.mark.skipif(shutil.which("bash") is None, reason="the step is a bash script")
def test_the_main_job_fails_only_on_what_changed(tmp_path: Path) -> None:
    (check_step,) = [
        step
        for step in steps(workflows()["vllm-main.yml"])
        if "patchset check" in step.get("run", "")
    ]
    upstream = tmp_path / "upstream"
    upstream.mkdir()
    git(upstream, "init", "-q", "-b", "main")
    commit(upstream, BODY, "v0.33.0")
    commit(upstream, BODY + "more\n")
    project = tmp_path / "project"
    (project / "patches").mkdir(parents=True)
    add_patch(project / "patches", "fits", diff=MOD_DIFF, targets=["vllm/mod.py"], vllm=">=0.33")
    other = MOD_DIFF.replace("line 11 patched", "line 11 other")
    add_patch(project / "patches", "breaks", diff=other, targets=["vllm/mod.py"], vllm=">=0.33")
    # the clone as the clone step leaves it: main fetched to origin/main
    git(tmp_path, "clone", "-q", str(upstream), str(project / "vllm-main"))

    first = run_step(check_step["run"], project)
    assert first.returncode == 0, first.stdout + first.stderr  # nothing in range breaks yet
    assert (project / "main-report.json").is_file()

    commit(upstream, BODY.replace("line 11\n", "line eleven\n") + "more\n")  # both conflict
    git(project / "vllm-main", "fetch", "-q", "origin", "main:refs/remotes/origin/main")
    second = run_step(check_step["run"], project)
    assert second.returncode == 1, second.stdout + second.stderr
    errors = [line for line in second.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 2 and all(
        "conflict on main (new since the last run)" in e for e in errors
    )

    third = run_step(check_step["run"], project)  # the same problems: nothing changed
    assert third.returncode == 0, third.stdout + third.stderr
    assert "::error" not in third.stdout
