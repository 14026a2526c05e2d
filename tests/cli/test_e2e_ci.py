"""End to end, as another project meets patchset in CI: a fresh git repository with its own
registry, patchset installed from the wheel `nox -s dist` built (and checked) from this
checkout, pre-commit running the hook of .pre-commit-hooks.yaml, then the steps of
docs/ci-example.yml and of action.yml run as scripts with GITHUB_* variables pointing at temp
files; the annotations and the job summary are checked line by line.

The package index is a real HTTP server on 127.0.0.1 serving the real 0.19.1 and 0.20.0
sdists (taken from the release cache), named in the project's `[tool.patchset] index-url`,
with a `cache-dir` of the project's own: `--since 0.19.0` then means exactly those two.
Heavy (a wheel build, a fresh venv, pre-commit's own environment): the `dist` group.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import venv
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from patchset.cachedir import cache_root
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index.cache import Cache
from tests.helpers.fake_index import FakeIndex
from tests.helpers.workflow_commands import read_annotations

pytestmark = [pytest.mark.dist, pytest.mark.network, pytest.mark.slow]

REPO = Path(__file__).parents[2]
GIT_ENV = {
    "GIT_AUTHOR_NAME": "ci",
    "GIT_AUTHOR_EMAIL": "ci@localhost",
    "GIT_COMMITTER_NAME": "ci",
    "GIT_COMMITTER_EMAIL": "ci@localhost",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def sh(*argv: str | Path, cwd: Path, env: dict[str, str] | None = None) -> str:
    # no PYTHONPATH: a checkout on it (its egg-info) passes for an installed patchset, and
    # pip would not install the wheel; the project's CI runs the wheel, never this checkout
    outer = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    proc = subprocess.run(
        [str(a) for a in argv],
        cwd=cwd,
        env={**outer, **GIT_ENV, **(env or {})},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )
    assert proc.returncode == 0, f"{argv}: {proc.stdout}{proc.stderr}"
    return proc.stdout


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """`nox -s dist` (sdist and wheel, twine check, the wheel run in a fresh venv of its own),
    then that wheel installed into another fresh venv for the project; its bin folder."""
    work = tmp_path_factory.mktemp("dist")
    sh(sys.executable, "-m", "nox", "-s", "dist", "--noxfile", REPO / "noxfile.py", cwd=REPO)
    (wheel,) = (REPO / "dist").glob("patchset-*.whl")
    assert (REPO / "dist" / wheel.name.replace("-py3-none-any.whl", ".tar.gz")).is_file()
    venv.EnvBuilder(with_pip=True).create(work / "venv")
    bin_dir = work / "venv" / "bin"
    sh(bin_dir / "python", "-m", "pip", "install", "-q", wheel, cwd=work)
    return bin_dir


@pytest.fixture
def index(fake_index: FakeIndex) -> FakeIndex:
    """The real 0.19.1 and 0.20.0 files the patches touch (read from the releases' wheels
    through the release cache), published as small wheels and sdists."""
    wanted = (
        "vllm/model_executor/layers/fla/ops/utils.py",
        "vllm/v1/attention/backends/turboquant_attn.py",
    )
    for version in ("0.19.1", "0.20.0"):
        with IndexSource(cache=Cache(cache_root())).open(version) as tree:
            files = {p: data for p in wanted if (data := tree.read(p)) is not None}
        fake_index.add_release(version, files)
    return fake_index


def make_project(root: Path, index_url: str, bin_dir: Path) -> Path:
    project = root / "serving"
    project.mkdir()
    sh("git", "init", "-q", "-b", "main", cwd=project)
    sh(bin_dir / "patchset", "init", cwd=project)
    pyproject = project / "pyproject.toml"
    pyproject.write_text(
        pyproject.read_text() + f'index-url = "{index_url}"\ncache-dir = ".cache/patchset"\n'
    )
    # the TMA patch, carried forward: an open range and no probe, so 0.20.0 conflicts in range
    patch = project / "patches" / "fla-tma-sm12x"
    shutil.copytree(REPO / "patches" / "fla-tma-sm12x", patch)
    toml = patch / "patch.toml"
    text = toml.read_text().replace('vllm = ">=0.11.1,<0.20.0"', 'vllm = ">=0.19.0"')
    toml.write_text(re.sub(r"\[upstream\.probe\].*?(?=\[hardware\])", "", text, flags=re.S))
    (project / ".gitignore").write_text(".cache/\n")
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-q", "-m", "vLLM patches", cwd=project)
    return project


def pre_commit(project: Path, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "pre_commit", "run", "--all-files"],
        cwd=project,
        env={**os.environ, **GIT_ENV, "PRE_COMMIT_HOME": str(home)},
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
    )


def check_pre_commit(project: Path, tmp_path: Path) -> None:
    """pre-commit runs the hook this repository publishes, from this repository's HEAD."""
    head = sh("git", "rev-parse", "HEAD", cwd=REPO).strip()
    (project / ".pre-commit-config.yaml").write_text(
        f"repos:\n  - repo: {REPO}\n    rev: {head}\n    hooks:\n      - id: patchset-validate\n"
    )
    sh("git", "add", "-A", cwd=project)
    sh("git", "commit", "-q", "-m", "pre-commit", cwd=project)
    hooks = tmp_path / "pre-commit-home"
    ok = pre_commit(project, hooks)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert re.search(r"^patchset validate\.+Passed$", ok.stdout, re.M), ok.stdout
    toml = project / "patches" / "fla-tma-sm12x" / "patch.toml"
    good = toml.read_text()
    toml.write_text(good.replace('kind = "diff"', 'kind = "dif"'))
    bad = pre_commit(project, hooks)
    assert bad.returncode == 1
    (line,) = [x for x in bad.stdout.splitlines() if x.startswith("patchset: error: ")]
    assert line.startswith("patchset: error: patches/fla-tma-sm12x/patch.toml: kind: 'dif'")
    kind_line = good.splitlines().index('kind = "diff"') + 1
    assert line.endswith(f"(did you mean 'diff'?) (line {kind_line})")
    toml.write_text(good)


def steps(path: Path) -> list[dict[str, Any]]:
    data: dict[str, Any] = yaml.safe_load(path.read_text())
    if "runs" in data:
        return list(data["runs"]["steps"])
    return [s for job in data["jobs"].values() for s in job["steps"]]


def run_step(script: str, project: Path, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "-e", "-o", "pipefail", "-c", script],
        cwd=project,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=600,
    )


def test_another_project_in_ci(installed: Path, index: FakeIndex, tmp_path: Path) -> None:
    project = make_project(tmp_path, index.index_url, installed)

    check_pre_commit(project, tmp_path)

    # the example workflow's steps, as the runner would run them
    summary, output = tmp_path / "summary.md", tmp_path / "output.txt"
    env = {
        **{k: v for k, v in os.environ.items() if not k.startswith(("PATCHSET_", "GITHUB_"))},
        "PATH": f"{installed}{os.pathsep}{os.environ['PATH']}",
        "CI": "true",
        "GITHUB_ACTIONS": "true",
        "GITHUB_WORKSPACE": str(project),
        "GITHUB_STEP_SUMMARY": str(summary),
        "GITHUB_OUTPUT": str(output),
        "RUNNER_TEMP": str(tmp_path),
    }
    ran = []
    for step in steps(REPO / "docs" / "ci-example.yml"):
        script = step.get("run")
        if script is None or "pip install" in script:
            continue  # uses: steps are GitHub's; patchset is installed from the wheel above
        ran.append(run_step(script, project, env))
    validate, check = ran
    assert validate.returncode == 0, validate.stderr
    assert check.returncode == 1, check.stderr
    lines = check.stdout.splitlines()
    assert len(lines) == 2
    (error,) = read_annotations(check.stdout)
    assert error.name == "error"
    assert error.properties == {
        "file": "patches/fla-tma-sm12x/patch.diff",
        "line": "3",
        "title": "fla-tma-sm12x r1: conflict on vLLM 0.20.0",
    }
    assert error.data.startswith(
        "vLLM 0.20.0: vllm/model_executor/layers/fla/ops/utils.py: hunk #1 does not match"
    )
    assert lines[1] == (
        "patchset check: 2 results, releases 0.19.1..0.20.0 (2); 1 in range need attention"
    )
    text = summary.read_text().splitlines()
    digest = re.search(r"`([0-9a-f]{12})`", text[2])
    assert digest is not None
    assert text[:8] == [
        "## patchset check",
        "",
        f"registry `{digest[1]}`, releases 0.19.1..0.20.0 (2): **1 in range need attention**",
        "",
        "### Needs attention (in range)",
        "",
        f"- **`fla-tma-sm12x`: conflict** on vLLM 0.20.0: {error.data.split(': ', 1)[1]}",
        "",
    ]
    assert text[8] == "<details><summary>Every verdict (0 out of range)</summary>"
    assert "| `fla-tma-sm12x` r1 | needed | conflict |" in text
    assert text[-2:] == ["</details>", ""]

    # the composite action's steps: outputs, exit code, the JSON report
    output.write_text("")
    action_env = {**env, "INPUT_REGISTRY": "", "INPUT_SINCE": "0.19.0", "INPUT_FORMAT": "github"}
    (check_step,) = [s for s in steps(REPO / "action.yml") if s.get("id") == "check"]
    proc = run_step(check_step["run"], project, action_env)
    assert proc.returncode == 1, proc.stderr
    outputs = dict(line.split("=", 1) for line in output.read_text().splitlines())
    assert outputs["exit-code"] == "1"
    report = json.loads(Path(outputs["json"]).read_text())
    site = sh(
        installed / "python", "-c", "import patchset.schemas as s; print(s.__file__)", cwd=tmp_path
    )
    schema = json.loads((Path(site.strip()).parent / "check.json").read_text())
    jsonschema.validate(report, schema)
    assert [(r["vllm"], r["verdict"]) for r in report["results"]] == [
        ("0.19.1", "needed"),
        ("0.20.0", "conflict"),
    ]
