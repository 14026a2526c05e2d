"""Issue 27's gaps on the command line: `check --build` runs the library's whole check (the
definitions' releases prefetched, with the command's progress bar), and a malformed forge
URL in the environment is bad configuration (exit 2, one line naming the variable)."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchset.cachedir import cache_root
from patchset.errors import ExitCode
from patchset.sources.base import DownloadProgress
from tests.helpers import gitrepos
from tests.helpers.cli import REPO, cli
from tests.helpers.synthetic import BODY, add_patch


def test_check_build_prefetches_the_pinned_releases(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    for tag in ("v0.19.1", "v0.20.0", "v0.21.0"):
        gitrepos.commit(clone, {"vllm/__init__.py": "", "vllm/one.py": BODY + tag}, tag)
    patches, builds = tmp_path / "patches", tmp_path / "builds"
    patches.mkdir()
    builds.mkdir()
    add_patch(patches, "one", diff=gitrepos.line_diff("one"), targets=["vllm/one.py"])
    (builds / "a.toml").write_text(gitrepos.definition_text("0.19.1", ["one"]))
    (builds / "b.toml").write_text(gitrepos.definition_text("0.21.0", ["one"]))
    asked: list[list[str]] = []

    @contextlib.contextmanager
    def bar(versions: list[str]) -> Iterator[DownloadProgress | None]:
        asked.append(list(versions))
        yield None

    monkeypatch.setattr("patchset.cli.commands.check._bar", bar)
    where = ("--registry", patches, "--builds", builds)
    done = cli(*where, "check", "--builds", "--source", f"git:{clone}", cwd=tmp_path)
    assert done.code == ExitCode.OK, done.err
    assert asked == [["0.19.1", "0.21.0"]]  # what the definitions pin, in one prefetch
    asked.clear()
    shutil.rmtree(cache_root() / "memo")  # a check the memo answers fetches nothing
    done = cli(*where, "check", "--build", builds / "a.toml", "--source", f"git:{clone}")
    assert (done.code, asked) == (ExitCode.OK, [["0.19.1"]]), done.err


@pytest.mark.parametrize(
    ("variable", "argv"),
    [
        ("PATCHSET_FORGE_API_URL", ["upstream"]),
        ("PATCHSET_FORGE_URL", ["add", "new-patch", "--pr", "team/vllm#1", "--no-check"]),
    ],
)
@pytest.mark.parametrize("value", ["htp:/not a url", "https://", "http://host:port/"])
def test_a_malformed_forge_url_is_bad_configuration(
    tmp_path: Path, variable: str, argv: list[str], value: str
) -> None:
    registry = tmp_path / "patches"
    registry.mkdir()
    if argv[0] == "upstream":
        registry = REPO / "patches"
    done = cli("--registry", registry, *argv, env={variable: value})
    assert done.code == ExitCode.BAD_INPUT, done.err
    lines = done.err.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"patchset: error: ${variable}: "), lines
    if argv[0] == "add":
        assert not any(registry.iterdir())  # refused before anything is written
