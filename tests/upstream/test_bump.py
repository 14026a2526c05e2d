"""`patchset bump`: a definition carried from 0.19.1 to 0.20.0 of a real git clone, one
patch per outcome: still needed (kept), upstream (dropped, with evidence), conflicting but
merging cleanly (refreshed), conflicting for real (hand work); the new definition's text,
--write, the pull-request body, the exit codes, and bad input."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from patchset.errors import ExitCode, UnknownPatchError, UsageError
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.git import GitSource
from patchset.upstream.bump import bump
from tests.helpers import gitrepos
from tests.helpers.cli import cli as cli_in_process
from tests.helpers.cli import run_cli
from tests.helpers.hardening import full_disk_under
from tests.helpers.schemas import assert_matches
from tests.helpers.synthetic import BODY, add_patch

DEFINITION = """\
# the recipe's build, kept by bump
vllm = "0.19.1"
cuda = "cu130"
base = "vllm/vllm-openai:v0.19.1-cu130"
repository = "team/vllm-openai"
tags = ["{{vllm}}-{{cuda}}", "stable-0.19.1"]
patches = [{patches}]

[env]
VLLM_X = "1"

[serve]
args = ["--max-model-len", "4096"]
"""


def diff(name: str, old: str = "line 11", new: str = "line 11 patched") -> str:
    return f"""\
--- a/vllm/{name}.py
+++ b/vllm/{name}.py
@@ -9,5 +9,5 @@
 line 9
 line 10
-{old}
+{new}
 line 12
 line 13
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A clone with v0.19.1 and v0.20.0, and a registry of one patch per outcome."""
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    files = {f"vllm/{n}.py": BODY for n in ("keep", "gone-up", "clean", "hard")}
    gitrepos.commit(clone, {"vllm/__init__.py": "", **files}, "v0.19.1")
    gitrepos.commit(
        clone,
        {
            "vllm/gone-up.py": BODY.replace("line 11\n", "line 11 patched\n"),  # the fix upstream
            "vllm/clean.py": BODY.replace("line 9\n", "line nine\n"),  # nearby, mergeable
            "vllm/hard.py": BODY.replace("line 11\n", "line 11 rewritten\n"),  # the same line
        },
        "v0.20.0",
    )
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in ("keep", "gone-up", "clean", "hard"):
        add_patch(patches, name, diff=diff(name), targets=[f"vllm/{name}.py"], vllm=">=0.19")
    (tmp_path / "builds").mkdir()
    return tmp_path


def definition(project: Path, *names: str) -> Path:
    path = project / "builds" / "0.19.1.toml"
    path.write_text(DEFINITION.format(patches=", ".join(f'"{n}"' for n in names)))
    return path


def test_each_patch_gets_its_outcome(project: Path) -> None:
    old = definition(project, "keep", "gone-up", "clean", "hard")
    registry = load_registry(project / "patches")
    report = bump(registry, old, "0.20.0", source=GitSource(project / "vllm"))
    got = {s.patch: (s.verdict, s.action) for s in report.steps}
    assert got == {
        "keep": ("needed", "kept"),
        "gone-up": ("upstream", "dropped"),
        "clean": ("conflict", "refreshed"),
        "hard": ("conflict", "hand-work"),
    }
    assert report.exit_code == ExitCode.ATTENTION and not report.complete
    assert report.target == project / "builds" / "0.20.0.toml" and not report.target.exists()
    assert report.written == ()
    up = next(s for s in report.steps if s.patch == "gone-up")
    assert up.evidence  # the check's detail says why
    evidence = {s.patch: s.evidence for s in report.steps}  # one line, naming files and lines
    assert "vllm/gone-up.py: hunk #1 already present at line 9" in evidence["gone-up"]
    assert "(conflict was at vllm/clean.py#1)" in evidence["clean"]
    assert evidence["hard"].startswith("refresh: three-way merge conflicts at vllm/hard.py:")
    text = report.text
    assert text.startswith("# the recipe's build, kept by bump\n")
    assert 'vllm = "0.20.0"' in text and 'base = "vllm/vllm-openai:v0.20.0-cu130"' in text
    assert '"stable-0.20.0"' in text and '"{vllm}-{cuda}"' in text
    assert 'patches = ["keep", "clean"]' in text and 'VLLM_X = "1"' in text
    assert sorted(p.name for p in (project / "patches" / "clean").iterdir()) == [
        "patch.diff",
        "patch.toml",
    ]  # a dry run writes nothing
    assert_matches(report.to_dict(), "bump")


def cli(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    where: list[str | Path] = ["--registry", project / "patches", "bump", *args]
    return run_cli(*where, "--source", f"git:{project / 'vllm'}", cwd=project)


def test_write_and_the_pull_request_body(project: Path) -> None:
    old = definition(project, "keep", "gone-up", "clean", "hard")
    done = cli(project, str(old), "--to", "0.20.0", "--write", "--format", "markdown")
    assert done.returncode == ExitCode.ATTENTION, done.stderr
    body = done.stdout
    assert body.startswith("## vLLM 0.20.0 for `0.19.1.toml`")
    assert "| `hard` | conflict | **hand-work** |" in body and "- [ ] `hard`:" in body
    assert "| `gone-up` | upstream | dropped |" in body
    new = load_definition(project / "builds" / "0.20.0.toml")
    assert (new.vllm, new.base, new.patches) == (
        "0.20.0",
        "vllm/vllm-openai:v0.20.0-cu130",
        ("keep", "clean"),
    )
    registry = load_registry(project / "patches")
    new.check_patches(registry)  # every patch listed fits 0.20.0 by its range
    clean = registry.get("clean")
    assert clean.variant_for("0.20.0") is not None and len(clean.variants) == 2
    again = cli(project, str(old), "--to", "0.20.0", "--write")
    assert again.returncode == ExitCode.BAD_INPUT and "not overwritten" in again.stderr


def test_latest_when_nothing_is_newer_is_one_line_exit_0(project: Path) -> None:
    path = project / "builds" / "0.20.0.toml"
    path.write_text(DEFINITION.format(patches='"keep"').replace("0.19.1", "0.20.0"))
    done = cli(project, str(path), "--to", "latest", "--write")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == (
        "patchset bump: no release newer than 0.20.0 on the git yet; nothing to bump"
    )
    assert sorted(p.name for p in (project / "builds").iterdir()) == ["0.20.0.toml"]


def test_a_base_without_the_version_is_hand_work(project: Path) -> None:
    old = definition(project, "keep")
    old.write_text(old.read_text().replace("vllm/vllm-openai:v0.19.1-cu130", "team/base@sha256:ab"))
    report = bump(
        load_registry(project / "patches"), old, "0.20.0", source=GitSource(project / "vllm")
    )
    assert report.notes and "set the base for 0.20.0 by hand" in report.notes[0]
    assert report.exit_code == ExitCode.ATTENTION
    assert_matches(report.to_dict(), "bump")


def test_a_complete_bump_exits_0(project: Path) -> None:
    old = definition(project, "keep", "gone-up")
    done = cli(project, str(old), "--to", "latest", "--format", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert_matches(data, "bump")
    assert data["complete"] and data["to"] == "0.20.0" and data["patches"] == ["keep"]
    wrote = cli(project, str(old), "--to", "latest", "--write", "--format", "json")
    assert wrote.returncode == 0, wrote.stderr
    data = json.loads(wrote.stdout)
    assert_matches(data, "bump")
    assert data["written"] == [str(project / "builds" / "0.20.0.toml")]


def test_a_full_disk_writing_the_new_definition_is_one_line_exit_2(
    project: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 9: `bump --write` whose `builds/0.20.0.toml` meets a full disk (the
    disk: tests/hardening.full_disk_under): one line, exit 2, no new file, no temp file."""
    old = definition(project, "keep", "gone-up")
    before = sorted(p.name for p in (project / "builds").iterdir())
    full_disk_under(monkeypatch, project / "builds")
    argv = ("--registry", project / "patches", "bump", old, "--to", "0.20.0", "--write")
    done = cli_in_process(*argv, "--source", f"git:{project / 'vllm'}", cwd=project)
    assert done.code == ExitCode.BAD_INPUT, done.err
    assert done.err.splitlines() == [
        f"patchset: error: {project / 'builds' / '0.20.0.toml'}: the disk is full"
        " (No space left on device); not written"
    ]
    assert sorted(p.name for p in (project / "builds").iterdir()) == before


@pytest.mark.parametrize(
    ("to", "words"),
    [
        ("0.19.0", "not newer than the definition's"),
        ("0.21.0", "has no such release"),
        ("soon", "is not a version"),
    ],
)
def test_a_bad_target_is_exit_2(project: Path, to: str, words: str) -> None:
    old = definition(project, "keep")
    done = cli(project, str(old), "--to", to)
    assert done.returncode == ExitCode.BAD_INPUT and words in done.stderr
    with pytest.raises(UsageError):
        bump(load_registry(project / "patches"), old, to, source=GitSource(project / "vllm"))


def test_a_definition_naming_an_unknown_patch(project: Path) -> None:
    old = definition(project, "keep", "nope")
    with pytest.raises(UnknownPatchError):
        bump(load_registry(project / "patches"), old, "0.20.0", source=GitSource(project / "vllm"))
    assert cli(project, str(old), "--to", "0.20.0").returncode == ExitCode.BAD_INPUT
