"""Fixtures for tests marked ``docker``: a real engine, real registries, the stand-in base.

Loaded by tests/conftest.py (``pytest_plugins``). Nothing here skips: when the engine cannot
be reached or provisioned, the tests that need it fail with the reason.
"""

from __future__ import annotations

import contextlib
import io
import secrets
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, NamedTuple

import docker
import docker.errors
import pytest

from patchset.adapters.dockerengine import Engine, connect
from patchset.errors import DockerError
from tests.infra.registry import Registry, start_registry
from tests.infra.run import image_repo
from tests.infra.standin import build_standin_base, standin_tag

PROVISION = Path(__file__).with_name("provision.sh")


class AuthRegistry(NamedTuple):
    address: str  # 127.0.0.1:PORT
    user: str
    password: str


class StandinImage(NamedTuple):
    ref: str  # <run id>/vllm-openai-standin:v0.19.1-cu130
    id: str
    version: str


def _connect() -> tuple[Engine | None, str]:
    try:
        return connect(), ""
    except DockerError as exc:
        return None, str(exc)


@pytest.fixture(scope="session")
def docker_client() -> Iterator[Any]:
    """A ``docker.DockerClient`` on a reachable engine; runs provision.sh when none answers."""
    engine, problem = _connect()
    if engine is None:
        done = subprocess.run(
            ["bash", str(PROVISION)], capture_output=True, text=True, check=False, timeout=1800
        )
        if done.returncode != 0:
            said = (done.stderr or done.stdout).strip().splitlines() or ["(no output)"]
            pytest.fail(f"{problem}; and {PROVISION.name} failed: {said[-1]}", pytrace=False)
        engine, problem = _connect()
        if engine is None:
            pytest.fail(f"{PROVISION.name} ran, but {problem}", pytrace=False)
    yield engine.client
    engine.close()


@pytest.fixture(scope="session")
def engine(docker_client: Any) -> Engine:
    """patchset's own wrapper on the same engine."""
    return Engine(docker_client)


@pytest.fixture(scope="session")
def registry_server(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any
) -> Iterator[Registry]:
    """The plain registry below as an object, to look at its HTTP API (catalog, tags)."""
    running = _start(tmp_path_factory.mktemp("registry"), auth=False)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def registry(registry_server: Registry) -> str:
    """A plain-HTTP registry on 127.0.0.1; its address ``127.0.0.1:PORT``."""
    return registry_server.address


@pytest.fixture(scope="session")
def auth_registry_server(
    tmp_path_factory: pytest.TempPathFactory, docker_client: Any
) -> Iterator[Registry]:
    """The htpasswd registry below as an object, to look at its HTTP API."""
    running = _start(tmp_path_factory.mktemp("auth-registry"), auth=True)
    yield running
    running.stop()


@pytest.fixture(scope="session")
def auth_registry(auth_registry_server: Registry) -> AuthRegistry:
    """A registry with bcrypt htpasswd auth on 127.0.0.1: (address, user, password)."""
    running = auth_registry_server
    assert running.user is not None and running.password is not None
    return AuthRegistry(running.address, running.user, running.password)


def _start(workdir: Path, *, auth: bool) -> Registry:
    try:
        return start_registry(workdir, auth=auth)
    except (RuntimeError, OSError, subprocess.CalledProcessError) as exc:
        pytest.fail(f"cannot start a registry: {exc}", pytrace=False)


@pytest.fixture(scope="session")
def standin_base(docker_client: Any) -> StandinImage:
    """The stand-in of ``vllm/vllm-openai:v0.19.1-cu130`` (see tests/infra/standin.py);
    built once per run, under the run's name, and removed with the run."""
    version = "0.19.1"
    try:
        image_id = build_standin_base(docker_client, version)
    except Exception as exc:  # any failure here is a set-up failure, said once
        pytest.fail(f"cannot build the stand-in base image: {exc}", pytrace=False)
    return StandinImage(standin_tag(version), image_id, version)


@pytest.fixture
def tiny_image(docker_client: Any) -> Iterator[str]:
    """A fresh one-file image (a few hundred bytes, quick to push); its id. Removed after."""
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        payload = f"patchset test image {secrets.token_hex(8)}\n".encode()
        member = tarfile.TarInfo("hello.txt")
        member.size = len(payload)
        archive.addfile(member, io.BytesIO(payload))
    tag = image_repo(f"tiny-{secrets.token_hex(4)}")
    docker_client.api.import_image_from_data(buffer.getvalue(), repository=tag, tag="1")
    image = docker_client.images.get(f"{tag}:1")
    yield str(image.id)
    with contextlib.suppress(docker.errors.NotFound):
        docker_client.api.remove_image(image.id, force=True)
