"""The lines the registry records at load, which annotations point at (`check --format
github`, `upstream --format github`): each hunk's `@@`, each file's `--- `, each site's
`anchor` and `file` keys, and `[upstream] state`."""

from __future__ import annotations

from pathlib import Path

from patchset.registry import load_registry
from tests.helpers.synthetic import add_patch

REAL = Path(__file__).parents[2] / "patches"

# A mail above the diff, two files, a deletion.
MAIL = """\
Subject: two files

The text of a mail above the diff,
kept as the description.
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -1,3 +1,3 @@
 line 1
-line 2
+line 2 patched
 line 3
@@ -9,3 +9,3 @@
 line 9
-line 10
+line 10 patched
 line 11
--- a/vllm/gone.py
+++ /dev/null
@@ -1,2 +0,0 @@
-a
-b
"""

SITES = '''\
[[site]]
name = "one"
anchor = """
file = "not the key: inside the anchor"
"""
file = "vllm/mod.py"
action = "replace"
marker = "m1"
text = "x = 1"

[[site]]
name = "two"
file = "vllm/other.py"
action = "replace"
marker = "m2"
anchor = "y = 2"
text = "y = 3"
'''


def test_a_diffs_hunks_and_headers(tmp_path: Path) -> None:
    add_patch(tmp_path, "two-files", diff=MAIL, targets=["vllm/mod.py", "vllm/gone.py"])
    variant = load_registry(tmp_path).get("two-files").variants[0]
    assert dict(variant.hunk_lines) == {
        ("vllm/mod.py", 1): 7,
        ("vllm/mod.py", 2): 12,
        ("vllm/gone.py", 1): 19,
    }
    assert dict(variant.file_lines) == {"vllm/mod.py": 5, "vllm/gone.py": 17}


def test_each_sites_anchor_and_file(tmp_path: Path) -> None:
    add_patch(tmp_path, "sited", sites=SITES, targets=["vllm/mod.py", "vllm/other.py"])
    patch = load_registry(tmp_path).get("sited")
    assert patch.variants[0].site_lines == ((3, 6), (16, 13))
    text = (patch.folder / "patch.toml").read_text().split("\n")
    assert text[patch.upstream.state_line - 1].startswith("state =")  # type: ignore[operator]


def test_the_real_registry() -> None:
    registry = load_registry(REAL)
    tma = registry.get("fla-tma-sm12x")
    assert tma.upstream.state_line == 24
    assert dict(tma.variants[0].hunk_lines) == {
        ("vllm/model_executor/layers/fla/ops/utils.py", 1): 3
    }
    assert registry.get("tolist-cudagraph").variants[0].site_lines[0] == (9, 6)
