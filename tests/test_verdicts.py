"""The decision table of docs/check.md on small synthetic trees (edge cases the real releases
do not show on demand): partial diffs with a per-hunk state, both directions fitting."""

from __future__ import annotations

from pathlib import Path

from patchset.registry import load_registry
from patchset.release_check.verdicts import CheckResult, Explain, check
from patchset.sources.folder import FolderSource
from tests.synthetic import add_patch, make_tree

BODY = "".join(f"line {i}\n" for i in range(1, 41))
TWO_HUNKS = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -4,7 +4,7 @@
 line 4
 line 5
 line 6
-line 7
+line 7 patched
 line 8
 line 9
 line 10
@@ -30,7 +30,7 @@
 line 30
 line 31
 line 32
-line 33
+line 33 patched
 line 34
 line 35
 line 36
"""


def _check(tmp_path: Path, text: str, diff: str, *, explain: Explain = "in-range") -> CheckResult:
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=diff, targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/mod.py": text})
    source = FolderSource(tree)
    report = check(load_registry(registry), ["0.19.1"], source=source, explain=explain)
    return report.result("0.19.1", "pat")


def test_half_upstream_diff_is_partial_with_hunk_states(tmp_path: Path) -> None:
    text = BODY.replace("line 7\n", "line 7 patched\n").replace("line 33\n", "line 33 other\n")
    r = _check(tmp_path, text, TWO_HUNKS)
    assert r.verdict == "partial"
    assert r.locations[0] == "vllm/mod.py: hunk #1 already present at line 4"
    assert r.locations[1].startswith("vllm/mod.py: hunk #2 conflicts, no match; nearest lines")
    assert "already present: vllm/mod.py#1" in r.detail


def test_present_and_applicable_hunks(tmp_path: Path) -> None:
    text = BODY.replace("line 7\n", "line 7 patched\n")
    r = _check(tmp_path, text, TWO_HUNKS)
    assert r.verdict == "partial"
    assert r.locations == (
        "vllm/mod.py: hunk #1 already present at line 4",
        "vllm/mod.py: hunk #2 applies at line 30",
    )


def test_no_nearest_lines_unless_explained(tmp_path: Path) -> None:
    text = BODY.replace("line 7\n", "line seven\n")
    r = _check(tmp_path, text, TWO_HUNKS, explain="none")
    assert r.verdict == "conflict" and "nearest" not in r.detail


def test_both_directions_fit_is_a_reported_disagreement(tmp_path: Path) -> None:
    # The diff adds a line equal to its neighbour.
    diff = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -9,4 +9,5 @@
 line 9
 line 10
+line 10
 line 11
 line 12
"""
    # The file holds the original lines and, further down, a copy of them with the change.
    text = BODY + "line 9\nline 10\nline 10\nline 11\nline 12\n" + "end\n" * 3
    r = _check(tmp_path, text, diff)
    assert (r.verdict, r.signals.reverse) == ("needed", True)
    assert r.disagreement is not None and "both fit" in r.disagreement
    assert r.disagreement.endswith("chose needed, the nearer")
