"""The decision table of docs/check.md on small synthetic trees (edge cases the real releases
do not show on demand): partial diffs with a per-hunk state, both directions fitting."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchset.registry import load_registry
from patchset.release_check import CheckResult, Explain, check, check_tree
from patchset.release_check.memo import Memo
from patchset.sources.base import MemoryTree, ReleaseInfo, ReleaseSource
from patchset.sources.folder import FolderSource
from tests.engine.test_python_kind import ENGINE, registry_with, tree
from tests.helpers.synthetic import BODY as SYNTHETIC_BODY
from tests.helpers.synthetic import MOD_DIFF, ON_TOP, add_keys, add_patch, make_tree

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


def test_memo_is_a_lookup_and_follows_content(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(tmp_path / "cache"))
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=TWO_HUNKS, targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/mod.py": BODY})
    loaded = load_registry(registry)
    first = check(loaded, ["0.19.1"], source=FolderSource(tree))
    assert first.result("0.19.1", "pat").verdict == "needed"
    again = Memo()
    second = check(loaded, ["0.19.1"], source=FolderSource(tree), memo=again)
    assert again.hits == 1 and second.results == first.results
    # The file changes: the key changes, the patch is evaluated again.
    (tree / "vllm" / "mod.py").write_text(BODY.replace("line 7\n", "line 7 patched\n"))
    third = Memo()
    r = check(loaded, ["0.19.1"], source=FolderSource(tree), memo=third).result("0.19.1", "pat")
    assert third.hits == 0 and r.verdict == "partial"


def test_moved_hint_only_for_a_file_that_existed(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    long_lines = TWO_HUNKS.replace("line ", "the line number ")
    add_patch(registry, "pat", diff=long_lines, targets=["vllm/mod.py"], vllm=">=0.19.1")
    # The file's content now lives elsewhere under the same name.
    moved = {"vllm/sub/mod.py": BODY.replace("line ", "the line number ")}
    loaded = load_registry(registry)
    for version, expected in (("0.18.0", ()), ("0.20.0", ("vllm/sub/mod.py",))):
        tree = make_tree(tmp_path / version, moved, version=version)
        r = check(loaded, [version], source=FolderSource(tree), use_memo=False).result(
            version, "pat"
        )
        assert (r.verdict, r.moved_to) == ("missing-target", expected)


class _Releases(ReleaseSource):
    """Releases held in memory, counting how often each is opened."""

    name = "test"
    offline = True
    named_on_trust = False

    def __init__(self, files: dict[str, dict[str, bytes]]) -> None:
        self.files = files
        self.opened: list[str] = []

    def versions(self) -> list[str]:
        return list(self.files)

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[MemoryTree]:
        self.opened.append(version)
        yield MemoryTree(ReleaseInfo(version, "memory"), self.files[version])


def test_a_vanished_file_is_read_once_where_it_was_last_seen(tmp_path: Path) -> None:
    """Three patches on a file that moved, in two later releases: each is hinted at its new
    home, and the release that last held the file is opened once more to read it, not once
    a patch and release."""
    registry = tmp_path / "patches"
    long_lines = TWO_HUNKS.replace("line ", "the line number ")
    for name in ("pat-a", "pat-b", "pat-c"):
        add_patch(registry, name, diff=long_lines, targets=["vllm/mod.py"], vllm=">=0.19.1")
    body = BODY.replace("line ", "the line number ").encode()
    source = _Releases(
        {
            "0.19.1": {"vllm/mod.py": body},
            "0.20.0": {"vllm/sub/mod.py": body},
            "0.21.0": {"vllm/sub/mod.py": body},
        }
    )
    versions = ["0.19.1", "0.20.0", "0.21.0"]
    report = check(load_registry(registry), versions, source=source, use_memo=False)
    for version in ("0.20.0", "0.21.0"):
        for name in ("pat-a", "pat-b", "pat-c"):
            r = report.result(version, name)
            assert (r.verdict, r.moved_to) == ("missing-target", ("vllm/sub/mod.py",))
    assert sorted(source.opened) == ["0.19.1", "0.19.1", "0.20.0", "0.21.0"]


def test_end_of_file_append_already_upstream_with_code_after_it(tmp_path: Path) -> None:
    diff = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -38,3 +38,5 @@
 line 38
 line 39
 line 40
+def tail():
+    return 1
"""
    appended = BODY + "def tail():\n    return 1\n"
    # The release as the diff left it: upstream, as git -R --check says too.
    assert _check(tmp_path / "a", appended, diff).verdict == "upstream"
    # Upstream added more after it: git finds neither direction (the hunk must end the file);
    # the change is there whole, so: upstream, and the disagreement with git is said.
    r = _check(tmp_path / "b", appended + "def more():\n    pass\n", diff)
    assert (r.verdict, r.signals.forward, r.signals.reverse) == ("upstream", "conflict", False)
    assert r.disagreement is not None and r.disagreement.startswith("git apply -R --check fails")
    assert r.locations[0].startswith("vllm/mod.py: hunk #1 already present at line 38")
    # A release that never had the function and has code after line 40: a conflict, never
    # `needed` somewhere in the middle of the file.
    r = _check(tmp_path / "c", BODY + "other = 2\n", diff)
    assert r.verdict == "conflict" and "not at the end of the file" in r.detail


def test_deleting_the_end_of_a_file_is_not_upstream_by_its_context_alone(tmp_path: Path) -> None:
    diff = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -36,5 +36,3 @@
 line 36
 line 37
 line 38
-line 39
-line 40
"""
    # The context is there, followed by other code: nothing says the deletion happened.
    r = _check(tmp_path, BODY + "other = 1\n", diff)
    assert r.verdict == "conflict"


# -- runtime sites with `when` (conditional on the served configuration) ----------------------
COND_MODULE = "def f(x):\n    out = g(x)\n    return out\n"


def _site(name: str, anchor: str, when: str = "") -> str:
    return (
        f'[[site]]\nname = "{name}"\nfile = "vllm/m.py"\naction = "replace"\n'
        f'marker = "patchset: {name}"\nanchor = "{anchor}"\ntext = "{anchor}  # {name}"\n'
        + (f"when = {when}\n" if when else "")
    )


GPTQ = "{ quantization = ['gptq'] }"


@pytest.mark.parametrize(
    ("sites", "verdict", "conditional"),
    [
        # an unconditional site applies; a conditional one's anchor is not in this release
        ([("a", "return out", ""), ("b", "return gone", GPTQ)], "needed", ["b"]),
        # the same without `when`: a real failure, as before
        ([("a", "return out", ""), ("b", "return gone", "")], "partial", []),
        # every site conditional, one matches: it decides
        ([("a", "out = g(x)", GPTQ), ("b", "return gone", GPTQ)], "needed", ["b"]),
        # every site conditional and none matches: the text is all there is to go by
        ([("a", "return gone", GPTQ), ("b", "out = gone", GPTQ)], "conflict", []),
    ],
)
def test_conditional_sites_depend_on_the_served_configuration(
    tmp_path: Path, sites: list[tuple[str, str, str]], verdict: str, conditional: list[str]
) -> None:
    registry = tmp_path / "patches"
    text = "\n".join(_site(*s) for s in sites)
    add_patch(registry, "cond", sites=text, targets=["vllm/m.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": COND_MODULE})
    report = check(load_registry(registry), ["0.19.1"], source=FolderSource(tree), use_memo=False)
    r = report.result("0.19.1", "cond")
    assert r.verdict == verdict, r.detail
    said = [line for line in r.locations if "depends on the served configuration" in line]
    assert [line.split("site ")[1].split(":")[0] for line in said] == conditional
    for line in said:
        assert "when quantization in ['gptq']" in line
    assert not set(conditional) & set(r.failing_sites)


def test_sites_the_served_configuration_leaves_out_are_conditional(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    mixed = _site("a", "return out") + "\n" + _site("b", "out = g(x)", GPTQ)
    add_patch(registry, "mixed", sites=mixed, targets=["vllm/m.py"])
    only = _site("c", "return out", GPTQ)
    add_patch(registry, "only", sites=only, targets=["vllm/m.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": COND_MODULE})
    loaded = load_registry(registry)
    awq = {"quantization": "awq"}
    report = check(loaded, ["0.19.1"], source=FolderSource(tree), use_memo=False, served=awq)
    r = report.result("0.19.1", "mixed")
    assert r.verdict == "needed"
    assert any(
        "site b: conditional" in line and "served: quantization=awq" in line for line in r.locations
    )
    # Its only site left out: not a conflict; the site's text decides (it fits).
    r = report.result("0.19.1", "only")
    assert r.verdict == "needed", r.detail
    # The served configuration is part of the memo key: gptq applies site b too.
    memo = Memo()
    for served, conditional in ((awq, True), ({"quantization": "gptq"}, False)):
        again = check(loaded, ["0.19.1"], source=FolderSource(tree), memo=memo, served=served)
        lines = again.result("0.19.1", "mixed").locations
        assert any("conditional" in line for line in lines) is conditional


def test_a_stacked_patch_is_memoised_and_follows_what_it_requires(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """'a-second' requires 'z-first', whose patched line 11 is in a-second's context."""
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(tmp_path / "cache"))
    registry = tmp_path / "patches"
    add_patch(registry, "z-first", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(registry, "a-second", diff=ON_TOP, targets=["vllm/mod.py"])
    add_keys(registry, "a-second", 'requires = ["z-first"]')
    tree = make_tree(tmp_path / "tree", {"vllm/mod.py": SYNTHETIC_BODY})

    def run() -> tuple[Memo, dict[str, str]]:
        memo = Memo()
        report = check(load_registry(registry), ["0.19.1"], source=FolderSource(tree), memo=memo)
        return memo, {r.patch: r.verdict for r in report.results}

    cold, verdicts = run()
    assert (cold.hits, cold.misses) == (0, 2)
    assert verdicts == {"a-second": "needed", "z-first": "needed"}
    warm, again = run()
    assert (warm.hits, warm.misses) == (2, 0) and again == verdicts  # nothing evaluated
    # The required patch's payload changes its line 11: both are evaluated again, and the
    # stacked one no longer finds its context on top of it.
    first_diff = registry / "z-first" / "patch.diff"
    first_diff.write_text(first_diff.read_text().replace("line 11 patched", "line 11 edited"))
    edited, after = run()
    assert (edited.hits, edited.misses) == (0, 2)
    assert after == {"a-second": "conflict", "z-first": "needed"}
    # Back as it was: both rows are found again; editing the stacked patch alone re-evaluates
    # it alone.
    first_diff.write_text(first_diff.read_text().replace("line 11 edited", "line 11 patched"))
    back, restored = run()
    assert (back.hits, back.misses) == (2, 0) and restored == verdicts
    own = registry / "a-second" / "patch.diff"
    own.write_text(own.read_text().replace("line 12 patched too", "line 12 patched again"))
    mine, _ = run()
    assert (mine.hits, mine.misses) == (1, 1)


def test_a_python_patch_is_memoised_by_the_modules_it_touches(tmp_path: Path) -> None:
    patches = load_registry(registry_with(tmp_path)).patches
    memo = Memo(tmp_path / "memo")
    good = tree("def is_set(name):\n    return False\n", ENGINE)
    assert [r.verdict for r in check_tree(patches, good, "0.20.0", memo=memo)] == ["needed"]
    assert [r.verdict for r in check_tree(patches, good, "0.20.0", memo=memo)] == ["needed"]
    assert memo.hits == 1
    # The name it touches is gone: the key changes (it holds the touched modules' digests).
    renamed = tree("def is_set_now(name):\n    return False\n", ENGINE)
    (r,) = check_tree(patches, renamed, "0.20.0", memo=memo)
    assert r.verdict == "missing-target"
    assert (memo.hits, memo.misses) == (1, 2)
