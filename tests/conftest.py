"""Shared fixtures. Each is small and named for what it gives; add yours below, keep others'."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchset.sources.package_index.cache import Cache, cache_root
from tests.fake_index import FakeIndex, FakeServer

# Docker engine, registries and the stand-in base image (tests marked docker).
pytest_plugins = ["tests.infra.docker_fixtures"]

# -- network guard: unit tests reach loopback only ------------------------------------------


def _is_loopback(host: object) -> bool:
    if isinstance(host, bytes):
        host = host.decode(errors="replace")
    if not isinstance(host, str):
        return False
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.split("%")[0]).is_loopback
    except ValueError:
        return False


@pytest.fixture(autouse=True)
def no_remote_network(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> None:
    """Any connection or name lookup beyond loopback raises, except in tests marked network
    or docker. Unix sockets (the Docker engine's) are not affected."""
    if request.node.get_closest_marker("network") or request.node.get_closest_marker("docker"):
        return

    def refuse(target: object) -> RuntimeError:
        return RuntimeError(f"a unit test tried to reach {target!r}; mark it network")

    real_connect = socket.socket.connect
    real_connect_ex = socket.socket.connect_ex
    real_getaddrinfo = socket.getaddrinfo

    def connect(self: socket.socket, address: Any) -> None:
        if self.family in {socket.AF_INET, socket.AF_INET6} and not _is_loopback(address[0]):
            raise refuse(address)
        real_connect(self, address)

    def connect_ex(self: socket.socket, address: Any) -> int:
        if self.family in {socket.AF_INET, socket.AF_INET6} and not _is_loopback(address[0]):
            raise refuse(address)
        return real_connect_ex(self, address)

    def getaddrinfo(host: Any, *args: Any, **kwargs: Any) -> Any:
        if host is not None and not _is_loopback(host):
            raise refuse(host)
        return real_getaddrinfo(host, *args, **kwargs)

    monkeypatch.setattr(socket.socket, "connect", connect)
    monkeypatch.setattr(socket.socket, "connect_ex", connect_ex)
    monkeypatch.setattr(socket, "getaddrinfo", getaddrinfo)


# -- caches and a fake package index ---------------------------------------------------------


@pytest.fixture(scope="session")
def release_cache() -> Cache:
    """The cache real releases go to, shared by the whole session and by later runs:
    $PATCHSET_CACHE_DIR, else ~/.cache/patchset (so a second run needs no network)."""
    return Cache(cache_root())


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    """An empty cache for one test, also set as $PATCHSET_CACHE_DIR."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(root))
    return Cache(root)


@pytest.fixture
def http_server() -> Iterator[FakeServer]:
    """A real HTTP server on 127.0.0.1 with scripted replies (see tests/fake_index.py)."""
    server = FakeServer()
    yield server
    server.close()


@pytest.fixture
def fake_index(http_server: FakeServer) -> FakeIndex:
    """vLLM on a fake package index served by `http_server`; add releases to it."""
    return FakeIndex(http_server)
