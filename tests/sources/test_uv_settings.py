"""uv's index settings beside pip's: the order between patchset's own settings, uv's and
pip's (docs/check.md, "Which index"), held in several layouts of real files: a project's
uv.toml, a pyproject.toml with [tool.uv] above a folder, user and system uv.toml, the
variables, UV_CONFIG_FILE and UV_NO_CONFIG, and a uv.toml that does not parse."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from patchset.errors import ExitCode, RegistryError
from patchset.sources.package_index.settings import read_uv_settings, resolve, uv_config_files
from tests.helpers.cli import run_cli
from tests.helpers.fake_index import FakeIndex

REPO = Path(__file__).resolve().parents[2]
VARS = (
    "UV_DEFAULT_INDEX",
    "UV_INDEX_URL",
    "UV_INDEX",
    "UV_EXTRA_INDEX_URL",
    "UV_CONFIG_FILE",
    "UV_NO_CONFIG",
    "UV_INSECURE_HOST",
    "PIP_INDEX_URL",
    "PIP_TRUSTED_HOST",
)


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A clean machine: HOME, the XDG folders and pip's file under tmp_path, no uv or pip
    variable set, the working folder a project folder with nothing in it."""
    for var in VARS:
        monkeypatch.delenv(var, raising=False)
    home = tmp_path / "home"
    home.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "xdg-dirs"))
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    project = tmp_path / "work" / "project"
    project.mkdir(parents=True)
    monkeypatch.chdir(project)
    return home


def write(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def index(url: str, **keys: object) -> str:
    extra = "".join(f"{k} = {json.dumps(v)}\n" for k, v in keys.items())
    return f'[[index]]\nurl = "{url}"\n{extra}'


def chosen() -> tuple[str, str]:
    found = resolve()
    return found.index_url, found.chosen_by


def test_the_whole_order_one_setting_taken_away_at_a_time(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every setting at once, then each taken away in turn: the next in the documented order
    answers each time (patchset's own, uv's pin, uv's variables, pip's variable, uv's files,
    pip's file, uv's extra index, pip's default)."""
    pyproject = write(
        Path.cwd() / "pyproject.toml",
        '[tool.uv.sources]\nvllm = { index = "nightly" }\n\n'
        '[[tool.uv.index]]\nname = "nightly"\nurl = "https://pinned.invalid/simple"\n'
        "explicit = true\n\n"
        '[[tool.uv.index]]\nurl = "https://project-default.invalid/simple"\ndefault = true\n',
    )
    pip_conf = write(
        tmp_path / "pip.conf", "[global]\nindex-url = https://pip-file.invalid/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(pip_conf))
    monkeypatch.setenv("UV_DEFAULT_INDEX", "main=https://uv-default.invalid/simple")
    monkeypatch.setenv("UV_INDEX_URL", "https://uv-index-url.invalid/simple")
    monkeypatch.setenv("UV_INDEX", "https://uv-extra.invalid/simple https://second.invalid/s")
    monkeypatch.setenv("PIP_INDEX_URL", "https://pip-env.invalid/simple")

    assert resolve("https://given.invalid/simple").chosen_by == "--index-url"
    url, by = chosen()
    assert url == "https://pinned.invalid/simple" and "[tool.uv.sources] vllm" in by
    assert str(pyproject) in by
    write(pyproject, pyproject.read_text().replace('vllm = { index = "nightly" }', ""))
    assert chosen() == ("https://uv-default.invalid/simple", "UV_DEFAULT_INDEX")
    monkeypatch.delenv("UV_DEFAULT_INDEX")
    assert chosen() == ("https://uv-index-url.invalid/simple", "UV_INDEX_URL")
    monkeypatch.delenv("UV_INDEX_URL")
    assert chosen() == ("https://pip-env.invalid/simple", "PIP_INDEX_URL")
    monkeypatch.delenv("PIP_INDEX_URL")
    assert chosen() == (
        "https://project-default.invalid/simple",
        f"{pyproject} (tool.uv.index[1])",
    )
    write(pyproject, pyproject.read_text().replace("default = true", ""))
    assert chosen() == ("https://pip-file.invalid/simple", "pip config (index-url)")
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    assert chosen() == ("https://uv-extra.invalid/simple", "UV_INDEX")
    monkeypatch.delenv("UV_INDEX")
    # the explicit index is for pinned packages only: the first other [[tool.uv.index]]
    assert chosen() == (
        "https://project-default.invalid/simple",
        f"{pyproject} (tool.uv.index[1])",
    )
    pyproject.unlink()
    assert chosen()[1] == "pip's default"


def test_project_user_and_system_files(home: Path, tmp_path: Path) -> None:
    """The project's file beats the user's, which beats the system's; in one file an
    [[index]] with default = true beats index-url; a later file's default still beats an
    earlier file's index-url only through [[index]], as uv merges its arrays first."""
    system = write(
        tmp_path / "xdg-dirs" / "uv" / "uv.toml", index("https://system.invalid/s", default=True)
    )
    assert chosen() == ("https://system.invalid/s", f"{system} (index[0])")
    user = write(home / ".config" / "uv" / "uv.toml", 'index-url = "https://user.invalid/s"\n')
    assert chosen() == ("https://system.invalid/s", f"{system} (index[0])")  # [[index]] first
    write(user, index("https://user.invalid/s", default=True))
    assert chosen() == ("https://user.invalid/s", f"{user} (index[0])")
    project = write(
        Path.cwd() / "uv.toml",
        index("https://torch.invalid/s") + index("https://project.invalid/s", default=True),
    )
    assert chosen() == ("https://project.invalid/s", f"{project} (index[1])")
    assert [f.path for f in uv_config_files()] == [project, user, system]


def test_the_nearest_project_file_as_uv_finds_it(home: Path, tmp_path: Path) -> None:
    """From a subfolder up: a pyproject.toml without [tool.uv] is passed over, the first
    folder with a uv.toml or a [tool.uv] table is the project's, and in one folder uv.toml
    wins over pyproject.toml."""
    work = tmp_path / "work"
    here = Path.cwd()
    write(here / "pyproject.toml", '[project]\nname = "x"\nversion = "1"\n')
    top = write(work / "pyproject.toml", '[tool.uv]\nindex-url = "https://top.invalid/s"\n')
    assert chosen() == ("https://top.invalid/s", f"{top} (index-url)")
    beside = write(work / "uv.toml", 'index-url = "https://beside.invalid/s"\n')
    assert chosen() == ("https://beside.invalid/s", f"{beside} (index-url)")
    nearer = write(here / "uv.toml", 'extra-index-url = ["https://near.invalid/s"]\n')
    # the nearest file is the project's: the one above is not read at all
    assert chosen() == ("https://near.invalid/s", f"{nearer} (extra-index-url)")
    assert [f.path for f in uv_config_files()] == [nearer]
    assert resolve(cwd=work).index_url == "https://beside.invalid/s"


def test_uv_config_file_replaces_and_no_config_skips(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write(Path.cwd() / "uv.toml", index("https://project.invalid/s", default=True))
    write(home / ".config" / "uv" / "uv.toml", index("https://user.invalid/s", default=True))
    named = write(tmp_path / "ci-uv.toml", 'index-url = "https://named.invalid/s"\n')
    monkeypatch.setenv("UV_CONFIG_FILE", str(named))
    assert chosen() == ("https://named.invalid/s", f"{named} (index-url)")
    monkeypatch.setenv("UV_NO_CONFIG", "1")
    assert chosen()[1] == "pip's default"
    assert read_uv_settings().files == ()


def test_xdg_config_home_and_insecure_hosts(
    home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "xdg-home"))
    write(home / ".config" / "uv" / "uv.toml", 'index-url = "https://not-read.invalid/s"\n')
    user = write(
        tmp_path / "xdg-home" / "uv" / "uv.toml",
        'index-url = "https://xdg.invalid/s"\nallow-insecure-host = ["xdg.invalid"]\n',
    )
    monkeypatch.setenv("UV_INSECURE_HOST", "env.invalid:8080")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "pip.invalid")
    found = resolve()
    assert (found.index_url, found.chosen_by) == ("https://xdg.invalid/s", f"{user} (index-url)")
    assert found.transport.trusted_hosts == ("pip.invalid", "env.invalid:8080", "xdg.invalid")


def test_uv_extra_index_url_and_credentials(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("UV_EXTRA_INDEX_URL", "https://u:s3cret@extra.invalid/s https://b.invalid/s")
    found = resolve()
    assert (found.index_url, found.chosen_by) == ("https://extra.invalid/s", "UV_EXTRA_INDEX_URL")
    assert found.transport.credentials == (("extra.invalid", "u", "s3cret"),)


@pytest.mark.parametrize(
    ("text", "problem"),
    [
        ("index-url = [unclosed\n", "not valid TOML"),
        ("index-url = 3\n", "index-url: expected a string, got an integer"),
        ('[[index]]\nname = "x"\n', "index[0].url: required key is missing"),
        (
            '[[index]]\nurl = "https://a.invalid/s"\ndefault = "yes"\n',
            "index[0].default: expected true or false",
        ),
    ],
)
def test_a_bad_uv_toml_is_one_line_naming_it(home: Path, text: str, problem: str) -> None:
    bad = write(Path.cwd() / "uv.toml", text)
    with pytest.raises(RegistryError) as caught:
        resolve()
    message = str(caught.value)
    assert message.startswith(f"{bad}: ") and problem in message and "\n" not in message
    assert caught.value.exit_code == ExitCode.BAD_INPUT


def test_a_pin_to_an_undefined_index(home: Path) -> None:
    write(Path.cwd() / "pyproject.toml", '[tool.uv.sources]\nvllm = { index = "nightly" }\n')
    with pytest.raises(RegistryError, match="names the index 'nightly'"):
        resolve()


def test_check_reads_the_index_from_uv_toml_and_stops_on_a_bad_one(
    home: Path, fake_index: FakeIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """End to end: `patchset check` run in a uv project finds the index its uv.toml names
    (nothing else names one), and a uv.toml that does not parse is one line, exit 2."""
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(tmp_path / "cache"))
    fake_index.add_release("0.1.0", {"vllm/x.py": b"x = 1\n"})
    write(Path.cwd() / "uv.toml", index(fake_index.index_url, default=True))
    args = ("--registry", REPO / "patches")
    done = run_cli(*args, "check", "--vllm", "0.1.0", "--format", "json", cwd=Path.cwd())
    assert done.returncode in (0, 1), done.stderr
    assert json.loads(done.stdout)["releases"][0]["vllm"] == "0.1.0"
    assert any("/simple/vllm/" in path for path in fake_index.server.hits), "index not asked"
    write(Path.cwd() / "uv.toml", "[[index]\n")
    done = run_cli(*args, "check", "--vllm", "0.1.0", cwd=Path.cwd())
    assert done.returncode == ExitCode.BAD_INPUT, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert "uv.toml" in line and "not valid TOML" in line and "Traceback" not in done.stderr
