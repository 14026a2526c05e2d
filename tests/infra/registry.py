"""A throwaway distribution registry (Debian's ``docker-registry``) on 127.0.0.1.

dockerd treats registries on 127.0.0.0/8 as insecure-allowed by default, so plain HTTP on
loopback is enough for pushes and pulls; with `auth` it uses bcrypt htpasswd (basic auth).
"""

from __future__ import annotations

import base64
import json
import secrets
import shutil
import socket
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

REGISTRY_BIN = "/usr/bin/docker-registry"

CONFIG = """\
version: 0.1
log:
  level: warn
  accesslog:
    disabled: true
storage:
  filesystem:
    rootdirectory: {storage}
  delete:
    enabled: true
http:
  addr: 127.0.0.1:{port}
  secret: {secret}
{auth}"""

AUTH = """\
auth:
  htpasswd:
    realm: patchset-test
    path: {htpasswd}
"""


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class Registry:
    """A running registry; `address` is ``127.0.0.1:PORT``."""

    address: str
    process: subprocess.Popen[bytes]
    log: Path
    user: str | None = None
    password: str | None = None

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=10)

    def get(self, path: str, *, user: str | None = None, password: str | None = None) -> Any:
        """GET a JSON document of the registry's HTTP API (``/v2/_catalog``, ...); the
        registry's own credentials unless others are given."""
        request = urllib.request.Request(f"http://{self.address}{path}")
        user = user or self.user
        password = password or self.password
        if user is not None:
            token = base64.b64encode(f"{user}:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
        with urllib.request.urlopen(request, timeout=10) as response:  # noqa: S310 -- loopback
            return json.load(response)

    def repositories(self) -> list[str]:
        return list(self.get("/v2/_catalog").get("repositories") or [])

    def tags(self, repo: str) -> list[str]:
        try:
            return list(self.get(f"/v2/{repo}/tags/list").get("tags") or [])
        except urllib.error.HTTPError as exc:
            if exc.code == 404:
                return []
            raise


def start_registry(workdir: Path, *, auth: bool = False, timeout: float = 30.0) -> Registry:
    """Start a registry storing under `workdir`; wait until its API answers."""
    if not Path(REGISTRY_BIN).is_file():
        raise RuntimeError(f"{REGISTRY_BIN} is missing: run tests/infra/provision.sh as root")
    workdir.mkdir(parents=True, exist_ok=True)
    user = password = None
    auth_block = ""
    if auth:
        user, password = "patchset", secrets.token_urlsafe(12)
        htpasswd_bin = shutil.which("htpasswd")
        if htpasswd_bin is None:
            raise RuntimeError("htpasswd is missing: run tests/infra/provision.sh as root")
        made = subprocess.run(
            [htpasswd_bin, "-Bbn", user, password], capture_output=True, text=True, check=True
        )
        htpasswd = workdir / "htpasswd"
        htpasswd.write_text(made.stdout)
        auth_block = AUTH.format(htpasswd=htpasswd)
    last_error = ""
    for _attempt in range(3):  # another process may take the free port before we bind it
        port = free_port()
        config = workdir / "config.yml"
        config.write_text(
            CONFIG.format(
                storage=workdir / "storage",
                port=port,
                secret=secrets.token_hex(16),
                auth=auth_block,
            )
        )
        log = workdir / "registry.log"
        with log.open("ab") as sink:
            process = subprocess.Popen(
                [REGISTRY_BIN, "serve", str(config)], stdout=sink, stderr=subprocess.STDOUT
            )
        registry = Registry(f"127.0.0.1:{port}", process, log, user, password)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and process.poll() is None:
            try:
                registry.get("/v2/")
            except urllib.error.HTTPError:
                return registry  # it answers, if only to refuse
            except OSError:
                time.sleep(0.1)
                continue
            return registry
        registry.stop()
        last_error = log.read_text(errors="replace")[-2000:]
        if "address already in use" not in last_error:
            break
    raise RuntimeError(f"the registry did not start; its log ends with:\n{last_error}")
