"""`[tool.patchset]`: index-url, offline, cache-dir and since as defaults, and bad tables
named by file and key."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from patchset.errors import RegistryError
from patchset.project import resolve
from tests.helpers.cli import run_cli

REPO = Path(__file__).parents[2]

# the tests read [tool.patchset] only: no PATCHSET_* variable of the caller's
NO_PATCHSET_ENV: dict[str, str | None] = {k: None for k in os.environ if k.startswith("PATCHSET_")}


def write(folder: Path, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "pyproject.toml"
    path.write_text(text)
    return path


def test_the_release_settings_are_read_and_typed(tmp_path: Path) -> None:
    write(
        tmp_path,
        '[tool.patchset]\nindex-url = "http://127.0.0.1:1/simple"\noffline = true\n'
        'cache-dir = ".cache/patchset"\nsince = "0.19.1"\n',
    )
    sub = tmp_path / "deep" / "er"
    sub.mkdir(parents=True)
    project = resolve(cwd=sub, environ={})
    assert project.index_url == "http://127.0.0.1:1/simple"
    assert project.offline is True
    assert project.cache_dir == tmp_path / ".cache" / "patchset"  # beside pyproject.toml
    assert project.since == "0.19.1"
    assert project.registry == tmp_path / "patches"


@pytest.mark.parametrize(
    ("table", "message"),
    [
        ('offline = "yes"', "tool.patchset.offline: expected true or false, got a string"),
        ('since = "latest"', "tool.patchset.since: 'latest' is not a PEP 440 version"),
        (
            'index_url = "http://127.0.0.1:1/"',
            "tool.patchset.index_url: unknown key (did you mean 'index-url'?)",
        ),
        ("cache-dir = 3", "tool.patchset.cache-dir: expected a string, got an integer"),
    ],
)
def test_a_bad_table_names_the_file_and_key(tmp_path: Path, table: str, message: str) -> None:
    pyproject = write(tmp_path, f"[tool.patchset]\n{table}\n")
    with pytest.raises(RegistryError) as caught:
        resolve(cwd=tmp_path, environ={})
    assert str(caught.value).startswith(f"{pyproject}: ")
    assert message in str(caught.value)
    proc = run_cli("validate", cwd=tmp_path, env=NO_PATCHSET_ENV)
    assert proc.returncode == 2
    assert proc.stderr == f"patchset: error: {caught.value}\n"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (b"tool = 3\n", "tool: expected a table, got int"),
        (b"[tool.patchset\n", "not valid TOML"),
        (b'[tool.patchset]\nregistry = "\xff"\n', "line 2: not UTF-8 (byte 0xff)"),
    ],
)
def test_an_unreadable_pyproject_on_the_way_up_is_one_line(
    tmp_path: Path, content: bytes, message: str
) -> None:
    pyproject = tmp_path / "pyproject.toml"
    pyproject.write_bytes(content)
    sub = tmp_path / "a" / "b"
    sub.mkdir(parents=True)
    proc = run_cli("list", cwd=sub, env=NO_PATCHSET_ENV)
    assert proc.returncode == 2
    (line,) = proc.stderr.splitlines()
    assert line.startswith(f"patchset: error: {pyproject}: ") and message in line


def test_index_url_and_cache_dir_from_the_table_are_used(tmp_path: Path) -> None:
    """A closed port as the index and an empty cache: the check must fail on that index."""
    write(
        tmp_path,
        '[tool.patchset]\nindex-url = "http://127.0.0.1:9/simple"\ncache-dir = "cache"\n',
    )
    (tmp_path / "patches").mkdir()
    start = time.monotonic()
    proc = run_cli(
        "check", "--vllm", "0.19.1", "--format", "github", cwd=tmp_path, env=NO_PATCHSET_ENV
    )
    assert proc.returncode == 3, proc.stderr
    assert "127.0.0.1:9" in proc.stderr
    assert proc.stdout.startswith("::error title=patchset check::")
    assert time.monotonic() - start < 60
    write(tmp_path, '[tool.patchset]\noffline = true\ncache-dir = "cache"\n')
    proc = run_cli("check", "--vllm", "0.19.1", cwd=tmp_path, env=NO_PATCHSET_ENV)
    assert proc.returncode == 3
    assert f"not in the cache at {tmp_path / 'cache'}" in proc.stderr  # the table's, offline
