"""A real HTTP server on 127.0.0.1 that plays a package index, and small real-format vLLM
wheels and sdists.

The index speaks only the simple API (PEP 691 JSON, or PEP 503 HTML with ``html=True``) and
serves byte ranges like a real file host (``Reply(ranges=False)`` ignores them,
``Reply(wrong_range=True)`` answers 206 with another range).

Replies are scripted per path: each request takes the next scripted reply and the last one
repeats, so "500 then 200" is ``server.route(path, Reply(500), Reply(200, body))``.
"""

from __future__ import annotations

import base64
import hashlib
import html
import http.server
import io
import json
import re
import sys
import tarfile
import threading
import time
import zipfile
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass(frozen=True)
class Reply:
    status: int = 200
    body: bytes = b""
    truncate: int | None = None  # send only this many body bytes (Content-Length says all)
    delay: float = 0.0  # seconds to wait before answering
    content_type: str = ""
    ranges: bool = True  # answer a Range header with 206 and the bytes asked for
    wrong_range: bool = False  # a 206 whose bytes are not those asked for


@dataclass
class _Script:
    routes: dict[str, list[Reply]] = field(default_factory=dict)
    hits: Counter[str] = field(default_factory=Counter)
    headers: dict[str, dict[str, str]] = field(default_factory=dict)  # the last, per path
    ranges: dict[str, list[str]] = field(default_factory=dict)  # Range headers, per path
    lock: threading.Lock = field(default_factory=threading.Lock)

    def next_reply(self, path: str, headers: dict[str, str]) -> Reply:
        with self.lock:
            self.hits[path] += 1
            self.headers[path] = headers
            if "Range" in headers:
                self.ranges.setdefault(path, []).append(headers["Range"])
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
        wanted = _byte_range(self.headers.get("Range"), len(body)) if reply.ranges else None
        if wanted is not None and reply.status == 200:
            first, last = wanted
            if reply.wrong_range:
                first, last = max(first - 1, 0), max(last - 1, 0)
            self.send_response(206)
            self.send_header("Content-Range", f"bytes {first}-{last}/{len(body)}")
            body = body[first : last + 1]
        else:
            self.send_response(reply.status)
        if reply.content_type:
            self.send_header("Content-Type", reply.content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        try:
            self.wfile.write(body if reply.truncate is None else body[: reply.truncate])
        except ConnectionError:  # the client stopped reading (a server that ignores ranges)
            self.close_connection = True
        if reply.truncate is not None:
            self.close_connection = True

    def log_message(self, format: str, *args: Any) -> None:
        """Quiet: tests read `hits`, not the log."""


def _byte_range(header: str | None, size: int) -> tuple[int, int] | None:
    match = re.fullmatch(r"bytes=(\d*)-(\d*)", header or "")
    if match is None or size == 0:
        return None
    if not match[1]:
        return max(size - int(match[2]), 0), size - 1
    return int(match[1]), min(int(match[2]) if match[2] else size - 1, size - 1)


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

    def ranges(self, path: str) -> list[str]:
        """The Range headers asked for `path`, in order."""
        return list(self._server.script.ranges.get(path, []))

    def route(self, path: str, *replies: Reply) -> None:
        self._server.script.routes[path] = list(replies)

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()


class FakeIndex:
    """vLLM on a fake simple-API index: the project page at ``/simple/vllm/``, wheels and
    sdists under ``/packages/`` linked by relative URLs, as real indexes do."""

    PAGE_PATH = "/simple/vllm/"

    def __init__(self, server: FakeServer) -> None:
        self.server = server
        self.files: dict[str, list[dict[str, Any]]] = {}  # version -> file entries
        self.sdists: dict[str, bytes] = {}
        self.wheels: dict[str, bytes] = {}
        self.html = False  # serve PEP 503 HTML instead of PEP 691 JSON

    @property
    def index_url(self) -> str:
        return f"{self.server.url}/simple/"

    def sdist_path(self, version: str) -> str:
        return f"/packages/vllm-{version}.tar.gz"

    def wheel_path(self, version: str) -> str:
        return f"/packages/{wheel_name(version)}"

    def add_release(
        self,
        version: str,
        files: dict[str, bytes] | None = None,
        *,
        yanked: bool = False,
        sha256: str | None = None,
        sdist: bytes | None = None,
        wheel: bytes | None = None,
        wheel_only: bool = False,
        sdist_only: bool = False,
        ranges: bool = True,
    ) -> bytes:
        """Publish `version` (a wheel and an sdist of `files`); returns the sdist's bytes.

        `sha256` overrides the digest the index announces for both.
        """
        sdist_data = sdist if sdist is not None else make_sdist(version, files or {})
        wheel_data = wheel if wheel is not None else make_wheel(version, files or {})
        entries = []
        if not sdist_only:
            entries.append(self._entry(wheel_name(version), wheel_data, sha256, yanked))
            self.server.route(self.wheel_path(version), Reply(200, wheel_data, ranges=ranges))
        if not wheel_only:
            entries.append(self._entry(f"vllm-{version}.tar.gz", sdist_data, sha256, yanked))
            self.server.route(self.sdist_path(version), Reply(200, sdist_data, ranges=ranges))
        self.files[version] = entries
        self.sdists[version] = sdist_data
        self.wheels[version] = wheel_data
        self.publish()
        return sdist_data

    @staticmethod
    def _entry(name: str, data: bytes, sha256: str | None, yanked: bool) -> dict[str, Any]:
        return {
            "filename": name,
            "url": f"../../packages/{name}",
            "hashes": {"sha256": sha256 or hashlib.sha256(data).hexdigest()},
            "size": len(data),
            "yanked": yanked,
        }

    def page(self) -> tuple[bytes, str]:
        entries = [e for files in self.files.values() for e in files]
        if self.html:
            links = "".join(
                f'<a href="{html.escape(e["url"])}#sha256={e["hashes"]["sha256"]}"'
                + (' data-yanked=""' if e["yanked"] else "")
                + f">{html.escape(e['filename'])}</a><br/>\n"
                for e in entries
            )
            body = f"<!DOCTYPE html><html><body><h1>vllm</h1>{links}</body></html>"
            return body.encode(), "text/html"
        answer = {"meta": {"api-version": "1.1"}, "name": "vllm", "files": entries}
        return json.dumps(answer).encode(), "application/vnd.pypi.simple.v1+json"

    def publish(self) -> None:
        body, kind = self.page()
        self.server.route(self.PAGE_PATH, Reply(200, body, content_type=kind))


def wheel_name(version: str) -> str:
    return f"vllm-{version}-py3-none-any.whl"


def make_wheel(
    version: str,
    files: dict[str, bytes],
    *,
    record: dict[str, str] | None = None,
    stored: bool = False,
) -> bytes:
    """A wheel laid out like vLLM's: ``vllm/...`` plus its dist-info with a real RECORD.

    `record` overrides RECORD's sha256 (hex) for some members, to make a lying RECORD.
    """
    members = {
        "vllm/__init__.py": b"",
        "vllm/_version.py": f"__version__ = version = '{version}'\n".encode(),
        **{name: data for name, data in files.items() if name.startswith("vllm/")},
        f"vllm-{version}.dist-info/METADATA": f"Name: vllm\nVersion: {version}\n".encode(),
        f"vllm-{version}.dist-info/WHEEL": b"Wheel-Version: 1.0\nRoot-Is-Purelib: true\n",
    }
    rows = []
    for name, data in members.items():
        digest = hashlib.sha256(data).digest()
        if record and name in record:
            digest = bytes.fromhex(record[name])
        b64 = base64.urlsafe_b64encode(digest).rstrip(b"=").decode()
        rows.append(f"{name},sha256={b64},{len(data)}")
    rows.append(f"vllm-{version}.dist-info/RECORD,,")
    out = io.BytesIO()
    method = zipfile.ZIP_STORED if stored else zipfile.ZIP_DEFLATED
    with zipfile.ZipFile(out, "w", compression=method) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"vllm-{version}.dist-info/RECORD", "\n".join(rows) + "\n")
    return out.getvalue()


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
