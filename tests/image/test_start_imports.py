"""Proof that the patched vLLM imports (issue 35.8) and `verify`'s bounds (issue 37, E11 and
E21): `entrypoint.py --prove --imports` imports, in a child process each, every module the
start changed; one that fails fails its patches by their policy with the exception's last
line. On a synthetic tree run by this Python, and through `patchset verify` on the stand-in."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from patchset.errors import ExitCode
from tests.helpers.cli import cli, run_cli
from tests.helpers.synthetic import (
    add_patch,
    definition_text,
    exported_bundle,
    run_entrypoint,
    stand_in_vllm,
)


def three_lines(name: str, old: str, new: str) -> str:
    """A diff of vllm/NAME.py ("x = 1\\ny = 2\\nz = 3\\n") replacing its middle line."""
    return (
        f"--- a/vllm/{name}.py\n+++ b/vllm/{name}.py\n@@ -1,3 +1,3 @@\n"
        f" x = 1\n-{old}\n+{new}\n z = 3\n"
    )


MODULE = "x = 1\ny = 2\nz = 3\n"


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    """`fine` changes vllm/mod.py, which still imports; `raises` makes vllm/other.py raise
    when imported (it compiles)."""
    registry = tmp_path / "patches"
    fine = three_lines("mod", "y = 2", "y = 22")
    raises = three_lines("other", "y = 2", "raise RuntimeError('y is gone')")
    add_patch(registry, "fine", diff=fine, targets=["vllm/mod.py"], when="startup")
    add_patch(registry, "raises", diff=raises, targets=["vllm/other.py"], when="startup")
    files = {"vllm/mod.py": MODULE, "vllm/other.py": MODULE}
    bundle, site = exported_bundle(
        tmp_path, registry, files, definition_text("0.20.0", ["fine", "raises"])
    )
    return bundle, site, stand_in_vllm(tmp_path / "bin")


def prove(setup: tuple[Path, Path, Path], **env: str) -> tuple[int, dict[str, Any]]:
    bundle, site, bin_dir = setup
    done = run_entrypoint(
        bundle, site, bin_dir, "--prove", "--imports", PATCHSET_COMPUTE_CAPABILITY="none", **env
    )
    return done.returncode, json.loads(done.stdout.splitlines()[-1])


def states(report: dict[str, Any]) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for r in report["results"]:
        out.setdefault(r["patch"], []).append(r["state"])
    return out


def test_a_module_that_does_not_import_fails_its_patch(setup: tuple[Path, Path, Path]) -> None:
    code, report = prove(setup)
    assert code == 1 and not report["ok"]
    found = states(report)
    assert "imported vllm.mod" in found["fine r1"]
    assert found["raises r1"][-1] == (
        "import FAILED: vllm.other does not import: RuntimeError: y is gone"
    )


def test_warn_lets_the_start_go_on_without_it(setup: tuple[Path, Path, Path]) -> None:
    code, report = prove(setup, PATCHSET_ON_FAILURE_RAISES="warn")
    assert code == 0 and report["ok"], report
    assert states(report)["raises r1"][-1].startswith("import FAILED (PATCHSET_ON_FAILURE_RAISES")
    assert report["on"] == ["fine"]


def test_an_import_that_hangs_is_bounded(setup: tuple[Path, Path, Path]) -> None:
    site = setup[1]
    (site / "vllm" / "__init__.py").write_text("import time\ntime.sleep(600)\n")
    started = time.monotonic()
    code, report = prove(setup, PATCHSET_IMPORT_TIMEOUT="2")
    assert time.monotonic() - started < 60
    assert code == 1
    assert "no answer in 2 s" in states(report)["fine r1"][-1]


def test_without_imports_nothing_is_imported(setup: tuple[Path, Path, Path]) -> None:
    bundle, site, bin_dir = setup
    done = run_entrypoint(bundle, site, bin_dir, "--prove", PATCHSET_COMPUTE_CAPABILITY="none")
    assert done.returncode == 0, done.stdout + done.stderr
    assert "import" not in json.dumps(json.loads(done.stdout.splitlines()[-1])["results"])


def test_verify_bundle_without_entrypoint_is_one_line(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """E21: a bundle missing entrypoint.py: one line, exit 2, before any engine is asked."""
    bundle = setup[0]
    broken = tmp_path / "broken"
    shutil.copytree(bundle, broken)
    (broken / "entrypoint.py").unlink()
    done = cli("verify", "some-image", "--bundle", broken)
    assert done.code == ExitCode.BAD_INPUT
    assert "Traceback" not in done.err and len(done.err.strip().splitlines()) == 1
    assert "no entrypoint.py: not a whole runtime export" in done.err


HANGING = "#!/bin/sh\nsleep 3600\n"


@pytest.mark.docker
@pytest.mark.network
def test_verify_on_an_image_whose_python_hangs_returns(
    docker_client: Any, setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """E11: the image's python3 never answers: `verify --bundle --timeout 5` returns, one
    line, its container gone."""
    import io
    import tarfile

    from tests.infra.standin import build_standin_base

    base = build_standin_base(docker_client, "0.20.0")
    context = io.BytesIO()
    with tarfile.open(fileobj=context, mode="w") as archive:
        for name, text, mode in (
            ("Dockerfile", "FROM " + base + "\nCOPY python3 /usr/local/bin/python3\n", 0o644),
            ("python3", HANGING, 0o755),
        ):
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(text.encode()), mode
            archive.addfile(info, io.BytesIO(text.encode()))
    context.seek(0)
    image, _ = docker_client.images.build(fileobj=context, custom_context=True, rm=True)
    try:
        started = time.monotonic()
        done = run_cli("verify", image.id, "--bundle", setup[0], "--timeout", "5", timeout=120)
        assert time.monotonic() - started < 100
        assert done.returncode == ExitCode.ATTENTION, done.stdout + done.stderr
        assert "no exit within 5 s" in done.stderr
        assert "Traceback" not in done.stderr
    finally:
        docker_client.images.remove(image.id, force=True)
