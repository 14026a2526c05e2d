"""A project of its own patches: where the registry and builds are found, `patchset init`, and
patchset installed from its wheel into a fresh virtual environment, used there for real."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import jsonschema
import pytest

from patchset.cli.main import main
from patchset.errors import RegistryError
from patchset.project import find_pyproject, init_project, read_tool_table, resolve
from patchset.registry.builds import load_definitions
from tests.helpers.hardening import full_disk_under, snapshot
from tests.helpers.releases import materialize, tree_digest

REPO = Path(__file__).parents[2]
TMA = REPO / "patches" / "fla-tma-sm12x"
TMA_FILE = "vllm/model_executor/layers/fla/ops/utils.py"


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- where things are ------------------------------------------------------------------------


def test_defaults_without_a_pyproject(tmp_path: Path) -> None:
    project = resolve(cwd=tmp_path, environ={})
    assert (project.registry, project.builds, project.pyproject) == (
        Path("patches"),
        Path("builds"),
        None,
    )


def test_tool_table_found_from_a_subfolder(tmp_path: Path) -> None:
    pyproject = write(
        tmp_path / "pyproject.toml",
        '[project]\nname = "x"\n\n[tool.patchset]\nregistry = "vllm/patches"\n',
    )
    sub = tmp_path / "src" / "deep"
    sub.mkdir(parents=True)
    assert find_pyproject(sub) == pyproject
    project = resolve(cwd=sub, environ={})
    assert project.pyproject == pyproject
    assert project.registry == tmp_path / "vllm" / "patches"  # relative to the pyproject
    assert project.builds == tmp_path / "builds"  # the default, beside the pyproject
    at_root = resolve(cwd=tmp_path, environ={})
    assert at_root.registry == Path("vllm/patches")  # shown relative when inside cwd


def test_flag_beats_environment_beats_table(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.patchset]\nregistry = "a"\nbuilds = "b"\n')
    env = {"PATCHSET_REGISTRY": "/env/reg", "PATCHSET_BUILDS": "/env/builds"}
    assert resolve(cwd=tmp_path, environ={}).registry == Path("a")
    assert resolve(cwd=tmp_path, environ=env).registry == Path("/env/reg")
    assert resolve(cwd=tmp_path, environ=env).builds == Path("/env/builds")
    flagged = resolve(registry=Path("flag"), cwd=tmp_path, environ=env)
    assert (flagged.registry, flagged.builds) == (Path("flag"), Path("/env/builds"))


def test_nearest_pyproject_without_the_table_means_defaults(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", '[tool.patchset]\nregistry = "outer"\n')
    write(tmp_path / "inner" / "pyproject.toml", '[project]\nname = "inner"\n')
    project = resolve(cwd=tmp_path / "inner", environ={})
    assert (project.registry, project.pyproject) == (Path("patches"), None)


def test_unknown_key_is_an_error_with_a_hint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    pyproject = write(tmp_path / "pyproject.toml", '[tool.patchset]\nregistyr = "p"\n')
    with pytest.raises(RegistryError, match=r"tool\.patchset\.registyr: unknown key"):
        read_tool_table(pyproject)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("PATCHSET_REGISTRY", raising=False)
    assert main(["list"]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'registry'" in err and len(err.strip().splitlines()) == 1


# -- patchset init ---------------------------------------------------------------------------

STYLED = """\
# my project
[project]
name = "serving"   # keep this comment
dependencies = [
    "patchset",
]

[tool.ruff]
line-length = 88
"""


def test_init_keeps_the_pyproject_style_and_is_idempotent(tmp_path: Path) -> None:
    write(tmp_path / "pyproject.toml", STYLED)
    result = init_project(tmp_path)
    text = (tmp_path / "pyproject.toml").read_text()
    assert text.startswith(STYLED)  # every byte the author wrote, as it was
    table = read_tool_table(tmp_path / "pyproject.toml")
    assert table is not None and (table.registry, table.builds) == ("patches", "builds")
    assert tmp_path / "pyproject.toml" in result.created
    assert (tmp_path / "patches" / "README.md").is_file()
    sample = tmp_path / "builds" / "example.toml.sample"
    assert all(line.startswith("#") for line in sample.read_text().splitlines())
    assert load_definitions(tmp_path / "builds") == []  # the example is never a target
    before = tree_digest(tmp_path)
    again = init_project(tmp_path)
    assert again.created == () and len(again.kept) == 5  # and .patchset/schemas, .taplo.toml
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("skip", [0, 1, 5], ids=["first file", "second file", "a schema"])
def test_init_on_a_full_disk_lays_out_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], skip: int
) -> None:
    """Issue 23 item 9: `patchset init` meeting a full disk (tests/hardening.full_disk_under)
    at its first, second or a later file: one line, exit 2, nothing of it left."""
    root = tmp_path / "project"
    root.mkdir()
    (root / "pyproject.toml").write_text('[project]\nname = "mine"\n')
    before = snapshot(root)
    full_disk_under(monkeypatch, root, skip=skip)
    assert main(["init", str(root)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "the disk is full (No space left on device)" in err[0], err
    assert "nothing was laid out" in err[0]
    assert snapshot(root) == before  # folders too: none left behind
    monkeypatch.undo()
    assert main(["init", str(root)]) == 0  # space again: the same command lays it out
    assert (root / "patches" / "README.md").is_file()


def test_init_then_use_from_a_subfolder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("PATCHSET_REGISTRY", raising=False)
    assert main(["init", str(tmp_path / "proj")]) == 0
    assert "created" in capsys.readouterr().out
    sub = tmp_path / "proj" / "src"
    sub.mkdir()
    monkeypatch.chdir(sub)
    assert main(["add", "tma-fix", "--diff", str(TMA / "patch.diff"), "--no-check"]) == 0
    assert (tmp_path / "proj" / "patches" / "tma-fix" / "patch.toml").is_file()
    capsys.readouterr()
    assert main(["validate", "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["patches"] == 1


# -- installed from the wheel, in a project of its own ---------------------------------------


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """patchset's wheel, built from this checkout and installed into a fresh venv (its
    dependencies from the package index); the venv's bin folder."""
    work = tmp_path_factory.mktemp("wheel")
    # no PYTHONPATH: pip would take this checkout (its egg-info) for an installed patchset
    pip_env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    pip_env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", str(REPO), "-w", str(work)],
        check=True,
        env=pip_env,
        timeout=900,
    )
    (wheel,) = work.glob("patchset-*.whl")
    env_dir = work / "venv"
    venv.EnvBuilder(with_pip=True).create(env_dir)
    bin_dir = env_dir / "bin"
    subprocess.run(
        [str(bin_dir / "python"), "-m", "pip", "install", "-q", str(wheel)],
        check=True,
        env=pip_env,
        timeout=900,
    )
    return bin_dir


def run_installed(
    bin_dir: Path, *args: str, cwd: Path, check: bool = True
) -> subprocess.CompletedProcess[str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PATCHSET_")}
    env.pop("PYTHONPATH", None)
    env["PATCHSET_CACHE_DIR"] = os.environ["PATCHSET_CACHE_DIR"]  # the run's own cache
    proc = subprocess.run(
        [str(bin_dir / "patchset"), *args],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )
    if check:
        assert proc.returncode == 0, proc.stderr
    return proc


@pytest.mark.network  # pip installs the dependencies from the index; releases from the cache
@pytest.mark.slow
def test_a_project_of_its_own_patches(installed: Path, tmp_path: Path) -> None:
    project = tmp_path / "serving"
    write(project / "pyproject.toml", STYLED)
    # the installed patchset is the one running: not this checkout
    where = subprocess.run(
        [str(installed / "python"), "-c", "import patchset; print(patchset.__file__)"],
        capture_output=True,
        text=True,
        check=True,
        cwd=tmp_path,
        env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"},  # as run_installed
    ).stdout
    assert "site-packages" in where and str(REPO) not in where
    # what the offline commands below read, fetched into the run's cache first (online)
    fetched = run_installed(
        installed,
        *("--registry", str(REPO / "patches"), "check", "--vllm", "0.19.1", "--vllm", "0.20.0"),
        cwd=tmp_path,
        check=False,
    )
    assert fetched.returncode in (0, 1), fetched.stderr
    run_installed(installed, "init", cwd=project)
    assert (project / "pyproject.toml").read_text().startswith(STYLED)
    sub = project / "src"
    sub.mkdir()
    # a real upstream diff, added from a subfolder: [tool.patchset] is found above it
    added = run_installed(
        installed,
        *("add", "fla-tma", "--diff", str(TMA / "patch.diff"), "--pr", "vllm-project/vllm#36325"),
        *("--vllm", "0.19.1", "--vllm", "0.20.0", "--offline", "--format", "json"),
        cwd=sub,
    )
    assert json.loads(added.stdout)["vllm"] == ">=0.19.1"  # 0.20.0 conflicts: no evidence, open
    assert (project / "patches" / "fla-tma" / "patch.diff").read_bytes() == (
        TMA / "patch.diff"
    ).read_bytes()
    # check, with the schema shipped in the installed package
    checked = run_installed(
        installed, "check", "--vllm", "0.19.1", "--offline", "--format", "json", cwd=project
    )
    report = json.loads(checked.stdout)
    schema_file = Path(where.strip()).parent / "schemas" / "check.json"
    jsonschema.validate(report, json.loads(schema_file.read_text()))
    assert [(r["patch"], r["verdict"], r["in_range"]) for r in report["results"]] == [
        ("fla-tma", "needed", True)
    ]
    # apply, on a folder holding the real 0.19.1 files
    target = materialize("0.19.1", tmp_path / "site", [TMA_FILE])
    before = (target / TMA_FILE).read_text()
    applied = run_installed(installed, "apply", "--target", str(target), cwd=sub)
    assert "applied" in applied.stdout
    after = (target / TMA_FILE).read_text()
    assert after != before and "9 <= torch.cuda.get_device_capability(0)[0] < 12" in after
    again = run_installed(
        installed, "apply", "--strict", "--target", str(target), cwd=sub, check=False
    )
    assert again.returncode == 6  # --strict: already applied, nothing to do
    # the project's own build definitions folder, from [tool.patchset]
    shutil.copy(REPO / "builds" / "0.19.1.toml", project / "builds" / "0.19.1.toml")
    listed = run_installed(installed, "validate", "--format", "json", cwd=sub)
    assert json.loads(listed.stdout)["patches"] == 1
