"""Which patches an export or a build takes, and how a refusal names them (issue 23, item 25).

`runtime export` from a folder source (no Docker; `patchset build` lays out its context with
the same `patch_files`/`without_upstream`): a refusal names the patch that failed first,
then those it blocked; a patch whose upstream fix the release already holds is left out with
a line, and `--strict` refuses it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.errors import BuildError
from patchset.image.export import export_runtime
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.folder import FolderSource
from tests.helpers.synthetic import BODY, MOD_DIFF, OTHER, OTHER_DIFF, add_patch, make_tree

DEFINITION = """\
vllm = "0.20.0"
cuda = "cu130"
base = "patchset-test/base:0.20.0"
repository = "patchset-test/out"
tags = ["{{vllm}}"]
patches = {patches}

[serve]
args = []
"""
PROBE = '\n[upstream.probe]\nfile = "vllm/other.py"\ncontains = ["beta patched"]\n'


def export(
    tmp_path: Path, patches: list[str], files: dict[str, str], *, strict: bool = False
) -> list[str]:
    """Export `patches` of the registry under tmp_path/patches against a release holding
    `files`; the lines it logged."""
    release = make_tree(tmp_path / "release", files, version="0.20.0")
    builds = tmp_path / "builds"
    builds.mkdir(exist_ok=True)
    (builds / "0.20.0.toml").write_text(DEFINITION.format(patches=json.dumps(patches)))
    logged: list[str] = []
    export_runtime(
        load_definition(builds / "0.20.0.toml"),
        load_registry(tmp_path / "patches"),
        tmp_path / "bundle",
        source=FolderSource(release),
        log=logged.append,
        strict=strict,
    )
    return logged


def test_a_refusal_names_the_failing_patch_only(tmp_path: Path) -> None:
    """`a-fine` comes first in the run; the planner refuses `z-broken` (with its fix) and
    nothing of `a-fine`, which the others never make fail (issue 35)."""
    add_patch(tmp_path / "patches", "a-fine", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(tmp_path / "patches", "z-broken", diff=OTHER_DIFF, targets=["vllm/other.py"])
    with pytest.raises(BuildError) as refused:
        export(tmp_path, ["a-fine", "z-broken"], {"vllm/mod.py": BODY, "vllm/other.py": "x\n"})
    message = str(refused.value)
    assert "z-broken does not apply" in message, message
    assert "1 refusal(s)" in message and "a-fine" not in message
    assert "fix: rebase its payload on this release" in message
    assert not (tmp_path / "bundle").exists()


def _fixed_upstream(registry: Path) -> None:
    """'fixed-upstream': OTHER_DIFF with a probe that finds it upstream in 0.20.0."""
    add_patch(registry, "fixed-upstream", diff=OTHER_DIFF, targets=["vllm/other.py"], tail=PROBE)


def test_an_upstream_patch_is_left_out_with_a_line(tmp_path: Path) -> None:
    add_patch(tmp_path / "patches", "mod-fix", diff=MOD_DIFF, targets=["vllm/mod.py"])
    _fixed_upstream(tmp_path / "patches")
    files = {"vllm/mod.py": BODY, "vllm/other.py": OTHER.replace("beta", "beta patched")}
    logged = export(tmp_path, ["mod-fix", "fixed-upstream"], files)
    assert any(
        line.startswith("fixed-upstream: upstream in 0.20.0: nothing to apply")
        and line.endswith("; left out")
        for line in logged
    ), logged
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert [p["id"] for p in manifest["patches"]] == ["mod-fix"]
    assert not (tmp_path / "bundle" / "payloads" / "fixed-upstream").exists()


def test_strict_refuses_an_upstream_patch(tmp_path: Path) -> None:
    _fixed_upstream(tmp_path / "patches")
    files = {"vllm/other.py": OTHER.replace("beta", "beta patched")}
    with pytest.raises(BuildError, match=r"upstream in 0\.20\.0.*--strict refuses it"):
        export(tmp_path, ["fixed-upstream"], files, strict=True)
    assert not (tmp_path / "bundle").exists()


def test_tests_never_tag_official_or_user_facing_names() -> None:
    """Issue 23, item 24: the stand-in bases and the images the tests build carry names of
    their own, so a run on a machine holding the real official image leaves its tags alone."""
    from tests.infra.standin import for_tests, standin_tag

    user_facing = ("vllm/vllm-openai:", "patchset/vllm-openai:")
    for version in ("0.19.1", "0.20.0"):
        assert not standin_tag(version).startswith(user_facing)
    builds = sorted((Path(__file__).parents[2] / "builds").glob("*.toml"))
    assert builds
    for path in builds:
        text = for_tests(path.read_text())
        assert "vllm/vllm-openai:" not in text and '"patchset/vllm-openai"' not in text, path
