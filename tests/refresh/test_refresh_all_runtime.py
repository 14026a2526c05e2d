"""`patchset refresh --all --vllm V` carries runtime patches too: one whose anchor V rewrote
gets the new anchor `refresh ID` proposes (written with --write), one with no clear new
anchor is left for hand work, one that still matches is left alone."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.registry import load_registry
from tests.helpers import gitrepos
from tests.helpers.synthetic import BODY, add_patch

OLD = "result = compute(first, second)\n"
NEW = "result = compute(first, second, third=None)\n"
SITES = """\
[[site]]
name = "s"
file = "vllm/{name}.py"
action = "insert-after"
marker = "patchset: {name}"
anchor = \"\"\"
{anchor}\"\"\"
text = \"\"\"
result = result + 1
\"\"\"
"""


@pytest.fixture
def project(tmp_path: Path) -> Path:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    old = BODY + OLD + BODY.replace("line", "tail")
    files = {"vllm/__init__.py": "", "vllm/moved.py": old, "vllm/same.py": old}
    files["vllm/gone.py"] = old
    gitrepos.commit(clone, files, "v0.19.1")
    gitrepos.commit(
        clone,
        {"vllm/moved.py": old.replace(OLD, NEW), "vllm/gone.py": BODY + BODY},
        "v0.20.0",
    )
    patches = tmp_path / "patches"
    patches.mkdir()
    for name in ("moved", "same", "gone"):
        sites = SITES.format(name=name, anchor=OLD)
        add_patch(patches, name, sites=sites, targets=[f"vllm/{name}.py"], when="startup")
    return tmp_path


def test_runtime_patches_get_their_new_anchors(project: Path) -> None:
    proposed = {c["patch"]: c for c in gitrepos.refresh_all(project)["carried"]}
    assert set(proposed) == {"moved", "gone"}  # `same` still matches: nothing to carry
    assert proposed["moved"]["outcome"] == "proposed"
    assert proposed["moved"]["detail"] == "new anchors: s"
    assert proposed["gone"]["outcome"] == "skipped"
    assert "no clear new anchor" in proposed["gone"]["detail"]
    assert len(load_registry(project / "patches").get("moved").variants) == 1  # not written

    written = {c["patch"]: c for c in gitrepos.refresh_all(project, "--write")["carried"]}
    assert written["moved"]["outcome"] == "written"
    moved = load_registry(project / "patches").get("moved")
    assert len(moved.variants) == 2
    new = (moved.folder / moved.variants[-1].name).read_text()
    assert NEW.strip() in new and OLD.strip() + '\n"""' not in new
    assert written["gone"]["outcome"] == "skipped"
    assert len(load_registry(project / "patches").get("gone").variants) == 1
