# ruff: noqa: E501 - the Genesis-shaped modules and entries below are written as such files are
"""Issue 36's Genesis-shaped fixtures through the whole import (a checkout written here, two
releases as folders): PN351's shape (a test helper building the patcher on a path it is given,
beside the module's own factory) imports as one patch on its file; P37's shape (`if target is
None:` the legacy file) imports with the legacy file for the release that has only it, and the
fall-back said; an entry whose credit says "#N CLOSED unmerged" comes in `closed`, its PR kept.
Bad input: a drift marker (the patch's upstream probe) empty, of whitespace only or over 10 KB
leaves that one entry out with one line naming the problem, nothing of it written, the rest
imported."""

from __future__ import annotations

import shutil
import textwrap
import tomllib
from pathlib import Path

import pytest

from patchset.importers import import_collection
from patchset.importers.model import ImportReport
from patchset.registry import load_registry
from tests.helpers import import_fixtures as fx

CORE = "sndr/engines/vllm/patches/core"

ENTRIES = """\
    "GH": {"title": "helper beside the factory", "env_flag": "GENESIS_ENABLE_GH",
           "default_on": False, "lifecycle": "stable", "credit": "",
           "apply_module": "sndr.engines.vllm.patches.core.gh"},
    "GF": {"title": "new file, else the legacy one", "env_flag": "GENESIS_ENABLE_GF",
           "default_on": False, "lifecycle": "stable", "credit": "",
           "apply_module": "sndr.engines.vllm.patches.core.gf"},
    "GC": {"title": "a vendored fix", "env_flag": "GENESIS_ENABLE_GC",
           "default_on": False, "lifecycle": "stable", "upstream_pr": 45199,
           "credit": "Genesis vendor of vllm PR #45199 (fixes #38551). UPSTREAM STATUS: #45199 CLOSED unmerged 2026-06-11, #38551 still OPEN.",
           "apply_module": "sndr.engines.vllm.patches.core.gc"},
"""

HEADER = """\
from sndr.engines.vllm.detection.guards import resolve_vllm_file
from sndr.kernel import TextPatch, TextPatcher
"""

# PN351's shape: the factory resolves the file; a lint/test helper builds on a path it is given
GH = (
    HEADER
    + """
def _build(target_file):
    return TextPatcher(patch_name="GH", target_file=target_file, marker="Genesis GH",
        sub_patches=[TextPatch(name="gh", anchor="    return z * 2\\n", replacement="    return z * 5\\n", required=True)])


def _make_patcher():
    target = resolve_vllm_file("x.py")
    if target is None:
        return None
    return _build(str(target))


def _make_patcher_for_source(_source, target_file):
    return _build(target_file)


def apply():
    patcher = _make_patcher()
    return "applied", "ok"
"""
)

# P37's shape: the new path first, then `if target is None:` the legacy one
GF = (
    HEADER
    + """
def _make_patcher():
    target = resolve_vllm_file("layers/x.py")
    if target is None:
        target = resolve_vllm_file("x.py")
    if target is None:
        return None
    return TextPatcher(patch_name="GF", target_file=str(target), marker="Genesis GF",
        sub_patches=[TextPatch(name="gf", anchor="import os\\n", replacement="import os\\nimport sys\\n", required=True)])


def apply():
    return "applied", "ok"
"""
)

GC = (
    HEADER
    + """
def _make_patcher():
    target = resolve_vllm_file("x.py")
    if target is None:
        return None
    return TextPatcher(patch_name="GC", target_file=str(target), marker="Genesis GC",
        sub_patches=[TextPatch(name="gc", anchor="    return y\\n", replacement="    return y or 0\\n", required=True)],
        upstream_drift_markers=[DRIFT])


def apply():
    return "applied", "ok"
"""
)


def _checkout(root: Path, drift: str = '"return y or 0  # upstream"') -> Path:
    checkout = fx.genesis(root)
    registry = checkout / "sndr" / "dispatcher" / "registry.py"
    registry.write_text(
        registry.read_text().replace(
            '    "G6": {', textwrap.indent(ENTRIES, "    ").lstrip() + '    "G6": {', 1
        )
    )
    core = checkout / CORE
    (core / "gh.py").write_text(GH)
    (core / "gf.py").write_text(GF)
    (core / "gc.py").write_text(GC.replace("[DRIFT]", f"[{drift}]"))
    fx.commit_all(checkout, "fixtures of issue 36")
    return checkout


def _releases(root: Path) -> list[str]:
    old = fx.release(root / "r0.19.1", "0.19.1")
    new = fx.release(root / "r0.20.0", "0.20.0", {"vllm/layers/x.py": fx.RELEASE_X})
    (new / "vllm" / "x.py").unlink()  # moved to layers/ in 0.20.0
    return [str(old), str(new)]


def _import(tmp_path: Path, **kwargs: str) -> tuple[ImportReport, Path]:
    checkout = _checkout(tmp_path / "g", **kwargs)
    registry = tmp_path / "patches"
    report = import_collection("genesis", checkout, registry, sources=_releases(tmp_path))
    return report, registry


def _toml(registry: Path, name: str) -> dict[str, object]:
    return tomllib.loads((registry / name / "patch.toml").read_text())


def test_genesis_shaped_fixtures_import_as_their_code_reads(tmp_path: Path) -> None:
    report, registry = _import(tmp_path)
    entries = {e.source_id: e for e in report.entries}
    for source_id in ("GH", "GF", "GC"):
        assert entries[source_id].status.startswith("imported"), entries[source_id]
    patches = load_registry(registry)
    # PN351: one patch on its file, the helper not a second patcher
    gh = patches.get("genesis-gh")
    assert gh.targets == ("vllm/x.py",)
    assert not any("helper" in r or "second" in r for r in entries["GH"].reasons)
    # P37: both files, each release's variant on the file that release has (the legacy one
    # before the move), nothing lost
    gf = patches.get("genesis-gf")
    assert set(gf.targets) == {"vllm/layers/x.py", "vllm/x.py"}
    assert entries["GF"].status == "imported" and entries["GF"].reasons == []
    variants = _toml(registry, "genesis-gf")["variants"]
    assert isinstance(variants, list)
    files = {
        str(v["vllm"]): tomllib.loads((registry / "genesis-gf" / str(v["payload"])).read_text())
        for v in variants
    }
    assert {k: [s["file"] for s in v["site"]] for k, v in files.items()} == {
        "<0.20.0": ["vllm/x.py"],
        ">=0.20.0": ["vllm/layers/x.py"],
    }
    # CLOSED unmerged: closed, the PR kept
    up = _toml(registry, "genesis-gc")["upstream"]
    assert isinstance(up, dict)
    assert up["state"] == "closed" and up["pr"] == "vllm-project/vllm#45199", up


@pytest.mark.parametrize(
    ("drift", "words"),
    [
        ('""', "an empty string matches every file"),
        ('"   "', "whitespace only"),
        ('"x" * 11000', "over 10 KB"),
    ],
)
def test_a_bad_drift_marker_leaves_that_entry_out_in_one_line(
    tmp_path: Path, drift: str, words: str
) -> None:
    report, registry = _import(tmp_path, drift=drift)
    gc = next(e for e in report.entries if e.source_id == "GC")
    assert gc.status == "not-imported", gc
    assert len(gc.reasons) == 1 and words in gc.reasons[0] and "\n" not in gc.reasons[0]
    assert len(gc.reasons[0]) < 400
    assert not (registry / "genesis-gc").exists()
    assert {"genesis-gh", "genesis-gf"} <= {p.id for p in load_registry(registry).patches}
    shutil.rmtree(registry)


def test_a_marker_only_a_later_unfixed_release_holds_is_kept_with_a_line(tmp_path: Path) -> None:
    """G1's drift marker is upstream code that came in 0.20.0 while G1's anchor still applies
    there (a fix made another way, as Genesis reads it): not in 0.19.1, the release G1 was
    written against, so the import keeps it and says so; the check reports the disagreement."""
    string = "def forward(x, fixed=True):"
    later = fx.RELEASE_X + f"\n\n{string}\n    return x\n"
    checkout = fx.genesis(tmp_path / "g")
    specs = [
        str(fx.release(tmp_path / "r0.19.1", "0.19.1")),
        str(fx.release(tmp_path / "r0.20.0", "0.20.0", {"vllm/x.py": later})),
    ]
    registry = tmp_path / "patches"
    report = import_collection("genesis", checkout, registry, sources=specs)
    upstream = _toml(registry, "genesis-g1")["upstream"]
    assert isinstance(upstream, dict)
    assert upstream["probe"] == {"file": "vllm/x.py", "any": [string]}
    lines = [n for n in report.notes if "probe string" in n]
    assert lines == [
        f"genesis-g1: kept its upstream probe string {string!r}, though it is in vllm/x.py of"
        " vllm 0.20.0 where the patch still applies and its change is absent: not so in 0.19.1,"
        " the release it was written against, so it may be the fix made another way (the"
        " check says so there, a disagreement)"
    ]
