"""One check, four sources: the index's sdists, a git clone, a folder, a Docker image must give
the same verdicts for the same real release files."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchset.registry import load_registry
from patchset.release_check import check
from patchset.sources.folder import FolderSource
from patchset.sources.git import GitSource
from tests.helpers.cli import run_cli
from tests.helpers.releases import materialize
from tests.infra.docker_fixtures import StandinImage
from tests.sources.test_git_source import commit, git, git_identity  # noqa: F401 - autouse fixture

pytestmark = pytest.mark.network
REPO = Path(__file__).parents[2]
REGISTRY = load_registry(REPO / "patches")
FILES = [t for p in REGISTRY.patches for t in p.targets]


def verdicts(report_results: object) -> dict[tuple[str, str], str]:
    assert isinstance(report_results, tuple)
    return {(r.vllm, r.patch): r.verdict for r in report_results}


def test_git_and_folder_agree_with_the_index(tmp_path: Path) -> None:
    releases = ["0.19.1", "0.20.0"]
    expected = verdicts(check(REGISTRY, releases).results)
    clone = tmp_path / "vllm"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    for version in releases:
        tree = materialize(version, tmp_path / f"tree-{version}", FILES)
        files: dict[str, str | None] = {
            str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py")
        }
        commit(clone, files, f"vLLM {version}")
        git(clone, "tag", f"v{version}")
    from_git = check(REGISTRY, releases, source=GitSource(clone))
    assert verdicts(from_git.results) == expected
    assert all("git tag" in r.origin or "v0." in r.origin for r in from_git.releases)
    folder = materialize("0.19.1", tmp_path / "folder", FILES)
    from_folder = check(REGISTRY, ["0.19.1"], source=FolderSource(folder))
    assert verdicts(from_folder.results) == {k: v for k, v in expected.items() if k[0] == "0.19.1"}


@pytest.mark.docker
def test_image_source_through_the_cli(standin_base: StandinImage) -> None:
    proc = run_cli(
        "check", "--source", f"image:{standin_base.ref}", "--format", "json", timeout=300
    )
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    got = {(r["vllm"], r["patch"]): r["verdict"] for r in data["results"]}
    assert got == {
        ("0.19.1", "fla-tma-sm12x"): "needed",
        ("0.19.1", "tolist-cudagraph"): "missing-target",
    }
    assert f"image {standin_base.ref}" in data["releases"][0]["origin"]


def test_git_ancestry_is_a_third_signal(tmp_path: Path) -> None:
    """upstream.commit in a clone's history says `upstream` even where the diff would still
    apply; a release before the fix is `needed`, and the signals are shown side by side."""
    clone = tmp_path / "vllm"
    clone.mkdir()
    git(clone, "init", "-q", "-b", "main")
    tree = materialize("0.19.1", tmp_path / "t", FILES)
    files: dict[str, str | None] = {
        str(p.relative_to(tree)): p.read_text() for p in tree.rglob("*.py")
    }
    commit(clone, files, "vLLM 0.19.1")
    git(clone, "tag", "v0.19.1")
    fix = commit(clone, {"vllm/fix_elsewhere.py": "FIXED = True\n"}, "the upstream fix")
    git(clone, "tag", "v0.19.2")
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    toml = patches / "fla-tma-sm12x" / "patch.toml"
    toml.write_text(
        toml.read_text().replace('state = "open"', f'state = "merged"\ncommit = "{fix}"')
    )
    registry = load_registry(patches)
    report = check(
        registry, ["0.19.1", "0.19.2"], source=GitSource(clone), patches=["fla-tma-sm12x"]
    )
    before, after = report.results
    assert (before.verdict, before.signals.ancestry) == ("needed", False)
    assert (after.verdict, after.signals.ancestry, after.signals.forward) == (
        "upstream",
        True,
        "applies",
    )
    assert after.disagreement == "the patch still applies, yet git history holds the upstream fix"
    index = check(registry, ["0.19.1"], patches=["fla-tma-sm12x"])
    assert index.results[0].signals.ancestry is None  # no clone, no git signal
