"""patchset.adapters.net against a real HTTP server on 127.0.0.1: retries, 4xx, truncation."""

from __future__ import annotations

import base64
import hashlib
import json
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from patchset.adapters import net
from patchset.errors import IntegrityError, SourceError
from patchset.sources.package_index.cache import Cache
from patchset.sources.package_index.client import PackageIndex
from tests.helpers.fake_index import FakeServer, Reply

PAYLOAD = b"0123456789abcdef" * 10_000  # bigger than one read chunk
PAYLOAD_SHA = hashlib.sha256(PAYLOAD).hexdigest()


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "BACKOFF_BASE", 0.001)


def free_port() -> int:
    """A loopback port nobody listens on (bound, then released)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
    return port


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def get_json(url: str, **kwargs: Any) -> Any:
    """A JSON answer through `net.fetch_page`, as the index client asks for its pages."""
    return json.loads(net.fetch_page(url, accept="application/json", **kwargs)[2])


def test_fetch_page(http_server: FakeServer) -> None:
    http_server.route("/x/json", Reply(200, b'{"a": [1, 2]}'))
    assert get_json(f"{http_server.url}/x/json") == {"a": [1, 2]}


def test_a_500_is_retried(http_server: FakeServer) -> None:
    http_server.route("/x", Reply(500), Reply(503), Reply(200, b"[]"))
    assert get_json(f"{http_server.url}/x", retries=3) == []
    assert http_server.hits["/x"] == 3


def test_404_is_not_retried(http_server: FakeServer) -> None:
    with pytest.raises(net.HTTPStatusError) as caught:
        get_json(f"{http_server.url}/missing", retries=5)
    assert caught.value.status == 404
    assert http_server.hits["/missing"] == 1
    assert "HTTP 404" in str(caught.value)


def test_persistent_500_gives_one_clear_line(http_server: FakeServer) -> None:
    http_server.route("/x", Reply(502))
    with pytest.raises(net.UnreachableError) as caught:
        get_json(f"{http_server.url}/x", retries=2)
    message = str(caught.value)
    assert message == (
        f"cannot reach the package index at {http_server.url}/x: HTTP 502 Bad Gateway"
        " (tried 3 times); use --offline to work from the cache"
    )
    assert "\n" not in message
    assert http_server.hits["/x"] == 3
    assert caught.value.exit_code == 3


def test_unreachable_port() -> None:
    url = f"http://127.0.0.1:{free_port()}/pypi/vllm/json"
    with pytest.raises(net.UnreachableError) as caught:
        get_json(url, retries=1, timeout=2)
    message = str(caught.value)
    assert message.startswith(f"cannot reach the package index at {url}: ")
    assert "refused" in message.lower()
    assert message.endswith("(tried 2 times); use --offline to work from the cache")


def test_a_hung_server_is_given_up_on_after_the_timeout(http_server: FakeServer) -> None:
    """The timeout bounds the whole wait without an answer, retries included: a server that
    does not answer is not asked again (each retry would wait as long again)."""
    http_server.route("/slow", Reply(200, b"{}", delay=1.5))
    start = time.monotonic()
    with pytest.raises(net.UnreachableError, match=r"timed out \(tried once\)"):
        get_json(f"{http_server.url}/slow", retries=3, timeout=0.3)
    assert time.monotonic() - start < 1.2
    assert http_server.hits["/slow"] == 1


def test_a_hung_server_is_not_waited_on_again_in_the_same_run(
    http_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Once a server gave no answer for a whole timeout, the run's next requests to it fail at
    once (a check's many requests would otherwise each wait the timeout in turn); another
    server is asked as usual, and the server is asked again once HUNG_FOR has passed."""
    monkeypatch.setattr(net, "_HUNG", {})
    http_server.route("/slow", Reply(200, b"{}", delay=1.5))
    http_server.route("/fine", Reply(200, b"[1]"))
    with pytest.raises(net.UnreachableError, match="timed out"):
        get_json(f"{http_server.url}/slow", retries=3, timeout=0.3)
    start = time.monotonic()
    with pytest.raises(net.UnreachableError, match=r"no answer .* earlier in this run"):
        get_json(f"{http_server.url}/fine", retries=3, timeout=0.3)
    assert time.monotonic() - start < 0.1
    assert http_server.hits.get("/fine", 0) == 0
    monkeypatch.setattr(net, "HUNG_FOR", 0.0)
    assert get_json(f"{http_server.url}/fine", retries=3, timeout=0.3) == [1]


def test_a_server_that_answers_is_retried_within_the_timeout(http_server: FakeServer) -> None:
    """Quick failures (a 503, a body cut off after some bytes) are heard from: they are tried
    again, however short the timeout."""
    http_server.route("/flaky", Reply(503), Reply(200, PAYLOAD, truncate=1000), Reply(200, b"[1]"))
    assert get_json(f"{http_server.url}/flaky", retries=3, timeout=0.3) == [1]
    assert http_server.hits["/flaky"] == 3


def test_not_json(http_server: FakeServer, tmp_cache: Cache) -> None:
    """An index answering garbage where its project page should be: one line, exit 3."""
    http_server.route("/simple/vllm/", Reply(200, b"<html", content_type="application/json"))
    index = PackageIndex(f"{http_server.url}/simple", cache=tmp_cache, retries=0)
    with pytest.raises(SourceError, match="not a simple-API project page") as caught:
        index.files()
    assert caught.value.exit_code == 3 and "\n" not in str(caught.value)


def test_only_web_and_file_urls() -> None:
    with pytest.raises(SourceError, match="only https, http, file URLs"):
        get_json("ftp://127.0.0.1/x")


def test_file_url_for_a_local_mirror(tmp_path: Path) -> None:
    answer = tmp_path / "json"
    answer.write_text(json.dumps({"releases": {}}))
    assert get_json(answer.as_uri()) == {"releases": {}}


def test_credentials_go_into_a_header_and_out_of_messages(http_server: FakeServer) -> None:
    url = http_server.url.replace("://", "://me:s%40cret@") + "/private"
    with pytest.raises(net.HTTPStatusError) as caught:
        get_json(url)
    sent = http_server.headers("/private")["Authorization"]
    assert base64.b64decode(sent.removeprefix("Basic ")) == b"me:s@cret"
    assert "cret" not in str(caught.value)


def test_download_verifies_and_reports_progress(http_server: FakeServer, tmp_path: Path) -> None:
    http_server.route("/f.tar.gz", Reply(200, PAYLOAD))
    dest = tmp_path / "dl" / "f.tar.gz"
    seen: list[tuple[int, int]] = []
    net.download(
        f"{http_server.url}/f.tar.gz",
        dest,
        sha256=PAYLOAD_SHA.upper(),
        progress=lambda done, total: seen.append((done, total)),
    )
    assert dest.read_bytes() == PAYLOAD
    assert leftovers(dest.parent) == ["f.tar.gz"]
    assert seen[0] == (0, len(PAYLOAD))
    assert seen[-1] == (len(PAYLOAD), len(PAYLOAD))
    assert [done for done, _ in seen] == sorted(done for done, _ in seen)


def test_download_retries_a_truncated_body(http_server: FakeServer, tmp_path: Path) -> None:
    http_server.route("/f", Reply(200, PAYLOAD, truncate=1000), Reply(200, PAYLOAD))
    dest = tmp_path / "f"
    net.download(f"{http_server.url}/f", dest, sha256=PAYLOAD_SHA, retries=2)
    assert dest.read_bytes() == PAYLOAD
    assert http_server.hits["/f"] == 2
    assert leftovers(tmp_path) == ["f"]


def test_download_always_truncated_leaves_nothing(http_server: FakeServer, tmp_path: Path) -> None:
    http_server.route("/f", Reply(200, PAYLOAD, truncate=1000))
    with pytest.raises(net.UnreachableError, match=f"closed after 1000 of {len(PAYLOAD)} bytes"):
        net.download(f"{http_server.url}/f", tmp_path / "f", sha256=PAYLOAD_SHA, retries=1)
    assert leftovers(tmp_path) == []


def test_wrong_sha256_deletes_and_does_not_retry(http_server: FakeServer, tmp_path: Path) -> None:
    http_server.route("/f", Reply(200, PAYLOAD))
    dest = tmp_path / "f"
    dest.write_bytes(b"an older good copy")
    with pytest.raises(IntegrityError, match="does not match") as caught:
        net.download(f"{http_server.url}/f", dest, sha256="0" * 64, retries=3)
    assert http_server.hits["/f"] == 1
    assert dest.read_bytes() == b"an older good copy"  # only a verified file replaces it
    assert leftovers(tmp_path) == ["f"]
    assert caught.value.exit_code == 3


def test_download_404_names_the_status(http_server: FakeServer, tmp_path: Path) -> None:
    with pytest.raises(net.HTTPStatusError, match="HTTP 404"):
        net.download(f"{http_server.url}/gone", tmp_path / "f", sha256=PAYLOAD_SHA)
    assert http_server.hits["/gone"] == 1
    assert leftovers(tmp_path) == []


def test_remote_addresses_are_refused_in_unit_tests() -> None:
    """The conftest guard stops the lookup before any packet leaves the machine."""
    with pytest.raises(RuntimeError, match="mark it network"):
        socket.getaddrinfo("vllm-release.invalid", 443)


def test_the_http_libraries_are_imported_with_the_first_request() -> None:
    """A command that asks no server (a report kept from last time) imports the index client
    and `parallel.wanted` without urllib3, http.client, ssl or the kernel (~70 ms)."""
    code = (
        "import sys, patchset.sources.package_index.client, patchset.release_check.parallel;"
        "print(sorted(m for m in ('urllib3', 'ssl', 'http.client', 'urllib.request',"
        " 'patchset.adapters.net.pools', 'patchset.kernel.touches', 'patchset.kernel.manifest')"
        " if m in sys.modules))"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
