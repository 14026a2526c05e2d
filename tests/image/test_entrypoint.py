"""The image/stock entrypoint run by this Python on a synthetic tree (no Docker): an exported
bundle applied to a folder named by PATCHSET_VLLM_ROOT, the program exec'd replaced by a script
that prints its argv. The same behaviours on the stand-in image:
tests/image/test_runtime_export.py."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    OTHER,
    OTHER_DIFF,
    add_patch,
    definition_text,
    exported_bundle,
    run_entrypoint,
    stand_in_vllm,
)

STARTUP = "a = 1\nb = 2\nc = 3\n"
STARTUP_DIFF = OTHER_DIFF.replace("other", "start").replace("alpha", "a = 1")
STARTUP_DIFF = STARTUP_DIFF.replace("-beta\n+beta patched", "-b = 2\n+b = 22").replace(
    " gamma", " c = 3"
)

DEFINITION = definition_text(
    "0.20.0", ["mod-fix", "other-fix", "breaks-it"], tables='[env]\nFROM_DEFINITION = "1"\n\n'
)
SMI = "#!/bin/sh\necho '{line}'\n"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(bundle, the tree to patch, a bin folder): mod-fix is a build-time patch scoped to
    compute capability >= 12.0, other-fix a startup one."""
    registry = tmp_path / "patches"
    scoped = '\n[hardware]\ncompute_capability = ">=12.0"\n'
    add_patch(registry, "mod-fix", diff=MOD_DIFF, targets=["vllm/mod.py"], tail=scoped)
    add_patch(registry, "other-fix", diff=STARTUP_DIFF, targets=["vllm/start.py"], when="startup")
    add_patch(registry, "breaks-it", diff=OTHER_DIFF, targets=["vllm/other.py"], when="startup")
    files = {"vllm/mod.py": BODY, "vllm/start.py": STARTUP, "vllm/other.py": OTHER}
    bundle, tree = exported_bundle(tmp_path, registry, files, DEFINITION)
    bin_dir = stand_in_vllm(tmp_path / "bin")
    return bundle, tree, bin_dir


def start(
    bundle: Path, tree: Path, bin_dir: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """The entrypoint, with breaks-it (whose result does not compile) disabled unless asked."""
    env.setdefault("PATCHSET_DISABLE", "breaks-it")
    return run_entrypoint(bundle, tree, bin_dir, *args, **env)


def test_start_applies_then_finds_present(setup: tuple[Path, Path, Path]) -> None:
    bundle, tree, bin_dir = setup
    done = start(bundle, tree, bin_dir, "--port", "1", PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert done.returncode == 0, done.stderr
    assert "patchset: mod-fix r1 (build): applied" in done.stdout
    assert "patchset: other-fix r1 (startup): applied" in done.stdout
    assert json.loads(done.stdout.splitlines()[-1]) == ["serve", "--model", "m", "--port", "1"]
    assert "line 11 patched" in (tree / "vllm" / "mod.py").read_text()
    again = start(bundle, tree, bin_dir, PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert "mod-fix r1 (build): already-applied" in again.stdout
    assert "other-fix r1 (startup): already-applied" in again.stdout
    assert not list(tree.rglob("__pycache__")) and not list(bundle.rglob("__pycache__"))


@pytest.mark.parametrize(
    ("line", "state"),
    [
        ("NVIDIA GeForce RTX 5090, 12.0", "applied"),
        ("NVIDIA GeForce RTX 3090, 8.6", "skipped (scope cc >=12.0, this GPU: 8.6 (NVIDIA"),
        ("NVIDIA GeForce RTX 5090, 12.0\nNVIDIA GeForce RTX 3090, 8.6", "skipped"),
    ],
)
def test_nvidia_smi(setup: tuple[Path, Path, Path], line: str, state: str) -> None:
    bundle, tree, bin_dir = setup
    (bin_dir / "nvidia-smi").write_text(SMI.format(line=line))
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = start(bundle, tree, bin_dir)
    assert done.returncode == 0, done.stderr
    assert f"patchset: mod-fix r1 (build): {state}" in done.stdout


def test_switches_and_refusals(setup: tuple[Path, Path, Path]) -> None:
    bundle, tree, bin_dir = setup
    done = start(bundle, tree, bin_dir, PATCHSET_ONLY="mod-fix", PATCHSET_COMPUTE_CAPABILITY="12")
    assert done.returncode == 0, done.stderr
    assert "other-fix r1 (startup): left out (PATCHSET_ONLY)" in done.stdout
    assert (tree / "vllm" / "start.py").read_text() == STARTUP
    done = start(bundle, tree, bin_dir, PATCHSET_DISABLE="mod-fix,nope")
    assert done.returncode == 9
    assert "PATCHSET_DISABLE names nope, not in this manifest" in done.stderr
    assert "Traceback" not in done.stderr
    # a file changed behind patchset's back: nothing is written, not even the other patch
    (tree / "vllm" / "mod.py").write_text(BODY + "# local edit\n")
    before = (tree / "vllm" / "start.py").read_bytes()
    done = start(bundle, tree, bin_dir, PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert done.returncode == 9 and "mod-fix r1 (build): FAILED" in done.stdout
    assert (tree / "vllm" / "start.py").read_bytes() == before
    done = start(
        bundle, tree, bin_dir, PATCHSET_COMPUTE_CAPABILITY="12.0", PATCHSET_ON_FAILURE="warn"
    )
    # warn: the failed patch is left out, the start goes on with the others
    assert done.returncode == 0
    assert "mod-fix failed; its policy is warn: starting vllm without it" in done.stderr
    assert "other-fix r1 (startup): applied" in done.stdout
    assert (tree / "vllm" / "start.py").read_bytes() != before
    assert (tree / "vllm" / "mod.py").read_text() == BODY + "# local edit\n"
    # another release in the image
    (tree / "vllm" / "_version.py").write_text("__version__ = version = '0.21.0'\n")
    done = start(bundle, tree, bin_dir)
    assert done.returncode == 9
    assert "this bundle is for vLLM 0.20.0, but the image holds vLLM 0.21.0" in done.stderr


def test_verify_reports_without_writing(setup: tuple[Path, Path, Path]) -> None:
    bundle, tree, bin_dir = setup
    done = start(bundle, tree, bin_dir, "--verify", PATCHSET_COMPUTE_CAPABILITY="none")
    report = json.loads(done.stdout)
    assert report["ok"] and done.returncode == 0
    assert {r["patch"]: r["state"] for r in report["results"]}["other-fix r1"] == "applies"
    assert (tree / "vllm" / "start.py").read_text() == STARTUP
    assert os.environ.get("PATCHSET_VLLM_ROOT") is None


def test_prove_is_a_start_without_the_exec(setup: tuple[Path, Path, Path]) -> None:
    """`--prove` (what `patchset verify --start/--bundle` runs): the startup patches written,
    a JSON report, and no vllm exec'd (none on PATH either)."""
    bundle, tree, _bin_dir = setup
    empty = tree.parent / "empty-bin"
    empty.mkdir()
    done = start(bundle, tree, empty, "--prove", PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert done.returncode == 0, done.stderr
    report = json.loads(done.stdout)
    states = {r["patch"]: r["state"] for r in report["results"]}
    assert (
        report["ok"] and states["other-fix r1"] == "applied" and states["mod-fix r1"] == "applied"
    )
    assert "b = 22" in (tree / "vllm" / "start.py").read_text()  # written, as a start does
    assert "ready in" not in done.stdout
    done = start(bundle, tree, empty, PATCHSET_COMPUTE_CAPABILITY="12.0")  # a real start: no vllm
    assert done.returncode == 9 and "no vllm program on PATH" in done.stderr


def test_compile_check_names_patch_file_and_line(setup: tuple[Path, Path, Path]) -> None:
    bundle, tree, bin_dir = setup
    before = {p: p.read_bytes() for p in tree.rglob("*.py")}
    done = start(bundle, tree, bin_dir, PATCHSET_DISABLE="", PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert done.returncode == 9
    assert (
        "breaks-it r1 (startup): FAILED: vllm/other.py:2: invalid syntax"
        " (does not compile after patching)" in done.stdout
    )
    assert {p: p.read_bytes() for p in tree.rglob("*.py")} == before  # nothing written


def test_driver_and_cuda_known_at_start(tmp_path: Path) -> None:
    """`[applies]` on the driver and the CUDA runtime at start: the driver from the fake
    nvidia-smi's one answer line, CUDA from the site's dist-info; unknown (and so named)
    when neither says."""
    registry = tmp_path / "patches"
    folder = add_patch(
        registry, "other-fix", diff=STARTUP_DIFF, targets=["vllm/start.py"], when="startup"
    )
    applies = '\n[applies]\ncuda = ">=12.8"\ndriver = ">=570"\n'
    (folder / "patch.toml").write_text((folder / "patch.toml").read_text() + applies)
    definition = DEFINITION.replace('["mod-fix", "other-fix", "breaks-it"]', '["other-fix"]')
    assert definition != DEFINITION
    bundle, tree = exported_bundle(tmp_path, registry, {"vllm/start.py": STARTUP}, definition)
    bin_dir = stand_in_vllm(tmp_path / "bin")
    (bin_dir / "nvidia-smi").write_text(SMI.format(line="NVIDIA GeForce RTX 5090, 12.0, 580.82.07"))
    (bin_dir / "nvidia-smi").chmod(0o755)
    done = run_entrypoint(bundle, tree, bin_dir)
    assert done.returncode == 0, done.stderr
    assert "other-fix r1 (startup): skipped (applies: unknown here: cuda = '>=12.8')" in done.stdout
    info = tree / "nvidia_cuda_runtime_cu12-12.8.90.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Name: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n")
    done = run_entrypoint(bundle, tree, bin_dir)
    assert done.returncode == 0, done.stderr
    assert "patchset: other-fix r1 (startup): applied" in done.stdout
    done = run_entrypoint(bundle, tree, bin_dir, PATCHSET_DRIVER_VERSION="550.54")
    assert "other-fix r1 (startup): skipped (applies: " in done.stdout
    assert "is false here" in done.stdout
