"""`patchset add` gaps a collection trial hit (issue 26, items 4 and 5): `--from-tree ... --runtime`
(anchored sites, not hunks), `--since` beside `--vllm`, `base` recorded, one common base for
several overlays, `add --python`, and `patchset remove`. Releases come from a fake index on
127.0.0.1 (several releases) or a folder (one)."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest

from patchset.authoring.tree import unified
from patchset.registry import load_registry
from tests.authoring.test_runtime_sites import EDITED, FILE, NEXT, ORIGINAL
from tests.helpers.cli import cli
from tests.helpers.fake_index import FakeIndex
from tests.helpers.synthetic import add_patch, make_tree


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    """An empty registry folder (`tmp_path/patches`). Kept in this module: in conftest.py it
    would shadow the Docker registry fixture of tests/infra/docker_fixtures.py."""
    folder = tmp_path / "patches"
    folder.mkdir()
    return folder


@pytest.fixture
def index(fake_index: FakeIndex, tmp_cache: object) -> tuple[str, ...]:
    """0.27.0 and 0.27.1 (the comment above the edited line rewritten), in an empty cache."""
    fake_index.add_release("0.27.0", {FILE: ORIGINAL.encode()})
    fake_index.add_release("0.27.1", {FILE: NEXT.encode()})
    return ("--index-url", fake_index.index_url)


def _json(result: object) -> dict[str, object]:
    out = getattr(result, "out")  # noqa: B009 - Result from tests.helpers.cli
    data: dict[str, object] = json.loads(out)
    return data


def _verdicts(data: dict[str, object]) -> dict[str, str]:
    check = data["check"]
    assert isinstance(check, dict)
    return {r["vllm"]: r["verdict"] for r in check["results"]}


def test_from_tree_runtime_sites_checked_since(
    tmp_path: Path, registry: Path, index: tuple[str, ...]
) -> None:
    """The edited 0.27.0 as sites (one unique line anchors it) and as a diff: with --since
    both releases are checked (not only --vllm's); on 0.27.1, whose comment above the line
    changed, the diff conflicts and the sites are needed; `base` is recorded either way."""
    tree = make_tree(tmp_path / "edited", {FILE: EDITED}, version="0.27.0")
    common: tuple[str | Path, ...] = (
        "--from-tree",
        tree,
        "--vllm",
        "0.27.0",
        "--since",
        "0.27.0",
        *index,
    )
    sites = cli("--registry", registry, "add", "as-sites", *common, "--runtime", "--format", "json")
    assert sites.code == 0, sites.err
    diff = cli("--registry", registry, "add", "as-diff", *common, "--format", "json")
    assert diff.code == 0, diff.err
    assert _verdicts(_json(sites)) == {"0.27.0": "needed", "0.27.1": "needed"}
    assert _verdicts(_json(diff)) == {"0.27.0": "needed", "0.27.1": "conflict"}
    (site,) = tomllib.loads((registry / "as-sites" / "sites.toml").read_text())["site"]
    assert (site["action"], site["anchor"]) == ("replace", "    split = min(x.split, 8)\n")
    patches = {p.id: p for p in load_registry(registry).patches}
    assert patches["as-sites"].kind == "runtime" and patches["as-sites"].apply == "startup"
    assert str(patches["as-sites"].vllm) == ">=0.27.0"
    assert [v.base for v in patches["as-sites"].variants] == ["0.27.0"]
    assert [v.base for v in patches["as-diff"].variants] == ["0.27.0"]


def test_runtime_refuses_what_sites_cannot_say(tmp_path: Path, registry: Path) -> None:
    release = make_tree(tmp_path / "release", {FILE: ORIGINAL})
    tree = make_tree(tmp_path / "edited", {FILE: ORIGINAL, "vllm/new.py": "x = 1\n"})
    args = ("--from-tree", tree, "--vllm", "0.19.1", "--source", release, "--runtime")
    result = cli("--registry", registry, "add", "made", *args, "--file", "vllm/new.py")
    assert result.code == 2
    assert "--runtime: the edit creates vllm/new.py" in result.err
    diff = tmp_path / "x.diff"
    diff.write_text(f"--- a/{FILE}\n+++ b/{FILE}\n@@ -1 +1 @@\n-import os\n+import sys\n")
    result = cli("--registry", registry, "add", "made", "--diff", diff, "--runtime", "--no-check")
    assert result.code == 2 and "--runtime makes sites from an edited tree" in result.err
    assert list(registry.iterdir()) == []


def test_a_diff_checked_on_its_one_release_records_it_as_base(
    tmp_path: Path, registry: Path
) -> None:
    release = make_tree(tmp_path / "release", {FILE: ORIGINAL})
    diff = tmp_path / "x.diff"
    diff.write_text(unified(FILE, ORIGINAL, ORIGINAL.replace("import os", "import sys")))
    source = ("--vllm", "0.19.1", "--source", release)
    assert cli("--registry", registry, "add", "fits", "--diff", diff, *source).code == 0
    other = ORIGINAL.replace("import os", "import re")
    diff.write_text(unified(FILE, other, other.replace("import re", "import sys")))
    assert cli("--registry", registry, "add", "misfit", "--diff", diff, *source).code == 0
    patches = {p.id: p for p in load_registry(registry).patches}
    assert patches["fits"].variants[0].base == "0.19.1"
    assert patches["misfit"].variants[0].base is None  # not needed there: not its base


def test_overlays_share_one_base_or_are_refused(
    tmp_path: Path, registry: Path, fake_index: FakeIndex, tmp_cache: object
) -> None:
    """a.py is the same in both releases, b.py changed in 0.20.0: overlays of both with a
    fix come from 0.20.0, and that is the base; b.py from 0.19.1 beside c.py from 0.20.0
    is refused (the patch would fit no release), each named with its release."""
    a = "".join(f"a{i} = {i}\n" for i in range(20))
    b_old = "".join(f"b{i} = {i}\n" for i in range(20))
    b_new = b_old.replace("b5 = 5", "b5 = 55")
    c_old = "".join(f"c{i} = {i}\n" for i in range(20))
    c_new = c_old.replace("c7 = 7", "c7 = 77")
    fake_index.add_release(
        "0.19.1",
        {"vllm/a.py": a.encode(), "vllm/b.py": b_old.encode(), "vllm/c.py": c_old.encode()},
    )
    fake_index.add_release(
        "0.20.0",
        {"vllm/a.py": a.encode(), "vllm/b.py": b_new.encode(), "vllm/c.py": c_new.encode()},
    )
    url = ("--vllm", "0.19.1", "--vllm", "0.20.0", "--index-url", fake_index.index_url)

    def overlay(name: str, text: str) -> Path:
        path = tmp_path / "overlays" / name
        path.parent.mkdir(exist_ok=True)
        path.write_text(text)
        return path

    fixed_a = overlay("a.py", a.replace("a3 = 3", "a3 = 33"))
    fixed_b = overlay("b.py", b_new.replace("b9 = 9", "b9 = 99"))
    result = cli("--registry", registry, "add", "two", "--overlay", fixed_a, fixed_b, *url)
    assert result.code == 0, result.err
    assert "the 2 overlays come from one release: vLLM 0.20.0 (the base)" in result.err
    assert f"{fixed_a}: a copy of vllm/a.py from vLLM 0.20.0" in result.err
    (patch,) = load_registry(registry).patches
    assert patch.variants[0].base == "0.20.0"
    text = (registry / "two" / "patch.diff").read_text()
    assert "-b9 = 9\n+b9 = 99" in text and "b5" not in text.split("@@")[-1].split("b9")[0][-40:]
    old_b = overlay("b.py", b_old.replace("b9 = 9", "b9 = 99"))
    new_c = overlay("c.py", c_new.replace("c1 = 1", "c1 = 11"))
    result = cli("--registry", registry, "add", "mixed", "--overlay", old_b, new_c, *url)
    assert result.code == 2
    assert (
        f"the overlays come from different releases ({old_b} from 0.19.1; {new_c} from 0.20.0)"
        in result.err
    )
    assert not (registry / "mixed").exists()


def test_python_skeleton(registry: Path) -> None:
    result = cli("--registry", registry, "add", "wrap-is-set", "--python", "--format", "json")
    assert result.code == 0, result.err
    assert json.loads(result.out)["kind"] == "python"
    folder = registry / "wrap-is-set"
    assert "def apply() -> None:" in (folder / "plugin.py").read_text()
    toml = (folder / "patch.toml").read_text()
    assert 'kind = "python"' in toml and "touches = []" in toml
    assert cli("--registry", registry, "validate").code == 2  # refused until filled in
    toml = toml.replace('vllm = ""', 'vllm = ">=0.20.0"')
    toml = toml.replace("targets = []", 'targets = ["vllm/envs.py"]')
    toml = toml.replace("touches = []", 'touches = ["vllm.envs:is_set"]')
    (folder / "patch.toml").write_text(toml)
    (folder / "plugin.py").write_text("def apply() -> None:\n    import vllm.envs\n")
    assert cli("--registry", registry, "validate").code == 0


def test_remove_refuses_what_others_stand_on(tmp_path: Path, registry: Path) -> None:
    body = "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-a\n+b\n"
    add_patch(registry, "base-fix", diff=body, targets=["vllm/a.py"])
    top = add_patch(
        registry, "top-fix", diff=body.replace("-a\n+b", "-b\n+c"), targets=["vllm/a.py"]
    )
    (top / "patch.toml").write_text(
        (top / "patch.toml")
        .read_text()
        .replace("[upstream]", 'requires = ["base-fix"]\n\n[upstream]')
    )
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "0.20.0.toml").write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["top-fix"]\n\n[serve]\nargs = ["--model", "m"]\n'
    )
    args = ("--registry", registry, "--builds", builds)
    result = cli(*args, "remove", "base-fix")
    assert result.code == 2 and "base-fix is still named: top-fix requires it" in result.err
    result = cli(*args, "remove", "top-fix")
    assert result.code == 2 and "build definition 0.20.0.toml lists it" in result.err
    assert sorted(p.name for p in registry.iterdir()) == ["base-fix", "top-fix"]
    (builds / "0.20.0.toml").unlink()
    assert cli(*args, "remove", "top-fix").code == 0
    assert cli(*args, "remove", "base-fix").code == 0
    assert list(registry.iterdir()) == []
    result = cli(*args, "remove", "base-fix")
    assert result.code == 2 and "no patch 'base-fix'" in result.err
    (registry / "half-done").mkdir()
    (registry / "half-done" / "patch.toml").write_text('id = "half-done"\n')
    assert cli(*args, "remove", "half-done").code == 0  # a patch that does not load goes too
    assert list(registry.iterdir()) == []
