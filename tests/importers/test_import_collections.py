"""`patchset import genesis|club-3090`: small collections in their shapes, built here."""

from __future__ import annotations

import json
import os
import tomllib
from pathlib import Path

import pytest

from patchset.importers import club, genesis, import_collection
from patchset.importers.club import meta as club_meta
from patchset.importers.model import Collected, Draft
from patchset.registry.write import toml_text
from patchset.sources import parse_source
from tests.helpers import import_fixtures as fx
from tests.helpers.cli import cli


def _draft(collected: Collected, source_id: str) -> Draft:
    return next(d for d in collected.drafts if d.source_id == source_id)


def _at(data: object, *keys: str) -> object:
    """`data[k1][k2]...` of nested dicts (patch.toml data)."""
    for key in keys:
        assert isinstance(data, dict), data
        data = data[key]
    return data


# -- Genesis, read statically -----------------------------------------------------------


def test_genesis_text_patch_becomes_sites_in_order(tmp_path: Path) -> None:
    collected = genesis.collect(fx.genesis(tmp_path / "g"))
    draft = _draft(collected, "G1")
    meta = draft.meta
    assert meta["kind"] == "runtime"
    assert meta["targets"] == ["vllm/x.py"]
    assert meta["vllm"] == ">=0.19.0,<0.30.0"
    assert meta["switch"] == {"env": "GENESIS_ENABLE_G1", "default": False}
    assert meta["applies"] == {
        "all": [{"architecture": ["Qwen3NextForCausalLM"]}, {"kv_cache_family": "turboquant"}]
    }
    assert meta["requires_modules"] == ["sndr.engines.vllm.middleware"]
    assert _at(meta, "upstream", "pr") == "vllm-project/vllm#12345"
    assert _at(meta, "upstream", "probe") == {
        "file": "vllm/x.py",
        "any": ["def forward(x, fixed=True):"],
    }
    assert meta["lifecycle"] == {"state": "experimental"}
    assert _at(meta, "provenance", "file") == "sndr/engines/vllm/patches/core/g1.py"
    assert len(str(_at(meta, "provenance", "commit"))) == 40
    sites = tomllib.loads(draft.payloads["sites.toml"])["site"]
    assert [s["name"] for s in sites] == ["g1_forward", "g1_gone"]
    assert [s["optional"] for s in sites] == [False, True]
    assert sites[0]["text"].endswith("    y = x + 2\n")  # an f-string of module constants
    assert sites[0]["marker"] == "Genesis G1 Genesis G1 forward v1 :: x.py :: g1_forward"
    assert sites[0]["probe"] == {"any": ["y = x + 1  # upstream"]}  # its own upstream marker
    assert _at(meta, "x", "composes_with") == ["genesis-g2"]
    assert collected.supports and collected.supports[0].name == "sndr"


def test_genesis_wiring_becomes_a_python_patch(tmp_path: Path) -> None:
    collected = genesis.collect(fx.genesis(tmp_path / "g"))
    draft = _draft(collected, "G2")
    assert draft.meta["kind"] == "python"
    assert draft.meta["touches"] == ["vllm.y:Thing.run"]
    assert draft.meta["targets"] == ["vllm/y.py"]
    assert draft.meta["lifecycle"] == {"state": "deprecated"}
    assert draft.meta["requires_modules"] == ["sndr.engines.vllm.patches.core.g2"]
    assert "importlib.import_module(MODULE).apply()" in draft.payloads["plugin.py"]
    compile(draft.payloads["plugin.py"], "plugin.py", "exec")
    # G2 conflicts with G1, which is imported
    assert draft.meta["conflicts"] == ["genesis-g1"]
    reasons = {e.source_id: e.reasons[0] for e in collected.entries}
    assert reasons["G3"] == "no apply_module: nothing to apply"
    assert "does not parse" in reasons["G4"]


def test_genesis_cli_dry_run_writes_nothing_and_names_the_broken_file(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    project = tmp_path / "p"
    project.mkdir()
    result = cli("import", "genesis", checkout, "--dry-run", "--format", "json", cwd=project)
    assert result.code == 1, result.err  # a module that does not parse: named, exit 1
    data = json.loads(result.out)
    assert data["unparsed"] == {
        "sndr/engines/vllm/patches/core/g4.py": data["unparsed"][
            "sndr/engines/vllm/patches/core/g4.py"
        ]
    }
    assert {e["source"]: e["action"] for e in data["entries"]}["G1"] == "would-add"
    assert not (project / "patches").exists()


def test_not_a_collection_is_one_line_exit_2(tmp_path: Path) -> None:
    for name in ("genesis", "club-3090"):
        result = cli("import", name, tmp_path, cwd=tmp_path)
        assert result.code == 2
        assert result.err.count("\n") == 1 and "looked for" in result.err


def test_only_selects_by_either_id(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    assert [d.id for d in genesis.collect(checkout, only={"G2"}).drafts] == ["genesis-g2"]
    assert [d.id for d in genesis.collect(checkout, only={"genesis-g1"}).drafts] == ["genesis-g1"]


def test_toml_writer_round_trips_any_text() -> None:
    text = 'a "quoted" \\ back\tslash\r\n"""\n\x01end'
    data = {"k": text, "t": {"n": 1, "b": True}, "site": [{"s": "x\ny"}, {"s": ""}]}
    assert tomllib.loads(toml_text(data)) == data


# -- club-3090 --------------------------------------------------------------------------


def _club(tmp_path: Path, *, run_scripts: bool = False, script: str | None = None) -> Collected:
    checkout = fx.club(tmp_path / "c")
    if script is not None:
        (checkout / "models/m1/vllm/patches/anchor/patch_x.py").write_text(script)
    sources = [
        parse_source(str(fx.release(tmp_path / "r19", "0.19.1"))),
        parse_source(str(fx.release(tmp_path / "r20", "0.20.0"))),
    ]
    return club.collect(checkout, sources=sources, run_scripts=run_scripts, timeout=5)


def test_club_anchor_script_runs_in_a_scratch_copy(tmp_path: Path) -> None:
    collected = _club(tmp_path, run_scripts=True)
    draft = _draft(collected, "m-anchor")
    assert draft.meta["kind"] == "runtime"
    assert draft.meta["vllm"] == ">=0.20.0"  # the release its compose pins
    sites = tomllib.loads(draft.payloads["sites.toml"])["site"]
    assert [(s["anchor"], s["text"]) for s in sites] == [
        ("    return z * 2", "    return z * 4")  # one line: it is unique
    ]
    assert _at(draft.meta, "upstream", "probe") == {
        "file": "vllm/x.py",
        "any": ["return z * 2  # fixed upstream"],
    }
    assert collected.ran == ["m-anchor: patch_x.py"]  # said in the summary
    # the release folders were never written
    assert (tmp_path / "r20" / "vllm" / "x.py").read_text() == fx.RELEASE_X


@pytest.mark.parametrize(
    ("script", "why"),
    [
        ("while True:\n    pass\n", "refused: patch_x.py hung: stopped after 5 s"),
        ("import sys\nsys.exit('no anchor')\n", "the script fits no release it targets"),
    ],
)
def test_club_anchor_script_refused(tmp_path: Path, script: str, why: str) -> None:
    script = "T = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'\n" + script
    collected = _club(tmp_path, run_scripts=True, script=script)
    entry = next(e for e in collected.entries if e.source_id == "m-anchor")
    assert entry.status == "not-imported" and entry.reasons[0].startswith(why), entry.reasons


def test_club_anchor_script_writing_outside_is_refused(tmp_path: Path) -> None:
    outside = tmp_path / "outside.txt"
    outside.write_text("before\n")
    script = (
        "T = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'\n"
        f"open({str(outside)!r}, 'w').write('after')\n"
    )
    collected = _club(tmp_path, run_scripts=True, script=script)
    entry = next(e for e in collected.entries if e.source_id == "m-anchor")
    assert entry.reasons == [f"refused: patch_x.py wrote outside its scratch tree: {outside}"]


@pytest.mark.parametrize(
    "write",
    [
        "open(UP + OUTSIDE.lstrip('/'), 'w').write('after')",  # relative to its working folder
        "import os; os.replace('x.tmp' if open('x.tmp', 'w') else '', UP + OUTSIDE.lstrip('/'))",
        "import os; os.symlink(OUTSIDE, 'link'); open('link', 'w').write('after')",
        "import shutil; shutil.copyfile(__file__, UP + OUTSIDE.lstrip('/'))",
    ],
)
def test_club_anchor_script_relative_write_outside_is_refused(tmp_path: Path, write: str) -> None:
    """A write the script names by a relative path (or through a symlink it makes) is
    caught by the sandbox's audit hook, refused before it happens, and named."""
    outside = tmp_path / "outside.txt"
    outside.write_text("before\n")
    script = (
        "T = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'\n"
        "UP = '../' * 40\n"
        f"OUTSIDE = {str(outside)[1:]!r}.join(['/', ''])\n"  # not an absolute path literal
        f"{write}\n"
    )
    collected = _club(tmp_path, run_scripts=True, script=script)
    entry = next(e for e in collected.entries if e.source_id == "m-anchor")
    assert entry.reasons == [f"refused: patch_x.py wrote outside its scratch tree: {outside}"]
    assert outside.read_text() == "before\n"  # refused before it happened


def test_club_anchor_script_starting_a_process_is_refused(tmp_path: Path) -> None:
    script = (
        "T = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'\n"
        "import subprocess\nsubprocess.run(['true'])\n"
    )
    collected = _club(tmp_path, run_scripts=True, script=script)
    entry = next(e for e in collected.entries if e.source_id == "m-anchor")
    assert entry.reasons == ["refused: patch_x.py started a process (subprocess.Popen): refused"], (
        entry.reasons
    )


def test_club_forms(tmp_path: Path) -> None:
    collected = _club(tmp_path)
    diff = _draft(collected, "m-vllm-pr111-diff")
    assert diff.meta["kind"] == "diff"
    assert diff.meta["targets"] == ["vllm/x.py", "vllm/helper_mod.py"]
    assert "--- /dev/null\n+++ b/vllm/helper_mod.py" in diff.payloads["patch.diff"]
    assert diff.meta["base"] == "0.20.0"
    assert diff.meta["upstream"] == {"state": "open", "pr": "vllm-project/vllm#111"}
    assert _at(diff.meta, "x", "drop_when") == "upstream ships #111"
    assert _at(diff.meta, "x", "drift_guard") == {"check": "grep z * 3", "on_fail": "re-vendor"}
    overlay = _draft(collected, "m-overlay")
    assert overlay.meta["base"] == "0.20.0"  # both releases hold the same x.py: the newest
    assert "+    y = x + 10" in overlay.payloads["patch.diff"]
    hook = _draft(collected, "m-hook")
    assert hook.meta["kind"] == "python"
    assert str(_at(hook.meta, "touches")).startswith("['vllm.y:")
    reasons = {e.source_id: (e.status, e.reasons[0]) for e in collected.entries}
    assert reasons["m-same"] == ("not-imported", "identical to vLLM 0.20.0: nothing to import")
    assert reasons["m-anchor"][1].startswith("an anchor script (the collection's code)")
    assert reasons["m-template"] == ("out-of-scope", "a chat template")
    assert reasons["genesis-p1"][0] == "out-of-scope"
    plan = next(p for p in collected.plans if p.name == "club-m1-0.20.0.toml")
    assert plan.vllm == "0.20.0" and plan.wanted == ("club-m-overlay",)  # what the compose mounts
    assert plan.data["cuda"] == "cu129"
    assert plan.data["serve"] == {"args": ["--model", "m1-weights"]}


def test_club_unknown_layout(tmp_path: Path) -> None:
    checkout = fx.club(tmp_path / "c")
    (checkout / club_meta.PATCHES_YML).write_text("schema_version: 7\npatches: []\n")
    result = cli("import", "club-3090", checkout, cwd=tmp_path)
    assert result.code == 2 and "unknown layout" in result.err


# -- landing ---------------------------------------------------------------------------


def test_genesis_import_validates_applies_and_updates(tmp_path: Path) -> None:
    import patchset
    from patchset.registry import load_registry

    checkout = fx.genesis(tmp_path / "g")
    registry = tmp_path / "p" / "patches"
    report = import_collection("genesis", checkout, registry)
    assert report.exit_code == 1  # g4.py does not parse
    assert {e.source_id: e.action for e in report.entries}["G1"] == "added"
    assert cli("validate", "--registry", registry).code == 0
    assert (
        registry / "_support" / "sndr" / "src" / "sndr" / "engines" / "vllm" / "middleware.py"
    ).is_file()
    target = fx.release(tmp_path / "tree", "0.20.0")
    os.environ["GENESIS_ENABLE_G1"] = "1"  # the switch (default off) turned on
    try:
        applied = patchset.apply(
            load_registry(registry), target, patches=["genesis-g1"], served=None, force=True
        )
    finally:
        del os.environ["GENESIS_ENABLE_G1"]
    assert "    y = x + 2" in (target / "vllm" / "x.py").read_text(), applied.to_dict()
    # an edit of the user's, then a newer checkout
    toml = registry / "genesis-g1" / "patch.toml"
    toml.write_text(
        toml.read_text().replace('title = "Genesis G1: forward adds two"', 'title = "mine"')
    )
    g1 = checkout / "sndr/engines/vllm/patches/core/g1.py"
    g1.write_text(g1.read_text().replace("y = x + 2", "y = x + 3"))
    fx.commit_all(checkout, "newer")
    again = import_collection("genesis", checkout, registry)
    entry = {e.source_id: e for e in again.entries}["G1"]
    assert entry.action == "updated" and entry.kept == ["title"]
    data = tomllib.loads(toml.read_text())
    assert data["revision"] == 2 and data["title"] == "mine"
    assert "y = x + 3" in (registry / "genesis-g1" / "sites.toml").read_text()
    assert {e.source_id: e.action for e in again.entries}["G2"] == "unchanged"
    reasons = {e.source_id: e.reasons for e in again.entries}
    assert reasons["G5"][0].startswith("validate refuses it:") and "nosuchpkg" in reasons["G5"][0]
    g6 = tomllib.loads((registry / "genesis-g6" / "patch.toml").read_text())
    assert g6["switch"]["env"] == "GENESIS_ENABLE_G1__G6"  # its own: one variable per patch
    assert "GENESIS_ENABLE_G1" in reasons["G6"][0]


def test_id_clash_with_the_projects_own_patch_is_refused(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    own = registry / "genesis-g2"
    own.mkdir(parents=True)
    (own / "patch.toml").write_text('id = "genesis-g2"\n')
    report = import_collection("genesis", fx.genesis(tmp_path / "g"), registry, dry_run=True)
    entry = {e.source_id: e for e in report.entries}["G2"]
    assert entry.status == "not-imported" and "id clash" in entry.reasons[0]


def test_id_clash_refused_in_a_dry_run(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    own = registry / "genesis-g2"
    own.mkdir(parents=True)
    (own / "patch.toml").write_text('id = "genesis-g2"\n')
    report = import_collection("genesis", fx.genesis(tmp_path / "g"), registry, dry_run=True)
    entry = {e.source_id: e for e in report.entries}["G2"]
    assert entry.status == "not-imported" and "id clash" in entry.reasons[0]
    assert (own / "patch.toml").read_text() == 'id = "genesis-g2"\n'


# -- the real collections, opt in -------------------------------------------------------


@pytest.mark.collections
@pytest.mark.skipif(not os.environ.get("PATCHSET_GENESIS_DIR"), reason="PATCHSET_GENESIS_DIR unset")
def test_real_genesis(tmp_path: Path) -> None:
    report = import_collection(
        "genesis", os.environ["PATCHSET_GENESIS_DIR"], tmp_path / "patches", dry_run=True
    )
    assert report.count("imported", "imported-with-loss") >= 250
    assert report.seconds < 20


@pytest.mark.collections
@pytest.mark.skipif(
    not os.environ.get("PATCHSET_CLUB3090_DIR"), reason="PATCHSET_CLUB3090_DIR unset"
)
def test_real_club(tmp_path: Path) -> None:
    report = import_collection(
        "club-3090", os.environ["PATCHSET_CLUB3090_DIR"], tmp_path / "patches", dry_run=True
    )
    assert report.count("imported", "imported-with-loss") >= 10


@pytest.mark.collections
@pytest.mark.skipif(
    not os.environ.get("PATCHSET_CLUB3090_DIR"), reason="PATCHSET_CLUB3090_DIR unset"
)
def test_real_club_scripts_run_in_the_sandbox(tmp_path: Path) -> None:
    """The club's own anchor scripts, run under the sandbox's audit hook (releases from the
    package index): none is refused, and what they edit becomes patches."""
    report = import_collection(
        "club-3090",
        os.environ["PATCHSET_CLUB3090_DIR"],
        tmp_path / "patches",
        dry_run=True,
        run_scripts=True,
    )
    assert len(report.ran) >= 5, report.ran
    refused = [r for e in report.entries for r in e.reasons if r.startswith("refused:")]
    assert not refused, refused
    scripted = [e for e in report.entries if e.status.startswith("imported") and e.patch]
    assert len({e.source_id for e in scripted}) >= 15


def test_club_import_validates_and_applies(tmp_path: Path) -> None:
    import patchset
    from patchset.registry import load_registry

    checkout = fx.club(tmp_path / "c")
    specs = [str(fx.release(tmp_path / f"r{v}", v)) for v in ("0.19.1", "0.20.0")]
    registry, builds = tmp_path / "p" / "patches", tmp_path / "p" / "builds"
    report = import_collection(
        "club-3090", checkout, registry, sources=specs, builds=builds, run_scripts=True
    )
    actions = {e.source_id: e.action for e in report.entries}
    assert actions["m-vllm-pr111-diff"] == actions["m-anchor"] == actions["m-hook"] == "added"
    assert cli("validate", "--registry", registry).code == 0
    assert (builds / "club-m1-0.20.0.toml").is_file()
    target = fx.release(tmp_path / "tree", "0.20.0")
    patchset.apply(load_registry(registry), target, patches=["club-m-vllm-pr111-diff"])
    assert "    return z * 3" in (target / "vllm" / "x.py").read_text()
    assert (target / "vllm" / "helper_mod.py").read_text() == "HELP = 1\n"
    again = import_collection("club-3090", checkout, registry, sources=specs, run_scripts=True)
    assert {e.action for e in again.entries if e.patch} == {"unchanged"}


def test_reimport_reports_a_removed_patch_and_keeps_it(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    registry = tmp_path / "patches"
    import_collection("genesis", checkout, registry)
    source = checkout / "sndr/dispatcher/registry.py"
    text = source.read_text()
    start = text.index('    "G2": {')
    source.write_text(text[:start] + text[text.index('    "G3": {') :])
    fx.commit_all(checkout, "G2 gone")
    again = import_collection("genesis", checkout, registry)
    removed = [e for e in again.entries if e.action == "removed"]
    assert [(e.source_id, e.patch) for e in removed] == [("G2", "genesis-g2")]
    assert (registry / "genesis-g2" / "patch.toml").is_file()  # kept: the user decides
