"""The build definitions an import writes: every one exports (`patchset runtime export`) on
its release; a nightly pin is named, never mapped to a release; alternatives are never
listed together; a patch that does not fit is left out and said."""

from __future__ import annotations

import os
import tomllib
from pathlib import Path

import pytest

from patchset.importers import import_collection
from tests.helpers import import_fixtures as fx
from tests.helpers.cli import cli


def _exports(project: Path, names: list[str], release: Path) -> None:
    """`runtime export` of each written definition, on the release it names."""
    assert names
    for name in names:
        out = project / "rt" / name.removesuffix(".toml")
        result = cli(
            "runtime",
            "export",
            out,
            "--build",
            project / "builds" / name,
            "--registry",
            project / "patches",
            "--source",
            release,
            cwd=project,
        )
        assert result.code == 0, (name, result.err)
        assert (out / "manifest.json").is_file()


def test_genesis_definitions_per_final_pin_export(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    fx.genesis_pins(
        checkout,
        ("0.20.1rc1.dev16+g7a1eb8ac2", "0.20.0", "nightly-7a1eb8ac2f00", "0.21.0rc1", "0.22.0"),
        stable="v0.20.0",
    )
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    project = tmp_path / "p"
    report = import_collection(
        "genesis",
        checkout,
        project / "patches",
        builds=project / "builds",
        sources=[str(release)],
    )
    assert report.builds == ["genesis-0.20.0.toml"]  # the final release, once
    nightly = [n for n in report.notes if "7a1eb8ac2" in n]
    assert len(nightly) == 1  # its two spellings on one line
    assert "nightly-7a1eb8ac2f00" in nightly[0] and "no definition written" in nightly[0]
    assert "--source git:PATH@7a1eb8ac2" in nightly[0] and "--source image:" in nightly[0]
    assert any("0.21.0rc1" in n and "pre-release" in n for n in report.notes)
    # a final release the source lacks: said, not written
    assert (
        "builds/genesis-0.22.0.toml: vLLM 0.22.0 is not a release the source has: not written"
        in report.notes
    )
    assert not any(
        "0.23.1" in n and "definition" in n and "genesis-0.23" in n for n in report.notes
    )
    data = tomllib.loads((project / "builds" / "genesis-0.20.0.toml").read_text())
    assert data["vllm"] == "0.20.0" and data["base"] == "vllm/vllm-openai:v0.20.0"
    # G2 is on by default; G1 (which G2 conflicts with) is gated on a model no serve
    # argument names: G2 listed, G1 left out and said
    assert "genesis-g2" in data["patches"] and "genesis-g1" not in data["patches"]
    assert any("genesis-g1 (applies = " in n for n in report.notes), report.notes
    _exports(project, report.builds, release)


def test_genesis_nightly_only_pins_write_no_definition(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    fx.genesis_pins(checkout, ("0.20.2rc1.dev93+g51f22dcfd",))
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    project = tmp_path / "p"
    report = import_collection(
        "genesis", checkout, project / "patches", builds=project / "builds", sources=[str(release)]
    )
    assert report.builds == []
    assert not (project / "builds").exists()  # 0.20.0 is no pin of Genesis: never mapped to it
    assert any("51f22dcfd" in n and "nightly" in n for n in report.notes)


def test_club_definitions_per_compose_set_export(tmp_path: Path) -> None:
    checkout = fx.club(tmp_path / "c")
    fx.club_alternative_compose(checkout)
    releases = [fx.release(tmp_path / f"r{v}", v) for v in ("0.19.1", "0.20.0")]
    project = tmp_path / "p"
    report = import_collection(
        "club-3090",
        checkout,
        project / "patches",
        builds=project / "builds",
        sources=[str(r) for r in releases],
        run_scripts=True,
    )
    # two composes at 0.20.0 mount different sets: two definitions, never one listing both
    assert sorted(report.builds) == [
        "club-m1-0.20.0-dual-b.toml",
        "club-m1-0.20.0-single-a.toml",
    ], (report.builds, report.notes)
    first = tomllib.loads((project / "builds" / "club-m1-0.20.0-single-a.toml").read_text())
    second = tomllib.loads((project / "builds" / "club-m1-0.20.0-dual-b.toml").read_text())
    assert first["patches"] == ["club-m-overlay"]
    # the hook's touches (read from the module it waits for) name no attribute of the
    # release: it does not fit, so it is left out, and said
    assert second["patches"] == ["club-m-vllm-pr111-diff"]
    assert any("dual-b.toml: left out 1: club-m-hook (missing-target" in n for n in report.notes)
    assert second["serve"] == {"args": ["--model", "m1-other"]}
    # the overlay is written against 0.20.0 (its range >=0.20.0): at 0.19.1 it does not fit
    assert not (project / "builds" / "club-m1-0.19.1.toml").exists()
    assert any("club-m1-0.19.1.toml" in n and "club-m-overlay" in n for n in report.notes)
    _exports(project, report.builds, releases[1])


def test_a_dry_run_names_the_definitions_and_writes_none(tmp_path: Path) -> None:
    checkout = fx.club(tmp_path / "c")
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    project = tmp_path / "p"
    report = import_collection(
        "club-3090",
        checkout,
        project / "patches",
        builds=project / "builds",
        sources=[str(release)],
        dry_run=True,
    )
    assert report.builds == ["club-m1-0.20.0.toml"]
    assert not project.exists()


@pytest.mark.collections
@pytest.mark.network  # Genesis's releases from the package index (cached)
@pytest.mark.skipif(
    not (os.environ.get("PATCHSET_GENESIS_DIR") and os.environ.get("PATCHSET_CLUB3090_DIR")),
    reason="PATCHSET_GENESIS_DIR or PATCHSET_CLUB3090_DIR unset",
)
def test_real_collections_definitions_export(tmp_path: Path) -> None:
    """Both real checkouts imported (releases from the package index): every definition
    written exports on its release; Genesis's nightly pins are named, not written."""
    for name, variable, options in (
        ("genesis", "PATCHSET_GENESIS_DIR", {"sources": ["index"]}),
        ("club-3090", "PATCHSET_CLUB3090_DIR", {"run_scripts": True}),
    ):
        project = tmp_path / name
        report = import_collection(
            name,
            os.environ[variable],
            project / "patches",
            builds=project / "builds",
            **options,
        )
        if name == "genesis":
            assert any("a nightly build" in n for n in report.notes)
            assert all(b.startswith("genesis-") for b in report.builds)
        for build in report.builds:
            out = project / "rt" / build.removesuffix(".toml")
            result = cli(
                "runtime",
                "export",
                out,
                "--build",
                project / "builds" / build,
                "--registry",
                project / "patches",
                cwd=project,
            )
            assert result.code == 0, (build, result.err)
        assert report.builds, name


def _runtime(
    registry: Path, pid: str, new: str, *, on: bool, conflicts: tuple[str, ...] = ()
) -> None:
    from patchset.registry.write import toml_text, write_patch_folder

    meta: dict[str, object] = {
        "id": pid,
        "title": pid,
        "description": "a test patch\n",
        "kind": "runtime",
        "revision": 1,
        "vllm": ">=0.19.0",
        "apply": "startup",
        "targets": ["vllm/x.py"],
        "origin": "here",
        "credit": ["t"],
        **({"conflicts": list(conflicts)} if conflicts else {}),
        "switch": {"env": f"T_{pid.upper().replace('-', '_')}", "default": on},
        "upstream": {"state": "unsubmitted"},
    }
    site = {
        "name": "s",
        "file": "vllm/x.py",
        "action": "replace",
        "marker": f"{pid} s",
        "anchor": "    y = x + 1",
        "text": f"    {new}",
    }
    write_patch_folder(registry / pid, meta, {"sites.toml": toml_text({"site": [site]})})


def test_a_plan_lists_what_stacks_and_says_what_it_leaves_out(tmp_path: Path) -> None:
    """Two patches changing the same line: the preferred (first wanted) one is listed, the
    other left out as it would not apply on top; a conflict declared is honoured; what is
    written exports."""
    from patchset.importers.definitions import write_plans
    from patchset.importers.model import Plan
    from patchset.sources import parse_source

    project = tmp_path / "p"
    registry = project / "patches"
    _runtime(registry, "t-on", "y = x + 2", on=True)
    _runtime(registry, "t-off", "y = x + 3", on=False)
    _runtime(registry, "t-clash", "y = x + 4", on=False, conflicts=("t-on",))
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    data: dict[str, object] = {
        "vllm": "0.20.0",
        "cuda": "cu129",
        "base": "vllm/vllm-openai:v0.20.0",
        "repository": "t/vllm",
        "tags": ["{vllm}"],
        "serve": {"args": []},
    }
    plan = Plan("t-0.20.0.toml", "0.20.0", ("t-on", "t-off", "t-clash", "t-gone"), data, "t")
    planned = write_plans(
        [plan], registry, project / "builds", [parse_source(str(release))], dry_run=False
    )
    assert planned.written == ["t-0.20.0.toml"], planned.notes
    written = tomllib.loads((project / "builds" / "t-0.20.0.toml").read_text())
    assert written["patches"] == ["t-on"]
    (note,) = planned.notes
    assert "t-off (conflict on this release on top of t-on)" in note, note
    assert "t-clash (conflicts with t-on)" in note and "t-gone (not imported)" in note
    _exports(project, planned.written, release)


def _same_lines(checkout: Path, g8_on: bool) -> None:
    """Two more Genesis entries, each inserting a line before `return y` of vllm/x.py (the
    same lines; neither requires the other): G7 listed first and off by default, G8 on
    (`g8_on`) or off."""
    registry = checkout / "sndr/dispatcher/registry.py"
    entries = "".join(
        f'    "G{n}": {{"title": "adds {n}", "env_flag": "GENESIS_ENABLE_G{n}",'
        f' "default_on": {on}, "lifecycle": "stable", "credit": "",'
        f' "apply_module": "sndr.engines.vllm.patches.core.g{n}"}},\n'
        for n, on in ((7, False), (8, g8_on))
    )
    registry.write_text(
        registry.read_text().replace("PATCH_REGISTRY = {\n", "PATCH_REGISTRY = {\n" + entries, 1)
    )
    for n in (7, 8):
        (checkout / f"sndr/engines/vllm/patches/core/g{n}.py").write_text(
            "from sndr.kernel import TextPatch, TextPatcher\n\n\n"
            "def _make():\n"
            "    return TextPatcher(\n"
            f'        patch_name="G{n}", target_file=str(resolve_vllm_file("x.py")),'
            f' marker="G{n}",\n'
            f'        sub_patches=[TextPatch(name="g{n}", anchor="    return y\\n",\n'
            f'                               replacement="    y = y + {n}\\n    return y\\n")],\n'
            "    )\n"
        )
    fx.commit_all(checkout, "same lines")


@pytest.mark.parametrize(
    ("g8_on", "kept", "left", "why"),
    [(True, "g8", "g7", "on by default"), (False, "g7", "g8", "wanted first")],
)
def test_two_patches_on_the_same_lines_one_left_out_with_its_line(
    tmp_path: Path, g8_on: bool, kept: str, left: str, why: str
) -> None:
    """The planner refuses two listed patches changing the same lines, neither requiring the
    other: the import leaves one out (the one off by default, though listed first; both off:
    the one wanted later), says which and why on a line of its own, and the definition it
    writes exports."""
    checkout = fx.genesis(tmp_path / "g")
    fx.genesis_pins(checkout, ("0.20.0",))
    _same_lines(checkout, g8_on)
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    project = tmp_path / "p"
    report = import_collection(
        "genesis", checkout, project / "patches", builds=project / "builds", sources=[str(release)]
    )
    assert report.builds == ["genesis-0.20.0.toml"], report.notes
    data = tomllib.loads((project / "builds" / "genesis-0.20.0.toml").read_text())
    assert f"genesis-{kept}" in data["patches"], data
    assert f"genesis-{left}" not in data["patches"], data
    (line,) = [n for n in report.notes if f"left out genesis-{left}:" in n]
    assert line == (
        f"builds/genesis-0.20.0.toml: left out genesis-{left}: changes the same lines as"
        f" genesis-{kept} (vllm/x.py line 6) and neither requires the other: genesis-{kept}"
        f" kept ({why})"
    ), line
    _exports(project, report.builds, release)


def test_nothing_the_planner_takes_is_left_no_definition_written(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A runtime patch whose only site is optional and absent from the release changes
    nothing: the planner refuses it (the import's own fit pass, which would already leave it
    out as a conflict, is told to take everything here); with nothing else wanted, no
    definition is written and the summary says which patch went, and why, and that none
    was written."""
    from patchset.importers import definitions
    from patchset.importers.model import Plan
    from patchset.registry.write import toml_text, write_patch_folder
    from patchset.sources import parse_source

    monkeypatch.setattr(definitions._Fit, "alone", lambda *_a: None)
    monkeypatch.setattr(definitions._Fit, "stacked", lambda *_a: None)
    project = tmp_path / "p"
    registry = project / "patches"
    _runtime(registry, "t-none", "y = x + 2", on=True)
    site = {
        "name": "s",
        "file": "vllm/x.py",
        "action": "replace",
        "marker": "t-none s",
        "anchor": "    absent = 1",
        "text": "    absent = 2",
        "optional": True,
    }
    write_patch_folder(
        registry / "t-none",
        tomllib.loads((registry / "t-none" / "patch.toml").read_text()),
        {"sites.toml": toml_text({"site": [site]})},
    )
    release = fx.release(tmp_path / "r0.20.0", "0.20.0")
    data: dict[str, object] = {"vllm": "0.20.0", "serve": {"args": []}}
    plan = Plan("t-0.20.0.toml", "0.20.0", ("t-none",), data, "t")
    planned = definitions.write_plans(
        [plan], registry, project / "builds", [parse_source(str(release))], dry_run=False
    )
    assert planned.written == [] and not (project / "builds").exists()
    went, none = planned.notes
    assert went.startswith("builds/t-0.20.0.toml: left out t-none: the planner refuses it:")
    assert "changes nothing" in went, went
    assert none == (
        "builds/t-0.20.0.toml: no wanted patch is left that the planner takes for vLLM 0.20.0:"
        " not written"
    ), none
