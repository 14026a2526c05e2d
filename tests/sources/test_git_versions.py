"""Trees without a version: a folder or checkout whose version cannot be read is refused
(exit 2, one line) unless --source-version says it; a git checkout's version is its nearest
release tag with the commit; `git:PATH@REF` checks a branch tip as the next release after its
tag against ranges. Real git repositories, a shallow clone among them."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from patchset.adapters.gitrepo import open_repo
from patchset.errors import ExitCode, UsageError
from patchset.sources import parse_source
from patchset.sources.folder import FolderSource
from patchset.sources.git import GitSource, checkout_version, tip_version
from tests.helpers import gitrepos
from tests.helpers.cli import run_cli
from tests.helpers.gitrepos import git
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

MOD = "vllm/mod.py"


def commit(repo: Path, body: str, tag: str | None = None, when: int = 1_700_000_000) -> str:
    return gitrepos.commit(repo, {"vllm/__init__.py": "", MOD: body}, tag, when)


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """v0.32.0, v0.33.0, then two commits on main (the file unchanged, so the patch fits)."""
    repo = tmp_path / "vllm"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, BODY, "v0.32.0", when=1_700_000_000)
    commit(repo, BODY + "\n", "v0.33.0", when=1_700_100_000)
    commit(repo, BODY + "\n\n", when=1_700_200_000)
    commit(repo, BODY + "\n\n\n", when=1_700_300_000)
    return repo


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return run_cli(*args, cwd=cwd, timeout=120)


def registry(tmp_path: Path, vllm: str) -> Path:
    root = tmp_path / "patches"
    if not root.exists():
        root.mkdir()
    add_patch(root, f"p-{len(list(root.iterdir()))}", diff=MOD_DIFF, targets=[MOD], vllm=vllm)
    return root


def test_a_checkouts_version_is_its_tag_with_the_commit(clone: Path) -> None:
    head = git(clone, "rev-parse", "HEAD")
    assert FolderSource(clone).versions() == [f"0.33.0+g{head[:7]}"]
    git(clone, "checkout", "-q", "v0.33.0")
    assert FolderSource(clone).versions() == ["0.33.0"]  # at the tag: the release itself
    assert FolderSource(clone, version="0.40.0").versions() == ["0.40.0"]  # the caller knows


def test_a_branch_tip_is_the_next_release_after_its_tag(clone: Path) -> None:
    head = git(clone, "rev-parse", "HEAD")
    with open_repo(clone) as repo:
        assert tip_version(repo, "main") == f"0.33.1.dev2+g{head[:7]}"
        assert tip_version(repo, "v0.33.0") == "0.33.0"
        assert (checkout_version(repo, "main~1") or "").startswith("0.33.0+g")
    source = GitSource(f"{clone}@main")
    assert (source.path, source.ref) == (clone, "main")
    (label,) = source.versions()
    with source.open(label) as tree:
        assert tree.read(MOD) == (BODY + "\n\n\n").encode()
        assert tree.info.origin == f"git main @{head[:12]}"
    git(clone, "tag", "v0.34.0rc1")
    commit(clone, BODY, when=1_700_400_000)
    with open_repo(clone) as repo:
        assert tip_version(repo, "main").startswith("0.34.0rc2.dev1+g")


@pytest.mark.parametrize(
    ("vllm", "in_range"),
    [
        (">=0.33.0", True),
        ("<0.33.1", False),  # PEP 440: a dev release of 0.33.1 is not below it
        ("<0.34", True),
        ("<=0.33.0", False),
        (">0.33.0", True),
    ],
)
def test_the_tip_against_ranges(clone: Path, tmp_path: Path, vllm: str, in_range: bool) -> None:
    root = registry(tmp_path, vllm)
    done = cli(
        "--registry",
        str(root),
        "check",
        "--source",
        f"git:{clone}@main",
        "--format",
        "json",
        cwd=tmp_path,
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    (release,) = data["releases"]
    assert release["vllm"].startswith("0.33.1.dev2+g")
    (result,) = data["results"]
    assert result["in_range"] is in_range
    assert result["verdict"] == "needed"


def test_a_shallow_clone_reckons_from_the_tags_fetched(clone: Path, tmp_path: Path) -> None:
    """A shallow clone of main (the tags not in its history) with the release tags fetched
    one commit deep, as the daily job does: the newest tag made before the tip."""
    shallow = tmp_path / "shallow"
    git(tmp_path, "clone", "-q", "--depth", "1", "--no-tags", f"file://{clone}", str(shallow))
    with pytest.raises(UsageError, match="no release tag"):
        GitSource(f"{shallow}@HEAD")
    git(shallow, "fetch", "-q", "--depth", "1", "origin", "refs/tags/v*:refs/tags/v*")
    head = git(shallow, "rev-parse", "HEAD")
    assert GitSource(f"{shallow}@HEAD").versions() == [f"0.33.1.dev0+g{head[:7]}"]
    assert GitSource(f"{shallow}@HEAD", version="0.33.5").versions() == ["0.33.5"]


def test_without_a_version_the_check_is_one_line_exit_2(tmp_path: Path) -> None:
    tree = tmp_path / "tree"
    (tree / "vllm").mkdir(parents=True)
    (tree / MOD).write_text(BODY)
    root = registry(tmp_path, ">=0.1")
    base = ["--registry", str(root), "check", "--source", str(tree)]
    done = cli(*base, cwd=tmp_path)
    assert done.returncode == ExitCode.BAD_INPUT
    (line,) = done.stderr.strip().splitlines()
    assert str(tree) in line and "--source-version X" in line
    told = cli(*base, "--source-version", "0.20.0", "--format", "json", cwd=tmp_path)
    assert told.returncode == 0, told.stderr
    assert json.loads(told.stdout)["releases"][0]["vllm"] == "0.20.0"
    bad = cli(*base, "--source-version", "tomorrow", cwd=tmp_path)
    assert bad.returncode == ExitCode.BAD_INPUT
    assert "--source-version 'tomorrow' is not a version" in bad.stderr
    index = cli(
        "--registry",
        str(root),
        "check",
        "--vllm",
        "0.20.0",
        "--source-version",
        "0.20.0",
        cwd=tmp_path,
    )
    assert index.returncode == ExitCode.BAD_INPUT and "only with a folder" in index.stderr


def test_a_checkout_without_tags_is_refused(tmp_path: Path) -> None:
    repo = tmp_path / "untagged"
    repo.mkdir()
    git(repo, "init", "-q")
    commit(repo, BODY)
    with pytest.raises(UsageError, match="git checkout with no release tag"):
        FolderSource(repo)
    with pytest.raises(UsageError, match="no revision 'nope'"):
        parse_source(f"git:{repo}@nope")
