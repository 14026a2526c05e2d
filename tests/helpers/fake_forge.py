"""A fake forge on 127.0.0.1 speaking the shape of GitHub's REST API for pull requests
(``GET /repos/{owner}/{repo}/pulls/{n}``: state, merged, merged_at, merge_commit_sha), with
ETags and If-None-Match, a scripted failure mode, and a log of what was asked."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import re
import socket
import threading
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

_PULL = re.compile(r"^/api/repos/(?P<owner>[^/]+)/(?P<repo>[^/]+)/pulls/(?P<n>\d+)$")


@dataclass
class ForgeScript:
    pulls: dict[str, dict[str, Any]] = field(default_factory=dict)  # "owner/repo#n" -> body
    # ok | rate-limit | rate-limit-429 | unauthorized | html | bad-json | redirect | drip-head
    mode: str = "ok"
    drip: float = 1.0  # mode drip-head: seconds between the bytes of its status line and headers
    redirect_to: str = ""  # mode redirect: the base URL the answer sends the client to
    hits: Counter[str] = field(default_factory=Counter)
    conditional: Counter[str] = field(default_factory=Counter)  # asked with If-None-Match
    authorization: list[str | None] = field(default_factory=list)


class _Server(http.server.ThreadingHTTPServer):
    """Its handlers' threads end with it: `server_close` cuts the connections a client keeps
    open (HTTP/1.1 keep-alive) and joins the threads serving them."""

    daemon_threads = False
    block_on_close = True

    def __init__(self, handler: type[http.server.BaseHTTPRequestHandler]) -> None:
        super().__init__(("127.0.0.1", 0), handler)
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()

    def get_request(self) -> tuple[socket.socket, Any]:
        conn, address = super().get_request()
        with self.connections_lock:
            self.connections.add(conn)
        return conn, address

    def shutdown_request(self, request: Any) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)

    def server_close(self) -> None:
        with self.connections_lock:
            for conn in self.connections:
                with contextlib.suppress(OSError):
                    conn.shutdown(socket.SHUT_RDWR)
        super().server_close()


class FakeForge:
    def __init__(self) -> None:
        self.script = ForgeScript()
        script = self.script

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                script.hits[self.path] += 1
                script.authorization.append(self.headers.get("Authorization"))
                if script.mode == "redirect":
                    self._send(301, b"", {"Location": script.redirect_to + self.path})
                    return
                if script.mode == "rate-limit":
                    self._send(
                        403,
                        b'{"message": "API rate limit exceeded"}',
                        {"X-RateLimit-Remaining": "0", "X-RateLimit-Reset": "1893456000"},
                    )
                    return
                if script.mode == "rate-limit-429":
                    self._send(429, b'{"message": "slow down"}', {"Retry-After": "60"})
                    return
                if script.mode == "unauthorized":
                    self._send(401, b'{"message": "Bad credentials"}')
                    return
                if script.mode == "html":
                    self._send(
                        200,
                        b"<html><body>Sign in to the proxy</body></html>",
                        {"Content-Type": "text/html"},
                    )
                    return
                if script.mode == "drip-head":
                    self._drip(b'{"state": "open", "merged": false}')
                    return
                if script.mode == "bad-json":
                    self._send(200, b'{"state": "open", "merged": fal')
                    return
                match = _PULL.match(self.path)
                key = match and f"{match['owner']}/{match['repo']}#{match['n']}"
                if match is None or not key or key not in script.pulls:
                    self._send(404, b'{"message": "Not Found"}')
                    return
                body = json.dumps({"number": int(match["n"]), "title": "x", **script.pulls[key]})
                etag = '"' + hashlib.sha256(body.encode()).hexdigest()[:16] + '"'
                if self.headers.get("If-None-Match") == etag:
                    script.conditional[self.path] += 1
                    self._send(304, b"", {"ETag": etag})
                    return
                self._send(200, body.encode(), {"ETag": etag, "X-RateLimit-Remaining": "4999"})

            def _drip(self, body: bytes) -> None:
                """Its status line and headers a byte at a time (each read gets something
                before any per-read timeout), then the body."""
                head = (
                    "HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    + "".join(f"X-Filler-{i}: {'x' * 20}\r\n" for i in range(50))
                    + f"Content-Length: {len(body)}\r\n\r\n"
                ).encode()
                with contextlib.suppress(OSError):
                    for i in range(len(head)):
                        self.wfile.write(head[i : i + 1])
                        self.wfile.flush()
                        time.sleep(script.drip)
                    self.wfile.write(body)
                self.close_connection = True

            def _send(
                self, status: int, body: bytes, headers: dict[str, str] | None = None
            ) -> None:
                self.send_response(status)
                for name, value in {"Content-Type": "application/json", **(headers or {})}.items():
                    self.send_header(name, value)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self._server = _Server(Handler)
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self.api = f"http://127.0.0.1:{self._server.server_address[1]}/api"

    def pull(
        self,
        pr: str,
        state: str = "open",
        *,
        merged: bool = False,
        sha: str | None = None,
        merged_at: str | None = None,
    ) -> None:
        self.script.pulls[pr] = {
            "state": state,
            "merged": merged,
            "merged_at": merged_at or ("2026-11-30T12:00:00Z" if merged else None),
            "merge_commit_sha": sha,
        }

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()
