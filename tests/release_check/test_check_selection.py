"""`patchset check` choosing releases from a real HTTP index on 127.0.0.1: --since includes
its release, an empty selection is one line and exit 0, and latest/--since agree with the
index on pre-releases and yanked files (left out unless --pre; yanked always)."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchset.cli.main import main
from patchset.sources.base import DownloadProgress
from patchset.sources.package_index.cache import Cache
from tests.helpers.fake_index import FakeIndex, Reply
from tests.helpers.workflow_commands import read_annotations

UTILS = "vllm/model_executor/layers/fla/ops/utils.py"


@pytest.fixture
def index(fake_index: FakeIndex, tmp_cache: Cache) -> FakeIndex:
    fake_index.add_release("0.1.0", {UTILS: b"x = 1\n"})
    fake_index.add_release("0.2.0", {UTILS: b"x = 2\n"}, yanked=True)
    fake_index.add_release("0.3.0rc1", {UTILS: b"x = 3\n"})
    fake_index.publish()
    return fake_index


def checked(index: FakeIndex, capsys: pytest.CaptureFixture[str], *args: str) -> list[str]:
    registry = Path(__file__).parents[2] / "patches"
    argv = ["check", "--registry", str(registry), "--index-url", index.index_url, *args]
    assert main([*argv, "--format", "json"]) == 0
    return [r["vllm"] for r in json.loads(capsys.readouterr().out)["releases"]]


def test_since_includes_its_release_and_skips_yanked_and_pre(
    index: FakeIndex, capsys: pytest.CaptureFixture[str]
) -> None:
    assert checked(index, capsys, "--since", "0.1.0") == ["0.1.0"]
    assert checked(index, capsys, "--since", "0.1.0", "--pre") == ["0.1.0", "0.3.0rc1"]


def test_latest_agrees_with_the_index(index: FakeIndex, capsys: pytest.CaptureFixture[str]) -> None:
    assert checked(index, capsys, "--vllm", "latest") == ["0.1.0"]
    assert checked(index, capsys, "--vllm", "latest", "--pre") == ["0.3.0rc1"]


@pytest.mark.parametrize("fmt", ["table", "github", "json"])
def test_nothing_at_or_after_since_is_one_line_and_exit_0(
    index: FakeIndex, capsys: pytest.CaptureFixture[str], tmp_path: Path, fmt: str
) -> None:
    (tmp_path / "patches").mkdir()
    argv = ["check", "--registry", str(tmp_path / "patches"), "--index-url", index.index_url]
    assert main([*argv, "--since", "0.1.1", "--format", fmt]) == 0
    out = capsys.readouterr().out
    line = "patchset check: no final release at or after 0.1.1 on the index yet; nothing to check"
    if fmt == "table":
        assert out == line + "\n"
    elif fmt == "github":
        (notice,) = read_annotations(out)
        assert (notice.name, notice.data) == ("notice", line)
        assert out.count("\n") == 1
    else:
        report = json.loads(out)
        assert (report["releases"], report["results"], report["exit_code"]) == ([], [], 0)


def test_verbose_shows_the_retries_and_the_download(
    fake_index: FakeIndex, tmp_cache: Cache, capsys: pytest.CaptureFixture[str]
) -> None:
    """A flaky index is not silence: -v names each retry and what is read (stderr)."""
    fake_index.add_release("0.1.0", {UTILS: b"x = 1\n"})
    body, kind = fake_index.page()
    fake_index.server.route(FakeIndex.PAGE_PATH, Reply(503), Reply(200, body, content_type=kind))
    registry = Path(__file__).parents[2] / "patches"
    argv = ["check", "--registry", str(registry), "--index-url", fake_index.index_url]
    assert main([*argv, "--vllm", "0.1.0", "-v"]) == 0
    err = capsys.readouterr().err.splitlines()
    assert any(re.match(r"patchset: .*: HTTP 503 .*; trying again in [\d.]+s$", e) for e in err)
    assert any(e.startswith("patchset: reading the central directory of ") for e in err)


def test_since_from_tool_patchset_when_no_release_is_named(
    index: FakeIndex,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "pyproject.toml").write_text(
        f'[tool.patchset]\nindex-url = "{index.index_url}"\nsince = "0.1.0"\n'
    )
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--format", "json"]) == 0
    assert [r["vllm"] for r in json.loads(capsys.readouterr().out)["releases"]] == ["0.1.0"]
    assert main(["check", "--vllm", "latest", "--pre", "--format", "json"]) == 0  # named: wins
    assert [r["vllm"] for r in json.loads(capsys.readouterr().out)["releases"]] == ["0.3.0rc1"]


def test_the_check_is_one_library_call(index: FakeIndex, tmp_cache: Cache) -> None:
    """`patchset.check` selects the releases (``latest``, `since`), prefetches what the check
    reads (`files_needed`: every target, the probe's file, ``vllm/_version.py``) with the
    caller's progress, and evaluates: the CLI only parses and renders."""
    import patchset
    from patchset.release_check import files_needed
    from patchset.sources import parse_source

    registry = patchset.load_registry(Path(__file__).parents[2] / "patches")
    needed = files_needed(registry.patches)
    assert "vllm/_version.py" in needed
    assert set(needed) >= {t for p in registry.patches for t in p.targets}
    selected: list[list[str]] = []
    heard: list[str] = []

    @contextlib.contextmanager
    def bar(versions: list[str]) -> Iterator[DownloadProgress]:
        selected.append(versions)
        yield lambda version, done, total: heard.append(version)

    source = parse_source(None, index_url=index.index_url, prereleases=True)
    report = patchset.check(registry, since="0.1.0", pre=True, source=source, progress=bar)
    assert selected == [["0.1.0", "0.3.0rc1"]] and set(heard) == {"0.1.0", "0.3.0rc1"}
    assert [r.version for r in report.releases] == ["0.1.0", "0.3.0rc1"]
    assert {r.patch for r in report.results} == {p.id for p in registry.patches}
    hits = dict(index.server.hits)
    offline = parse_source(None, offline=True, prereleases=True)
    again = patchset.check(registry, ["latest"], pre=True, source=offline)
    assert [r.version for r in again.releases] == ["0.3.0rc1"]  # offline: nothing fetched
    assert dict(index.server.hits) == hits
    nothing = patchset.check(registry, since="0.4.0", source=source)
    assert (nothing.releases, nothing.results, nothing.exit_code) == ((), (), 0)
