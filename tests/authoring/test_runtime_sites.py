"""`authoring.runtime_sites`: an edit as anchored runtime sites, each anchor the smallest run of
original lines unique in the file; the case of a changed comment above the edit, where a
three-line-context diff of the same edit conflicts and the site still applies."""

from __future__ import annotations

import time
import tomllib
from pathlib import Path

import pytest

from patchset.authoring.runtime_sites import MAX_ANCHOR, SiteEdit, sites_from_edit, sites_toml
from patchset.authoring.tree import unified
from patchset.errors import UsageError
from patchset.registry import load_registry
from patchset.registry.sites import load_sites
from patchset.release_check import check
from tests.helpers.synthetic import MemoryReleases, add_patch

FILE = "vllm/model_executor/layer.py"
ORIGINAL = """\
import os


def forward(x):
    # cap the split at 4 on consumer GPUs
    split = min(x.split, 8)
    return run(x, split)


def backward(x):
    split = min(x.split, 16)
    return run(x, split)
"""
EDITED = ORIGINAL.replace("split = min(x.split, 8)", "split = min(x.split, 4)")
# The next release rewrote the comment right above the edited line (a diff's context).
NEXT = ORIGINAL.replace("# cap the split at 4 on consumer GPUs", "# the split: see #40886")


def test_one_changed_unique_line_is_a_one_line_anchor() -> None:
    text = ORIGINAL.replace("import os\n", "import sys\n")
    assert sites_from_edit(ORIGINAL, text, FILE) == [
        SiteEdit(FILE, "replace", "import os", "import sys", 1)
    ]


def test_a_repeated_line_grows_by_the_fewest_lines_that_make_it_unique() -> None:
    edited = ORIGINAL.replace(
        "8)\n    return run(x, split)\n", "8)\n    return run(x, split or 1)\n"
    )
    (site,) = sites_from_edit(ORIGINAL, edited, FILE)
    # `return run(x, split)` is there twice: the line above makes it unique
    assert site.action == "replace" and site.line == 6
    assert site.anchor == "    split = min(x.split, 8)\n    return run(x, split)"
    assert site.text == "    split = min(x.split, 8)\n    return run(x, split or 1)"


def test_insertions_and_deletions() -> None:
    added = ORIGINAL.replace("import os\n", "import os\nimport sys\n")
    assert sites_from_edit(ORIGINAL, added, FILE) == [
        SiteEdit(FILE, "insert-after", "import os", "import sys", 1)
    ]
    above = ORIGINAL.replace("def backward", "@cache\ndef backward")
    assert sites_from_edit(ORIGINAL, above, FILE) == [
        SiteEdit(FILE, "insert-before", "def backward(x):", "@cache", 10)
    ]
    gone = ORIGINAL.replace("    # cap the split at 4 on consumer GPUs\n", "")
    (site,) = sites_from_edit(ORIGINAL, gone, FILE)
    # no text is left to put in: the line below comes along
    assert site.anchor.splitlines()[0] == "    # cap the split at 4 on consumer GPUs"
    assert (site.action, site.text) == ("replace", "    split = min(x.split, 8)")


def test_two_edits_far_apart_are_two_sites_close_ones_one() -> None:
    both = ORIGINAL.replace("import os", "import sys").replace("def backward(x)", "def back(x)")
    assert [s.line for s in sites_from_edit(ORIGINAL, both, FILE)] == [1, 10]
    near = ORIGINAL.replace("def forward(x):\n    # cap", "def forward(y):\n    # capped")
    (one,) = sites_from_edit(ORIGINAL, near, FILE)
    assert one.anchor.splitlines() == [
        "def forward(x):",
        "    # cap the split at 4 on consumer GPUs",
    ]


def test_a_file_that_repeats_itself_takes_the_run_that_is_unique() -> None:
    (site,) = sites_from_edit("x = 1\n" * 5, "x = 1\n" * 4 + "x = 2\n", FILE)
    assert site.anchor == "\n".join(["x = 1"] * 5)  # only the whole file occurs once


def test_sites_toml_round_trips_through_the_loader(tmp_path: Path) -> None:
    tricky = ORIGINAL.replace("import os\n", 'import os\nPATH = "C:\\\\tmp"  # """ and \t\n')
    edits = sites_from_edit(ORIGINAL, tricky, FILE)
    path = tmp_path / "sites.toml"
    path.write_text(sites_toml("pat", edits, header="made by a test"))
    (site,) = load_sites(path)
    assert (site.name, site.marker) == ("layer-1", "patchset: pat layer-1")
    assert site.text == edits[0].text + "\n"
    assert tomllib.loads(path.read_text())["site"][0]["anchor"] == "import os\n"


def test_the_anchor_holds_where_the_diff_of_the_same_edit_conflicts(tmp_path: Path) -> None:
    """club-3090's pr40886 on 0.27.1, in small: a comment above the edited line changed in the
    next release. The diff made from the edit (three lines of context) conflicts there; the
    site made from the same edit still finds its one unique line and is `needed`."""
    (site,) = sites_from_edit(ORIGINAL, EDITED, FILE)
    assert site.anchor == "    split = min(x.split, 8)"  # one line: it is unique
    registry = tmp_path / "patches"
    add_patch(registry, "as-diff", diff=unified(FILE, ORIGINAL, EDITED), targets=[FILE])
    add_patch(registry, "as-sites", sites=sites_toml("as-sites", [site]), targets=[FILE])
    source = MemoryReleases({"0.27.0": {FILE: ORIGINAL}, "0.27.1": {FILE: NEXT}})
    report = check(load_registry(registry), ["0.27.0", "0.27.1"], source=source, use_memo=False)
    verdicts = {(r.vllm, r.patch): r.verdict for r in report.results}
    assert verdicts == {
        ("0.27.0", "as-diff"): "needed",
        ("0.27.0", "as-sites"): "needed",
        ("0.27.1", "as-diff"): "conflict",
        ("0.27.1", "as-sites"): "needed",
    }


def test_a_long_repetitive_file_is_quick_and_an_unpinnable_edit_refused() -> None:
    """20,000 lines of seven repeated ones: the matcher sees only the changed middle (it
    used to take minutes); an edit no run of up to MAX_ANCHOR lines pins down is refused."""
    block = "".join(f"    x = f({i % 7})\n" for i in range(20_000))
    original = "def f():\n" + block
    start = time.process_time()
    (site,) = sites_from_edit(original, original.replace("x = f(3)", "x = f(33)", 1), FILE)
    assert time.process_time() - start < 2
    assert site.line == 1 and site.anchor.endswith("    x = f(3)")
    same = "x = 1\n" * 400
    edited = "x = 1\n" * 200 + "x = 2\n" + "x = 1\n" * 199
    with pytest.raises(UsageError, match=f"no run of up to {MAX_ANCHOR} lines unique"):
        sites_from_edit(same, edited, FILE)
