"""Issue 11's bad input for the release check: never a wrong `needed`.

Overlapping hunks read `conflict` naming the hunk; a release file holding bytes that are not
UTF-8 is patched byte-exactly (as git does); a hunk whose counts disagree with its lines is
refused on load with one line.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import patchset
from patchset.errors import PatchsetError
from patchset.registry import load_registry
from patchset.sources.folder import FolderSource
from tests.helpers.synthetic import BODY, add_patch, make_tree

OVERLAPPING = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -9,4 +9,4 @@
 line 9
 line 10
-line 11
+line 11 patched
 line 12
@@ -10,4 +10,4 @@
 line 10
 line 11
-line 12
+line 12 patched
 line 13
"""

NEAR_BAD_BYTES = """\
--- a/vllm/raw.py
+++ b/vllm/raw.py
@@ -2,3 +2,3 @@
 a = 1
-b = 2
+b = 3
 c = 4
"""


def verdict(tmp_path: Path, diff: str, files: dict[str, bytes]) -> patchset.CheckResult:
    registry = tmp_path / "patches"
    add_patch(registry, "bad-diff", diff=diff, targets=sorted(files))
    tree = make_tree(tmp_path / "release", {})
    for rel, data in files.items():
        (tree / rel).write_bytes(data)
    report = patchset.check(
        load_registry(registry), ["0.19.1"], source=FolderSource(tree), use_memo=False
    )
    (result,) = report.results
    return result


def test_overlapping_hunks_conflict_with_the_reason(tmp_path: Path) -> None:
    result = verdict(tmp_path, OVERLAPPING, {"vllm/mod.py": BODY.encode()})
    assert result.verdict == "conflict"
    assert "hunk #2" in result.detail


def test_a_release_file_that_is_not_utf8(tmp_path: Path) -> None:
    """Bytes that are not UTF-8 away from the hunk: git applies it, and so does patchset,
    keeping those bytes exactly; `needed` is then the right verdict."""
    raw = b"\xff\xfe not text\na = 1\nb = 2\nc = 4\n"
    result = verdict(tmp_path, NEAR_BAD_BYTES, {"vllm/raw.py": raw})
    assert result.verdict == "needed"
    report = patchset.apply(load_registry(tmp_path / "patches"), tmp_path / "release")
    assert [r.outcome for r in report.results] == ["applied"]
    assert (tmp_path / "release" / "vllm" / "raw.py").read_bytes() == raw.replace(
        b"b = 2", b"b = 3"
    )


def test_hunk_counts_that_disagree_are_refused_on_load(tmp_path: Path) -> None:
    short = OVERLAPPING.replace("@@ -9,4 +9,4 @@", "@@ -9,9 +9,9 @@", 1)
    add_patch(tmp_path / "patches", "bad-diff", diff=short, targets=["vllm/mod.py"])
    with pytest.raises(PatchsetError) as caught:
        load_registry(tmp_path / "patches")
    message = str(caught.value)
    assert "\n" not in message and "patch.diff" in message
