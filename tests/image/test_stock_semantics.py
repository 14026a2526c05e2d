"""Issue 24 end to end on the stand-in of the stock image (a real Docker engine): an exported
bundle of five patches on vLLM 0.20.0's own files, mounted read-only at /opt/patchset and
started as the docs say, then the exported compose.yaml brought up by Debian's
`docker-compose` against the local engine (only the GPU reservation dropped).

- a switch that is off by default, then on by its variable;
- a predicate on the served configuration and one on the GPU (PATCHSET_COMPUTE_CAPABILITY);
- a warn-policy failure (its proof fails) that serves, and the same with the policy `fail`;
- a support package imported by an inserted site in a process vLLM-style spawned (the
  stand-in has no torch: the import of vllm stops after our site ran, which is enough);
- `patchset verify IMAGE --bundle DIR` (and `--start` on a built image): the start's apply
  and proofs in a throwaway container, per patch `verified` or failed by its policy.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
import uuid
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchset.image.export import export_runtime
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from tests.helpers.cli import cli
from tests.helpers.synthetic import PATCH_TOML
from tests.image.test_runtime_export import FAKE_SMI, RTX_5090, recorded, run_stock
from tests.infra.run import image_repo, object_name
from tests.infra.standin import build_standin_base

pytestmark = [pytest.mark.docker, pytest.mark.network]
REPO = Path(__file__).parents[2]

# (id, file, anchor in vLLM 0.20.0, inserted text, patch.toml tables, sites.toml extra)
PATCHES = [
    ("off-default", "vllm/logger.py", "import datetime", "PS_E2E_OFF = 1",
     '[switch]\nenv = "PS_E2E_OFF"\ndefault = false\naliases = ["PS_E2E_OLD_OFF"]\n', ""),
    ("fp8-only", "vllm/scalar_type.py", "import functools", "PS_E2E_FP8 = 1",
     '[applies]\nkv_cache_dtype = "fp8*"\n', ""),
    ("sm12-only", "vllm/collect_env.py", "import datetime", "PS_E2E_SM12 = 1",
     '[applies]\ncompute_capability = ">=12.0"\n', ""),
    ("may-fail", "vllm/envs.py", "import functools", "PS_E2E_MAY_FAIL = 1",
     '[failure]\npolicy = "warn"\n\n[[verify]]\nfile = "vllm/envs.py"\ncontains = "NEVER_THERE"\n',
     ""),
    ("uses-support", "vllm/env_override.py", "import os", "import psup as _psup\n_psup.mark()",
     '[[verify]]\nfile = "vllm/env_override.py"\ncontains = "_psup.mark()"\n',
     'requires_modules = ["psup"]\n'),
    ("new-stack", "vllm/connections.py", "import asyncio", "PS_E2E_STACK = 1",
     '[applies]\nall = [{ cuda = ">=12.8" }, { driver = ">=570" }]\n', ""),
    # a pinned wheel and a pinned sdist (built below); vllm/__init__.py imports vllm.version first
    ("uses-pinned", "vllm/version.py",
     "# SPDX-FileCopyrightText: Copyright contributors to the vLLM project",
     "import pwheel as _pwheel\nimport psdist as _psdist\n_pwheel.mark()\n_psdist.mark()",
     '[[verify]]\nattribute = "pwheel:mark"\n\n[[verify]]\nmodule = "psdist"\n'
     'expr = "m.KIND == \'sdist\'"\n',
     'requires_modules = ["pwheel", "psdist"]\n'),
]  # fmt: skip
PSUP = """import os


def mark():
    with open(f"/tmp/psup-mark-{os.getpid()}", "w") as fh:
        fh.write(str(os.getpid()))
"""
PINNED = """import os

KIND = "{kind}"


def mark():
    with open(f"/tmp/{name}-mark-{{os.getpid()}}", "w") as fh:
        fh.write(str(os.getpid()))
"""


def pinned_wheel(folder: Path) -> str:
    """`pwheel` as a pure wheel written by hand (a zip: the package, its dist-info with
    METADATA, WHEEL and RECORD); its file name."""
    name = "pwheel-0.1.0-py3-none-any.whl"
    files = {
        "pwheel/__init__.py": PINNED.format(kind="wheel", name="pwheel").encode(),
        "pwheel-0.1.0.dist-info/METADATA": b"Metadata-Version: 2.1\nName: pwheel\nVersion: 0.1.0\n",
        "pwheel-0.1.0.dist-info/WHEEL": b"Wheel-Version: 1.0\nGenerator: tests\n"
        b"Root-Is-Purelib: true\nTag: py3-none-any\n",
    }
    record = "".join(
        f"{rel},sha256={base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b'=').decode()},"
        f"{len(data)}\n"
        for rel, data in files.items()
    )
    files["pwheel-0.1.0.dist-info/RECORD"] = (record + "pwheel-0.1.0.dist-info/RECORD,,\n").encode()
    with zipfile.ZipFile(folder / name, "w", zipfile.ZIP_DEFLATED) as archive:
        for rel, data in files.items():
            archive.writestr(rel, data)
    return name


def pinned_sdist(folder: Path) -> str:
    """`psdist` as an sdist (a tar.gz: its root folder, PKG-INFO, pyproject.toml and a src/
    layout); its file name."""
    name = "psdist-0.1.0.tar.gz"
    files = {
        "psdist-0.1.0/PKG-INFO": b"Metadata-Version: 2.1\nName: psdist\nVersion: 0.1.0\n",
        "psdist-0.1.0/pyproject.toml": b'[project]\nname = "psdist"\nversion = "0.1.0"\n',
        "psdist-0.1.0/src/psdist/__init__.py": PINNED.format(kind="sdist", name="psdist").encode(),
    }
    with tarfile.open(folder / name, "w:gz") as archive:
        for rel, data in files.items():
            info = tarfile.TarInfo(rel)
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return name


def pin(registry: Path, package: str, build: Callable[[Path], str]) -> None:
    folder = registry / "_support" / package
    folder.mkdir(parents=True)
    name = build(folder)
    sha = hashlib.sha256((folder / name).read_bytes()).hexdigest()
    (folder / "support.toml").write_text(
        f'name = "{package}"\nmodules = ["{package}"]\nfile = "{name}"\nsha256 = "{sha}"\n'
    )


# Stands for `vllm serve`: starts a process with spawn (as vLLM's engine core and workers
# are), which imports vllm (our site in vllm/env_override.py runs, then torch is missing).
SPAWNER = """#!/usr/bin/python3
import glob, json, multiprocessing, os, sys


def child():
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass


if __name__ == "__main__":
    proc = multiprocessing.get_context("spawn").Process(target=child)
    proc.start()
    proc.join()
    marks = {name: [open(m).read() for m in sorted(glob.glob(f"/tmp/{name}-mark-*"))]
             for name in ("psup", "pwheel", "psdist")}
    print(json.dumps({"argv": sys.argv[1:], "parent": os.getpid(), "marks": marks.pop("psup"),
                      "pinned": marks, "pythonpath": os.environ.get("PYTHONPATH", "")}))
"""


@pytest.fixture(scope="module")
def standin_020(docker_client: Any) -> str:
    return build_standin_base(docker_client, "0.20.0")


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("stock-semantics")
    registry = tmp / "patches"
    for patch_id, file, anchor, text, tables, extra in PATCHES:
        folder = registry / patch_id
        folder.mkdir(parents=True)
        head = PATCH_TOML.format(
            id=patch_id, kind="runtime", vllm=">=0.20.0", when="startup", targets=f'["{file}"]'
        )
        (folder / "patch.toml").write_text(head.replace("[upstream]", tables + "\n[upstream]"))
        (folder / "sites.toml").write_text(
            f'[[site]]\nname = "s"\nfile = "{file}"\naction = "insert-after"\n'
            f'marker = "patchset: {patch_id}"\nanchor = """\n{anchor}\n"""\n'
            f'text = """\n{text}\n"""\n{extra}'
        )
    package = registry / "_support" / "psup"
    (package / "src" / "psup").mkdir(parents=True)
    (package / "support.toml").write_text('name = "psup"\nmodules = ["psup"]\npath = "src"\n')
    (package / "src" / "psup" / "__init__.py").write_text(PSUP)
    pin(registry, "pwheel", pinned_wheel)
    pin(registry, "psdist", pinned_sdist)
    text = (REPO / "builds" / "0.20.0.toml").read_text()
    text = text.replace(
        'patches = ["tolist-cudagraph"]', f"patches = {json.dumps([p[0] for p in PATCHES])}"
    )
    text = text.replace(
        '"--dtype", "float16",', '"--dtype", "float16", "--kv-cache-dtype", "fp8_e4m3",'
    )
    (tmp / "builds").mkdir()
    (tmp / "builds" / "0.20.0.toml").write_text(text)
    folder = tmp / "bundle"
    export_runtime(load_definition(tmp / "builds" / "0.20.0.toml"), load_registry(registry), folder)
    (tmp / "bin").mkdir()
    (tmp / "bin" / "vllm").write_text(SPAWNER)
    (tmp / "bin" / "vllm").chmod(0o755)
    return folder


def start(client: Any, image: str, bundle: Path, *args: str, **env: str) -> tuple[int, str]:
    env.setdefault("PATCHSET_COMPUTE_CAPABILITY", "none")
    env.setdefault("PATCHSET_EXEC", "/opt/e2e/vllm")
    status, out, _ = run_stock(
        client, image, bundle, *args, env=env, mounts={str(bundle.parent / "bin"): "/opt/e2e"}
    )
    return status, out


def line(out: str, patch_id: str) -> str:
    prefix = f"patchset: {patch_id} r1 (startup): "
    return next(x.removeprefix(prefix) for x in out.splitlines() if x.startswith(prefix))


def test_switch_off_by_default_then_on(docker_client: Any, standin_020: str, bundle: Path) -> None:
    status, out = start(docker_client, standin_020, bundle)
    assert status == 0, out
    assert line(out, "off-default") == "off (by default; PS_E2E_OFF=1 turns it on)"
    status, out = start(docker_client, standin_020, bundle, PS_E2E_OFF="1")
    assert status == 0 and line(out, "off-default") == "applied", out


def test_predicates_on_served_config_and_gpu(
    docker_client: Any, standin_020: str, bundle: Path
) -> None:
    status, out = start(docker_client, standin_020, bundle, PATCHSET_COMPUTE_CAPABILITY="12.0")
    assert status == 0, out
    assert line(out, "fp8-only") == "applied"  # the definition serves an fp8 KV cache
    assert line(out, "sm12-only") == "applied"
    status, out = start(
        docker_client,
        standin_020,
        bundle,
        "--kv-cache-dtype",
        "auto",
        PATCHSET_COMPUTE_CAPABILITY="8.6",
    )
    assert status == 0, out
    assert line(out, "fp8-only") == "skipped (applies: kv_cache_dtype = 'fp8*' is false here)"
    assert (
        line(out, "sm12-only") == "skipped (applies: compute_capability = '>=12.0' is false here)"
    )


def test_driver_and_cuda_from_nvidia_smi_and_dist_info(
    docker_client: Any, standin_020: str, bundle: Path, tmp_path: Path
) -> None:
    """`[applies]` on the CUDA runtime and the NVIDIA driver with neither variable set: unknown
    (and named) on the bare stand-in; known once a fake nvidia-smi answers the one query
    (driver 580.82.07) and the CUDA runtime's dist-info is in dist-packages."""
    status, out = start(docker_client, standin_020, bundle)
    assert status == 0, out
    assert line(out, "new-stack").startswith("skipped (applies: unknown here: cuda"), out
    smi = tmp_path / "nvidia-smi"
    smi.write_text(FAKE_SMI.format(line=RTX_5090))
    smi.chmod(0o755)
    info = tmp_path / "nvidia_cuda_runtime_cu12-12.8.90.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: nvidia-cuda-runtime-cu12\nVersion: 12.8.90\n"
    )
    site = "/usr/local/lib/python3.11/dist-packages"
    status, out, _ = run_stock(
        docker_client,
        standin_020,
        bundle,
        env={"PATCHSET_EXEC": "/opt/e2e/vllm"},  # no PATCHSET_COMPUTE_CAPABILITY: nvidia-smi
        mounts={
            str(bundle.parent / "bin"): "/opt/e2e",
            str(smi): "/usr/local/bin/nvidia-smi",
            str(info): f"{site}/{info.name}",
        },
    )
    assert status == 0, out
    assert "GPU: 12.0 (NVIDIA GeForce RTX 5090)" in out
    assert line(out, "new-stack") == "applied"


def test_warn_failure_serves_and_fail_refuses(
    docker_client: Any, standin_020: str, bundle: Path
) -> None:
    status, out = start(docker_client, standin_020, bundle)
    assert status == 0, out
    assert "may-fail failed; its policy is warn: starting vllm without it" in out
    assert any(
        x.startswith("patchset: may-fail r1 (startup): verify FAILED (its [failure] policy = warn)")
        for x in out.splitlines()
    ), out
    assert recorded(out)["argv"][0] == "serve"
    status, out = start(docker_client, standin_020, bundle, PATCHSET_ON_FAILURE_MAY_FAIL="fail")
    assert status == 9, out
    assert "patchset: may-fail r1 (startup): verify FAILED: verify vllm/envs.py contains" in out
    assert "not starting vllm" in out


def test_support_package_in_a_spawned_process(
    docker_client: Any, standin_020: str, bundle: Path
) -> None:
    status, out = start(docker_client, standin_020, bundle)
    assert status == 0, out
    assert line(out, "uses-support") == "applied"
    assert "patchset: uses-support r1 (startup): verified" in out
    got = recorded(out)
    assert "/opt/patchset/support/psup" in got["pythonpath"].split(":")
    assert got["marks"] and all(int(m) != got["parent"] for m in got["marks"])  # the child's


def outcomes(out: str) -> dict[str, str]:
    report = json.loads(out)
    assert report["mode"] == "start"
    return {p["patch"].removesuffix(" r1"): p["outcome"] for p in report["patches"]}


def test_verify_proves_a_bundles_startup_patches(
    docker_client: Any, standin_020: str, bundle: Path
) -> None:
    """`patchset verify IMAGE --bundle DIR`: the startup patches applied and their proofs run
    in a throwaway container of the stock image, with no vllm serve; a warn-policy failure
    leaves the verdict good, the policy `fail` (one --env) makes it exit 1."""
    env = ["--env", "PATCHSET_COMPUTE_CAPABILITY=12.0"]
    args: list[str | Path] = ["verify", standin_020, "--bundle", bundle, "--format", "json", *env]
    result = cli(*args)
    assert result.code == 0, result.err
    assert outcomes(result.out) == {
        "off-default": "off",
        "fp8-only": "applied",
        "sm12-only": "applied",
        "may-fail": "failed (warn)",
        "uses-support": "verified",
        "uses-pinned": "verified",
        "new-stack": "skipped",
    }
    assert json.loads(result.out)["ok"] is True
    result = cli(*args, "--env", "PS_E2E_OFF=1", "--env", "PATCHSET_ON_FAILURE_MAY_FAIL=fail")
    assert result.code == 1, result.err
    got = outcomes(result.out)
    assert got["off-default"] == "applied" and got["may-fail"] == "failed (fail)"
    table = cli("verify", standin_020, "--bundle", bundle, *env)
    assert table.code == 0, table.err
    assert "uses-support r1 (startup): verified" in table.out
    assert "the start would serve" in table.out
    # the present-only check of the same bundle does not get this far: --env needs a start
    assert cli("verify", standin_020, "--env", "A=1").code == 2
    assert cli("verify", standin_020, "--bundle", bundle.parent / "patches").code == 2


def test_pinned_wheel_and_sdist_in_a_spawned_process(
    docker_client: Any, standin_020: str, bundle: Path
) -> None:
    """Support packages of kind wheel and sdist (a pinned file and its sha256): the bundle
    carries the wheel as it is and the sdist's package unpacked, the start imports both and
    their proofs (an attribute, an expression) run in fresh interpreters, and the site vLLM's
    spawned process imports runs both."""
    carried = sorted(p.relative_to(bundle).as_posix() for p in (bundle / "support").rglob("*.*"))
    assert "support/pwheel/pwheel-0.1.0-py3-none-any.whl" in carried
    assert "support/psdist/psdist/__init__.py" in carried
    status, out = start(docker_client, standin_020, bundle)
    assert status == 0, out
    assert line(out, "uses-pinned") == "applied"
    assert "patchset: uses-pinned r1 (startup): verified" in out
    got = recorded(out)
    path = got["pythonpath"].split(":")
    assert "/opt/patchset/support/pwheel/pwheel-0.1.0-py3-none-any.whl" in path
    assert "/opt/patchset/support/psdist" in path
    for name in ("pwheel", "psdist"):
        pids = got["pinned"][name]
        assert pids and all(int(pid) != got["parent"] for pid in pids), got  # the child's


def test_the_exported_compose_file_comes_up(
    docker_client: Any, standin_020: str, bundle: Path, tmp_path: Path
) -> None:
    """The compose.yaml as exported, with only the GPU reservation dropped and the image
    pointed at the stand-in (a run-specific tag); the switch lines are its own comments."""
    if shutil.which("docker-compose") is None:  # never skipped: provision.sh installs it
        pytest.fail("no docker-compose on PATH: run tests/infra/provision.sh", pytrace=False)
    compose = yaml.safe_load((bundle / "compose.yaml").read_text())
    assert (
        '# PS_E2E_OFF: "1"  # off-default: off by default' in (bundle / "compose.yaml").read_text()
    )
    service = compose["services"]["vllm"]
    del service["deploy"]  # no GPU here
    tag = f"{image_repo('compose-standin')}:{uuid.uuid4().hex[:12]}"
    docker_client.images.get(standin_020).tag(tag)
    try:
        service["image"] = tag
        service["environment"]["PATCHSET_COMPUTE_CAPABILITY"] = "none"
        service["environment"]["PS_E2E_OFF"] = "1"  # one line switches a patch on
        service["volumes"] = [f"{bundle}:/opt/patchset:ro"]
        service.pop("ports")
        service["network_mode"] = "none"
        (tmp_path / "compose.yaml").write_text(yaml.safe_dump(compose))
        compose_cmd = ["docker-compose", "-p", object_name(uuid.uuid4().hex[:8])]
        done = subprocess.run(
            [*compose_cmd, "up", "--abort-on-container-exit", "--no-color"],
            cwd=tmp_path, capture_output=True, text=True, timeout=300, check=False,
        )  # fmt: skip
        logs = done.stdout + done.stderr
        subprocess.run(
            [*compose_cmd, "down", "-v"],
            cwd=tmp_path,
            capture_output=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0, logs
        assert "off-default r1 (startup): applied" in logs
        assert "patchset: ready in" in logs and '"argv": ["serve"' in logs
    finally:
        docker_client.images.remove(tag)


def test_a_built_image_honours_the_same_semantics(
    docker_client: Any, standin_020: str, bundle: Path, tmp_path: Path
) -> None:
    """`patchset build` of the same patches on the stand-in: the definition's `[switches]`
    turns off-default on for this image (its variable still wins at start), the support
    package is in /opt/patchset/support, and the image verifies."""
    from patchset.adapters.dockerengine import Engine
    from patchset.image.build import build
    from patchset.image.verify import per_patch, prove_start, verify_image
    from tests.infra.standin import built_repository, for_tests

    repository = image_repo(f"semantics-{uuid.uuid4().hex[:8]}")
    text = for_tests((bundle.parent / "builds" / "0.20.0.toml").read_text())
    text = text.replace(f'"{built_repository()}"', f'"{repository}"')
    (tmp_path / "0.20.0.toml").write_text(text + "\n[switches]\nPS_E2E_OFF = true\n")
    engine = Engine(docker_client)
    report = build(
        load_definition(tmp_path / "0.20.0.toml"),
        load_registry(bundle.parent / "patches"),
        engine=engine,
    )
    try:
        env = {"PATCHSET_COMPUTE_CAPABILITY": "12.0"}
        status, out, _ = run_stock(docker_client, report.image_id, None, env=env)
        assert status == 0, out
        assert line(out, "off-default") == "applied"  # on in this image by its definition
        assert line(out, "uses-support") == "applied"
        assert line(out, "sm12-only") == "applied"
        assert "patchset: uses-support r1 (startup): verified" in out
        status, out, _ = run_stock(  # the pinned wheel and sdist, in a spawned process
            docker_client,
            report.image_id,
            None,
            env={**env, "PATCHSET_EXEC": "/opt/e2e/vllm"},
            mounts={str(bundle.parent / "bin"): "/opt/e2e"},
        )
        assert status == 0 and line(out, "uses-pinned") == "applied", out
        pinned = recorded(out)["pinned"]
        assert pinned["pwheel"] and pinned["psdist"], out
        status, out, _ = run_stock(
            docker_client, report.image_id, None, env={**env, "PS_E2E_OFF": "0"}
        )
        assert status == 0 and line(out, "off-default").startswith("off (PS_E2E_OFF=0;"), out
        # the image carries switches.json as a bundle does: an alias maps, a typo is named
        status, out, _ = run_stock(
            docker_client,
            report.image_id,
            None,
            env={**env, "PS_E2E_OLD_OFF": "0", "PS_E2E_OFFF": "1"},
        )
        assert status == 0 and line(out, "off-default").startswith("off (PS_E2E_OFF=0;"), out
        assert (
            "patchset: switch PS_E2E_OLD_OFF: an alias of PS_E2E_OFF, the switch of"
            " off-default (mapped)" in out
        ), out
        assert "PS_E2E_OFFF=1: names no switch of this bundle's registry; nearest" in out, out
        # its startup patches' proofs: only a start runs them (`verify --start`)
        present = verify_image(engine, report.image_id)
        assert not any(r.state == "verified" for r in present.results), present
        proved = prove_start(engine, report.image_id, environment=env)
        assert {p.patch: p.outcome for p in per_patch(proved)}["uses-support r1"] == "verified"
        assert proved.ok
    finally:
        for tag in report.tags:
            engine.untag(tag)
