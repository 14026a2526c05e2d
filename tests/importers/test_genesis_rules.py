# ruff: noqa: E501 - the Genesis-shaped modules below are written as such modules are
"""How Genesis's TextPatcher rules carry over: drift markers, conditional and either-or
sub-patches, an anchor reading a required patch's edit (modules written here, read statically)."""

from __future__ import annotations

import textwrap
import tomllib
from pathlib import Path

import patchset
from patchset.importers.genesis import text as genesis_text
from patchset.importers.model import Draft
from patchset.importers.pystatic import Package
from patchset.registry import load_registry
from patchset.registry.write import toml_text, write_patch_folder
from patchset.sources import parse_source
from tests.helpers import import_fixtures as fx

HEADER = """\
from sndr.engines.vllm.detection.guards import resolve_vllm_file
from sndr.kernel import TextPatch, TextPatcher
"""


def _sites(
    tmp_path: Path, body: str
) -> tuple[dict[str, object], list[dict[str, object]], list[str]]:
    (tmp_path / "sndr").mkdir(parents=True, exist_ok=True)
    (tmp_path / "sndr" / "m.py").write_text(HEADER + textwrap.dedent(body))
    scope = Package(tmp_path).scope("sndr.m")
    assert scope is not None
    patchers, unresolved = genesis_text.read_patchers(scope)
    assert not unresolved, unresolved
    meta: dict[str, object] = {"upstream": {}}
    lost: list[str] = []
    payloads, _ = genesis_text.runtime_patch("genesis-t", "T", patchers, meta, lost)
    return meta, tomllib.loads(payloads["sites.toml"])["site"], lost


def test_a_drift_marker_its_own_text_holds_is_the_patch_probe(tmp_path: Path) -> None:
    # Genesis skips the patch when upstream has the function the patch itself adds: patchset
    # weighs the patch's probe after "already applied", so it is kept.
    meta, _, _ = _sites(
        tmp_path,
        """
        def _make_patcher():
            return TextPatcher(
                patch_name="t",
                target_file=resolve_vllm_file("x.py"),
                marker="T v1",
                sub_patches=[TextPatch(name="a", anchor="def f():\\n", replacement="def f():\\n    g()\\n", required=True)],
                upstream_drift_markers=["[Genesis T", "    g()\\n"],
            )
        """,
    )
    assert meta["upstream"] == {"probe": {"file": "vllm/x.py", "any": ["[Genesis T", "    g()\n"]}}


def test_a_later_patchers_drift_is_read_after_the_patchers_before(tmp_path: Path) -> None:
    # Two shapes of one file, two patchers: the second's drift marker is the first's edit
    # (Genesis then skips it); a marker the second's own first sub-patch inserts is left out
    # of its later sites, where Genesis (reading once, before its first edit) never sees it.
    _, sites, _ = _sites(
        tmp_path,
        """
        def _one():
            return TextPatcher(
                patch_name="one", target_file=resolve_vllm_file("x.py"), marker="T one",
                sub_patches=[TextPatch(name="old", anchor="a = 1\\n", replacement="a = cdiv(1)\\n", required=True)],
                upstream_drift_markers=["[Genesis T"],
            )

        def _two():
            return TextPatcher(
                patch_name="two", target_file=resolve_vllm_file("x.py"), marker="T two",
                sub_patches=[
                    TextPatch(name="new", anchor="b = 1\\n", replacement="b = cdiv(2)\\n", required=True),
                    TextPatch(name="new2", anchor="c = 1\\n", replacement="c = 3\\n", required=True),
                ],
                upstream_drift_markers=["a = cdiv(", "b = cdiv("],
            )
        """,
    )
    assert [s["name"] for s in sites] == ["old", "new", "new2"]
    assert "probe" not in sites[0]
    assert sites[1]["probe"] == {"any": ["a = cdiv(", "b = cdiv("]}
    assert sites[2]["probe"] == {"any": ["a = cdiv("]}  # "b = cdiv(" is site new's own edit


def test_a_sub_patch_appended_under_an_if_is_optional(tmp_path: Path) -> None:
    _, sites, lost = _sites(
        tmp_path,
        """
        def apply():
            target = resolve_vllm_file("x.py")
            content = open(target).read()
            if target is not None:
                subs = [TextPatch(name="base", anchor="x = 1\\n", replacement="x = 2\\n", required=True)]
                if "[Genesis OTHER]" in content:
                    subs.append(TextPatch(name="over", anchor="y = 1\\n", replacement="y = 2\\n", required=True))
                TextPatcher(patch_name="t", target_file=target, marker="T", sub_patches=subs).apply()
        """,
    )
    assert [(s["name"], s["optional"]) for s in sites] == [("base", False), ("over", True)]
    assert any("sub-patch over" in line and "`if`" in line for line in lost), lost


def test_patchers_returned_in_turn_on_two_files_are_optional(tmp_path: Path) -> None:
    _, sites, lost = _sites(
        tmp_path,
        """
        def _make_patcher():
            new = resolve_vllm_file("new.py")
            legacy = resolve_vllm_file("legacy.py")
            if new is not None:
                return TextPatcher(patch_name="n", target_file=new, marker="T",
                    sub_patches=[TextPatch(name="n", anchor="n = 1\\n", replacement="n = 2\\n", required=True)])
            if legacy is not None:
                return TextPatcher(patch_name="l", target_file=legacy, marker="T",
                    sub_patches=[TextPatch(name="l", anchor="l = 1\\n", replacement="l = 2\\n", required=True)])
            return None
        """,
    )
    assert [(s["file"], s["optional"]) for s in sites] == [
        ("vllm/new.py", True),
        ("vllm/legacy.py", True),
    ]
    assert sum("whichever the release has" in line for line in lost) == 2


def _runtime_meta(pid: str) -> dict[str, object]:
    """A runtime patch's patch.toml on vllm/x.py, its id `pid` (title and description too)."""
    meta: dict[str, object] = {"id": pid, "title": pid, "description": pid, "kind": "runtime"}
    meta |= {"revision": 1, "vllm": ">=0.1", "apply": "startup", "targets": ["vllm/x.py"]}
    meta |= {"origin": "test", "credit": ["test"], "upstream": {"state": "unsubmitted"}}
    return meta


BASE_TEXT = "def forward(x):\n    y = x + 1\n    return y\n"


def test_an_anchor_over_a_required_patchs_edit_reads_patchsets_marker(tmp_path: Path) -> None:
    """PN388 reads P34's edit: with patchset's marker comment above P34's text, the stacked
    anchor still matches on top of it (and, as its alternative, on Genesis's own result)."""
    below_site = {
        "name": "b",
        "file": "vllm/x.py",
        "action": "replace",
        "marker": "Genesis B b",
        "anchor": "    y = x + 1\n",
        "text": "    y = x + 2\n",
        "optional": False,
    }
    above_site = {
        "name": "a",
        "file": "vllm/x.py",
        "action": "replace",
        "marker": "Genesis A a",
        "anchor": "def forward(x):\n    y = x + 2\n    return y\n",
        "text": "def forward(x):\n    y = x + 2\n    return y * 3\n",
        "optional": False,
    }

    def draft(pid: str, site: dict[str, object], **extra: object) -> Draft:
        meta = _runtime_meta(pid) | extra
        return Draft(pid, pid, meta, {"sites.toml": toml_text({"site": [site]}, header="h")})

    drafts = [draft("t-below", below_site), draft("t-above", above_site, requires=["t-below"])]
    genesis_text.stacked_anchors(drafts)
    site = tomllib.loads(drafts[1].payloads["sites.toml"])["site"][0]
    assert site["anchor"] == "def forward(x):\n    # Genesis B b\n    y = x + 2\n    return y\n"
    assert site["alternatives"] == [{"anchor": above_site["anchor"]}]
    registry = tmp_path / "patches"
    for d in drafts:
        write_patch_folder(registry / d.id, d.meta, d.payloads)
    release = fx.release(tmp_path / "r", "0.20.0", {"vllm/x.py": BASE_TEXT})
    report = patchset.check(
        load_registry(registry), ["0.20.0"], source=parse_source(str(release)), use_memo=False
    )
    result = report.result("0.20.0", "t-above")
    assert result.verdict == "needed", result.detail


AT_LEAST_ONE = """
_LAUNCH = ("launch_a", "launch_b")

def _make_patcher():
    return TextPatcher(
        patch_name="t", target_file=resolve_vllm_file("x.py"), marker="T v1",
        sub_patches=[
            TextPatch(name="tile", anchor="tile = 32\\n", replacement="tile = 64\\n", required=True),
            TextPatch(name="launch_a", anchor="launch(w=4)\\n", replacement="launch(w=8)\\n", required=False),
            TextPatch(name="launch_b", anchor="launch(w=4, **kw)\\n", replacement="launch(w=8, **kw)\\n", required=False),
            TextPatch(name="extra", anchor="z = 1\\n", replacement="z = 2\\n", required=False),
        ],
    )

def apply():
    patcher = _make_patcher()
    result, failure = patcher.apply()
    if not set(patcher.applied_sub_patches).intersection(_LAUNCH):
        return "failed", "NONE of the launch variants matched"
    return "applied", "ok"
"""


def test_sub_patches_the_module_requires_one_of_are_one_site_with_alternatives(
    tmp_path: Path,
) -> None:
    """PN351's convention: optional sub-patches, one per upstream shape of one edit, and an
    `apply()` that fails when none of them applied. Imported as one site (not optional) whose
    alternatives are the other shapes: a release with none of them is `partial` (the tile site
    fits, the launch site does not), not the required sub-patch applied alone ("needed", a
    half-patch Genesis itself refuses)."""
    meta, sites, _ = _sites(tmp_path, AT_LEAST_ONE)
    assert [(s["name"], s["optional"]) for s in sites] == [
        ("tile", False),
        ("launch_a", False),
        ("extra", True),  # named by no such check: optional, as before
    ]
    assert sites[1]["alternatives"] == [
        {"anchor": "launch(w=4, **kw)\n", "text": "launch(w=8, **kw)\n"}
    ]
    meta = _runtime_meta("t-one")
    registry = tmp_path / "patches"
    write_patch_folder(
        registry / "t-one", meta, {"sites.toml": toml_text({"site": sites}, header="h")}
    )
    files = {
        "0.20.0": "tile = 32\nlaunch(w=4)\n",
        "0.21.0": "tile = 32\nlaunch(w=4, **kw)\n",
        "0.22.0": "tile = 32\nlaunch(w=4, num_stages=2, **kw)\n",  # a shape neither knows
    }
    verdicts = {}
    for version, text in files.items():
        release = fx.release(tmp_path / version, version, {"vllm/x.py": text})
        report = patchset.check(
            load_registry(registry), [version], source=parse_source(str(release)), use_memo=False
        )
        verdicts[version] = report.result(version, "t-one").verdict
    assert verdicts == {"0.20.0": "needed", "0.21.0": "needed", "0.22.0": "partial"}


def test_one_of_each_pair_the_module_requires_is_one_site_per_pair(tmp_path: Path) -> None:
    # The successor's P100: each base name and its `_dev748` shape, at least one of each pair;
    # not one site for all four (that would apply one edit of the four).
    _, sites, _ = _sites(
        tmp_path,
        """
        _BASES = ("a", "b")

        def _make_patcher():
            return TextPatcher(
                patch_name="t", target_file=resolve_vllm_file("x.py"), marker="T v1",
                sub_patches=[
                    TextPatch(name="a", anchor="a = 1\\n", replacement="a = 2\\n", required=False),
                    TextPatch(name="a_dev748", anchor="a = 10\\n", replacement="a = 20\\n", required=False),
                    TextPatch(name="b", anchor="b = 1\\n", replacement="b = 2\\n", required=False),
                    TextPatch(name="b_dev748", anchor="b = 10\\n", replacement="b = 20\\n", required=False),
                ],
            )

        def apply():
            patcher = _make_patcher()
            result, failure = patcher.apply()
            applied = set(patcher.applied_sub_patches)
            for base in _BASES:
                if base not in applied and f"{base}_dev748" not in applied:
                    return "failed", f"neither shape of {base!r} matched"
            return "applied", "ok"
        """,
    )
    assert [(s["name"], s["optional"], s["alternatives"]) for s in sites] == [
        ("a", False, [{"anchor": "a = 10\n", "text": "a = 20\n"}]),
        ("b", False, [{"anchor": "b = 10\n", "text": "b = 20\n"}]),
    ]


def test_a_name_list_no_failing_check_reads_leaves_its_sub_patches_optional(
    tmp_path: Path,
) -> None:
    # The same module whose `apply()` only reports which shape applied: nothing required.
    body = AT_LEAST_ONE.replace('return "failed", "NONE', 'return "applied", "NONE')
    _, sites, _ = _sites(tmp_path, body)
    assert [(s["name"], s["optional"]) for s in sites] == [
        ("tile", False),
        ("launch_a", True),
        ("launch_b", True),
        ("extra", True),
    ]
    assert all("alternatives" not in s for s in sites)


def test_a_fallback_file_becomes_a_variant_by_release(tmp_path: Path) -> None:
    """`resolve_vllm_file("a.py") or resolve_vllm_file("b.py")`: given releases, the import
    writes one payload per run of releases picking the same file, each where Genesis patches."""
    from patchset.importers.common import Releases
    from patchset.importers.genesis.files import by_release

    (tmp_path / "sndr").mkdir()
    (tmp_path / "sndr" / "m.py").write_text(
        HEADER
        + textwrap.dedent(
            """
            def _make_patcher():
                target = resolve_vllm_file("a.py") or resolve_vllm_file("b.py")
                return TextPatcher(patch_name="t", target_file=target, marker="T",
                    sub_patches=[TextPatch(name="s", anchor="    y = x + 1\\n", replacement="    y = x + 2\\n", required=True)],
                    upstream_drift_markers=["y = x + 9"])
            """
        )
    )
    scope = Package(tmp_path).scope("sndr.m")
    assert scope is not None
    patchers, _ = genesis_text.read_patchers(scope)
    releases = [
        fx.release(tmp_path / "r1", "0.19.0", {"vllm/a.py": BASE_TEXT}),
        fx.release(tmp_path / "r2", "0.20.0", {"vllm/b.py": BASE_TEXT}),
        fx.release(tmp_path / "r3", "0.21.0", {"vllm/b.py": BASE_TEXT}),
    ]
    meta: dict[str, object] = {"vllm": ">=0.19.0", "upstream": {}}
    found = Releases([parse_source(str(r)) for r in releases])
    try:
        made = by_release(("genesis-t", "T"), patchers, meta, found)
    finally:
        found.close()
    assert made is not None
    payloads, _ = made
    assert meta["variants"] == [
        {"payload": "sites.toml", "vllm": "<0.20.0"},
        {"payload": "v0.20.0.sites.toml", "vllm": ">=0.20.0"},
    ]
    assert meta["targets"] == ["vllm/a.py", "vllm/b.py"]
    assert tomllib.loads(payloads["sites.toml"])["site"][0]["file"] == "vllm/a.py"
    later = tomllib.loads(payloads["v0.20.0.sites.toml"])["site"][0]
    assert later["file"] == "vllm/b.py"
    assert later["probe"] == {"any": ["y = x + 9"]}  # the patch's probe reads a.py: here, b.py's
    assert meta["upstream"] == {"probe": {"file": "vllm/a.py", "any": ["y = x + 9"]}}
