"""`patchset runtime export` against a real Docker engine: the bundle mounted read-only into
the stand-in of the stock image (Debian + python3 + the real vLLM sources of the release, at
the official layout; no image can be pulled here), started with ``--entrypoint python3``.

The stand-in's ``vllm`` records its argv and environment instead of serving (see
tests/infra/standin.py). The release's files for the export come from the package index's
wheel or sdist (cached): files equal to those the stand-in carries (from the sdist).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchset.image.export import export_runtime
from patchset.registry import load_registry
from patchset.registry.builds import BuildDefinition, load_definition
from tests.helpers.cli import run_cli
from tests.infra.docker_fixtures import StandinImage
from tests.infra.standin import (
    build_standin_base,
    for_tests,
    standin_site_packages,
    standin_tag,
)

pytestmark = [pytest.mark.docker, pytest.mark.network]
REPO = Path(__file__).parents[2]
REGISTRY = load_registry(REPO / "patches")
TURBO = "vllm/v1/attention/backends/turboquant_attn.py"
FLA = "vllm/model_executor/layers/fla/ops/utils.py"

# What a real nvidia-smi prints for
# `--query-gpu=name,compute_cap,driver_version --format=csv,noheader`.
FAKE_SMI = """#!/bin/sh
if [ "$1" != "--query-gpu=name,compute_cap,driver_version" ] \\
        || [ "$2" != "--format=csv,noheader" ]; then
    echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2
fi
echo "{line}"
"""
RTX_5090 = "NVIDIA GeForce RTX 5090, 12.0, 580.82.07"
RTX_3090 = "NVIDIA GeForce RTX 3090, 8.6, 575.57.08"


@pytest.fixture(scope="module")
def standin_020(docker_client: Any) -> str:
    return build_standin_base(docker_client, "0.20.0")


def export(tmp_path: Path, build: str, name: str = "bundle", registry: Any = None) -> Path:
    folder = tmp_path / name
    export_runtime(load_definition(REPO / "builds" / build), registry or REGISTRY, folder)
    return folder


def export_cli(dest: Path, build: Path, *more: str) -> subprocess.CompletedProcess[str]:
    """`patchset runtime export DEST --build BUILD ... --format json`, as a user runs it."""
    return run_cli("runtime", "export", str(dest), "--build", str(build), *more, "--format", "json")


def run_stock(
    client: Any,
    image: str,
    bundle: Path | None,
    *args: str,
    env: dict[str, str] | None = None,
    user: str | None = None,
    mounts: dict[str, str] | None = None,
    keep: bool = False,
) -> tuple[int, str, Any]:
    """Start the stock image as the docs say: bundle read-only at /opt/patchset,
    `--entrypoint python3 ... /opt/patchset/entrypoint.py ARGS`."""
    volumes = {str(bundle): {"bind": "/opt/patchset", "mode": "ro"}} if bundle else {}
    for host, inside in (mounts or {}).items():
        volumes[host] = {"bind": inside, "mode": "ro"}
    container = client.containers.run(
        image,
        ["/opt/patchset/entrypoint.py", *args],
        entrypoint=["python3"],
        environment=env or {},
        volumes=volumes,
        user=user or "",
        detach=True,
        network_mode="none",
    )
    status = container.wait(timeout=120)["StatusCode"]
    logs = container.logs().decode()
    if not keep:
        container.remove(force=True)
    return status, logs, container


def file_sha(client: Any, container: Any, path: str) -> str:
    """sha256 of a file in a stopped container (copied out through the engine)."""
    import io
    import tarfile

    stream, _ = client.api.get_archive(container.id, path)
    with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as archive:
        member = archive.extractfile(archive.getmembers()[0])
        assert member is not None
        return hashlib.sha256(member.read()).hexdigest()


def recorded(out: str) -> dict[str, Any]:
    result: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return result


def test_export_writes_bundle_compose_and_run_line(tmp_path: Path) -> None:
    proc = export_cli(tmp_path / "rt", REPO / "builds" / "0.20.0.toml")
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    bundle = tmp_path / "rt"
    assert {"entrypoint.py", "manifest.json", "compose.yaml", "docker-run.sh"} <= set(
        report["files"]
    )
    assert "patchset_kernel/hunks.py" in report["files"]
    assert "payloads/tolist-cudagraph/sites.toml" in report["files"]
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["delivery"] == "stock" and manifest["vllm"] == "0.20.0"
    assert manifest["release_files"].startswith("index ")  # the release's wheel, or its sdist
    assert "vllm-0.20.0" in manifest["release_files"]
    compose = yaml.safe_load((bundle / "compose.yaml").read_text())
    service = compose["services"]["vllm"]
    assert service["image"] == "vllm/vllm-openai:v0.20.0-cu130"
    assert service["entrypoint"] == ["python3", "/opt/patchset/entrypoint.py"]
    assert "./:/opt/patchset:ro" in service["volumes"]
    assert service["environment"]["NCCL_P2P_DISABLE"] == "1"
    line = report["docker_run"]
    assert f"-v {bundle.resolve()}:/opt/patchset:ro" in line
    assert line.endswith(
        "--entrypoint python3 vllm/vllm-openai:v0.20.0-cu130 /opt/patchset/entrypoint.py"
    )
    # every file readable by any user (the container may run as another one), none writable
    assert all(oct(p.stat().st_mode)[-3:] in ("644", "755") for p in bundle.rglob("*"))
    # a folder that holds something else is refused, with nothing written
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    proc = run_cli("runtime", "export", str(other), "--build", str(REPO / "builds" / "0.20.0.toml"))
    assert proc.returncode == 2 and "not empty" in proc.stderr, proc.stderr
    assert sorted(p.name for p in other.iterdir()) == ["keep.txt"]


def test_stock_image_read_only_mount_restart_and_switches(
    tmp_path: Path, docker_client: Any, standin_020: str
) -> None:
    bundle = export(tmp_path, "0.20.0.toml")
    status, out, container = run_stock(
        docker_client, standin_020, bundle, "--port", "9000", keep=True
    )
    try:
        assert status == 0, out
        assert "patchset: tolist-cudagraph r1 (startup): applied" in out
        assert "patchset: vLLM 0.20.0 at /usr/local/lib/python3." in out
        args = recorded(out)["argv"]
        assert args[:3] == ["serve", "--model", "Lorbus/Qwen3.6-27B-int4-AutoRound"]
        assert args[-2:] == ["--port", "9000"]  # the definition's arguments, then the user's
        assert recorded(out)["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "1"  # from the manifest
        site = standin_site_packages_of(docker_client, standin_020)
        patched = file_sha(docker_client, container, f"{site}/{TURBO}")
        # the same container started again: the patch is found present, not applied twice
        container.start()
        assert container.wait(timeout=120)["StatusCode"] == 0
        again = container.logs().decode()
        assert again.count("tolist-cudagraph r1 (startup): already-applied") == 1
        assert file_sha(docker_client, container, f"{site}/{TURBO}") == patched
    finally:
        container.remove(force=True)
    assert not list(bundle.rglob("__pycache__"))
    # PATCHSET_DISABLE and PATCHSET_ONLY, reported in the start-up lines
    status, out, _ = run_stock(
        docker_client, standin_020, bundle, env={"PATCHSET_DISABLE": "tolist-cudagraph"}
    )
    assert status == 0 and "tolist-cudagraph r1 (startup): disabled (PATCHSET_DISABLE)" in out
    status, out, _ = run_stock(
        docker_client, standin_020, bundle, env={"PATCHSET_ONLY": "tolist-cudagraph"}
    )
    assert status == 0 and "tolist-cudagraph r1 (startup): applied" in out
    # an id that is not in the bundle: one line, start refused (exit 9), or go on with warn
    status, out, _ = run_stock(
        docker_client, standin_020, bundle, env={"PATCHSET_DISABLE": "no-such-patch"}
    )
    assert status == 9, out
    assert "PATCHSET_DISABLE names no-such-patch, not in this manifest" in out
    assert "Traceback" not in out and '"argv"' not in out
    status, out, _ = run_stock(
        docker_client,
        standin_020,
        bundle,
        env={"PATCHSET_DISABLE": "no-such-patch", "PATCHSET_ON_FAILURE": "warn"},
    )
    assert status == 0 and "starting vllm unpatched" in out and '"argv": ["serve"' in out


def standin_site_packages_of(client: Any, image: str) -> str:
    from patchset.adapters.dockerengine import Engine

    return standin_site_packages(Engine(client), image)


NO_STRAY = """
import hashlib, os, pathlib, subprocess, sys
root = pathlib.Path('{site}/vllm')
def snap():
    return {{str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in root.rglob('*') if p.is_file()}}
before = snap()
done = subprocess.run([sys.executable, '/opt/patchset/entrypoint.py'],
                      env={{**os.environ, 'PATCHSET_EXEC': 'true'}}, capture_output=True, text=True)
after = snap()
print(done.stdout + done.stderr)
print('CHANGED', sorted(p.split('/vllm/', 1)[1] for p in after if before.get(p) != after[p]))
print('NEW', sorted(p for p in after if p not in before))
"""


def test_stock_start_touches_only_its_files(
    tmp_path: Path, docker_client: Any, standin_020: str
) -> None:
    bundle = export(tmp_path, "0.20.0.toml")
    site = standin_site_packages_of(docker_client, standin_020)
    script = tmp_path / "t"
    script.mkdir()
    (script / "nostray.py").write_text(NO_STRAY.format(site=site))
    container = docker_client.containers.run(
        standin_020,
        ["/t/nostray.py"],
        entrypoint=["python3"],
        volumes={
            str(bundle): {"bind": "/opt/patchset", "mode": "ro"},
            str(script): {"bind": "/t", "mode": "ro"},
        },
        detach=True,
        network_mode="none",
    )
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0
        out = container.logs().decode()
    finally:
        container.remove(force=True)
    assert "tolist-cudagraph r1 (startup): applied" in out, out
    assert "CHANGED ['v1/attention/backends/turboquant_attn.py']" in out
    assert "NEW []" in out  # no .pyc, no temporary file left in vLLM's tree


def test_stock_refusals(tmp_path: Path, docker_client: Any, standin_020: str) -> None:
    # a bundle for 0.19.1 in the 0.20.0 image: refused, both releases named
    old = export(tmp_path, "0.19.1.toml", "b0191")
    status, out, _ = run_stock(docker_client, standin_020, old)
    assert status == 9, out
    assert "this bundle is for vLLM 0.19.1, but the image holds vLLM 0.20.0" in out
    assert '"argv"' not in out
    # a tampered payload, and a tampered manifest: refused, vLLM's file untouched
    bundle = export(tmp_path, "0.20.0.toml")
    sites = bundle / "payloads" / "tolist-cudagraph" / "sites.toml"
    original = sites.read_bytes()
    sites.write_bytes(original + b"\n# tampered\n")
    status, out, _ = run_stock(docker_client, standin_020, bundle)
    assert status == 9 and "differs from the one exported (sha256)" in out, out
    assert "vLLM's files are left as they were" in out
    sites.write_bytes(original)
    manifest_path = bundle / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    manifest["patches"][0]["sites"][0]["text"] += "\n# changed"
    manifest_path.write_text(json.dumps(manifest))
    for policy, code in (("fail", 9), ("warn", 0)):
        status, out, container = run_stock(
            docker_client, standin_020, bundle, env={"PATCHSET_ON_FAILURE": policy}, keep=True
        )
        try:
            assert status == code, out
            assert "FAILED" in out and "the result differs from the one checked" in out
            site = standin_site_packages_of(docker_client, standin_020)
            assert (
                file_sha(docker_client, container, f"{site}/{TURBO}")
                == manifest["patches"][0]["files"][TURBO]["before"]
            )  # untouched
        finally:
            container.remove(force=True)
    assert '"argv": ["serve"' in out  # warn: vLLM started, unpatched
    # no bundle mounted: the manifest is not there
    status, out, _ = run_stock(docker_client, standin_020, None)
    assert status != 0 and "/opt/patchset/entrypoint.py" in out and '"argv"' not in out
    # a bundle without its manifest: one line, refused; with warn, vllm starts unpatched
    manifest_path.unlink()
    status, out, _ = run_stock(docker_client, standin_020, bundle)
    assert status == 9 and "cannot read /opt/patchset/manifest.json" in out, out
    assert out.count("\n") <= 2 and "Traceback" not in out
    status, out, _ = run_stock(
        docker_client, standin_020, bundle, "--port", "1", env={"PATCHSET_ON_FAILURE": "warn"}
    )
    assert status == 0 and recorded(out)["argv"] == ["serve", "--port", "1"]


def test_stock_as_another_user(tmp_path: Path, docker_client: Any, standin_020: str) -> None:
    bundle = export(tmp_path, "0.20.0.toml")
    status, out, _ = run_stock(docker_client, standin_020, bundle, user="1000:1000")
    assert status == 9, out
    assert "is not writable by uid 1000: start the container as the user that owns" in out
    assert "Traceback" not in out
    # a manifest that user cannot read: one line, refused
    (bundle / "manifest.json").chmod(0o600)
    status, out, _ = run_stock(docker_client, standin_020, bundle, user="1000:1000")
    assert status == 9 and "cannot read /opt/patchset/manifest.json: Permission denied" in out
    assert "Traceback" not in out


def test_the_printed_docker_run_line_runs(
    tmp_path: Path, docker_client: Any, standin_020: str
) -> None:
    """The `docker run` line of the report, run by the shell through the docker CLI, less
    `--gpus all` (no GPU runtime here) and with no network."""
    home = tmp_path / "home"
    home.mkdir()
    build = tmp_path / "0.20.0.toml"  # the base named by the stand-in's test-only tag
    build.write_text(for_tests((REPO / "builds" / "0.20.0.toml").read_text()))
    proc = export_cli(tmp_path / "rt", build)
    line = json.loads(proc.stdout)["docker_run"]
    assert " --gpus all " in line and line.startswith("docker run --rm ")
    line = line.replace(" --gpus all ", " --network none ").replace(" -p 8000:8000 ", " ")
    done = subprocess.run(
        ["sh", "-c", f"{line} --port 9"],
        capture_output=True,
        text=True,
        check=False,
        env={"HOME": str(home), "PATH": "/usr/local/bin:/usr/bin:/bin"},
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert "tolist-cudagraph r1 (startup): applied" in done.stdout
    assert recorded(done.stdout)["argv"][-2:] == ["--port", "9"]
    assert (home / ".cache" / "huggingface").is_dir()  # the cache mount is the user's


def test_compute_capability_from_a_fake_nvidia_smi(
    tmp_path: Path, docker_client: Any, standin_base: StandinImage
) -> None:
    """fla-tma-sm12x (scope >=12.0, a build-time patch) from a 0.19.1 bundle: applied at start
    on an RTX 5090, skipped on an RTX 3090, and the override wins over nvidia-smi."""
    bundle = export(tmp_path, "0.19.1.toml")
    smi: dict[str, Path] = {}
    for name, line in (("5090", RTX_5090), ("3090", RTX_3090)):
        smi[name] = tmp_path / f"nvidia-smi-{name}"
        smi[name].write_text(FAKE_SMI.format(line=line))
        smi[name].chmod(0o755)
    status, out, _ = run_stock(
        docker_client,
        standin_base.id,
        bundle,
        mounts={str(smi["5090"]): "/usr/local/bin/nvidia-smi"},
    )
    assert status == 0, out
    assert "GPU: 12.0 (NVIDIA GeForce RTX 5090)" in out
    assert "patchset: fla-tma-sm12x r1 (build): applied" in out
    status, out, _ = run_stock(
        docker_client,
        standin_base.id,
        bundle,
        mounts={str(smi["3090"]): "/usr/local/bin/nvidia-smi"},
    )
    assert status == 0, out
    assert "GPU: 8.6 (NVIDIA GeForce RTX 3090)" in out
    assert (
        "fla-tma-sm12x r1 (build): skipped (scope cc >=12.0, this GPU: 8.6 (NVIDIA GeForce RTX"
        " 3090))" in out
    )
    status, out, _ = run_stock(
        docker_client,
        standin_base.id,
        bundle,
        env={"PATCHSET_COMPUTE_CAPABILITY": "12.0"},
        mounts={str(smi["3090"]): "/usr/local/bin/nvidia-smi"},
    )
    assert "GPU: 12.0 (PATCHSET_COMPUTE_CAPABILITY)" in out
    assert "fla-tma-sm12x r1 (build): applied" in out


def broken_bundle(tmp_path: Path) -> tuple[Path, dict[str, Any]]:
    """The 0.20.0 bundle with site A's text re-indented so the file no longer compiles (and the
    manifest's digests made to match, as an export that missed it would write them)."""
    from patchset.engine.evaluate import evaluate_runtime
    from patchset.kernel.sites import Site
    from patchset.registry import Variant
    from tests.infra.standin import fetch_sdist

    bundle = export(tmp_path, "0.20.0.toml")
    manifest = json.loads((bundle / "manifest.json").read_text())
    entry = manifest["patches"][0]
    entry["sites"][0]["text"] = "      " + entry["sites"][0]["text"]  # an unexpected indent
    import tarfile

    with tarfile.open(fetch_sdist("0.20.0")) as archive:
        handle = archive.extractfile(f"vllm-0.20.0/{TURBO}")
        assert handle is not None
        original = handle.read()
    variant = Variant("sites.toml", REGISTRY.get("tolist-cudagraph").vllm, "", sites=tuple(
        Site.from_dict(s) for s in entry["sites"]))  # fmt: skip
    ev = evaluate_runtime(variant, {TURBO: original}.get, compile_check=False)
    assert ev.state == "applies"
    entry["files"][TURBO]["after"] = hashlib.sha256(ev.changes[TURBO]).hexdigest()
    from patchset.kernel.manifest import PatchEntry

    entry["edits_sha256"] = PatchEntry.from_json(entry, "edited").edits_digest()  # sealed too
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    return bundle, entry


def test_compile_check_at_start(tmp_path: Path, docker_client: Any, standin_020: str) -> None:
    bundle, entry = broken_bundle(tmp_path)
    status, out, container = run_stock(docker_client, standin_020, bundle, keep=True)
    try:
        assert status == 9, out
        assert f"tolist-cudagraph r1 (startup): FAILED: {TURBO}:" in out
        assert "(does not compile after patching)" in out
        site = standin_site_packages_of(docker_client, standin_020)
        assert (
            file_sha(docker_client, container, f"{site}/{TURBO}")
            == (entry["files"][TURBO]["before"])
        )
    finally:
        container.remove(force=True)


def python_registry(tmp_path: Path, body: str) -> Any:
    """The repository's patches plus a python patch that wraps vllm.envs.is_set."""
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    folder = patches / "envs-probe"
    folder.mkdir()
    (folder / "patch.toml").write_text(
        'id = "envs-probe"\ntitle = "Wrap vllm.envs.is_set"\n'
        'description = "A test plugin: wraps is_set and records the process."\n'
        'kind = "python"\nrevision = 1\nvllm = ">=0.20.0,<0.21.0"\napply = "startup"\n'
        'targets = ["vllm/envs.py"]\ntouches = ["vllm.envs:is_set"]\n'
        'origin = "tests"\ncredit = ["tests"]\n\n[upstream]\nstate = "unsubmitted"\n'
    )
    (folder / "plugin.py").write_text(body)
    return load_registry(patches)


PLUGIN = """
import os


def apply():
    import vllm.envs as envs

    original = envs.is_set

    def is_set(name):
        return original(name)

    is_set.patchset = True
    envs.is_set = is_set
    with open(os.environ["PLUGIN_RECORD"], "a") as fh:
        fh.write(f"{os.getpid()}\\n")
"""

# vLLM's own loader, as close as runs without torch: vllm/__init__.py (which imports torch)
# is skipped by registering the package folder by hand; vllm/plugins/__init__.py and
# vllm/envs.py are the release's own, unchanged. Each process calls load_general_plugins()
# twice, as vLLM may; two children are started with spawn, as vLLM starts its workers.
DRIVER = """
import importlib.util, json, multiprocessing, os, sys, types


def load():
    spec = importlib.util.find_spec("vllm")
    package = types.ModuleType("vllm")
    package.__path__ = list(spec.submodule_search_locations)
    sys.modules["vllm"] = package
    import vllm.plugins
    import vllm.envs
    vllm.plugins.load_general_plugins()
    vllm.plugins.load_general_plugins()
    return getattr(vllm.envs.is_set, "patchset", False), vllm.plugins.__file__


if __name__ == "__main__":
    wrapped, loader = load()
    context = multiprocessing.get_context("spawn")
    children = [context.Process(target=load) for _ in range(2)]
    for child in children:
        child.start()
    for child in children:
        child.join()
    record = os.environ["PLUGIN_RECORD"]
    pids = open(record).read().split() if os.path.exists(record) else []
    print(json.dumps({"main": os.getpid(), "pids": pids, "wrapped": wrapped, "loader": loader,
                      "exits": [c.exitcode for c in children]}))
"""
FAKE_VLLM = (  # drops "serve" and the serve arguments; runs the loader driver
    "#!/bin/sh\nexec python3 /t/driver.py\n"
)


def plugin_run(
    client: Any, image: str, bundle: Path | None, tmp_path: Path, env: dict[str, str]
) -> tuple[int, str]:
    folder = tmp_path / "t"
    folder.mkdir(exist_ok=True)
    (folder / "driver.py").write_text(DRIVER)
    (folder / "vllm").write_text(FAKE_VLLM)
    (folder / "vllm").chmod(0o755)
    env = {"PATCHSET_EXEC": "/t/vllm", "PLUGIN_RECORD": "/tmp/record", **env}
    status, out, _ = run_stock(client, image, bundle, env=env, mounts={str(folder): "/t"})
    return status, out


def test_python_patch_through_vllm_plugin_loader(
    tmp_path: Path, docker_client: Any, standin_020: str
) -> None:
    registry = python_registry(tmp_path, PLUGIN)
    definition = load_definition(REPO / "builds" / "0.20.0.toml")
    definition = BuildDefinition(
        **{**definition.__dict__, "patches": ("tolist-cudagraph", "envs-probe")}
    )
    bundle = tmp_path / "bundle"
    export_runtime(definition, registry, bundle)
    assert (
        bundle / "plugins" / "patchset_plugins-1.0.dist-info" / "entry_points.txt"
    ).read_text() == (
        "[vllm.general_plugins]\nenvs-probe = patchset_plugins.entry_envs_probe:apply\n"
    )
    status, out = plugin_run(docker_client, standin_020, bundle, tmp_path, {})
    assert status == 0, out
    assert "patchset: envs-probe r1 (startup): plugin (vLLM runs it in each process)" in out
    result = recorded(out)
    assert result["loader"].endswith("/dist-packages/vllm/plugins/__init__.py")
    assert result["wrapped"] is True and result["exits"] == [0, 0]
    assert len(result["pids"]) == 3 and len(set(result["pids"])) == 3  # once per process
    assert str(result["main"]) in result["pids"]
    assert out.count("patchset: plugin envs-probe applied in pid") == 3
    # VLLM_PLUGINS, vLLM's own filter, is respected: another name, and the plugin never loads
    status, out = plugin_run(
        docker_client, standin_020, bundle, tmp_path, {"VLLM_PLUGINS": "something-else"}
    )
    assert status == 0 and recorded(out)["pids"] == [], out  # no process ran it
    status, out = plugin_run(
        docker_client, standin_020, bundle, tmp_path, {"VLLM_PLUGINS": "envs-probe"}
    )
    assert status == 0 and len(recorded(out)["pids"]) == 3
    # PATCHSET_DISABLE reaches every process: loaded by vLLM, but not run
    status, out = plugin_run(
        docker_client, standin_020, bundle, tmp_path, {"PATCHSET_DISABLE": "envs-probe"}
    )
    assert "envs-probe r1 (startup): disabled (PATCHSET_DISABLE)" in out
    assert status == 0 and recorded(out)["pids"] == [] and "applied in pid" not in out
    # --verify shows the plugin registered where vLLM's lookup finds it
    status, out, _ = run_stock(docker_client, standin_020, bundle, "--verify")
    report = recorded(out)
    assert status == 0 and report["ok"], out
    states = {r["patch"]: r["state"] for r in report["results"]}
    assert states["envs-probe r1"] == (
        "plugin registered (vllm.general_plugins: envs-probe ="
        " patchset_plugins.entry_envs_probe:apply)"
    )


def test_python_patch_that_raises(tmp_path: Path, docker_client: Any, standin_020: str) -> None:
    registry = python_registry(tmp_path, "def apply():\n    raise RuntimeError('boom')\n")
    definition = load_definition(REPO / "builds" / "0.20.0.toml")
    definition = BuildDefinition(**{**definition.__dict__, "patches": ("envs-probe",)})
    bundle = tmp_path / "bundle"
    export_runtime(definition, registry, bundle)
    status, out = plugin_run(docker_client, standin_020, bundle, tmp_path, {})
    assert "patchset: plugin envs-probe failed in pid" in out and "RuntimeError: boom" in out
    assert "Traceback" not in out.split("plugin envs-probe failed")[0]
    assert status != 0  # the main process exits 9 (and the driver never prints)
    status, out = plugin_run(
        docker_client, standin_020, bundle, tmp_path, {"PATCHSET_ON_FAILURE": "warn"}
    )
    assert out.count("plugin envs-probe failed in pid") == 3  # reported in each process
    # a name the plugin touches, gone from the release: the start is refused
    manifest = json.loads((bundle / "manifest.json").read_text())
    manifest["patches"][0]["touches"] = ["vllm.envs:no_such_function"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    status, out, _ = run_stock(docker_client, standin_020, bundle)
    assert status == 9
    assert "touches vllm.envs:no_such_function, which vllm/envs.py no longer defines" in out


def test_export_from_the_image_itself(tmp_path: Path, docker_client: Any, standin_020: str) -> None:
    """--source image:REF reads the release's files from the (local) image: the same digests
    as the index's, and the bundle starts there."""
    proc = export_cli(
        tmp_path / "rt",
        REPO / "builds" / "0.20.0.toml",
        "--source",
        f"image:{standin_tag('0.20.0')}",
    )
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["release_files"].startswith(f"image {standin_tag('0.20.0')}")
    from_image = json.loads((tmp_path / "rt" / "manifest.json").read_text())
    from_index = json.loads((export(tmp_path, "0.20.0.toml") / "manifest.json").read_text())
    assert from_image["patches"][0]["files"] == from_index["patches"][0]["files"]
    status, out, _ = run_stock(docker_client, standin_020, tmp_path / "rt")
    assert status == 0 and "tolist-cudagraph r1 (startup): applied" in out, out


def test_a_stacked_series_applies_in_its_order(
    tmp_path: Path, docker_client: Any, standin_020: str
) -> None:
    """'a-stack-top' requires 'z-stack-bottom' (its context holds the bottom's line), and the
    definition lists the top first: the bundle applies the bottom, then the top; without the
    bottom, the top is skipped and the file left as the release has it."""
    from tests.helpers.releases import FLA, stacked_series

    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    once, twice = stacked_series(patches, "0.20.0", bottom="startup", top="startup")
    builds = tmp_path / "builds"
    builds.mkdir()
    text = (REPO / "builds" / "0.20.0.toml").read_text()
    text = text.replace(
        'patches = ["tolist-cudagraph"]', 'patches = ["a-stack-top", "z-stack-bottom"]'
    )
    (builds / "0.20.0.toml").write_text(text)
    bundle = tmp_path / "bundle"
    export_runtime(load_definition(builds / "0.20.0.toml"), load_registry(patches), bundle)
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [(p["id"], p["requires"]) for p in manifest["patches"]] == [
        ("z-stack-bottom", []),
        ("a-stack-top", ["z-stack-bottom"]),
    ]
    site = standin_site_packages_of(docker_client, standin_020)
    status, out, container = run_stock(docker_client, standin_020, bundle, keep=True)
    try:
        assert status == 0, out
        lines = [line for line in out.splitlines() if "stack" in line and " r1 " in line]
        assert lines == [
            "patchset: z-stack-bottom r1 (startup): applied",
            "patchset: a-stack-top r1 (startup): applied",
        ]
        wanted = hashlib.sha256(twice.encode()).hexdigest()
        assert file_sha(docker_client, container, f"{site}/{FLA}") == wanted
    finally:
        container.remove(force=True)
    status, out, container = run_stock(
        docker_client, standin_020, bundle, env={"PATCHSET_DISABLE": "z-stack-bottom"}, keep=True
    )
    try:
        assert status == 0, out
        assert (
            "patchset: a-stack-top r1 (startup): skipped (requires z-stack-bottom, which is"
            " disabled (PATCHSET_DISABLE))" in out
        )
        pristine = manifest["patches"][0]["files"][FLA]["before"]
        assert file_sha(docker_client, container, f"{site}/{FLA}") == pristine
        assert pristine != hashlib.sha256(once.encode()).hexdigest()
    finally:
        container.remove(force=True)
