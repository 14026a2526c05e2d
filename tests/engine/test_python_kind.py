"""The `python` patch kind on the host: validated on load, checked by name (missing-target when a
name it touches is gone), never written by `apply`; and the kernel's `touches` reader."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from patchset.engine.apply import apply, revert
from patchset.errors import PayloadError, RegistryError
from patchset.kernel.touches import defines, module_files, parse_touch
from patchset.registry import load_registry
from patchset.release_check import check_tree
from patchset.sources.base import MemoryTree, ReleaseInfo
from tests.helpers.cli import run_cli

TOML = """id = "envs-probe"
title = "Wrap vllm.envs.is_set"
description = "Wraps is_set."
kind = "python"
revision = 1
vllm = ">=0.20.0"
apply = "startup"
targets = ["vllm/envs.py", "vllm/v1/engine/__init__.py"]
touches = ["vllm.envs:is_set", "vllm.v1.engine:EngineCoreRequest.prompt"]
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""
PLUGIN = "def apply():\n    import vllm.envs\n"


def registry_with(tmp_path: Path, toml: str = TOML, plugin: str = PLUGIN) -> Path:
    folder = tmp_path / "patches" / "envs-probe"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(toml)
    (folder / "plugin.py").write_text(plugin)
    return tmp_path / "patches"


def tree(envs: str, engine: str) -> MemoryTree:
    files = {"vllm/__init__.py": b"", "vllm/envs.py": envs.encode()}
    if engine:
        files["vllm/v1/engine/__init__.py"] = engine.encode()
    return MemoryTree(ReleaseInfo("0.20.0", "test"), files)


ENGINE = "class EngineCoreRequest:\n    prompt: str | None = None\n"


def test_check_by_name(tmp_path: Path) -> None:
    registry = load_registry(registry_with(tmp_path))
    (patch,) = registry.patches
    assert patch.kind == "python" and patch.touches[0] == "vllm.envs:is_set"
    good = tree("import os\n\ndef is_set(name):\n    return name in os.environ\n", ENGINE)
    (result,) = check_tree(registry.patches, good, "0.20.0")
    assert result.verdict == "needed"
    assert result.detail.startswith("every name it touches is there: vllm.envs:is_set")
    renamed = tree("def is_set_now(name):\n    return False\n", ENGINE)
    (result,) = check_tree(registry.patches, renamed, "0.20.0")
    assert result.verdict == "missing-target"
    assert "vllm/envs.py: is_set not in this release" in result.detail
    (result,) = check_tree(registry.patches, tree("def is_set(n): ...\n", ""), "0.20.0")
    assert result.verdict == "missing-target" and "vllm/v1/engine.py" in result.detail


def test_apply_writes_nothing(tmp_path: Path) -> None:
    registry = load_registry(registry_with(tmp_path))
    target = tmp_path / "site"
    (target / "vllm" / "v1" / "engine").mkdir(parents=True)
    (target / "vllm" / "__init__.py").write_text("")
    (target / "vllm" / "envs.py").write_text("def is_set(name):\n    return False\n")
    (target / "vllm" / "v1" / "engine" / "__init__.py").write_text(ENGINE)
    before = {p: p.read_bytes() for p in target.rglob("*") if p.is_file()}
    report = apply(registry, target, version="0.20.0")
    (result,) = report.results
    assert result.outcome == "plugin" and "reaches vLLM as a plugin" in result.details[0]
    assert {p: p.read_bytes() for p in target.rglob("*") if p.is_file()} == before
    # Its own word, counted by no exit code: with --strict, a tree whose only in-range patch
    # is a python patch is not "already applied" (6) (was: `not-applied`, exit 6).
    strict = apply(registry, target, version="0.20.0", strict=True)
    assert [r.outcome for r in strict.results] == ["plugin"] and strict.exit_code == 0
    reverted = revert(registry, target, version="0.20.0", strict=True)
    assert [r.outcome for r in reverted.results] == ["plugin"] and reverted.exit_code == 0


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (('touches = ["vllm.envs:is_set", ', 'touches = ["vllm.envs", '), "expected module:attr"),
        (('targets = ["vllm/envs.py", ', "targets = ["), "list its module's file vllm/envs.py"),
        (('apply = "startup"', 'apply = "build"'), "apply = 'startup'"),
        (("touches = [", "xtouches = ["), "touches"),
    ],
)
def test_bad_python_patches(tmp_path: Path, change: tuple[str, str], message: str) -> None:
    with pytest.raises(RegistryError, match=message.replace("(", r"\(").replace("[", r"\[")):
        load_registry(registry_with(tmp_path, TOML.replace(*change)))


def test_plugin_module_must_compile_and_define_apply(tmp_path: Path) -> None:
    with pytest.raises(PayloadError, match=r"plugin.py: line 1: .*"):
        load_registry(registry_with(tmp_path, plugin="def apply(:\n"))
    shutil.rmtree(tmp_path / "patches")
    with pytest.raises(PayloadError, match="defines no apply"):
        load_registry(registry_with(tmp_path, plugin="def run():\n    pass\n"))


def test_touches_reader() -> None:
    assert parse_touch("vllm.envs:is_set") == ("vllm.envs", "is_set")
    assert module_files("vllm.v1.engine") == ("vllm/v1/engine.py", "vllm/v1/engine/__init__.py")
    source = (
        "import os\nfrom a import b as c\ntry:\n    import flash\nexcept ImportError:\n"
        "    HAS = False\nif True:\n    X: int = 1\n"
        "class K:\n    def m(self): ...\n    y = 2\nasync def f(): ...\n"
    )
    for name in ("os", "c", "flash", "HAS", "X", "K", "K.m", "K.y", "f"):
        assert defines(source, name), name
    for name in ("b", "K.z", "f.x", "m", "missing"):
        assert not defines(source, name), name
    assert not defines("def broken(:\n", "broken")


def test_cli_show_and_refresh(tmp_path: Path) -> None:
    import json

    registry = registry_with(tmp_path)

    shown = json.loads(
        run_cli("--registry", registry, "show", "envs-probe", "--format", "json").stdout
    )
    assert shown["touches"] == ["vllm.envs:is_set", "vllm.v1.engine:EngineCoreRequest.prompt"]
    done = run_cli("--registry", registry, "refresh", "envs-probe", "--vllm", "0.21.0", "--offline")
    assert done.returncode == 2 and "is a python patch" in done.stderr
    assert "Traceback" not in done.stderr
