"""patchset.adapters.dockerengine against a real engine and real registries on 127.0.0.1."""

from __future__ import annotations

import re
import secrets
import time
from pathlib import Path

import pytest

from patchset.adapters.dockerengine import Engine, connect, registry_of, split_ref
from patchset.errors import DockerError
from tests.infra.docker_fixtures import AuthRegistry, StandinImage
from tests.infra.registry import Registry
from tests.infra.run import image_repo
from tests.infra.standin import STANDIN_LABEL, standin_site_packages


def test_connect_names_the_socket_it_could_not_reach(tmp_path: Path) -> None:
    with pytest.raises(DockerError, match="cannot reach a Docker engine at unix://") as caught:
        connect(f"unix://{tmp_path}/none.sock", timeout=5)
    message = str(caught.value)
    assert "start dockerd or set DOCKER_HOST" in message
    assert "\n" not in message


def test_refs_split_into_repo_and_tag() -> None:
    assert split_ref("vllm/vllm-openai:v0.19.1-cu130") == ("vllm/vllm-openai", "v0.19.1-cu130")
    assert split_ref("127.0.0.1:5000/a/b") == ("127.0.0.1:5000/a/b", "latest")
    assert split_ref("127.0.0.1:5000/a@sha256:ab") == ("127.0.0.1:5000/a", "sha256:ab")
    assert registry_of("127.0.0.1:5000/a/b:1") == "127.0.0.1:5000"
    assert registry_of("vllm/vllm-openai:v1") == "the default registry"


def _unique(name: str) -> str:
    return image_repo(f"{name}-{secrets.token_hex(4)}")


@pytest.mark.docker
def test_connect_reaches_the_engine(docker_client: object) -> None:
    with connect() as engine:
        assert engine.client.ping()


@pytest.mark.docker
def test_standin_base_looks_like_the_official_image(
    engine: Engine, standin_base: StandinImage
) -> None:
    info = engine.ensure_image(standin_base.ref)
    assert info.id == standin_base.id
    assert info.entrypoint == ("vllm", "serve")
    assert STANDIN_LABEL in info.labels
    assert standin_base.ref in info.tags
    assert "PATH" in info.env
    assert engine.image_size(standin_base.ref) == info.size
    assert info.size > 10_000_000


@pytest.mark.docker
def test_build_streams_its_log_and_tags_on_success(
    engine: Engine, standin_base: StandinImage, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {standin_base.ref}\n"
        "RUN echo first-line && sleep 2 && echo second-line\n"
        "RUN echo built > /built.txt\n"
    )
    seen: list[tuple[float, str]] = []
    tags = [_unique("tiny") + ":1", _unique("tiny") + ":2"]
    image_id = engine.build(
        tmp_path,
        tags,
        labels={"org.patchset.test": "yes"},
        on_log=lambda line: seen.append((time.monotonic(), line)),
    )
    done = time.monotonic()
    try:
        lines = [line for _, line in seen]
        assert any(re.match(r"Step 1/\d+ : FROM ", line) for line in lines)
        assert "second-line" in lines
        first_at = next(at for at, line in seen if line == "first-line")
        assert done - first_at > 1.0, "the log arrived only at the end, not while building"
        for ref in tags:
            assert engine.inspect(ref).id == image_id
        assert engine.inspect(image_id).labels["org.patchset.test"] == "yes"
        assert engine.copy_out(image_id, ["/built.txt"]) == {"/built.txt": b"built\n"}
    finally:
        engine.remove_image(image_id)
    assert not any(engine.image_exists(ref) for ref in tags)


@pytest.mark.docker
def test_a_failing_step_raises_and_tags_nothing(
    engine: Engine, standin_base: StandinImage, tmp_path: Path
) -> None:
    (tmp_path / "Dockerfile").write_text(
        f"FROM {standin_base.ref}\nRUN echo about-to-fail && exit 3\nRUN echo never\n"
    )
    tag = _unique("broken") + ":1"
    lines: list[str] = []
    with pytest.raises(
        DockerError, match=r"docker build of .* failed at 'Step 2/\d+ : RUN"
    ) as caught:
        engine.build(tmp_path, [tag], on_log=lines.append)
    assert "3" in str(caught.value)
    assert "about-to-fail" in lines
    assert "never" not in lines
    assert not engine.image_exists(tag)


@pytest.mark.docker
def test_run_python_has_no_network_unless_asked(engine: Engine, standin_base: StandinImage) -> None:
    code = "import os; print(sorted(os.listdir('/sys/class/net')))"
    assert engine.run_python(standin_base.ref, code).strip() == "['lo']"
    assert "eth0" in engine.run_python(standin_base.ref, code, network=True)


@pytest.mark.docker
def test_run_python_failure_carries_the_stderr_tail(
    engine: Engine, standin_base: StandinImage
) -> None:
    code = "import sys; print('out'); sys.stderr.write('boom-' * 3); sys.exit(4)"
    with pytest.raises(DockerError, match=r"exit status 4: boom-boom-boom-"):
        engine.run_python(standin_base.ref, code)


@pytest.mark.docker
def test_copy_out_reads_files_without_running_the_image(
    engine: Engine, standin_base: StandinImage
) -> None:
    site = standin_site_packages(engine, standin_base.ref)
    version_py = f"{site}/vllm/_version.py"
    found = engine.copy_out(standin_base.ref, [version_py, "/usr/local/bin/vllm", "/no/such"])
    assert b"'0.19.1'" in (found[version_py] or b"")
    assert (found["/usr/local/bin/vllm"] or b"").startswith(b"#!/usr/bin/python3")
    assert found["/no/such"] is None
    files = engine.copy_files(standin_base.ref, [version_py, "/usr/local/bin/vllm", "/no/such"])
    assert {path: f.data if f else None for path, f in files.items()} == found
    modes = {path: f.mode for path, f in files.items() if f is not None}
    assert modes == {version_py: 0o644, "/usr/local/bin/vllm": 0o755}

    fla = f"{site}/vllm/model_executor/layers/fla"
    tree = engine.copy_tree(standin_base.ref, fla, suffixes=(".py",))
    assert tree is not None
    assert "fla/ops/utils.py" in tree
    assert all(name.startswith("fla/") and name.endswith(".py") for name in tree)
    assert engine.copy_tree(standin_base.ref, "/no/such/folder") is None


@pytest.mark.docker
def test_push_to_a_registry_and_pull_back_by_digest(
    engine: Engine, tiny_image: str, registry_server: Registry
) -> None:
    # the address from the server itself: tests/conftest.py's `registry` is a patch registry
    repo = f"{registry_server.address}/{_unique('pushed')}"
    engine.tag(tiny_image, f"{repo}:v1")
    lines: list[str] = []
    digest = engine.push(f"{repo}:v1", on_log=lines.append)
    assert digest.startswith("sha256:")
    assert any("digest" in line for line in lines)
    name = repo.partition("/")[2]
    assert name in registry_server.repositories()
    assert registry_server.tags(name) == ["v1"]

    engine.remove_image(tiny_image)
    assert not engine.image_exists(f"{repo}:v1")
    pulled = engine.ensure_image(f"{repo}@{digest}")
    assert pulled.id == tiny_image
    assert f"{repo}@{digest}" in pulled.repo_digests


@pytest.mark.docker
def test_push_with_wrong_credentials_is_refused(
    engine: Engine,
    tiny_image: str,
    auth_registry: AuthRegistry,
    auth_registry_server: Registry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = f"{auth_registry.address}/{_unique('guarded')}"
    name = repo.partition("/")[2]
    engine.tag(tiny_image, f"{repo}:v1")
    wrong = {"username": auth_registry.user, "password": auth_registry.password + "-wrong"}
    with pytest.raises(DockerError, match=f"{auth_registry.address} refused the push") as caught:
        engine.push(f"{repo}:v1", auth=wrong)
    assert "\n" not in str(caught.value)
    assert name not in auth_registry_server.repositories()

    # No auth given, none in the environment, none in the Docker config for this port.
    monkeypatch.delenv("PATCHSET_REGISTRY_USER", raising=False)
    with pytest.raises(DockerError, match="refused the push"):
        engine.push(f"{repo}:v1")
    assert name not in auth_registry_server.repositories()


@pytest.mark.docker
def test_push_with_credentials_from_the_environment(
    engine: Engine,
    tiny_image: str,
    auth_registry: AuthRegistry,
    auth_registry_server: Registry,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    repo = f"{auth_registry.address}/{_unique('guarded')}"
    engine.tag(tiny_image, f"{repo}:v1")
    monkeypatch.setenv("PATCHSET_REGISTRY_USER", auth_registry.user)
    monkeypatch.setenv("PATCHSET_REGISTRY_PASSWORD", auth_registry.password)
    digest = engine.push(f"{repo}:v1")
    assert digest.startswith("sha256:")
    name = repo.partition("/")[2]
    assert name in auth_registry_server.repositories()
    assert auth_registry_server.tags(name) == ["v1"]
