"""Opt-in (issue 35.8): a real vLLM wheel installed with pip into a cached venv (torch 2.13.0,
CPU, from this machine's disk), a bundle of stacked runtime patches on its own files, started
by the bundle's entrypoint with `--prove --imports` with that venv's Python: every module the
patches changed imports in the real vLLM.

Heavy (a vLLM wheel and its dependencies, several GB): it runs only with PATCHSET_REALVLLM=1
and is skipped otherwise (a skip is never a pass). The venv is kept under the release cache
(`realvllm/`), so a second run installs nothing.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.cachedir import cache_root
from patchset.image.export import export_runtime
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.folder import FolderSource
from tests.helpers.synthetic import PATCH_TOML, definition_text

pytestmark = [
    pytest.mark.realvllm,
    pytest.mark.network,
    pytest.mark.skipif(
        os.environ.get("PATCHSET_REALVLLM") != "1", reason="set PATCHSET_REALVLLM=1 to run"
    ),
]
VLLM = os.environ.get("PATCHSET_REALVLLM_VERSION", "0.20.0")
TORCH = "torch==2.13.0"  # the CPU build on this machine's disk
SKIPPED = ("torch", "torchaudio", "torchvision", "xformers", "flashinfer", "nvidia-", "triton")
# (file, anchor) in vLLM's own sources; two patches on one file, stacked without `requires`
SITES = [
    ("vllm/collect_env.py", "import datetime"),
    ("vllm/collect_env.py", "import locale"),
    ("vllm/envs.py", "import os"),
]


def venv() -> Path:
    """The cached venv holding vLLM (no CUDA extras) and torch 2.13.0; its site folder."""
    root = cache_root() / "realvllm" / f"vllm-{VLLM}-py{sys.version_info[0]}{sys.version_info[1]}"
    python = root / "bin" / "python"
    done = root / ".installed"
    if not done.is_file():
        subprocess.run([sys.executable, "-m", "venv", str(root)], check=True)
        pip = [str(python), "-m", "pip", "install", "-q"]
        subprocess.run([*pip, TORCH], check=True)
        subprocess.run([*pip, "--no-deps", f"vllm=={VLLM}"], check=True)
        needs = subprocess.run(
            [str(python), "-c", "import importlib.metadata as m; print('\\n'.join("
             "m.requires('vllm') or []))"],
            capture_output=True, text=True, check=True,
        ).stdout.splitlines()  # fmt: skip
        wanted = [
            r.split(";")[0].strip()
            for r in needs
            if "extra ==" not in r and not r.lower().startswith(SKIPPED)
        ]
        (root / "constraints.txt").write_text(TORCH + "\n")
        subprocess.run([*pip, "-c", str(root / "constraints.txt"), *wanted], check=True)
        done.write_text("ok\n")
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return Path(site)


def test_every_module_a_stacked_set_changed_imports_in_real_vllm(tmp_path: Path) -> None:
    site = venv()
    registry = tmp_path / "patches"
    ids = []
    for n, (file, anchor) in enumerate(SITES):
        patch_id = f"real-{n}"
        folder = registry / patch_id
        folder.mkdir(parents=True)
        (folder / "patch.toml").write_text(
            PATCH_TOML.format(
                id=patch_id, kind="runtime", vllm=f">={VLLM}", when="startup", targets=f'["{file}"]'
            )
        )
        (folder / "sites.toml").write_text(
            f'[[site]]\nname = "s"\nfile = "{file}"\naction = "insert-after"\n'
            f'marker = "patchset: {patch_id}"\nanchor = """\n{anchor}\n"""\n'
            f'text = """\nPATCHSET_REAL_{n} = {n}\n"""\n'
        )
        ids.append(patch_id)
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / f"{VLLM}.toml").write_text(definition_text(VLLM, ids))
    bundle = tmp_path / "bundle"
    export_runtime(
        load_definition(tmp_path / "builds" / f"{VLLM}.toml"),
        load_registry(registry),
        bundle,
        source=FolderSource(site),
    )
    python = site.parents[2] / "bin" / "python"
    saved = {f: (site / f).read_bytes() for f, _ in SITES}  # the cached venv stays the release's
    try:
        done = subprocess.run(
            [str(python), str(bundle / "entrypoint.py"), "--prove", "--imports"],
            capture_output=True,
            text=True,
            timeout=900,
            check=False,
            env={
                **os.environ,
                "PATCHSET_VLLM_ROOT": str(site),
                "PATCHSET_COMPUTE_CAPABILITY": "none",
                "PATCHSET_IMPORT_TIMEOUT": "600",
                "PATCHSET_PYCACHE": str(tmp_path / "pycache"),  # not the machine's /tmp
            },
        )
        report = json.loads(done.stdout.splitlines()[-1])
        states = {r["patch"]: r["state"] for r in report["results"]}
        assert report["ok"], report
        assert states["real-0 r1"] == "imported vllm.collect_env"
        assert states["real-1 r1"] == "imported vllm.collect_env"
        assert states["real-2 r1"] == "imported vllm.envs"
        assert report["on"] == ids
    finally:
        for file, data in saved.items():
            (site / file).write_bytes(data)
