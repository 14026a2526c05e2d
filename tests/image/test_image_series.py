"""A stacked series (`requires`) in images and stock bundles, without Docker: the order the
manifest holds and the entrypoint follows, each patch's digests taken on top of the patches
before it, and a patch whose required patch is out of a start skipped, never half-applied.
The same on the stand-in image: tests/image/test_runtime_export.py and
tests/image/test_image_build.py."""

from __future__ import annotations

import hashlib
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from patchset.errors import BuildError
from patchset.image.content import series
from patchset.image.export import export_runtime
from patchset.kernel.order import in_order
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.folder import FolderSource
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    ON_TOP,
    add_keys,
    add_patch,
    definition_text,
    make_tree,
    run_entrypoint,
    stand_in_vllm,
)


def sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def stacked_registry(root: Path, *, bottom: str = "startup", top: str = "startup") -> Path:
    """'a-top' requires 'z-bottom': the alphabet would put them the wrong way round."""
    add_patch(root, "z-bottom", diff=MOD_DIFF, targets=["vllm/mod.py"], when=bottom)
    add_patch(root, "a-top", diff=ON_TOP, targets=["vllm/mod.py"], when=top)
    add_keys(root, "a-top", 'requires = ["z-bottom"]')
    return root


def export(tmp_path: Path, patches: list[str], **when: str) -> tuple[Path, dict[str, Any]]:
    registry = stacked_registry(tmp_path / "patches", **when)
    release = make_tree(tmp_path / "release", {"vllm/mod.py": BODY}, version="0.20.0")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.20.0.toml").write_text(definition_text("0.20.0", patches))
    bundle = tmp_path / "bundle"
    export_runtime(
        load_definition(tmp_path / "builds" / "0.20.0.toml"),
        load_registry(registry),
        bundle,
        source=FolderSource(release),
    )
    return bundle, json.loads((bundle / "manifest.json").read_text())


def start(tmp_path: Path, bundle: Path, **env: str) -> subprocess.CompletedProcess[str]:
    tree = tmp_path / "site"
    if not tree.exists():
        make_tree(tree, {"vllm/mod.py": BODY}, version="0.20.0")
        stand_in_vllm(tmp_path / "bin")
    env.setdefault("PATCHSET_COMPUTE_CAPABILITY", "none")
    return run_entrypoint(bundle, tree, tmp_path / "bin", **env)


def test_kernel_order_puts_each_item_after_what_it_requires() -> None:
    items = [("c", ["b"]), ("b", ["a"]), ("x", []), ("a", []), ("d", ["gone"])]
    ordered = in_order(items, lambda i: i[0], lambda i: i[1])
    assert [i[0] for i in ordered] == ["x", "a", "b", "c", "d"]
    cycle = [("p", ["q"]), ("q", ["p"]), ("r", [])]
    assert [i[0] for i in in_order(cycle, lambda i: i[0], lambda i: i[1])] == ["r", "p", "q"]


def test_build_series_puts_build_patches_first_then_requires_order(tmp_path: Path) -> None:
    root = stacked_registry(tmp_path / "patches")
    add_patch(root, "b-built", diff=MOD_DIFF.replace("mod", "other"), targets=["vllm/other.py"])
    registry = load_registry(root)
    assert [p.id for p in series(registry, ("a-top", "z-bottom", "b-built"))] == [
        "b-built",
        "z-bottom",
        "a-top",
    ]


@pytest.mark.parametrize(
    ("patches", "when", "message"),
    [
        (["a-top"], {}, "a-top requires z-bottom, which this definition does not list"),
        (
            ["a-top", "z-bottom"],
            {"top": "build"},
            "a-top is applied at build but requires z-bottom, applied at startup",
        ),
    ],
)
def test_a_definition_missing_a_required_patch_is_refused(
    tmp_path: Path, patches: list[str], when: dict[str, str], message: str
) -> None:
    with pytest.raises(BuildError, match=message) as caught:  # the planner's, all at once
        export(tmp_path, patches, **when)
    assert "0.20.0.toml" in str(caught.value)
    assert not (tmp_path / "bundle").exists()  # nothing written


@pytest.mark.parametrize("bottom", ["startup", "build"])
def test_manifest_holds_the_series_in_order_with_stacked_digests(
    tmp_path: Path, bottom: str
) -> None:
    _, manifest = export(tmp_path, ["a-top", "z-bottom"], bottom=bottom)
    entries = manifest["patches"]
    assert [(e["id"], e["requires"]) for e in entries] == [
        ("z-bottom", []),
        ("a-top", ["z-bottom"]),
    ]
    once = BODY.replace("line 11\n", "line 11 patched\n")
    twice = once.replace("line 12\n", "line 12 patched too\n")
    assert entries[0]["files"]["vllm/mod.py"] == {"before": sha(BODY), "after": sha(once)}
    assert entries[1]["files"]["vllm/mod.py"] == {"before": sha(once), "after": sha(twice)}


@pytest.mark.parametrize("bottom", ["startup", "build"])
def test_the_entrypoint_applies_the_series_and_finds_it_again(tmp_path: Path, bottom: str) -> None:
    bundle, _ = export(tmp_path, ["a-top", "z-bottom"], bottom=bottom)
    done = start(tmp_path, bundle)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = [line for line in done.stdout.splitlines() if " r1 " in line]
    assert lines == [
        f"patchset: z-bottom r1 ({bottom}): applied",
        "patchset: a-top r1 (startup): applied",
    ]
    text = (tmp_path / "site" / "vllm" / "mod.py").read_text()
    assert "line 11 patched\nline 12 patched too\n" in text
    again = start(tmp_path, bundle)
    assert again.returncode == 0, again.stdout + again.stderr
    assert f"z-bottom r1 ({bottom}): already-applied" in again.stdout
    assert "a-top r1 (startup): already-applied" in again.stdout


@pytest.mark.parametrize(
    ("env", "bottom_state", "top_state"),
    [
        (
            {"PATCHSET_DISABLE": "z-bottom"},
            "disabled (PATCHSET_DISABLE)",
            "skipped (requires z-bottom, which is disabled (PATCHSET_DISABLE))",
        ),
        (
            {"PATCHSET_ONLY": "a-top"},
            "left out (PATCHSET_ONLY)",
            "skipped (requires z-bottom, which is left out (PATCHSET_ONLY))",
        ),
    ],
)
def test_a_patch_whose_required_one_is_out_is_skipped(
    tmp_path: Path, env: dict[str, str], bottom_state: str, top_state: str
) -> None:
    bundle, _ = export(tmp_path, ["a-top", "z-bottom"])
    done = start(tmp_path, bundle, **env)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"patchset: z-bottom r1 (startup): {bottom_state}\n" in done.stdout
    assert f"patchset: a-top r1 (startup): {top_state}\n" in done.stdout
    assert (tmp_path / "site" / "vllm" / "mod.py").read_text() == BODY  # no half series


def test_a_patch_whose_required_one_failed_is_skipped_and_nothing_is_written(
    tmp_path: Path,
) -> None:
    bundle, _ = export(tmp_path, ["a-top", "z-bottom"])
    start(tmp_path, bundle, PATCHSET_DISABLE="z-bottom,a-top")  # lays out the tree
    edited = BODY.replace("line 11\n", "line 11 edited by hand\n")
    (tmp_path / "site" / "vllm" / "mod.py").write_text(edited)
    done = start(tmp_path, bundle, PATCHSET_ON_FAILURE="warn")
    assert (
        "z-bottom r1 (startup): FAILED (PATCHSET_ON_FAILURE=warn: left out, the start goes on):"
        " vllm/mod.py differs from the file" in done.stdout
    )
    assert "a-top r1 (startup): skipped (requires z-bottom, which failed)" in done.stdout
    assert done.returncode == 0
    assert "z-bottom failed; its policy is warn: starting vllm without it" in done.stderr
    assert (tmp_path / "site" / "vllm" / "mod.py").read_text() == edited
    refused = start(tmp_path, bundle)
    assert refused.returncode == 9
    assert (tmp_path / "site" / "vllm" / "mod.py").read_text() == edited


def test_a_patch_whose_required_one_is_out_of_scope_here_is_skipped(tmp_path: Path) -> None:
    bundle, manifest = export(tmp_path, ["a-top", "z-bottom"])
    manifest["patches"][0]["compute_capability"] = ">=12.0"  # as [hardware] would put it
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    done = start(tmp_path, bundle, PATCHSET_COMPUTE_CAPABILITY="8.6")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "z-bottom r1 (startup): skipped (scope cc >=12.0, this GPU: 8.6" in done.stdout
    assert (
        "a-top r1 (startup): skipped (requires z-bottom, which is skipped on this GPU)"
        in done.stdout
    )
    assert (tmp_path / "site" / "vllm" / "mod.py").read_text() == BODY
    done = start(tmp_path, bundle, PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert "a-top r1 (startup): applied" in done.stdout
