"""Image builds against a real Docker engine and real registries, on stand-in bases that carry
the real vLLM sources at the official layout (no image can be pulled on these machines)."""

from __future__ import annotations

import hashlib
import json
import secrets
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchset.adapters import dockerengine
from patchset.errors import BuildError, DockerError
from patchset.image.build import build, runtime_sources
from patchset.registry import Registry, load_registry
from patchset.registry.builds import BuildDefinition, load_definition
from tests.helpers.cli import run_cli
from tests.infra.docker_fixtures import AuthRegistry, StandinImage
from tests.infra.registry import Registry as RunningRegistry
from tests.infra.run import image_repo
from tests.infra.standin import (
    build_standin_base,
    built_repository,
    for_tests,
    rootfs_tag,
    standin_tag,
)

pytestmark = [pytest.mark.docker, pytest.mark.network]
REPO = Path(__file__).parents[2]
REGISTRY = load_registry(REPO / "patches")


@pytest.fixture(scope="module")
def standin_020(docker_client: Any) -> str:
    return build_standin_base(docker_client, "0.20.0")


@pytest.fixture
def repo_name(engine: dockerengine.Engine) -> Iterator[str]:
    """A fresh repository name; every image tagged into it is removed afterwards."""
    name = image_repo(f"vllm-{secrets.token_hex(4)}")
    yield name
    for image in engine.client.images.list(name=name):
        for tag in image.tags:
            engine.untag(tag)


def definition(tmp_path: Path, source: str, repository: str, **changes: str) -> BuildDefinition:
    text = for_tests((REPO / "builds" / source).read_text())  # stand-in base, test names
    text = text.replace(f'"{built_repository()}"', f'"{repository}"')
    for old, new in changes.items():
        text = text.replace(old, new)
    path = tmp_path / source
    path.write_text(text)
    return load_definition(path)


def tags_of(engine: dockerengine.Engine, repository: str) -> list[str]:
    return sorted(t for i in engine.client.images.list(name=repository) for t in i.tags)


def run_image(
    client: Any,
    image: str,
    *args: str,
    env: dict[str, str] | None = None,
    entrypoint: list[str] | None = None,
) -> tuple[int, str]:
    container = client.containers.run(
        image,
        list(args),
        environment=env or {},
        entrypoint=entrypoint,
        detach=True,
        network_mode="none",
    )
    try:
        status = container.wait(timeout=120)["StatusCode"]
        return status, container.logs().decode()
    finally:
        container.remove(force=True)


def test_build_0191_recipe(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_base: StandinImage,
    repo_name: str,
) -> None:
    d = definition(tmp_path, "0.19.1.toml", repo_name)
    lines: list[str] = []
    report = build(d, REGISTRY, output=tmp_path / "out", on_log=lines.append, engine=engine)
    short = REGISTRY.short_digest
    assert report.tags == (f"{repo_name}:0.19.1-cu130", f"{repo_name}:0.19.1-cu130-ps{short}")
    assert tags_of(engine, repo_name) == sorted(report.tags)
    assert any(line.startswith("Step ") for line in lines)  # the build log was streamed
    # the layer is the runtime (entrypoint and kernel) and little else: the manifest, the
    # patched file
    runtime = sum(len(data) for data in runtime_sources().values())
    assert runtime < report.added_bytes < runtime + 64 * 1024
    saved = json.loads((tmp_path / "out" / "report.json").read_text())
    assert saved["image_id"] == report.image_id and saved["base"]["id"] == standin_base.id
    assert (tmp_path / "out" / "build.log").read_text().count("Step ") >= 3
    info = engine.inspect(report.image_id)
    labels = info.labels
    assert labels["org.opencontainers.image.base.name"] == standin_tag("0.19.1")
    assert labels["org.opencontainers.image.base.digest"].startswith("sha256:")
    assert labels["org.opencontainers.image.version"] == f"0.19.1-cu130-ps{short}"
    for key in ("created", "revision"):
        assert labels[f"org.opencontainers.image.{key}"]
    # the registry's checkout has no remote: no source label (never a local path)
    assert "org.opencontainers.image.source" not in labels
    assert labels["io.patchset.registry.digest"] == REGISTRY.digest
    (entry,) = json.loads(labels["io.patchset.patches"])
    tma = REGISTRY.get("fla-tma-sm12x")
    assert entry == {
        "id": "fla-tma-sm12x",
        "revision": tma.revision,
        "apply": "build",
        "variant": "patch.diff",
        "payload_sha256": tma.variants[0].sha256,
        "upstream": "vllm-project/vllm#36325",
        "verdict": "needed",
    }
    # the patched file is really in the image, at the official dist-packages layout
    root = json.loads(
        engine.copy_out(report.image_id, ["/opt/patchset/manifest.json"])[
            "/opt/patchset/manifest.json"
        ]
        or b"{}"
    )["vllm_root"]
    assert "/dist-packages" in root
    utils = engine.copy_out(report.image_id, [f"{root}/{tma.targets[0]}"])[
        f"{root}/{tma.targets[0]}"
    ]
    assert utils is not None and b"9 <= torch.cuda.get_device_capability(0)[0] < 12" in utils
    # the entrypoint checks the build patch, then execs `vllm serve <recipe> "$@"`
    status, out = run_image(docker_client, report.image_id, "--port", "9000")
    assert status == 0, out
    assert (
        "patchset: fla-tma-sm12x r1 (build): present (built in; scope cc >=12.0, this GPU: none"
        " (no nvidia-smi))" in out
    )
    recorded = json.loads(out.strip().splitlines()[-1])
    assert recorded["argv"][:3] == ["serve", "--model", "Lorbus/Qwen3.6-27B-int4-AutoRound"]
    assert recorded["argv"][-2:] == ["--port", "9000"]
    assert recorded["env"]["VLLM_USE_FLASHINFER_SAMPLER"] == "1"
    # inspect and verify through the CLI
    proc = run_cli("verify", report.tags[1])
    assert proc.returncode == 0 and "verified" in proc.stdout, proc.stderr
    proc = run_cli("inspect", report.tags[0], "--format", "json")
    assert json.loads(proc.stdout)["manifest"]["registry"] == REGISTRY.digest


def test_build_0200_startup_patch_and_failure_policy(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
) -> None:
    d = definition(tmp_path, "0.20.0.toml", repo_name)
    report = build(d, REGISTRY, engine=engine)
    status, out = run_image(docker_client, report.image_id)
    assert status == 0, out
    assert "patchset: tolist-cudagraph r1 (startup): applied" in out
    # the file in the image itself is untouched until start: verify says it applies
    status, out = run_image(
        docker_client,
        report.image_id,
        "-c",
        "import subprocess,sys;"
        "subprocess.run([sys.executable,'/opt/patchset/entrypoint.py'],env={'PATCHSET_EXEC':'true','PATH':'/usr/bin:/bin'});"
        "subprocess.run([sys.executable,'/opt/patchset/entrypoint.py'],env={'PATCHSET_EXEC':'true','PATH':'/usr/bin:/bin'})",
        entrypoint=["python3"],
    )
    assert "tolist-cudagraph r1 (startup): applied" in out
    assert "tolist-cudagraph r1 (startup): already-applied" in out  # second start: a no-op
    # a file changed behind patchset's back: fail by default, go on with warn
    tamper = (
        "import importlib.util,pathlib,os;"
        "p=pathlib.Path(importlib.util.find_spec('vllm').submodule_search_locations[0])"
        "/'v1/attention/backends/turboquant_attn.py';p.write_text(p.read_text()+'#x\\n');"
        "os.execvp('python3',['python3','/opt/patchset/entrypoint.py'])"
    )
    status, out = run_image(docker_client, report.image_id, "-c", tamper, entrypoint=["python3"])
    assert status == 9 and "FAILED" in out and "not starting vllm" in out
    status, out = run_image(
        docker_client,
        report.image_id,
        "-c",
        tamper,
        entrypoint=["python3"],
        env={"PATCHSET_ON_FAILURE": "warn"},
    )
    assert status == 0 and "FAILED" in out and '"argv": ["serve"' in out


def test_hardware_scope_skips_startup_patch(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
) -> None:
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    toml = patches / "tolist-cudagraph" / "patch.toml"
    toml.write_text(toml.read_text() + '\n[hardware]\ncompute_capability = ">=12.0"\n')
    registry = load_registry(patches)
    report = build(definition(tmp_path, "0.20.0.toml", repo_name), registry, engine=engine)
    status, out = run_image(
        docker_client, report.image_id, env={"PATCHSET_COMPUTE_CAPABILITY": "8.6"}
    )
    assert status == 0
    assert (
        "tolist-cudagraph r1 (startup): skipped (scope cc >=12.0, this GPU: 8.6"
        " (PATCHSET_COMPUTE_CAPABILITY))" in out
    )
    status, out = run_image(
        docker_client, report.image_id, env={"PATCHSET_COMPUTE_CAPABILITY": "12.0"}
    )
    assert "tolist-cudagraph r1 (startup): applied" in out


def conflicting_registry(tmp_path: Path) -> Registry:
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    diff = patches / "fla-tma-sm12x" / "patch.diff"
    diff.write_text(diff.read_text().replace(" is_gather_supported =", " is_gather_supportd ="))
    return load_registry(patches)


def test_conflict_stops_before_any_tag(
    tmp_path: Path, engine: dockerengine.Engine, standin_base: StandinImage, repo_name: str
) -> None:
    # the planner's refusal, before anything is built
    with pytest.raises(BuildError, match=r"fla-tma-sm12x does not apply on the release's files"):
        build(
            definition(tmp_path, "0.19.1.toml", repo_name),
            conflicting_registry(tmp_path),
            engine=engine,
        )
    assert tags_of(engine, repo_name) == []


def test_base_without_vllm(
    tmp_path: Path, engine: dockerengine.Engine, standin_base: StandinImage, repo_name: str
) -> None:
    d = definition(
        tmp_path,
        "0.19.1.toml",
        repo_name,
        **{
            f'base = "{standin_tag("0.19.1")}"': f'base = "{rootfs_tag()}"',
        },
    )
    with pytest.raises(BuildError, match="finds no vllm package"):
        build(d, REGISTRY, engine=engine)
    assert tags_of(engine, repo_name) == []


def test_push_to_registry_and_refused_push(  # noqa: PLR0917 - pytest fixtures
    tmp_path: Path,
    engine: dockerengine.Engine,
    standin_base: StandinImage,
    registry_server: RunningRegistry,
    auth_registry: AuthRegistry,
    repo_name: str,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    d = definition(tmp_path, "0.19.1.toml", f"{registry_server.address}/{repo_name}")
    report = build(d, REGISTRY, push=True, engine=engine)
    assert set(report.pushed) == set(report.tags)
    assert all(v.startswith("sha256:") for v in report.pushed.values())
    assert sorted(registry_server.tags(repo_name)) == sorted(
        t.rsplit(":", 1)[1] for t in report.tags
    )
    # wrong credentials: the push is refused, and no local tag is left behind
    monkeypatch.setenv("PATCHSET_REGISTRY_USER", auth_registry.user)
    monkeypatch.setenv("PATCHSET_REGISTRY_PASSWORD", "wrong-" + auth_registry.password)
    refused = definition(tmp_path, "0.19.1.toml", f"{auth_registry.address}/{repo_name}")
    with pytest.raises(DockerError, match="refused the push"):
        build(refused, REGISTRY, push=True, engine=engine)
    assert tags_of(engine, f"{auth_registry.address}/{repo_name}") == []


def test_cli_without_engine(tmp_path: Path) -> None:
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchset",
            "build",
            str(REPO / "builds" / "0.19.1.toml"),
            "--output",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        env={
            "DOCKER_HOST": "unix:///nonexistent/docker.sock",
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
        },
    )
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stderr.strip().count("\n") == 0 and "Docker engine" in proc.stderr


TOUCHED = """
import hashlib, json, os, pathlib, subprocess, sys
root = pathlib.Path(json.load(open('/opt/patchset/manifest.json'))['vllm_root'])
def snap():
    return {str(p): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob('*')) if p.is_file() and '__pycache__' not in p.parts}
before = snap()
subprocess.run([sys.executable, '/opt/patchset/entrypoint.py'], check=True,
               env={**os.environ, 'PATCHSET_EXEC': 'true'}, stdout=subprocess.DEVNULL)
after = snap()
special = subprocess.run(['find', '/opt/patchset', str(root), '-perm', '/6000'],
                         capture_output=True, text=True).stdout.split()
print(json.dumps({'changed': sorted(k for k in after if before.get(k) != after[k]),
                  'setuid': special}))
"""


def test_runtime_touches_only_manifest_files_and_adds_no_privilege(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
) -> None:
    report = build(definition(tmp_path, "0.20.0.toml", repo_name), REGISTRY, engine=engine)
    status, out = run_image(docker_client, report.image_id, "-c", TOUCHED, entrypoint=["python3"])
    assert status == 0, out
    result = json.loads(out.strip().splitlines()[-1])
    assert [p.split("/dist-packages/")[1] for p in result["changed"]] == [
        "vllm/v1/attention/backends/turboquant_attn.py"
    ]
    assert result["setuid"] == []
    base, image = engine.inspect(standin_020), engine.inspect(report.image_id)
    base_user = docker_client.api.inspect_image(base.id)["Config"].get("User", "")
    assert docker_client.api.inspect_image(image.id)["Config"].get("User", "") == base_user


def test_build_fails_when_a_patched_file_does_not_compile(
    tmp_path: Path, engine: dockerengine.Engine, standin_020: str, repo_name: str
) -> None:
    """Site A's text loses a colon: the file is compiled with the image's own python3 (in the
    verification container) and the build stops, naming patch, file and line; no tag."""
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    sites = patches / "tolist-cudagraph" / "sites.toml"
    sites.write_text(sites.read_text().replace("else:\n    prefill_max_seq", "else\n    prefill"))
    registry = load_registry(patches)
    with pytest.raises(BuildError) as caught:
        build(definition(tmp_path, "0.20.0.toml", repo_name), registry, engine=engine)
    message = str(caught.value)
    assert "tolist-cudagraph" in message, message
    assert "vllm/v1/attention/backends/turboquant_attn.py:" in message
    assert "the built image fails verification: tolist-cudagraph r1" in message
    assert "(does not compile after patching)" in message
    assert tags_of(engine, repo_name) == []


def test_build_installs_python_patch_as_plugin_distribution(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
) -> None:
    from tests.image.test_runtime_export import DRIVER, FAKE_VLLM, PLUGIN, python_registry

    registry = python_registry(tmp_path, PLUGIN)
    d = definition(
        tmp_path,
        "0.20.0.toml",
        repo_name,
        **{'patches = ["tolist-cudagraph"]': 'patches = ["tolist-cudagraph", "envs-probe"]'},
    )
    report = build(d, registry, engine=engine)
    from patchset.image.verify import verify_image

    result = verify_image(engine, report.image_id)
    states = {r.patch: r.state for r in result.results}
    assert result.ok, result
    assert states["envs-probe r1"].startswith("plugin registered (vllm.general_plugins: envs-probe")
    root = json.loads(
        engine.copy_out(report.image_id, ["/opt/patchset/manifest.json"])[
            "/opt/patchset/manifest.json"
        ]
        or b"{}"
    )["vllm_root"]
    record = engine.copy_out(report.image_id, [f"{root}/patchset_plugins-1.0.dist-info/RECORD"])[
        f"{root}/patchset_plugins-1.0.dist-info/RECORD"
    ]
    assert record is not None and b"patchset_plugins/impl_envs_probe.py,sha256=" in record
    folder = tmp_path / "t"
    folder.mkdir()
    (folder / "driver.py").write_text(DRIVER)
    (folder / "vllm").write_text(FAKE_VLLM)
    (folder / "vllm").chmod(0o755)
    container = docker_client.containers.run(
        report.image_id,
        [],
        environment={"PATCHSET_EXEC": "/t/vllm", "PLUGIN_RECORD": "/tmp/record"},
        volumes={str(folder): {"bind": "/t", "mode": "ro"}},
        detach=True,
        network_mode="none",
    )
    try:
        assert container.wait(timeout=120)["StatusCode"] == 0
        out = container.logs().decode()
    finally:
        container.remove(force=True)
    ran = json.loads(out.strip().splitlines()[-1])
    assert len(set(ran["pids"])) == 3 and ran["wrapped"] is True, out
    assert "patchset: tolist-cudagraph r1 (startup): applied" in out


@pytest.mark.parametrize("bottom", ["build", "startup"])
def test_a_stacked_series_builds_and_starts(  # noqa: PLR0917 - pytest fixtures
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
    bottom: str,
) -> None:
    """'a-stack-top' (startup) requires 'z-stack-bottom' (built in, or at startup too): the
    build checks the top on the bottom's file, and the image starts with both in."""
    from tests.helpers.releases import FLA, stacked_series

    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    _, twice = stacked_series(patches, "0.20.0", bottom=bottom, top="startup")
    d = definition(
        tmp_path,
        "0.20.0.toml",
        repo_name,
        **{'patches = ["tolist-cudagraph"]': 'patches = ["a-stack-top", "z-stack-bottom"]'},
    )
    logged: list[str] = []
    report = build(d, load_registry(patches), engine=engine, on_log=logged.append)
    assert [p.id for p in report.patches] == ["z-stack-bottom", "a-stack-top"]
    assert any("a-stack-top r1 (patch.diff): checked for startup on top of z" in x for x in logged)
    check = (
        "import hashlib,importlib.util,pathlib,subprocess,sys;"
        "subprocess.run([sys.executable,'/opt/patchset/entrypoint.py'],"
        "env={'PATCHSET_EXEC':'true','PATH':'/usr/bin:/bin'});"
        "p=pathlib.Path(importlib.util.find_spec('vllm').submodule_search_locations[0])"
        f"/'{FLA.removeprefix('vllm/')}';"
        "print('SHA', hashlib.sha256(p.read_bytes()).hexdigest())"
    )
    status, out = run_image(docker_client, report.image_id, "-c", check, entrypoint=["python3"])
    assert status == 0, out
    bottom_state = "present" if bottom == "build" else "applied"
    assert f"patchset: z-stack-bottom r1 ({bottom}): {bottom_state}" in out
    assert "patchset: a-stack-top r1 (startup): applied" in out
    assert f"SHA {hashlib.sha256(twice.encode()).hexdigest()}" in out


def test_a_build_patch_deletes_a_file_and_creates_a_script(
    tmp_path: Path,
    engine: dockerengine.Engine,
    docker_client: Any,
    standin_020: str,
    repo_name: str,
) -> None:
    """A build patch deleting two of vLLM 0.20.0's own files (in git's form, from the
    release's bytes; one the only file of its folder), creating a 755 script and changing a
    file the base holds 755: the image is built and verified (`RUN rm` after the `COPY`), the
    files are gone in a container, the emptied folder too, the script is executable and the
    changed file keeps the base's mode."""
    from patchset.authoring.tree import unified
    from patchset.image.build import locate_vllm
    from patchset.sources.package_index import IndexSource
    from tests.helpers.synthetic import add_patch

    gone, lone = "vllm/benchmarks/sweep/utils.py", "vllm/third_party/flashmla/__init__.py"
    script, changed = "vllm/patchset_tools/run.sh", "vllm/benchmarks/lib/__init__.py"
    diff = unified(script, None, "#!/bin/sh\necho hi\n", executable=True)
    with IndexSource().open("0.20.0") as tree:
        for rel, keep in ((gone, False), (lone, False), (changed, True)):
            data = tree.read(rel)
            assert data is not None
            diff += unified(rel, data.decode(), data.decode() + "# patched\n" if keep else None)
    patches = tmp_path / "patches"
    shutil.copytree(REPO / "patches", patches)
    targets = [script, gone, lone, changed]
    add_patch(patches, "drop-and-add", diff=diff, targets=targets, vllm="==0.20.0")
    root, _ = locate_vllm(engine, standin_020)
    context = tmp_path / "base"
    context.mkdir()
    (context / "Dockerfile").write_text(f"FROM {standin_020}\nRUN chmod 755 {root}/{changed}\n")
    base = f"{repo_name}-base:755"
    engine.build(context, (base,), network=False)
    swap = {
        '"tolist-cudagraph"]': '"drop-and-add"]',
        f'"{standin_tag("0.20.0")}"': f'"{base}"',
    }
    check = (
        "import importlib.util,os,pathlib,stat;"
        "p=pathlib.Path(importlib.util.find_spec('vllm').submodule_search_locations[0]).parent;"
        "mode=lambda rel: oct(stat.S_IMODE(os.stat(p/rel).st_mode));"
        f"print('GONE', not (p/'{gone}').exists());"
        f"print('FOLDER', (p/'{lone}').parent.exists());"
        f"print('SCRIPT', mode('{script}'));"
        f"print('CHANGED', mode('{changed}'), (p/'{changed}').read_text().endswith('# patched\\n'))"
    )
    try:
        report = build(
            definition(tmp_path, "0.20.0.toml", repo_name, **swap),
            load_registry(patches),
            engine=engine,
        )
        status, out = run_image(docker_client, report.image_id, "-c", check, entrypoint=["python3"])
    finally:
        engine.untag(base)
    assert status == 0, out
    assert "GONE True" in out and "FOLDER False" in out, out
    assert "SCRIPT 0o755" in out and "CHANGED 0o755 True" in out, out
