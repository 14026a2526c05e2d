# ruff: noqa: E501 - the Genesis-shaped modules and entries below are written as such files are
"""Import fidelity: what a collection says of a patch carries over as it says it (PR state,
fallback files, a test helper beside the patcher, ranges), read from small collection-shaped
files written here."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from patchset.importers.genesis import text as genesis_text
from patchset.importers.genesis.registry import metadata
from patchset.importers.genesis.state import pr_state
from patchset.importers.pystatic import Package

HEADER = """\
from sndr.engines.vllm.detection.guards import resolve_vllm_file
from sndr.kernel import TextPatch, TextPatcher
"""


def _patchers(tmp_path: Path, body: str) -> tuple[list[genesis_text.Patcher], list[str]]:
    (tmp_path / "sndr").mkdir(parents=True, exist_ok=True)
    (tmp_path / "sndr" / "m.py").write_text(HEADER + textwrap.dedent(body))
    scope = Package(tmp_path).scope("sndr.m")
    assert scope is not None
    return genesis_text.read_patchers(scope)


def _upstream(entry: dict[str, object]) -> tuple[dict[str, object], list[str]]:
    lost: list[str] = []
    meta = metadata(
        "PN9", {"env_flag": "GENESIS_ENABLE_PN9", **entry}, {"PN9": "genesis-pn9"}, lost, ">=0.0"
    )
    up = meta["upstream"]
    assert isinstance(up, dict)
    return up, lost


def test_a_test_helper_building_the_patcher_on_its_argument_is_not_a_second_patcher(
    tmp_path: Path,
) -> None:
    # PN351's shape: the factory is called by the patch (on the resolved file) and by a
    # lint/test helper on a path it is given; the helper is not the patch.
    patchers, unresolved = _patchers(
        tmp_path,
        """
        def _build(target_file):
            return TextPatcher(patch_name="t", target_file=target_file, marker="T",
                sub_patches=[TextPatch(name="s", anchor="    y = x + 1\\n", replacement="    y = x + 2\\n", required=True)])

        def _make_patcher():
            target = resolve_vllm_file("a.py")
            if target is None:
                return None
            return _build(str(target))

        def _make_patcher_for_source(_source, target_file):
            return _build(target_file)

        def apply():
            return _make_patcher().apply()
        """,
    )
    assert unresolved == []
    assert [p.file for p in patchers] == ["vllm/a.py"]


def test_a_helper_the_module_calls_still_counts(tmp_path: Path) -> None:
    # the same shape, but apply() builds through the helper with a path found at run time:
    # not a test helper, so the patcher is unreadable (said), never silently dropped
    _, unresolved = _patchers(
        tmp_path,
        """
        def _build(target_file):
            return TextPatcher(patch_name="t", target_file=target_file, marker="T",
                sub_patches=[TextPatch(name="s", anchor="a\\n", replacement="b\\n", required=True)])

        def _for(path):
            return _build(path)

        def apply():
            import os
            return _for(os.environ["X"]).apply()
        """,
    )
    assert unresolved and "found at run time" in unresolved[0]


def test_an_if_target_is_none_fallback_is_a_fallback_file(tmp_path: Path) -> None:
    # P37's shape: the new path first, then `if target is None:` the legacy one
    patchers, unresolved = _patchers(
        tmp_path,
        """
        def _make_patcher():
            target = resolve_vllm_file("layers/experts/marlin_moe.py")
            if target is None:
                target = resolve_vllm_file("layers/fused_marlin_moe.py")
            if target is None:
                return None
            return TextPatcher(patch_name="t", target_file=target, marker="T",
                sub_patches=[TextPatch(name="s", anchor="a\\n", replacement="b\\n", required=True)])
        """,
    )
    assert unresolved == []
    assert [(p.file, p.other_files) for p in patchers] == [
        ("vllm/layers/experts/marlin_moe.py", ["vllm/layers/fused_marlin_moe.py"])
    ]
    meta: dict[str, object] = {"upstream": {}}
    lost: list[str] = []
    genesis_text.runtime_patch("genesis-t", "T", patchers, meta, lost)
    assert any("falls back to vllm/layers/fused_marlin_moe.py" in line for line in lost)


def test_closed_unmerged_in_the_credit_is_closed() -> None:
    up, lost = _upstream(
        {
            "upstream_pr": 45199,
            "credit": "Genesis vendor of vllm PR #45199 (fixes #38551). UPSTREAM STATUS: #45199 CLOSED unmerged 2026-06-11, #38551 still OPEN. Self-skips on #45199's merged form.",
        }
    )
    assert up["state"] == "closed"
    assert up["pr"] == "vllm-project/vllm#45199"
    assert "#45199 CLOSED" in str(up["note"])
    assert lost == []


def test_merged_with_its_commit() -> None:
    up, _ = _upstream(
        {
            "upstream_pr": 42739,
            "credit": "Backport of vllm#42739 (OPEN 2026-05-15).",
            "superseded_by": "vllm#42739 (merged 2026-05-23, commit d19db10974587335ec3a37e0a424abb57430574e)",
        }
    )
    assert up["state"] == "merged"
    assert up["commit"] == "d19db10974587335ec3a37e0a424abb57430574e"


def test_superseded_by_another_merged_pr() -> None:
    up, _ = _upstream(
        {
            "upstream_pr": 44113,
            "title": "a fix (vendor of CLOSED vllm#44113; superseded by MERGED vllm#44735 on dev491+)",
        }
    )
    assert up["state"] == "superseded"
    assert up["superseded_by"] == "vllm-project/vllm#44735"


@pytest.mark.parametrize("relationship", ["counter_regression", "intentional_inverse"])
def test_a_relationship_is_kept_and_said(relationship: str) -> None:
    lost: list[str] = []
    meta = metadata(
        "P98",
        {
            "env_flag": "GENESIS_ENABLE_P98",
            "upstream_pr": 40941,
            "upstream_pr_relationship": relationship,
            "credit": "Reverts upstream PR #40941 (MERGED 2026-04-27).",
        },
        {"P98": "genesis-p98"},
        lost,
        ">=0.0",
    )
    up, x = meta["upstream"], meta["x"]
    assert isinstance(up, dict) and isinstance(x, dict)
    assert up["state"] == "merged"
    assert x["upstream_pr_relationship"] == relationship
    assert "not its fix" in str(up["note"])


@pytest.mark.parametrize(
    "credit",
    [
        "vllm#41000 (MERGED 2026-05-01) and vllm#41000 (CLOSED 2026-05-02)",
        "#41000 MERGED; see also #41001 CLOSED, #41002 (OPEN), PR #41003 was CLOSED",
        "#41000 (" * 50 + "merged",
        "#41000" * 200,
        "",
    ],
)
def test_a_credit_naming_several_prs_or_states_is_one_reading_or_a_line(credit: str) -> None:
    read = pr_state({"credit": credit}, 41000)
    assert read.state in ("open", "merged", "closed")
    if read.state == "open" and "MERGED" in credit and "CLOSED" in credit and "41001" not in credit:
        assert read.problem and "both merged" in read.problem
    if "41001" in credit:
        assert read.state == "merged" and read.problem is None  # the others' states are theirs


def test_a_range_given_twice_keeps_both_bounds() -> None:
    # PN110 in the successor: applies_to's pair and a top-level string
    lost: list[str] = []
    meta = metadata(
        "PN110",
        {
            "env_flag": "GENESIS_ENABLE_PN110",
            "applies_to": {"vllm_version_range": (">=0.20.0", "<0.23.0")},
            "vllm_version_range": "<0.23.0",
        },
        {"PN110": "genesis-pn110"},
        lost,
        ">=0.0",
    )
    assert meta["vllm"] == ">=0.20.0,<0.23.0"
    meta = metadata(
        "PN110",
        {"env_flag": "GENESIS_ENABLE_PN110", "vllm_version_range": (">=0.21.0", None)},
        {"PN110": "genesis-pn110"},
        lost,
        ">=0.0",
    )
    assert meta["vllm"] == ">=0.21.0"


# -- again, on a newer checkout; and a dry run -------------------------------------------


def test_reimport_tells_no_longer_importable_from_removed(tmp_path: Path) -> None:
    from patchset.importers import import_collection
    from tests.helpers import import_fixtures as fx

    checkout = fx.genesis(tmp_path / "g")
    registry = tmp_path / "patches"
    import_collection("genesis", checkout, registry)
    good = (registry / "genesis-g1" / "sites.toml").read_text()
    source = checkout / "sndr/dispatcher/registry.py"
    text = source.read_text()
    # G2 leaves the collection; G1's module now builds its text at run time
    source.write_text(text[: text.index('    "G2": {')] + text[text.index('    "G3": {') :])
    g1 = checkout / "sndr/engines/vllm/patches/core/g1.py"
    g1.write_text(
        g1.read_text().replace(
            "target_file=str(target)", 'target_file=__import__("os").environ["T"]'
        )
    )
    again = import_collection("genesis", checkout, registry)
    by_source = {e.source_id: e for e in again.entries}
    assert by_source["G2"].action == "removed"
    assert by_source["G2"].reasons == ["no longer in the collection (kept)"]
    g1_entry = by_source["G1"]
    assert [e.source_id for e in again.entries].count("G1") == 1  # one line, not also "removed"
    assert (g1_entry.status, g1_entry.action, g1_entry.patch) == (
        "not-imported",
        "kept",
        "genesis-g1",
    )
    assert g1_entry.reasons[0].startswith("no longer importable (")
    assert "found at run time" in g1_entry.reasons[0]
    assert "last good version (revision 1) is kept" in g1_entry.reasons[0]
    assert (registry / "genesis-g1" / "sites.toml").read_text() == good


def test_a_dry_run_runs_every_check_the_import_runs(tmp_path: Path) -> None:
    from patchset.importers import import_collection
    from tests.helpers import import_fixtures as fx

    checkout = fx.genesis(tmp_path / "g")
    registry = tmp_path / "p" / "patches"
    dry = import_collection("genesis", checkout, registry, dry_run=True)
    assert not registry.exists()
    real = import_collection("genesis", checkout, registry)
    would = {"added": "would-add", "updated": "would-update"}
    assert [
        (e.source_id, e.status, would.get(e.action, e.action), e.reasons) for e in real.entries
    ] == [(e.source_id, e.status, e.action, e.reasons) for e in dry.entries]
    # G5 imports a module no support package provides: refused by both, not "would-add"
    g5 = next(e for e in dry.entries if e.source_id == "G5")
    assert (g5.status, g5.action) == ("not-imported", "none")
    assert g5.reasons[0].startswith("validate refuses it")
    assert str(tmp_path) in g5.reasons[0] and ".patchset-dry-run-" not in g5.reasons[0]


def test_a_club_range_the_collection_does_not_state_comes_from_evidence(tmp_path: Path) -> None:
    from patchset.importers import club
    from tests.helpers import import_fixtures as fx

    checkout = fx.club(tmp_path / "c")
    fx.club_backport(checkout)
    helper_gone = fx.RELEASE_X.split("def helper")[0]
    fixed = fx.RELEASE_X.replace("return z * 2", "return z * 5")
    releases = [
        fx.release(tmp_path / "r0.19.1", "0.19.1", {"vllm/x.py": helper_gone}),
        fx.release(tmp_path / "r0.20.0", "0.20.0"),
        fx.release(tmp_path / "r0.20.1", "0.20.1"),
        fx.release(tmp_path / "r0.21.0", "0.21.0", {"vllm/x.py": fixed}),  # merged upstream
    ]
    from patchset.sources import parse_source

    collected = club.collect(checkout, sources=[parse_source(str(r)) for r in releases])
    draft = next(d for d in collected.drafts if d.source_id == "m-backport")
    assert draft.meta["vllm"] == ">=0.20.0,<0.21.0"  # not ">=0.0"
    x = draft.meta["x"]
    assert isinstance(x, dict)
    assert x["range_from"] == (
        "the releases it applies to (0.19.1..0.21.0 checked): 0.20.0..0.20.1"
    )
    assert draft.meta["upstream"] == {
        "pr": "vllm-project/vllm#555",
        "state": "open",
        "note": "club-3090 status local-vendored; the PR's state is not given: open assumed",
    }


def test_a_one_line_anchor_is_widened_until_unique_on_every_release_in_range(
    tmp_path: Path,
) -> None:
    # pr48375's shape: the script's edit read on the pinned release, where its line is
    # unique; a later release of the range holds that line twice
    import tomllib

    from patchset.importers import club
    from patchset.sources import parse_source
    from tests.helpers import import_fixtures as fx

    checkout = fx.club(tmp_path / "c")
    twice = fx.RELEASE_X + "\n\ndef other(z):\n    return z * 2\n"
    sources = [
        parse_source(str(fx.release(tmp_path / "r19", "0.19.1"))),
        parse_source(str(fx.release(tmp_path / "r20", "0.20.0"))),
        parse_source(str(fx.release(tmp_path / "r21", "0.21.0", {"vllm/x.py": twice}))),
    ]
    collected = club.collect(checkout, sources=sources, run_scripts=True, timeout=30)
    draft = next(d for d in collected.drafts if d.source_id == "m-anchor")
    assert draft.meta["vllm"] == ">=0.20.0"
    sites = tomllib.loads(draft.payloads["sites.toml"])["site"]
    assert [(s["action"], s["anchor"], s["text"]) for s in sites] == [
        ("replace", "def helper(z):\n    return z * 2", "def helper(z):\n    return z * 4")
    ]
    assert "site x-1: its 1-line anchor is not unique on 0.21.0: widened to 2 lines" in draft.lost
    # and it applies on both releases of its range
    import patchset
    from patchset.registry import load_registry
    from patchset.registry.write import write_patch_folder

    registry = tmp_path / "patches"
    write_patch_folder(registry / draft.id, draft.meta, draft.payloads)
    for version, folder in (("0.20.0", "r20"), ("0.21.0", "r21")):
        report = patchset.check(
            load_registry(registry),
            [version],
            source=parse_source(str(tmp_path / folder)),
            use_memo=False,
        )
        assert report.result(version, draft.id).verdict == "needed", version


def test_genesis_switch_aliases_become_the_switch_aliases() -> None:
    # P64's shape: the merged entry keeps the enable flags of the patches it absorbed, so the
    # start maps a compose file's old names onto this switch instead of calling them unknown.
    lost: list[str] = []
    entry: dict[str, object] = {
        "env_flag": "GENESIS_ENABLE_P64",
        "env_flag_aliases": ["GENESIS_ENABLE_P61C", "GENESIS_ENABLE_P64", "not a name"],
    }
    meta = metadata("P64", entry, {"P64": "genesis-p64"}, lost, ">=0.0")
    assert meta["switch"] == {
        "env": "GENESIS_ENABLE_P64",
        "default": False,
        "aliases": ["GENESIS_ENABLE_P61C"],
    }
    assert [line for line in lost if "env_flag_aliases" in line], lost
