"""The start decides each patch on the files it finds (issue 35.1): three patches changing one
file, each with its own switch, in all 8 on/off combinations; each start ends with each patch
applied or off as switched, the file exactly the release's with the ones on, the report naming
the set that was on. Run by this Python on a synthetic tree, and on the stand-in image."""

from __future__ import annotations

import itertools
import json
import subprocess
from pathlib import Path
from typing import Any

import pytest

from tests.helpers.synthetic import (
    BODY,
    add_patch,
    definition_text,
    exported_bundle,
    run_entrypoint,
    stand_in_vllm,
)

# three diffs on vllm/mod.py, none requiring another; the first is off by default
EDITS = {"p-low": 3, "p-mid": 11, "p-high": 17}
DEFAULTS = {"p-low": False, "p-mid": True, "p-high": True}


def diff_for(line: int) -> str:
    return (
        "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n"
        f"@@ -{line - 1},3 +{line - 1},3 @@\n"
        f" line {line - 1}\n-line {line}\n+line {line} = {line}\n line {line + 1}\n"
    )


def switch_of(patch_id: str) -> str:
    return "PS_" + patch_id.upper().replace("-", "_")


def expected(on: set[str]) -> str:
    text = BODY
    for patch_id in sorted(on):
        line = EDITS[patch_id]
        text = text.replace(f"line {line}\n", f"line {line} = {line}\n")
    return text


def registry_of(root: Path) -> Path:
    for patch_id, line in EDITS.items():
        default = "true" if DEFAULTS[patch_id] else "false"
        tail = f'\n[switch]\nenv = "{switch_of(patch_id)}"\ndefault = {default}\n'
        add_patch(
            root, patch_id, diff=diff_for(line), targets=["vllm/mod.py"], when="startup", tail=tail
        )
    return root


COMBINATIONS = [set(c) for n in range(4) for c in itertools.combinations(sorted(EDITS), n)]


def switches(on: set[str]) -> dict[str, str]:
    return {switch_of(p): "1" if p in on else "0" for p in EDITS}


def check_lines(out: str, on: set[str]) -> None:
    for patch_id in EDITS:
        state = next(x for x in out.splitlines() if x.startswith(f"patchset: {patch_id} r1"))
        if patch_id in on:
            assert state.endswith(("): applied", "): already-applied")), state
        else:
            assert "): off (" in state, state
    assert f"patchset: on: {', '.join(sorted(on)) or 'none'} (set " in out, out


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, Path, Path]:
    registry = registry_of(tmp_path / "patches")
    bundle, site = exported_bundle(
        tmp_path, registry, {"vllm/mod.py": BODY}, definition_text("0.20.0", list(EDITS))
    )
    return bundle, site, stand_in_vllm(tmp_path / "bin")


def start(setup: tuple[Path, Path, Path], **env: str) -> subprocess.CompletedProcess[str]:
    bundle, site, bin_dir = setup
    return run_entrypoint(bundle, site, bin_dir, PATCHSET_COMPUTE_CAPABILITY="none", **env)


def test_manifest_pins_each_file_once_as_the_release_has_it(
    setup: tuple[Path, Path, Path],
) -> None:
    manifest = json.loads((setup[0] / "manifest.json").read_text())
    assert manifest["schema"] == "patchset.manifest/2"
    import hashlib

    assert manifest["targets"] == {"vllm/mod.py": hashlib.sha256(BODY.encode()).hexdigest()}


@pytest.mark.parametrize("on", COMBINATIONS, ids=lambda on: "+".join(sorted(on)) or "none")
def test_every_combination_starts_with_each_patch_as_switched(
    setup: tuple[Path, Path, Path], on: set[str]
) -> None:
    done = start(setup, **switches(on))
    assert done.returncode == 0, done.stdout + done.stderr
    check_lines(done.stdout, on)
    assert (setup[1] / "vllm" / "mod.py").read_text() == expected(on)
    again = start(setup, **switches(on))  # a restarted container: found, nothing written
    assert again.returncode == 0, again.stdout + again.stderr
    for patch_id in on:
        assert f"patchset: {patch_id} r1 (startup): already-applied" in again.stdout
    assert (setup[1] / "vllm" / "mod.py").read_text() == expected(on)


def test_a_start_with_other_switches_on_a_patched_tree_gives_that_set(
    setup: tuple[Path, Path, Path],
) -> None:
    """Two containers on one vLLM volume, switched differently: each start's result is the
    release's file with its own set, whatever the one before left."""
    sequence = [*COMBINATIONS, *reversed(COMBINATIONS)]
    for on in sequence:
        done = start(setup, **switches(on))
        assert done.returncode == 0, done.stdout + done.stderr
        check_lines(done.stdout, on)
        assert (setup[1] / "vllm" / "mod.py").read_text() == expected(on)


def test_the_defaults_and_the_report_name_the_set(setup: tuple[Path, Path, Path]) -> None:
    bundle, site, bin_dir = setup
    done = run_entrypoint(bundle, site, bin_dir, "--prove", PATCHSET_COMPUTE_CAPABILITY="none")
    report = json.loads(done.stdout.splitlines()[-1])
    assert done.returncode == 0, done.stdout + done.stderr
    assert report["on"] == ["p-high", "p-mid"]
    assert len(report["on_digest"]) == 12
    assert (site / "vllm" / "mod.py").read_text() == expected({"p-mid", "p-high"})


def test_a_hand_edited_file_is_still_refused(setup: tuple[Path, Path, Path]) -> None:
    path = setup[1] / "vllm" / "mod.py"
    path.write_text(BODY.replace("line 5\n", "line 5 by hand\n"))
    done = start(setup)
    assert done.returncode == 9
    assert "vllm/mod.py differs from the file checked at build time (sha256)" in done.stdout
    assert path.read_text() == BODY.replace("line 5\n", "line 5 by hand\n")


# -- the same on the stand-in image ------------------------------------------------------------

ANCHORS = {  # vLLM 0.20.0's vllm/collect_env.py: three anchors, one file
    "p-low": "import datetime",
    "p-mid": "import locale",
    "p-high": "import os",
}


@pytest.fixture(scope="module")
def standin_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from patchset.image.export import export_runtime
    from patchset.registry import load_registry
    from patchset.registry.builds import load_definition
    from tests.helpers.synthetic import PATCH_TOML

    tmp = tmp_path_factory.mktemp("switch-stack")
    registry = tmp / "patches"
    for patch_id, anchor in ANCHORS.items():
        folder = registry / patch_id
        folder.mkdir(parents=True)
        head = PATCH_TOML.format(
            id=patch_id,
            kind="runtime",
            vllm=">=0.20.0",
            when="startup",
            targets='["vllm/collect_env.py"]',
        )
        default = "true" if DEFAULTS[patch_id] else "false"
        (folder / "patch.toml").write_text(
            head + f'\n[switch]\nenv = "{switch_of(patch_id)}"\ndefault = {default}\n'
        )
        mark = patch_id.upper().replace("-", "_")
        (folder / "sites.toml").write_text(
            f'[[site]]\nname = "s"\nfile = "vllm/collect_env.py"\naction = "insert-after"\n'
            f'marker = "patchset: {patch_id}"\nanchor = """\n{anchor}\n"""\n'
            f'text = """\nPS_{mark} = 1\n"""\n'
        )
    (tmp / "builds").mkdir()
    (tmp / "builds" / "0.20.0.toml").write_text(definition_text("0.20.0", list(ANCHORS)))
    folder = tmp / "bundle"
    export_runtime(load_definition(tmp / "builds" / "0.20.0.toml"), load_registry(registry), folder)
    return folder


PROBE = """
import re, subprocess, sys, os
done = subprocess.run([sys.executable, '/opt/patchset/entrypoint.py'],
                      env={**os.environ, 'PATCHSET_EXEC': 'true'}, capture_output=True, text=True)
print(done.stdout + done.stderr)
text = open('{site}/vllm/collect_env.py').read()
print('MARKS', sorted(set(re.findall(r'^PS_P_[A-Z]+ = 1$', text, re.M))))
print('EXIT', done.returncode)
"""


@pytest.mark.docker
@pytest.mark.network
@pytest.mark.parametrize("on", COMBINATIONS, ids=lambda on: "+".join(sorted(on)) or "none")
def test_on_the_standin_every_combination_starts_as_switched(
    docker_client: Any, standin_bundle: Path, tmp_path: Path, on: set[str]
) -> None:
    from tests.image.test_runtime_export import standin_site_packages_of
    from tests.infra.standin import build_standin_base

    image = build_standin_base(docker_client, "0.20.0")
    site = standin_site_packages_of(docker_client, image)
    (tmp_path / "probe.py").write_text(PROBE.replace("{site}", site))
    env = {**switches(on), "PATCHSET_COMPUTE_CAPABILITY": "none"}
    container = docker_client.containers.run(
        image,
        ["/opt/probe/probe.py"],
        entrypoint=["python3"],
        environment=env,
        volumes={
            str(standin_bundle): {"bind": "/opt/patchset", "mode": "ro"},
            str(tmp_path): {"bind": "/opt/probe", "mode": "ro"},
        },
        detach=True,
        network_mode="none",
    )
    try:
        container.wait(timeout=120)
        out = container.logs().decode()
    finally:
        container.remove(force=True)
    assert "EXIT 0" in out, out
    check_lines(out, on)
    marks = sorted(f"PS_{p.upper().replace('-', '_')} = 1" for p in on)
    assert f"MARKS {marks}" in out, out


# -- two starts on one tree (issue 37, E3) -----------------------------------------------------


def test_many_concurrent_double_starts_on_one_tree_all_end_patched(
    setup: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    """60 trials, each two starts at once on a fresh tree: both exit 0, the file ends with
    the set on, no temp file is left, and each start names the same set."""
    import shutil
    import sys

    bundle, site, bin_dir = setup
    pristine = tmp_path / "pristine"
    shutil.copytree(site, pristine)
    on = {"p-mid", "p-high"}
    for _trial in range(60):
        shutil.rmtree(site)
        shutil.copytree(pristine, site)
        env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "PYTHON": sys.executable,
            "PATCHSET_VLLM_ROOT": str(site),
            "PATCHSET_PYCACHE": str(tmp_path / "pycache"),
            "PATCHSET_COMPUTE_CAPABILITY": "none",
        }
        both = [
            subprocess.Popen(
                [sys.executable, str(bundle / "entrypoint.py")],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        outs = [p.communicate(timeout=120) for p in both]
        for proc, (out, err) in zip(both, outs, strict=True):
            assert proc.returncode == 0, out + err
            check_lines(out, on)
        assert (site / "vllm" / "mod.py").read_text() == expected(on)
        assert not [p for p in (site / "vllm").iterdir() if "patchset-new" in p.name]


def test_a_created_file_and_a_restart(tmp_path: Path) -> None:
    """A diff creating a file beside two on one file: found again at the restart."""
    registry = registry_of(tmp_path / "patches")
    created = "--- /dev/null\n+++ b/vllm/new.py\n@@ -0,0 +1,2 @@\n+x = 1\n+y = 2\n"
    add_patch(registry, "p-new", diff=created, targets=["vllm/new.py"], when="startup")
    bundle, site = exported_bundle(
        tmp_path, registry, {"vllm/mod.py": BODY}, definition_text("0.20.0", [*EDITS, "p-new"])
    )
    bin_dir = stand_in_vllm(tmp_path / "bin")
    for state in ("applied", "already-applied"):
        done = run_entrypoint(bundle, site, bin_dir, PATCHSET_COMPUTE_CAPABILITY="none")
        assert done.returncode == 0, done.stdout + done.stderr
        assert f"patchset: p-new r1 (startup): {state}\n" in done.stdout
        assert (site / "vllm" / "new.py").read_text() == "x = 1\ny = 2\n"
    done = run_entrypoint(bundle, site, bin_dir, PATCHSET_DISABLE="p-new")
    assert done.returncode == 0, done.stdout + done.stderr
    assert not (site / "vllm" / "new.py").exists()  # off now: the file it made is gone
