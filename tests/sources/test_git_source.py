"""GitSource and the gitrepo wrapper, on real repositories made under tmp_path (never mocked)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from patchset.adapters import gitrepo
from patchset.errors import SourceError
from patchset.sources import parse_source
from patchset.sources.base import ReleaseSource
from patchset.sources.git import GitSource, release_tags
from tests.helpers.cli import run_cli

UTILS = "vllm/model_executor/layers/fla/ops/utils.py"


@pytest.fixture(autouse=True)
def git_identity(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Fixed author and committer, and no user or system git configuration."""
    for role in ("AUTHOR", "COMMITTER"):
        monkeypatch.setenv(f"GIT_{role}_NAME", "Patchset Tests")
        monkeypatch.setenv(f"GIT_{role}_EMAIL", "tests@patchset.invalid")
        monkeypatch.setenv(f"GIT_{role}_DATE", "2026-01-01T00:00:00+00:00")
    monkeypatch.setenv("GIT_CONFIG_GLOBAL", str(tmp_path / "gitconfig"))
    monkeypatch.setenv("GIT_CONFIG_NOSYSTEM", "1")


def git(repo: Path, *args: str) -> str:
    done = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True
    )
    return done.stdout.strip()


def commit(repo: Path, files: dict[str, str | None], message: str) -> str:
    """Write (or, for None, delete) files and commit them; returns the commit sha."""
    for rel, text in files.items():
        path = repo / rel
        if text is None:
            path.unlink()
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD")


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """v0.1.0 (lightweight tag), v0.2.0 (annotated), v0.3.0rc1, a nightly tag, then work
    beyond the last tag that is also left in the working tree."""
    repo = tmp_path / "vllm"
    repo.mkdir()
    git(repo, "init", "-q", "-b", "main")
    commit(repo, {"vllm/__init__.py": "", UTILS: "one\n", "setup.py": ""}, "first")
    git(repo, "tag", "v0.1.0")
    commit(repo, {UTILS: "two\n", "vllm/new.py": "new\n"}, "second")
    git(repo, "tag", "-a", "v0.2.0", "-m", "release 0.2.0")
    commit(repo, {"vllm/new.py": None}, "third")
    git(repo, "tag", "v0.3.0rc1")
    git(repo, "tag", "nightly")
    git(repo, "tag", "vnext")
    commit(repo, {UTILS: "main\n"}, "fourth")
    (repo / UTILS).write_text("uncommitted\n")
    return repo


def test_versions_are_release_tags(clone: Path) -> None:
    src: ReleaseSource = GitSource(clone)
    assert src.name == "git"
    assert src.versions() == ["0.1.0", "0.2.0"]
    assert GitSource(clone, prereleases=True).versions() == ["0.1.0", "0.2.0", "0.3.0rc1"]


def test_open_reads_the_tag_not_the_working_tree(clone: Path) -> None:
    src = GitSource(clone)
    with src.open("0.1.0") as tree:
        assert tree.read(UTILS) == b"one\n"
        assert tree.read("vllm/new.py") is None
        assert list(tree.paths()) == ["vllm/__init__.py", UTILS]
        assert tree.info.version == "0.1.0"
        assert tree.info.origin.startswith("git tag v0.1.0 @")
    with src.open("v0.2.0") as tree:  # annotated tags are peeled to their commit
        assert tree.read(UTILS) == b"two\n"
        assert list(tree.paths()) == ["vllm/__init__.py", UTILS, "vllm/new.py"]
        assert tree.info.version == "0.2.0"
    assert (clone / UTILS).read_text() == "uncommitted\n"
    assert git(clone, "status", "--porcelain") == f"M {UTILS}"


def test_missing_paths_and_folders(clone: Path) -> None:
    with GitSource(clone).open("0.2.0") as tree:
        assert tree.read("vllm/model_executor") is None  # a folder is not a file
        assert tree.read("vllm/nope/deeper.py") is None
        assert tree.read("setup.py") == b""


def test_unknown_version(clone: Path) -> None:
    with (
        pytest.raises(SourceError, match=r"no tag for vllm 9\.9 \(v9\.9\)"),
        GitSource(clone).open("9.9"),
    ):
        pass
    with pytest.raises(SourceError, match="is not a version"), GitSource(clone).open("main"):
        pass


def test_not_a_git_repository(tmp_path: Path) -> None:
    (tmp_path / "vllm").mkdir()
    with pytest.raises(SourceError) as caught:
        GitSource(tmp_path)
    assert str(caught.value) == f"{tmp_path}: not a git repository"
    with pytest.raises(SourceError, match="no such folder"):
        GitSource(tmp_path / "missing")


def test_repository_without_vllm_or_tags(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    with pytest.raises(SourceError, match="has no commits"):
        GitSource(repo)
    commit(repo, {"README.md": "x"}, "first")
    git(repo, "tag", "v1.0.0")
    with pytest.raises(SourceError, match="no vllm/ folder at HEAD"):
        GitSource(repo)
    commit(repo, {"vllm/__init__.py": ""}, "second")
    git(repo, "tag", "-d", "v1.0.0")
    with pytest.raises(SourceError, match=r"no release tags \(vX\.Y\.Z\)"):
        GitSource(repo)


def test_bare_clone(clone: Path, tmp_path: Path) -> None:
    bare = tmp_path / "bare.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(clone), str(bare)], check=True)
    with GitSource(bare).open("0.2.0") as tree:
        assert tree.read(UTILS) == b"two\n"


def test_symlinks_in_the_tree_are_not_files(clone: Path) -> None:
    (clone / "vllm" / "link.py").symlink_to("/etc/passwd")
    commit(clone, {}, "a link")
    git(clone, "tag", "v0.4.0")
    with GitSource(clone).open("0.4.0") as tree:
        assert tree.read("vllm/link.py") is None
        assert "vllm/link.py" not in set(tree.paths())


def test_gitrepo_wrapper(clone: Path) -> None:
    with gitrepo.open_repo(clone) as repo:
        assert {"v0.1.0", "v0.2.0", "v0.3.0rc1", "nightly", "vnext"} <= set(repo.tags())
        assert repo.commit("v0.2.0") == git(clone, "rev-parse", "v0.2.0^{commit}")
        assert repo.commit("no-such-rev") is None
        assert repo.read_blob("v0.1.0", UTILS) == b"one\n"
        assert repo.read_blob("main", UTILS) == b"main\n"
        assert repo.list_paths("v0.2.0", "vllm/model_executor") == [UTILS]
        assert repo.list_paths("v0.2.0", "nothing/here") == []
        assert repo.list_paths("v0.1.0") == ["setup.py", "vllm/__init__.py", UTILS]
        assert repo.has_dir("HEAD", "vllm") and not repo.has_dir("HEAD", "setup.py")
        with pytest.raises(SourceError, match="no revision 'v7'"):
            repo.read_blob("v7", UTILS)
        with pytest.raises(SourceError, match="not a path inside"):
            repo.read_blob("HEAD", "vllm/../setup.py")


def test_release_tags() -> None:
    tags = release_tags(["v0.19.1", "v0.2.1.post1", "v0.11.0rc1", "nightly", "vx", "0.1.0"])
    assert [str(v) for v in sorted(tags)] == ["0.2.1.post1", "0.11.0rc1", "0.19.1"]


def test_parse_source_git(clone: Path) -> None:
    src = parse_source(f"git:{clone}")
    assert isinstance(src, GitSource)
    assert src.versions() == ["0.1.0", "0.2.0"]


def test_add_since_picks_pre_releases_only_with_pre(clone: Path, tmp_path: Path) -> None:
    """`add --since` (like `check`) leaves the v0.3.0rc1 tag out unless --pre."""
    diff = tmp_path / "fix.diff"
    diff.write_text(f"--- a/{UTILS}\n+++ b/{UTILS}\n@@ -1 +1 @@\n-two\n+two patched\n")
    registry = tmp_path / "patches"
    registry.mkdir()
    said: dict[bool, str] = {}
    for n, extra in enumerate(([], ["--pre"])):
        done = run_cli(
            "--registry", registry, "add", f"fix-{n}", "--diff", diff, "--since", "0.2.0",
            "--source", f"git:{clone}", *extra, cwd=Path.cwd(), timeout=120,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        said[bool(extra)] = done.stderr
    assert "checking 1 release(s)" in said[False] and "0.3.0rc1" not in said[False]
    assert "checking 2 release(s)" in said[True] and "checked vLLM 0.3.0rc1" in said[True]
