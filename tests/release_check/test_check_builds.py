"""`check --build` / `--builds`: each definition's patches judged on the release it pins;
later releases shown as "would carry forward" and never failing; GitHub annotations only for
what the definitions run. A real git clone with three releases."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from patchset.errors import ExitCode
from tests.helpers import gitrepos
from tests.helpers.cli import run_cli
from tests.helpers.schemas import assert_matches
from tests.helpers.synthetic import BODY, add_patch


@pytest.fixture
def project(tmp_path: Path) -> Path:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    gitrepos.commit(
        clone, {"vllm/__init__.py": "", "vllm/steady.py": BODY, "vllm/fragile.py": BODY}, "v0.19.1"
    )
    broken = BODY.replace("line 11\n", "line 11 rewritten\n")
    gitrepos.commit(clone, {"vllm/fragile.py": broken}, "v0.20.0")
    gitrepos.commit(clone, {"vllm/steady.py": BODY + "tail\n"}, "v0.21.0")
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in ("steady", "fragile"):
        add_patch(
            patches, name, diff=gitrepos.line_diff(name), targets=[f"vllm/{name}.py"], vllm=">=0.19"
        )
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "gemma.toml").write_text(gitrepos.definition_text("0.19.1", ["steady", "fragile"]))
    (builds / "qwen.toml").write_text(gitrepos.definition_text("0.21.0", ["steady"]))
    return tmp_path


def cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    where: list[str | Path] = ["--registry", project / "patches", "--builds", project / "builds"]
    where.append("check")
    return run_cli(*where, "--source", f"git:{project / 'vllm'}", *args, cwd=project)


def test_each_definition_on_its_own_release(project: Path) -> None:
    done = cli(project, "--builds", "--since", "0.19.1", "--format", "json")
    assert done.returncode == 0, done.stderr  # fragile breaks only after gemma's pin
    data = json.loads(done.stdout)
    assert_matches(data, "check-builds")
    rows = {
        (d["definition"], r["vllm"], r["patch"]): (r["verdict"], r["role"], r["attention"])
        for d in data["definitions"]
        for r in d["results"]
    }
    assert rows == {
        ("gemma.toml", "0.19.1", "steady"): ("needed", "pinned", False),
        ("gemma.toml", "0.19.1", "fragile"): ("needed", "pinned", False),
        ("gemma.toml", "0.20.0", "steady"): ("needed", "carry-forward", False),
        ("gemma.toml", "0.20.0", "fragile"): ("conflict", "carry-forward", False),
        ("gemma.toml", "0.21.0", "steady"): ("needed", "carry-forward", False),
        ("gemma.toml", "0.21.0", "fragile"): ("conflict", "carry-forward", False),
        ("qwen.toml", "0.21.0", "steady"): ("needed", "pinned", False),
    }
    plain = cli(project, "--since", "0.19.1")  # without the pins: fragile's conflicts fail
    assert plain.returncode == ExitCode.ATTENTION


def test_a_broken_pin_fails_and_is_the_only_annotation(project: Path) -> None:
    (project / "builds" / "fragile.toml").write_text(
        gitrepos.definition_text("0.20.0", ["fragile"])
    )
    pins: tuple[str, ...] = ("--build", str(project / "builds" / "fragile.toml"))
    pins += ("--build", str(project / "builds" / "gemma.toml"), "--vllm", "0.21.0")
    done = cli(project, *pins, "--format", "github")
    assert done.returncode == ExitCode.ATTENTION, done.stderr
    errors = [line for line in done.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 1 and "fragile" in errors[0] and "0.20.0" in errors[0]
    as_json = cli(project, *pins, "--format", "json")
    assert as_json.returncode == ExitCode.ATTENTION, as_json.stderr
    data = json.loads(as_json.stdout)
    assert_matches(data, "check-builds")
    failing = [
        (d["definition"], r["patch"], r["vllm"])
        for d in data["definitions"]
        for r in d["results"]
        if r["attention"]
    ]
    assert data["exit_code"] == 1 and failing == [("fragile.toml", "fragile", "0.20.0")]
    table = cli(project, "--build", str(project / "builds" / "gemma.toml"), "--vllm", "0.20.0")
    assert table.returncode == 0 and "would carry forward" in table.stdout


def test_a_definition_naming_an_unknown_patch(project: Path) -> None:
    (project / "builds" / "bad.toml").write_text(gitrepos.definition_text("0.19.1", ["nope"]))
    done = cli(project, "--build", str(project / "builds" / "bad.toml"))
    assert done.returncode == ExitCode.BAD_INPUT and "nope" in done.stderr
