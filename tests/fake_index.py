"""A real HTTP server on 127.0.0.1 that plays a package index, and tiny fake vLLM sdists.

Replies are scripted per path: each request takes the next scripted reply and the last one
repeats, so "500 then 200" is ``server.route(path, Reply(500), Reply(200, body))``.
"""

from __future__ import annotations

import hashlib
import http.server
import io
import json
import sys
import tarfile
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    truncate: int | None = None  # send only this many body bytes (Content-Length says all)
    delay: float = 0.0  # seconds to wait before answering


@dataclass
class _Script:
    routes: dict[str, list[Reply]] = field(default_factory=dict)
    hits: Counter[str] = field(default_factory=Counter)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # the last, per path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, path: str, headers: dict[str, str]) -> Reply:
        with self.lock:
            self.hits[path] += 1
            self.headers[path] = headers
            replies = self.routes.get(path)
            if not replies:
                return Reply(404, b"not found")
            return replies.pop(0) if len(replies) > 1 else replies[0]


class _Handler(http.server.BaseHTTPRequestHandler):
    server: _Server

    def do_GET(self) -> None:
        reply = self.server.script.next_reply(self.path, dict(self.headers.items()))
        if reply.delay:
            time.sleep(reply.delay)
        body = reply.body
        self.send_response(reply.status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body if reply.truncate is None else body[: reply.truncate])
        if reply.truncate is not None:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `hits`, not the log."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = False
    block_on_close = True  # server_close() waits for handlers, so nothing outlives a test

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.script = _Script()

    def handle_error(self, request: Any, client_address: Any) -> None:
        """A client that gave up (a timeout test) is expected; anything else is reported."""
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


class FakeServer:
    """The running server: ``url`` is ``http://127.0.0.1:<port>``."""

    def __init__(self) -> None:
        self._server = _Server()
        self._thread = threading.Thread(
            target=self._server.serve_forever, kwargs={"poll_interval": 0.02}, daemon=True
        )
        self._thread.start()
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"

    @property
    def hits(self) -> Counter[str]:
        return self._server.script.hits

    def headers(self, path: str) -> dict[str, str]:
        return self._server.script.headers[path]

    def route(self, path: str, *replies: Reply) -> None:
        self._server.script.routes[path] = list(replies)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class FakeIndex:
    """vLLM on a fake index: a JSON API answer at ``/pypi/vllm/json`` and sdists under
    ``/packages/`` linked by relative URLs, as the real index does."""

    JSON_PATH = "/pypi/vllm/json"

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.releases: dict[str, list[dict[str, Any]]] = {}
        self.sdists: dict[str, bytes] = {}

    @property
    def index_url(self) -> str:
        return f"{self.server.url}/simple/"

    def sdist_path(self, version: str) -> str:
        return f"/packages/vllm-{version}.tar.gz"

    def add_release(
        self,
        version: str,
        files: dict[str, bytes] | None = None,
        *,
        yanked: bool = False,
        sha256: str | None = None,
        sdist: bytes | None = None,
        wheel_only: bool = False,
    ) -> bytes:
        """Publish `version`; `sha256` overrides the digest the index announces."""
        data = sdist if sdist is not None else make_sdist(version, files or {})
        entry: dict[str, Any] = {
            "filename": f"vllm-{version}.tar.gz",
            "packagetype": "sdist",
            "url": f"../..{self.sdist_path(version)}",
            "digests": {"sha256": sha256 or hashlib.sha256(data).hexdigest(), "md5": "x"},
            "size": len(data),
            "yanked": yanked,
        }
        wheel = {**entry, "filename": f"vllm-{version}-py3-none-any.whl"}
        wheel["packagetype"] = "bdist_wheel"
        self.releases[version] = [wheel] if wheel_only else [wheel, entry]
        self.sdists[version] = data
        self.server.route(self.sdist_path(version), Reply(200, data))
        self.publish()
        return data

    def publish(self) -> None:
        answer = {"info": {"name": "vllm"}, "releases": self.releases, "urls": []}
        self.server.route(self.JSON_PATH, Reply(200, json.dumps(answer).encode()))


def make_sdist(
    version: str,
    files: dict[str, bytes],
    *,
    extra: list[tarfile.TarInfo] | None = None,
) -> bytes:
    """A tar.gz laid out like vLLM's: ``vllm-X/vllm/...`` plus some files outside vllm/."""
    top = f"vllm-{version}"
    members = {
        f"{top}/setup.py": b"# not part of the package\n",
        f"{top}/tests/test_x.py": b"# nor this\n",
        f"{top}/vllm/__init__.py": b"",
        f"{top}/vllm/_version.py": f"__version__ = version = '{version}'\n".encode(),
        **{f"{top}/{name}": data for name, data in files.items()},
    }
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        folder = tarfile.TarInfo(f"{top}/vllm")
        folder.type = tarfile.DIRTYPE
        tar.addfile(folder)
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        for info in extra or []:
            tar.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return out.getvalue()
