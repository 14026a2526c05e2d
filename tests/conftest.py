"""Shared fixtures. Each is small and named for what it gives; add yours below, keep others'."""

from __future__ import annotations

import ipaddress
import os
import shutil
import socket
import sqlite3
import tempfile
import threading
import time
import weakref
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchset.sources.package_index.cache import Cache
from tests.helpers.fake_index import FakeIndex, FakeServer
from tests.infra import run

# Docker engine, registries and the stand-in base image (tests marked docker).
pytest_plugins = ["tests.infra.docker_fixtures"]

# -- the run: its own HOME, caches and Docker names -------------------------------------------

# Set for the whole session, so nothing of the user's decides a test: their cache
# (~/.cache/patchset), pip's and uv's user configuration, ~/.docker. pip's site and global
# configuration (/etc/pip.conf, /etc/xdg/pip) and PIP_* variables still apply, as on any
# machine. Each name is restored at the session's end.
_RUN_ENV = (
    *("HOME", "XDG_CACHE_HOME", "XDG_CONFIG_HOME", "XDG_DATA_HOME", "XDG_STATE_HOME"),
    *("DOCKER_CONFIG", "PATCHSET_CACHE_DIR", "UV_CONFIG_FILE", run.ENV),
)
_saved_env: dict[str, str | None] = {}
_run_home: list[Path] = []


def pytest_configure(config: pytest.Config) -> None:
    """A new run: its id, an empty HOME of its own and the release cache in it."""
    _saved_env.update({name: os.environ.get(name) for name in _RUN_ENV})
    run_id = run.start_run()
    home = Path(tempfile.mkdtemp(prefix=f"{run_id}-home-"))
    _run_home.append(home)
    os.environ.pop("UV_CONFIG_FILE", None)
    os.environ.update(
        {
            "HOME": str(home),
            "XDG_CACHE_HOME": str(home / ".cache"),
            "XDG_CONFIG_HOME": str(home / ".config"),
            "XDG_DATA_HOME": str(home / ".local" / "share"),
            "XDG_STATE_HOME": str(home / ".local" / "state"),
            "DOCKER_CONFIG": str(home / ".docker"),
            "PATCHSET_CACHE_DIR": str(home / ".cache" / "patchset"),
        }
    )


def pytest_sessionstart(session: pytest.Session) -> None:
    """Leftovers of killed runs (their pid is gone) go: images, containers, networks,
    registries and temporary HOMEs. Live runs' things, and anything not named by a run, stay."""
    for path in Path(tempfile.gettempdir()).glob(f"{run.PREFIX}*"):
        if (owner := run.run_of(path.name)) and run.is_dead(owner):
            shutil.rmtree(path, ignore_errors=True)
    with run.engine_if_up() as client:
        if client is not None:
            for dead in run.dead_runs(client):
                run.remove_run_or_warn(client, dead)


def pytest_unconfigure(config: pytest.Config) -> None:
    """The run's things go with it; the environment is the user's again."""
    run_id = os.environ.get(run.ENV, "")
    if run.owns(run_id):
        with run.engine_if_up() as client:
            if client is not None:
                run.remove_run_or_warn(client, run_id)
        for path in Path(tempfile.gettempdir()).glob(f"{run_id}-*"):  # HOME, copies
            shutil.rmtree(path, ignore_errors=True)
    _run_home.clear()
    for name, value in _saved_env.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


# -- threads end with their test ------------------------------------------------------------


def _started_by_tests(thread: threading.Thread) -> bool:
    """Whether `thread` runs code of tests/ (a fake server, a relay), by its target."""
    target = getattr(thread, "_target", None)
    owner = getattr(target, "__self__", None)
    module = getattr(type(owner) if owner is not None else target, "__module__", "") or ""
    return module.split(".")[0] == "tests"


@pytest.fixture(autouse=True)
def threads_end_with_their_test() -> Iterator[None]:
    """A thread a test starts ends with it: waited for a little after the test, and a
    thread of tests/ code still running then fails the test (it would keep a later check
    from forking, tests/release_check/test_parallel.py)."""
    before = set(threading.enumerate())
    yield
    deadline = time.monotonic() + 5.0
    left = [t for t in threading.enumerate() if t not in before]
    for thread in left:
        thread.join(timeout=max(0.0, deadline - time.monotonic()))
    alive = [t for t in left if t.is_alive() and _started_by_tests(t)]
    if alive:
        pytest.fail(f"the test left threads running: {alive}; join them", pytrace=False)


class _Tracked(sqlite3.Connection):
    """A connection `databases_close_with_their_test` can find again (a plain one takes no
    weak reference)."""


@pytest.fixture(autouse=True)
def databases_close_with_their_test(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    """A SQLite connection opened during a test and still held when it ends (a `Memo` a test
    made, a test's own look into a cache file) is closed then: Python 3.13 warns of an
    unclosed one when it is collected, at whatever later test that happens in (an error
    here). One dropped while the test runs is still collected, and warned of, in it."""
    opened: weakref.WeakSet[_Tracked] = weakref.WeakSet()
    real_connect = sqlite3.connect

    def connect(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        kwargs.setdefault("factory", _Tracked)
        db: sqlite3.Connection = real_connect(*args, **kwargs)
        if isinstance(db, _Tracked):
            opened.add(db)
        return db

    monkeypatch.setattr(sqlite3, "connect", connect)
    yield
    for db in list(opened):
        db.close()


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
    """The cache real releases go to, shared by the whole session and by no other run: in
    the run's own HOME ($PATCHSET_CACHE_DIR as the session set it). A test that needs a
    release in it fetches it first (online, by range reads, as the product does)."""
    return Cache(_run_home[0] / ".cache" / "patchset")


@pytest.fixture
def tmp_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Cache:
    """An empty cache for one test, also set as $PATCHSET_CACHE_DIR."""
    root = tmp_path / "cache"
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(root))
    return Cache(root)


@pytest.fixture
def http_server() -> Iterator[FakeServer]:
    """A real HTTP server on 127.0.0.1 with scripted replies (see tests/helpers/fake_index.py)."""
    server = FakeServer()
    yield server
    server.close()


@pytest.fixture
def fake_index(http_server: FakeServer) -> FakeIndex:
    """vLLM on a fake package index served by `http_server`; add releases to it."""
    return FakeIndex(http_server)
