"""Real git repositories for tests: git run with no user or system configuration."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

from tests.helpers import synthetic
from tests.helpers.cli import run_cli

GIT_ENV = {
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@t",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@t",
}


def git(repo: Path, *args: str, when: int | None = None) -> str:
    """`git -C repo ARGS`, its output stripped; `when` dates the commit (epoch seconds)."""
    env = {**os.environ, **GIT_ENV}
    if when is not None:
        env["GIT_AUTHOR_DATE"] = env["GIT_COMMITTER_DATE"] = f"@{when} +0000"
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    )
    return done.stdout.strip()


def commit(
    repo: Path, files: dict[str, str], tag: str | None = None, when: int | None = None
) -> str:
    """Write `files`, commit them all (tagged `tag`), and return the commit's sha."""
    for rel, text in files.items():
        path = repo / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", f"commit {when or ''}".strip(), when=when)
    if tag:
        git(repo, "tag", tag)
    return git(repo, "rev-parse", "HEAD")


def definition_text(vllm: str, patches: list[str] | tuple[str, ...]) -> str:
    """A minimal build definition pinned to `vllm`, listing `patches` (a team's repository,
    no serve arguments)."""
    return synthetic.definition_text(vllm, patches, repository="team/vllm-openai", args=())


def line_diff(name: str) -> str:
    """A diff of `vllm/NAME.py` (synthetic.BODY) changing its line 11."""
    return (
        f"--- a/vllm/{name}.py\n+++ b/vllm/{name}.py\n@@ -9,5 +9,5 @@\n line 9\n line 10\n"
        "-line 11\n+line 11 patched\n line 12\n line 13\n"
    )


def refresh_all(project: Path, *args: str) -> dict[str, Any]:
    """`patchset refresh --all --vllm 0.20.0` (ARGS added) on a project of a git vLLM
    (`project/vllm`, release tag v0.20.0) and `project/patches`: its JSON report, after
    checking it exits 0."""
    done = run_cli(
        "--registry",
        project / "patches",
        "refresh",
        "--all",
        "--vllm",
        "0.20.0",
        "--source",
        f"git:{project / 'vllm'}",
        "--format",
        "json",
        *args,
        cwd=project,
    )
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data
