"""Bringing real patch collections in: package-relative diffs (`patch -p1` from inside vllm/),
preambles and `git format-patch` mails, pull requests by URL, an edited tree, whole-file
overlays, and `patchset update`. Real git, real releases (network-marked, cached)."""

from __future__ import annotations

import json
import re
import subprocess
import tomllib
from pathlib import Path

import pytest

from patchset.adapters import forge
from patchset.authoring import preamble
from patchset.authoring.diff import normalize_diff
from patchset.cli.main import main
from patchset.engine.apply import apply
from patchset.errors import PayloadError
from patchset.registry import load_patch, load_registry
from patchset.sources.package_index import IndexSource
from tests.helpers.fake_index import FakeServer, Reply
from tests.helpers.releases import materialize, tree_digest

REPO = Path(__file__).parents[2]
TMA = REPO / "patches" / "fla-tma-sm12x"
TMA_DIFF = (TMA / "patch.diff").read_text()
TMA_FILE = "vllm/model_executor/layers/fla/ops/utils.py"
PACKAGE_FILE = TMA_FILE.removeprefix("vllm/")
PR = "vllm-project/vllm#36325"
PROSE = """\
This patch caps TMA at compute capability 12: consumer Blackwell runs the
autotuner out of memory otherwise.

Apply with: cd site-packages/vllm && patch -p1 < this.patch
"""


def package_relative(diff: str = TMA_DIFF) -> str:
    """The real diff as a collection keeps it: a prose preamble, paths relative to vllm/."""
    return (
        PROSE
        + "\n"
        + diff.replace(f"a/{TMA_FILE}", f"a/{PACKAGE_FILE}").replace(
            f"b/{TMA_FILE}", f"b/{PACKAGE_FILE}"
        )
    )


def run(root: Path, *args: str) -> int:
    return main(["--registry", str(root), *args])


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("patchset:")]
    assert len(err) == 1, err
    return err[0]


@pytest.fixture
def root(tmp_path: Path) -> Path:
    folder = tmp_path / "patches"
    folder.mkdir()
    return folder


# -- paths and preambles -----------------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ["--root", "vllm"],  # a/model_executor/...: git prefixes, package-relative
        ["--strip", "1", "--root", "vllm"],  # patch -p1 from inside vllm/
        ["--strip", "3"],  # a/x/y/vllm/...: -p3 leaves vllm/...
    ],
)
def test_root_and_strip(tmp_path: Path, root: Path, args: list[str]) -> None:
    text = package_relative()
    if "--strip" in args and "--root" not in args:  # x/y/vllm/...: -p3 leaves vllm/...
        text = PROSE + TMA_DIFF.replace("a/vllm/", "a/x/y/vllm/").replace("b/vllm/", "b/x/y/vllm/")
    diff = tmp_path / "in.patch"
    diff.write_text(text)
    assert run(root, "add", "tma", "--diff", str(diff), *args, "--no-check") == 0
    patch = load_patch(root / "tma")
    assert patch.targets == (TMA_FILE,)
    assert (root / "tma" / "patch.diff").read_text() == TMA_DIFF  # the registry's own form
    assert patch.description == PROSE  # the preamble, kept


def test_package_relative_without_a_release_says_what_to_do(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = tmp_path / "in.patch"
    diff.write_text(package_relative())
    before = tree_digest(tmp_path)
    assert run(root, "add", "tma", "--diff", str(diff), "--no-check") == 2
    line = one_line_error(capsys)
    assert str(diff) in line and "--root vllm" in line
    assert tree_digest(tmp_path) == before


@pytest.mark.parametrize("bad", [["--strip", "-1"], ["--root", "../elsewhere"], ["--root", "/x"]])
def test_bad_layout_is_refused(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str], bad: list[str]
) -> None:
    diff = tmp_path / "in.patch"
    diff.write_text(TMA_DIFF)
    assert run(root, "add", "tma", "--diff", str(diff), *bad, "--no-check") == 2
    assert bad[0] in one_line_error(capsys)
    assert list(root.iterdir()) == []


def format_patch(tmp_path: Path) -> str:
    """A real `git format-patch` mail of the TMA change, made with git in a scratch repo."""
    repo = tmp_path / "repo"
    env = {
        "GIT_AUTHOR_NAME": "Ada Lovelace",
        "GIT_AUTHOR_EMAIL": "ada@example.org",
        "GIT_COMMITTER_NAME": "Ada Lovelace",
        "GIT_COMMITTER_EMAIL": "ada@example.org",
        "HOME": str(tmp_path),
        "PATH": "/usr/bin:/bin",
    }

    def git(*args: str) -> str:
        return subprocess.run(
            ["git", *args], cwd=repo, env=env, check=True, capture_output=True, text=True
        ).stdout

    (repo / TMA_FILE).parent.mkdir(parents=True)
    old = "".join(
        line[1:] + "\n" for line in TMA_DIFF.splitlines()[3:] if line[:1] in " -"
    )  # the hunk's old side stands for the file
    new = "".join(line[1:] + "\n" for line in TMA_DIFF.splitlines()[3:] if line[:1] in " +")
    git("init", "-q")
    (repo / TMA_FILE).write_text(old)
    git("add", ".")
    git("commit", "-qm", "base")
    (repo / TMA_FILE).write_text(new)
    message = (
        "[Bugfix] Cap TMA at compute capability 12\n\n"
        "Consumer Blackwell (sm_12x) runs solve_tril's autotuner out of memory\nwith TMA.\n"
    )
    git("commit", "-qam", message)
    return git("format-patch", "-1", "--stdout")


def test_format_patch_mail_gives_title_credit_and_description(tmp_path: Path, root: Path) -> None:
    mail = format_patch(tmp_path)
    head, _ = preamble.split(mail)
    assert head.subject == "[Bugfix] Cap TMA at compute capability 12"  # [PATCH] tag gone
    assert head.author == "Ada Lovelace <ada@example.org>"
    diff = tmp_path / "0001-cap.patch"
    diff.write_text(mail)
    assert run(root, "add", "tma", "--diff", str(diff), "--no-check") == 0
    patch = load_patch(root / "tma")
    assert patch.title == head.subject
    assert patch.credit == ("Ada Lovelace <ada@example.org>",)
    assert patch.description.startswith("Consumer Blackwell (sm_12x)")
    assert "files changed" not in patch.description and "---" not in patch.description
    assert patch.targets == (TMA_FILE,)


def test_prose_with_dashes_is_not_a_diff() -> None:
    head, diff = preamble.split("Notes\n--- a ruler, not a header\nmore\n" + TMA_DIFF)
    assert head.description == "Notes\n--- a ruler, not a header\nmore\n"
    assert diff == TMA_DIFF


def test_pr_as_a_browser_url(tmp_path: Path, root: Path, http_server: FakeServer) -> None:
    http_server.route("/vllm-project/vllm/pull/36325.diff", Reply(200, TMA_DIFF.encode()))
    url = f"{http_server.url}/vllm-project/vllm/pull/36325/files"
    assert forge.pr_ref(url) == (PR, http_server.url)
    assert run(root, "add", "tma", "--pr", url, "--no-check") == 0
    patch = load_patch(root / "tma")
    assert patch.upstream.pr == PR  # the canonical form is what patch.toml holds
    assert (root / "tma" / "patch.diff").read_text() == TMA_DIFF


# -- with real releases ------------------------------------------------------------------------


@pytest.mark.network
def test_package_relative_diff_is_detected(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = tmp_path / "in.patch"
    diff.write_text(package_relative())
    code = run(root, "add", "tma", "--diff", str(diff), "--vllm", "0.19.1", "--format", "json")
    captured = capsys.readouterr()
    assert code == 0, captured.err
    out = json.loads(captured.out)
    assert out["detected_root"] == "vllm" and out["targets"] == [TMA_FILE]
    assert "relative to the vllm/ package" in captured.err and "0.19.1" in captured.err
    assert "checked vLLM 0.19.1 (1/1)" in captured.err  # progress while it checks
    assert out["check"]["results"][0]["verdict"] == "needed"
    assert load_patch(root / "tma").description == PROSE


@pytest.mark.network
def test_a_diff_for_another_package_is_refused(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = tmp_path / "torch.patch"
    diff.write_text(TMA_DIFF.replace(f"/{TMA_FILE}", "/torch/cuda/__init__.py"))
    assert run(root, "add", "torch-fix", "--diff", str(diff), "--vllm", "0.19.1") == 2
    line = one_line_error(capsys)
    assert "torch/cuda/__init__.py" in line and "no known release has them" in line
    assert list(root.iterdir()) == []


def whole_release(version: str, dest: Path) -> Path:
    with IndexSource().open(version) as tree:
        for rel in tree.paths():
            data = tree.read(rel)
            assert data is not None
            (dest / rel).parent.mkdir(parents=True, exist_ok=True)
            (dest / rel).write_bytes(data)
    return dest


@pytest.mark.network
def test_from_an_edited_tree(tmp_path: Path, root: Path) -> None:
    """An installed 0.19.1 edited in place (here: by applying the real patch), turned back
    into a patch; the result applies to a pristine 0.19.1 with the same bytes."""
    site = whole_release("0.19.1", tmp_path / "site-packages")
    (site / "vllm" / "__pycache__").mkdir(exist_ok=True)
    (site / "vllm" / "__pycache__" / "junk.pyc").write_bytes(b"\0\1")  # not looked at
    assert apply(load_registry(REPO / "patches"), site, patches=["fla-tma-sm12x"]).written
    edited = (site / TMA_FILE).read_bytes()
    args = ("add", "tma-local", "--from-tree", str(site / "vllm"), "--vllm", "0.19.1")
    assert run(root, *args) == 0
    patch = load_patch(root / "tma-local")
    assert patch.targets == (TMA_FILE,)
    assert "0.19.1" in patch.origin
    pristine = materialize("0.19.1", tmp_path / "pristine", [TMA_FILE])
    assert apply(load_registry(root), pristine, patches=["tma-local"]).written
    assert (pristine / TMA_FILE).read_bytes() == edited
    # edited again: `update` takes the tree's difference anew
    again = edited.replace(b"[0] < 12", b"[0] < 13")
    (site / TMA_FILE).write_bytes(again)
    update = ["update", "tma-local", "--from-tree", str(site), "--vllm", "0.19.1", "--no-check"]
    assert run(root, *update) == 0
    assert load_patch(root / "tma-local").revision == 2
    fresh = materialize("0.19.1", tmp_path / "fresh", [TMA_FILE])
    assert apply(load_registry(root), fresh, patches=["tma-local"]).written
    assert (fresh / TMA_FILE).read_bytes() == again


@pytest.mark.network
def test_from_tree_refusals(tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "empty").mkdir()
    assert run(root, "add", "x-y", "--from-tree", str(tmp_path / "empty"), "--vllm", "0.19.1") == 2
    assert "no vllm/ package" in one_line_error(capsys)
    same = materialize("0.19.1", tmp_path / "same", [TMA_FILE])
    code = run(root, "add", "x-y", "--from-tree", str(same), "--vllm", "0.19.1", "--file", TMA_FILE)
    assert code == 2
    assert "no file differs from vLLM 0.19.1" in one_line_error(capsys)
    assert list(root.iterdir()) == []


@pytest.mark.network
def test_overlay_found_by_content(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A copy of 0.19.1's utils.py with the fix, bind-mounted in the collection: which of the
    releases it came from is found by content among several, and among every utils.py."""
    tree = materialize("0.19.1", tmp_path / "t", [TMA_FILE])
    assert apply(load_registry(REPO / "patches"), tree, patches=["fla-tma-sm12x"]).written
    overlay = tmp_path / "overlays" / "utils.py"
    overlay.parent.mkdir()
    overlay.write_bytes((tree / TMA_FILE).read_bytes())
    versions = ("--vllm", "0.17.0", "--vllm", "0.19.1", "--vllm", "0.20.0")
    code = run(root, "add", "tma-overlay", "--overlay", str(overlay), *versions)
    err = capsys.readouterr().err
    assert code == 0, err
    assert f"a copy of {TMA_FILE} from vLLM 0.19.1" in err
    assert re.search(r"chosen by content among \d+ files named utils\.py, next vllm/\S+ at", err)
    assert (root / "tma-overlay" / "patch.diff").read_text() == TMA_DIFF
    bogus = tmp_path / "other" / "utils.py"
    bogus.parent.mkdir()
    bogus.write_text("".join(f"def f{i}(): return {i}\n" for i in range(200)))
    assert run(root, "add", "bogus", "--overlay", str(bogus), *versions) == 2
    line = one_line_error(capsys)
    assert "matches no release" in line and str(bogus) in line
    assert sorted(p.name for p in root.iterdir()) == ["tma-overlay"]


FLA_INIT = "vllm/model_executor/layers/fla/ops/__init__.py"
SPDX = (
    "# SPDX-License-Identifier: Apache-2.0\n"
    "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project\n"
)


@pytest.mark.network
def test_overlay_of_a_common_name_matched_by_path_or_refused(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """vLLM 0.19.1 has 170 files named __init__.py: an overlay of one is matched by content
    and says which it chose; one that several are as alike to is refused in one line that
    lists them, and FILE=vllm/PATH says which is meant."""
    pristine = materialize("0.19.1", tmp_path / "t", [FLA_INIT])
    overlay = tmp_path / "overlays" / "__init__.py"
    overlay.parent.mkdir()
    fixed = (pristine / FLA_INIT).read_text() + "FLA_OVERLAY = True\n"
    overlay.write_text(fixed)
    assert run(root, "add", "fla-init", "--overlay", str(overlay), "--vllm", "0.19.1") == 0
    err = capsys.readouterr().err
    assert f"a copy of {FLA_INIT} from vLLM 0.19.1" in err
    assert re.search(r"chosen by content among 1\d\d files named __init__\.py, next ", err), err
    diff = (root / "fla-init" / "patch.diff").read_text()
    assert diff.startswith(f"--- a/{FLA_INIT}\n+++ b/{FLA_INIT}\n")
    assert diff.endswith("+FLA_OVERLAY = True\n")
    # the bare licence header: a dozen __init__.py are exactly that
    overlay.write_text(SPDX + "import os\n")
    before = tree_digest(root)
    assert run(root, "add", "spdx-init", "--overlay", str(overlay), "--vllm", "0.19.1") == 2
    line = one_line_error(capsys)
    found = re.search(
        r"(\d+) files named __init__\.py are about as alike: (.*) and (\d+) more;", line
    )
    assert found, line
    assert int(found[1]) >= 12 and found[2].count("__init__.py (80%)") == 6
    assert f"say which it stands for: {overlay}=vllm/PATH" in line
    assert tree_digest(root) == before
    named = found[2].split(" (80%)")[0]
    spec = f"{overlay}={named}"
    assert run(root, "add", "spdx-init", "--overlay", spec, "--vllm", "0.19.1") == 0
    assert f"--- a/{named}\n" in (root / "spdx-init" / "patch.diff").read_text()


# -- update ------------------------------------------------------------------------------------


def test_update_bumps_revision_and_keeps_the_rest(
    tmp_path: Path, root: Path, http_server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "v1.diff"
    first.write_text(TMA_DIFF)
    assert run(root, "add", "tma", "--diff", str(first), "--pr", PR, "--no-check") == 0
    toml = root / "tma" / "patch.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]", "# why we carry it: sm_120 laptops\n[upstream]")
    )
    newer = TMA_DIFF.replace("< 12", "< 13")  # the pull request moved on
    assert newer != TMA_DIFF
    http_server.route("/vllm-project/vllm/pull/36325.diff", Reply(200, newer.encode()))
    capsys.readouterr()
    args = ("update", "tma", "--forge-url", http_server.url, "--no-check")
    assert run(root, *args) == 0  # from the recorded upstream.pr
    assert "revision 1 -> 2" in capsys.readouterr().out
    patch = load_patch(root / "tma")
    assert patch.revision == 2 and patch.upstream.pr == PR
    assert (root / "tma" / "patch.diff").read_text() == newer
    assert "# why we carry it: sm_120 laptops" in toml.read_text()
    before = tree_digest(root)
    assert run(root, *args) == 0  # the same again: nothing written
    assert "nothing written" in capsys.readouterr().out
    assert tree_digest(root) == before
    assert run(root, "update", "nope", "--diff", str(first), "--no-check") == 2
    line = one_line_error(capsys)
    assert "no patch 'nope'" in line and "patchset add nope" in line
    assert tree_digest(root) == before
    written = tomllib.loads(toml.read_text())
    assert written["revision"] == 2 and written["targets"] == [TMA_FILE]


def test_update_refuses_a_bad_diff_and_writes_nothing(
    tmp_path: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    first = tmp_path / "v1.diff"
    first.write_text(TMA_DIFF)
    assert run(root, "add", "tma", "--diff", str(first), "--no-check") == 0
    before = tree_digest(root)
    bad = tmp_path / "bad.diff"
    bad.write_text("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-a\n+b\n")
    capsys.readouterr()
    assert run(root, "update", "tma", "--diff", str(bad), "--no-check") == 2
    assert "touches no file under vllm/" in one_line_error(capsys)
    assert tree_digest(root) == before
    with pytest.raises(PayloadError):
        normalize_diff("--- a/x\n+++ b/x\n@@ -1 +1 @@\n-a\n+b\n", file="x")
