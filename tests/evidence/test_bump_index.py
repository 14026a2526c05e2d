"""Issue 36's bad input for `bump`, on the package index (a fake one on 127.0.0.1) rather than
a git clone: a release the index lacks, and a pre-release asked for without `--pre`, are one
line each, exit 2, nothing written (no definition, no variant, no cache left half-filled by
the refused target); with `--pre` the pre-release is bumped to."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.errors import ExitCode
from tests.helpers.cli import cli
from tests.helpers.fake_index import FakeIndex
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

DEFINITION = """\
# built on the vLLM 0.19.1 image
vllm = "0.19.1"
cuda = "cu130"
base = "vllm/vllm-openai:v0.19.1-cu130"
repository = "team/vllm-openai"
tags = ["{{vllm}}-{{cuda}}"]
patches = ["mod"]

[serve]
args = ["--max-model-len", "4096"]
"""


@pytest.fixture
def project(tmp_path: Path, fake_index: FakeIndex, tmp_cache: object) -> Path:
    for version in ("0.19.1", "0.20.0", "0.21.0rc1"):
        fake_index.add_release(version, {"vllm/mod.py": BODY.encode()})
    add_patch(tmp_path / "patches", "mod", diff=MOD_DIFF, targets=["vllm/mod.py"], vllm=">=0.19")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.19.1.toml").write_text(DEFINITION)
    return tmp_path


def _bump(project: Path, fake_index: FakeIndex, *args: str) -> tuple[int, str, str]:
    done = cli(
        "--registry",
        project / "patches",
        "bump",
        project / "builds" / "0.19.1.toml",
        *args,
        "--index-url",
        fake_index.index_url,
        cwd=project,
    )
    return done.code, done.out, done.err


def _written(project: Path) -> list[str]:
    """The project's files, the release cache (the index page it read) aside."""
    return sorted(
        str(p.relative_to(project))
        for folder in ("builds", "patches")
        for p in (project / folder).rglob("*")
        if p.is_file()
    )


@pytest.mark.parametrize(
    ("to", "words"),
    [("0.22.0", "has no such release"), ("0.21.0rc1", "is a pre-release: add --pre")],
)
def test_a_target_the_index_cannot_give_is_one_line_and_writes_nothing(
    project: Path, fake_index: FakeIndex, to: str, words: str
) -> None:
    before = _written(project)
    for fmt in ("table", "json"):
        code, out, err = _bump(project, fake_index, "--to", to, "--write", "--format", fmt)
        assert code == ExitCode.BAD_INPUT, (out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and words in lines[0] and to in lines[0], lines
        assert "Traceback" not in err and len(lines[0]) < 300
        assert out == ""
    assert _written(project) == before
    # the refused pre-release's files were never fetched
    assert fake_index.server.hits[fake_index.sdist_path(to)] == 0
    assert fake_index.server.hits[fake_index.wheel_path(to)] == 0


def test_a_pre_release_with_pre_is_bumped_to(project: Path, fake_index: FakeIndex) -> None:
    code, out, err = _bump(project, fake_index, "--to", "0.21.0rc1", "--pre", "--write")
    assert code == 0, (out, err)
    written = project / "builds" / "0.21.0rc1.toml"
    assert written.is_file() and 'vllm = "0.21.0rc1"' in written.read_text()
