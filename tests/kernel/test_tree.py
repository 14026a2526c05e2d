"""The kernel's rules for writing vLLM's files (`patchset/kernel/tree.py`) and the three write
paths that follow them: the engine's transaction (`apply`), the image entrypoint (a container
start) and the image build (its context and its deletion line).

The proof that the rules live in one place: change one (which folders a deletion may remove,
the mode a new file gets) in the kernel module alone, and all three paths follow.
"""

from __future__ import annotations

import errno
import importlib.util
import json
import stat
import sys
from pathlib import Path
from types import ModuleType

import pytest

import patchset.kernel
from patchset.engine import transaction
from patchset.engine.apply import apply
from patchset.errors import ExitCode, RegistryError, TargetError
from patchset.image import build
from patchset.kernel import tree
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from tests.helpers.synthetic import add_patch, build_manifest, make_tree

ENTRYPOINT = Path(build.__file__).parent / "runtime" / "entrypoint.py"
GONE = "vllm/sub/deep/gone.py"
NEW = "vllm/made/new.sh"


@pytest.fixture
def entrypoint(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """The entrypoint loaded in this process, its `patchset_kernel` being `patchset.kernel`
    itself (in an image it is a copy of the same files): a change to a kernel module here is
    the change an image would carry."""
    monkeypatch.setitem(sys.modules, "patchset_kernel", patchset.kernel)
    for path in Path(patchset.kernel.__file__).parent.glob("*.py"):
        if path.stem != "__init__":
            module = importlib.import_module(f"patchset.kernel.{path.stem}")
            monkeypatch.setitem(sys.modules, f"patchset_kernel.{path.stem}", module)
    spec = importlib.util.spec_from_file_location("entrypoint_under_test", ENTRYPOINT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    path_before = list(sys.path)
    spec.loader.exec_module(module)
    sys.path[:] = path_before
    return module


def _tree(root: Path) -> Path:
    return make_tree(root, {GONE: "x = 1\n", "vllm/keep.py": "y = 2\n"})


def _three_paths(tmp_path: Path, entrypoint: ModuleType) -> dict[str, tuple[bool, int]]:
    """Each write path deletes GONE (the only file of vllm/sub/deep and vllm/sub) and creates
    NEW as an executable: whether vllm/sub went, and NEW's mode."""
    changes: dict[str, bytes | None] = {GONE: None, NEW: b"#!/bin/sh\n"}
    seen: dict[str, tuple[bool, int]] = {}

    engine_tree = _tree(tmp_path / "engine")
    transaction.commit(engine_tree, changes, executable={NEW})
    seen["engine"] = (
        not (engine_tree / "vllm/sub").exists(),
        stat.S_IMODE((engine_tree / NEW).stat().st_mode),
    )

    start_tree = _tree(tmp_path / "start")
    plan = entrypoint.Plan(start_tree)
    for rel, data in changes.items():
        plan.get(rel)
        plan.current[rel] = data
    plan.executable.add(NEW)
    entrypoint.commit(plan)
    seen["entrypoint"] = (
        not (start_tree / "vllm/sub").exists(),
        stat.S_IMODE((start_tree / NEW).stat().st_mode),
    )

    context = tmp_path / "context"
    definition = tmp_path / "builds" / "0.20.0.toml"
    definition.parent.mkdir()
    definition.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b:1"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["p"]\n[serve]\nargs = []\n'
    )
    build._write_context(
        context,
        definition=load_definition(definition),
        from_ref="base",
        root="/site",
        build_ids=["p"],
        patched={NEW: b"#!/bin/sh\n"},
        manifest=build_manifest("p", [GONE, NEW], executable=(NEW,)),
        plugins={},
    )
    dockerfile = (context / "Dockerfile").read_text()
    seen["build"] = (
        "/site/vllm/sub " in dockerfile or "/site/vllm/sub;" in dockerfile,
        stat.S_IMODE((context / "files" / NEW).stat().st_mode),
    )
    return seen


def test_the_three_write_paths_follow_the_kernel_rules(
    tmp_path: Path, entrypoint: ModuleType
) -> None:
    seen = _three_paths(tmp_path, entrypoint)
    assert seen == dict.fromkeys(("engine", "entrypoint", "build"), (True, 0o755))


def test_one_rule_changed_in_the_kernel_changes_all_three(
    tmp_path: Path, entrypoint: ModuleType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Emptied folders kept below vllm/sub, new executables 750: set in kernel/tree.py only."""
    monkeypatch.setattr(
        tree,
        "removable",
        lambda folder: (
            folder not in {"", ".", "vllm"}
            and (not folder.startswith("vllm/sub") or folder.count("/") > 1)
        ),
    )
    real_mode = tree.file_mode
    monkeypatch.setattr(tree, "file_mode", lambda current, **kw: real_mode(current, **kw) & 0o750)
    seen = _three_paths(tmp_path, entrypoint)
    assert seen == dict.fromkeys(("engine", "entrypoint", "build"), (False, 0o750))


def test_emptied_folders_deepest_first_never_vllm() -> None:
    listing = {
        "vllm": ["vllm/a", "vllm/keep.py"],
        "vllm/a": ["vllm/a/b", "vllm/a/other.py"],
        "vllm/a/b": ["vllm/a/b/x.py"],
        "vllm/c": ["vllm/c/y.py"],
    }
    changes: dict[str, bytes | None] = {"vllm/a/b/x.py": None, "vllm/c/y.py": None}
    assert tree.emptied_candidates(changes) == ["vllm/a/b", "vllm/a", "vllm/c"]
    assert tree.emptied_folders(changes, listing.get) == ["vllm/a/b", "vllm/c"]
    assert tree.emptied_folders({"vllm/only.py": None}, {"vllm": ["vllm/only.py"]}.get) == []


def test_temp_names_always_fit() -> None:
    assert tree.temp_name("x.py", ".patchset-new") == ".x.py.patchset-new"
    long_name = "n" * 250 + ".py"
    temp = tree.temp_name(long_name, ".patchset-new")
    assert len(temp.encode()) <= tree.NAME_MAX and temp.endswith(".patchset-new")
    assert temp == tree.temp_name(long_name, ".patchset-new")  # a roll-back finds it again


# -- names the file system can hold (issue 23, item 7) ----------------------------------------


def _new_file_patch(tmp_path: Path, name: str) -> Path:
    rel = f"vllm/{name}"
    diff = f"diff --git a/{rel} b/{rel}\nnew file mode 100644\n--- /dev/null\n+++ b/{rel}\n"
    diff += "@@ -0,0 +1 @@\n+x = 1\n"
    return add_patch(tmp_path / "patches", "long-name", diff=diff, targets=[rel]).parent


def test_a_250_character_new_file_is_written_and_reverted(tmp_path: Path) -> None:
    name = "n" * 247 + ".py"  # 250 characters: fits, its old temp name did not
    registry = load_registry(_new_file_patch(tmp_path, name))
    target = make_tree(tmp_path / "t", {"vllm/keep.py": "y = 2\n"})
    report = apply(registry, target, compute_capability=None)
    assert [r.outcome for r in report.results] == ["applied"]
    assert (target / "vllm" / name).read_text() == "x = 1\n"
    assert not (target / transaction.JOURNAL).exists()


def test_a_name_too_long_to_write_is_bad_input_and_writes_nothing(tmp_path: Path) -> None:
    """Refused where it is read (the registry, exit 2), and by the transaction itself for a
    caller that hands it such a name: nothing written, no journal."""
    name = "n" * 260 + ".py"
    with pytest.raises(RegistryError, match="longer than 255 bytes") as caught:
        load_registry(_new_file_patch(tmp_path, name))
    assert caught.value.exit_code == ExitCode.BAD_INPUT
    target = make_tree(tmp_path / "t", {"vllm/keep.py": "y = 2\n"})
    before = sorted(p.relative_to(target) for p in target.rglob("*"))
    with pytest.raises(TargetError, match="longer than 255 bytes") as refused:
        transaction.commit(target, {f"vllm/{name}": b"x = 1\n"})
    assert refused.value.exit_code == ExitCode.BAD_INPUT
    assert sorted(p.relative_to(target) for p in target.rglob("*")) == before


def test_a_journal_naming_a_temp_too_long_to_exist_rolls_back(tmp_path: Path) -> None:
    """A journal an older patchset left (its temp name over the limit) no longer makes every
    later run fail: the roll-back cannot fail on its own names."""
    target = make_tree(tmp_path / "t", {"vllm/keep.py": "y = 2\n"})
    name = "n" * 247 + ".py"
    journal = target / transaction.JOURNAL
    journal.mkdir()
    temp = f"vllm/.{name}.patchset-new"
    entry: dict[str, object] = {
        "path": f"vllm/{name}",
        "backup": "0.orig",
        "existed": False,
        "temp": temp,
    }
    (journal / "index.json").write_text(json.dumps([entry]))
    with pytest.raises(OSError) as too_long:
        (target / temp).unlink()
    assert too_long.value.errno == errno.ENAMETOOLONG
    assert transaction.recover(target) == [f"vllm/{name}"]
    assert not journal.exists()
    left = sorted(p.name for p in (target / "vllm").iterdir())
    assert left == ["__init__.py", "_version.py", "keep.py"]
