"""Docker-side faults: the engine gone in the middle of a build leaves no tag behind.

The engine is reached through a real unix-socket relay in front of the real dockerd, and the
relay is cut while the build streams its log: to patchset that is an engine that vanished.
"""

from __future__ import annotations

import contextlib
import secrets
import socket
import threading
from pathlib import Path

import pytest

from patchset.adapters import dockerengine
from patchset.errors import DockerError
from patchset.image.build import build
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from tests.infra.docker_fixtures import StandinImage
from tests.infra.run import image_repo
from tests.infra.standin import built_repository, for_tests

pytestmark = [pytest.mark.docker, pytest.mark.network]
REPO = Path(__file__).parents[2]
DOCKERD = "/var/run/docker.sock"


class Relay:
    """A unix socket that forwards every connection to dockerd until `cut()`."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.server.bind(str(path))
        self.server.listen(16)
        self.open: list[socket.socket] = []
        self.lock = threading.Lock()
        self.threads = [threading.Thread(target=self._accept, daemon=True)]
        self.threads[0].start()

    def _accept(self) -> None:
        while True:
            try:
                client, _ = self.server.accept()
            except OSError:
                return
            upstream = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            upstream.connect(DOCKERD)
            with self.lock:
                self.open += [client, upstream]
            for a, b in ((client, upstream), (upstream, client)):
                pipe = threading.Thread(target=self._pipe, args=(a, b), daemon=True)
                with self.lock:
                    self.threads.append(pipe)
                pipe.start()

    @staticmethod
    def _pipe(src: socket.socket, dst: socket.socket) -> None:
        try:
            while data := src.recv(65536):
                dst.sendall(data)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def cut(self) -> None:
        """Every connection cut, the relay's threads ended (closing a listening socket does
        not wake the thread blocked in accept(): shutting it down does)."""
        with contextlib.suppress(OSError):
            self.server.shutdown(socket.SHUT_RDWR)
        self.server.close()
        with self.lock:
            for s in self.open:
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)
                s.close()
        for thread in self.threads:
            if thread is not threading.current_thread():
                thread.join(timeout=10)


def test_engine_gone_mid_build_leaves_no_tag(
    tmp_path: Path, standin_base: StandinImage, engine: dockerengine.Engine
) -> None:
    relay = Relay(tmp_path / "docker.sock")
    repository = image_repo(f"gone-{secrets.token_hex(4)}")
    text = for_tests((REPO / "builds" / "0.19.1.toml").read_text())
    path = tmp_path / "0.19.1.toml"
    path.write_text(text.replace(f'"{built_repository()}"', f'"{repository}"'))
    definition = load_definition(path)
    cut_at: list[str] = []

    def on_log(line: str) -> None:
        if line.startswith("Step 2/") and not cut_at:
            cut_at.append(line)
            relay.cut()

    flaky = dockerengine.connect(f"unix://{relay.path}")
    try:
        with pytest.raises(DockerError):
            build(
                definition,
                load_registry(REPO / "patches"),
                engine=flaky,
                nocache=True,
                on_log=on_log,
            )
    finally:
        flaky.close()
        relay.cut()  # again, from this thread: its threads are joined
    assert not any(t.is_alive() for t in relay.threads), relay.threads
    assert cut_at, "the relay was never cut: the build did not stream its steps"
    assert [t for i in engine.client.images.list(name=repository) for t in i.tags] == []
