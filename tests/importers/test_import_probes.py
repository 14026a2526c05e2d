"""Issue 36: the import weighs a collection's markers before it writes them. A probe string
present in a release where the patch is still needed by its own anchors (they apply, its
change is absent) is no evidence of the fix: dropped, one line each in the report. Genesis
shaped: G1's drift marker `def forward(x, fixed=True):` becomes its upstream probe."""

from __future__ import annotations

import tomllib
from pathlib import Path

from patchset.importers import import_collection
from tests.helpers import import_fixtures as fx

STRING = "def forward(x, fixed=True):"
# upstream has mentioned the new signature in a comment all along; the fix is not in
COMMENTED = f"# {STRING} is planned\n" + fx.RELEASE_X
# the fix itself: the new signature, and G1's anchor gone
FIXED = fx.RELEASE_X.replace("def forward(x):\n    y = x + 1\n", f"{STRING}\n    y = x + 2\n")


def _import(tmp_path: Path, texts: dict[str, str]) -> tuple[dict[str, object], list[str]]:
    checkout = fx.genesis(tmp_path / "g")
    specs = [
        str(fx.release(tmp_path / f"r{version}", version, {"vllm/x.py": text}))
        for version, text in texts.items()
    ]
    registry = tmp_path / "patches"
    report = import_collection("genesis", checkout, registry, sources=specs)
    assert {e.source_id: e.action for e in report.entries}["G1"] == "added"
    data = tomllib.loads((registry / "genesis-g1" / "patch.toml").read_text())
    return data, report.notes


def test_a_marker_in_an_unfixed_release_is_dropped_with_a_line(tmp_path: Path) -> None:
    data, notes = _import(tmp_path, {"0.19.1": COMMENTED, "0.20.0": COMMENTED})
    upstream = data["upstream"]
    assert isinstance(upstream, dict)
    assert "probe" not in upstream  # its one string dropped: the probe goes whole
    assert upstream["pr"] == "vllm-project/vllm#12345"  # the rest kept
    dropped = [n for n in notes if "probe string" in n]
    assert dropped == [
        f"genesis-g1: dropped its upstream probe string {STRING!r}: it is in vllm/x.py of vllm"
        " 0.19.1, where the patch still applies and its change is absent (no evidence of the"
        " fix)"
    ]


def test_a_marker_only_where_the_fix_is_kept(tmp_path: Path) -> None:
    data, notes = _import(tmp_path, {"0.19.1": fx.RELEASE_X, "0.20.0": FIXED})
    upstream = data["upstream"]
    assert isinstance(upstream, dict)
    assert upstream["probe"] == {"file": "vllm/x.py", "any": [STRING]}
    assert not [n for n in notes if "probe string" in n]
