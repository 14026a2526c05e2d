"""`--source-version` on the commands that take a release source (add, update, refresh, bump,
runtime export), not only on check: a folder whose version cannot be read is refused with the
hint that names the option, and the option makes the same command work."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.helpers.cli import cli
from tests.helpers.synthetic import make_tree

FILE = "vllm/model_executor/mod.py"
DIFF = f"""\
--- a/{FILE}
+++ b/{FILE}
@@ -1,3 +1,3 @@
 def f():
-    return 1
+    return 2
 # end
"""


@pytest.mark.parametrize(
    "command", [["add"], ["update"], ["refresh"], ["bump"], ["runtime", "export"]]
)
def test_the_option_is_offered(command: list[str]) -> None:
    result = cli(*command, "--help")
    assert result.code == 0
    assert "--source-version" in result.out


def test_add_on_an_unversioned_folder_needs_and_takes_the_option(tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", {FILE: "def f():\n    return 1\n# end\n"})
    (tree / "vllm" / "_version.py").unlink()
    registry = tmp_path / "patches"
    registry.mkdir()
    diff = tmp_path / "fix.diff"
    diff.write_text(DIFF)
    base = ("--registry", str(registry), "add", "mod-fix", "--diff", str(diff))

    refused = cli(*base, "--source", str(tree))
    assert refused.code == 2, refused
    assert "--source-version" in refused.err
    assert not (registry / "mod-fix").exists()

    added = cli(*base, "--source", str(tree), "--source-version", "0.20.0")
    assert added.code == 0, added
    assert (registry / "mod-fix" / "patch.toml").is_file()


def test_with_the_index_it_is_refused_in_one_line(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    registry.mkdir()
    diff = tmp_path / "fix.diff"
    diff.write_text(DIFF)
    result = cli(
        "--registry",
        str(registry),
        "add",
        "mod-fix",
        "--diff",
        str(diff),
        "--vllm",
        "0.20.0",
        "--source-version",
        "0.20.0",
    )
    assert result.code == 2, result
    assert "--source-version: only with a folder" in result.err
    assert len(result.err.strip().splitlines()) == 1
