"""A plain install (the wheel, with only the dependencies it declares) imports a club-3090
shaped checkout: its YAML is read by a dependency the wheel declares, not by a test extra.

Heavy (a wheel build, a fresh venv, its dependencies from the package index): the `dist`
group."""

from __future__ import annotations

import os
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from tests.helpers import import_fixtures as fx

pytestmark = [pytest.mark.dist, pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).parents[2]


def run(*argv: str | Path, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run(
        [str(a) for a in argv], cwd=cwd, env=env, capture_output=True, text=True, check=False,
        timeout=900,
    )  # fmt: skip


def test_wheel_in_a_fresh_venv_imports_a_club_checkout(tmp_path: Path) -> None:
    built = run(
        sys.executable, "-m", "pip", "wheel", "-q", "--no-deps",
        "-w", tmp_path / "dist", REPO, cwd=tmp_path,
    )  # fmt: skip
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "dist").glob("patchset-*.whl")
    venv.EnvBuilder(with_pip=True).create(tmp_path / "venv")
    python = tmp_path / "venv" / "bin" / "python"
    installed = run(python, "-m", "pip", "install", "-q", wheel, cwd=tmp_path)
    assert installed.returncode == 0, installed.stderr
    listed = run(python, "-m", "pip", "list", "--format=freeze", cwd=tmp_path).stdout.lower()
    assert "pyyaml==" in listed and "pytest==" not in listed  # the wheel's own, no test extra
    checkout = fx.club(tmp_path / "club")
    source = fx.release(tmp_path / "r20", "0.20.0")
    project = tmp_path / "project"
    project.mkdir()
    result = run(
        tmp_path / "venv" / "bin" / "patchset", "import", "club-3090", checkout,
        "--source", source, "--registry", project / "patches", "--builds", project / "builds",
        cwd=project,
    )  # fmt: skip
    assert "No module named" not in result.stderr, result.stderr
    assert result.returncode == 0, result.stdout + result.stderr
    assert (project / "patches" / "club-m-vllm-pr111-diff" / "patch.toml").is_file() or any(
        (project / "patches").glob("*/patch.toml")
    ), result.stdout
