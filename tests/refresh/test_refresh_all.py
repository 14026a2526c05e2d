"""`patchset refresh --all --vllm V`: the diff patches that fit V only at an offset or with
fuzz carried onto V as exact variants; the others (exact, conflicting) left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.release_check import check
from patchset.sources.git import GitSource
from tests.helpers import gitrepos
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import BODY, add_patch


@pytest.fixture
def project(tmp_path: Path) -> Path:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    names = ("moved", "exact", "broken")
    gitrepos.commit(
        clone, {"vllm/__init__.py": "", **{f"vllm/{n}.py": BODY for n in names}}, "v0.19.1"
    )
    gitrepos.commit(
        clone,
        {
            "vllm/moved.py": "new 1\nnew 2\nnew 3\n" + BODY,  # the hunk now sits 3 lines down
            "vllm/broken.py": BODY.replace("line 11\n", "line 11 rewritten\n"),
        },
        "v0.20.0",
    )
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in names:
        add_patch(patches, name, diff=gitrepos.line_diff(name), targets=[f"vllm/{name}.py"])
    return tmp_path


def test_only_the_shifted_patch_is_carried(project: Path) -> None:
    before = sorted(p.name for p in (project / "patches" / "moved").iterdir())
    proposed = gitrepos.refresh_all(project)
    assert [(c["patch"], c["outcome"]) for c in proposed["carried"]] == [("moved", "proposed")]
    assert sorted(p.name for p in (project / "patches" / "moved").iterdir()) == before
    written = gitrepos.refresh_all(project, "--write")
    (carried,) = written["carried"]
    assert carried["outcome"] == "written" and carried["variant"]
    registry = load_registry(project / "patches")
    moved = registry.get("moved")
    assert (
        len(moved.variants) == 2
        and getattr(moved.variant_for("0.20.0"), "name", None) == carried["variant"]
    )
    report = check(
        registry, ["0.20.0", "0.19.1"], source=GitSource(project / "vllm"), use_memo=False
    )
    for version in ("0.20.0", "0.19.1"):
        result = report.result(version, "moved")
        assert (result.verdict, result.shifted) == ("needed", False)  # exact on both now
    assert report.result("0.20.0", "broken").verdict == "conflict"  # left alone
    again = gitrepos.refresh_all(project)
    assert again["carried"] == []  # nothing shifted any more


def test_all_goes_with_vllm_only(project: Path) -> None:
    done = run_cli(
        "--registry",
        project / "patches",
        "refresh",
        "--all",
        "moved",
        "--vllm",
        "0.20.0",
        cwd=project,
    )
    assert done.returncode == ExitCode.BAD_INPUT and "--all takes --vllm" in done.stderr
    bare = run_cli("--registry", project / "patches", "refresh", "--vllm", "0.20.0", cwd=project)
    assert bare.returncode == ExitCode.BAD_INPUT and "give a patch ID" in bare.stderr
