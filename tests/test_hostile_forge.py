"""A hostile forge on 127.0.0.1 and rewritten caches (issue 37: E13 E14 E20): answers nested
100,000 deep, a rate-limit reset 5,000 digits long, a body dripped a byte at a time, control
bytes in `merged_at`; a forge cache entry and a memo row rewritten with a recomputed digest."""

from __future__ import annotations

import hashlib
import json
import sqlite3
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from patchset.adapters.forge import ForgeAPI, ForgeError
from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.release_check import check_tree
from patchset.release_check.memo import Memo
from patchset.sources.base import MemoryTree, ReleaseInfo
from tests.helpers.cli import run_cli, run_cli_bytes
from tests.helpers.fake_forge import FakeForge
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

PULL = "/repos/o/r/pulls/1"


class _Forge:
    """Answers by path: (status, headers, body, seconds between bytes)."""

    def __init__(self) -> None:
        self.routes: dict[str, tuple[int, dict[str, str], bytes, float]] = {}
        self.conditional = 0
        forge = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.headers.get("If-None-Match"):
                    forge.conditional += 1
                status, headers, body, drip = forge.routes[self.path]
                self.send_response(status)
                for k, v in {"Content-Length": str(len(body)), **headers}.items():
                    self.send_header(k, v)
                self.end_headers()
                try:
                    if not drip:
                        self.wfile.write(body)
                        return
                    for i in range(len(body)):
                        self.wfile.write(body[i : i + 1])
                        self.wfile.flush()
                        time.sleep(drip)
                except OSError:
                    return

            def log_message(self, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.api = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def answer(self, body: bytes, status: int = 200, drip: float = 0.0, **headers: str) -> None:
        self.routes[PULL] = (
            status,
            {k.replace("_", "-"): v for k, v in headers.items()},
            body,
            drip,
        )


@pytest.fixture
def forge() -> Iterator[_Forge]:
    fake = _Forge()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _pull(merged_at: str = "2026-11-30T12:00:00Z") -> bytes:
    data = {"number": 1, "state": "closed", "merged": True, "merged_at": merged_at,
            "merge_commit_sha": "a" * 40}  # fmt: skip
    return json.dumps(data).encode()


def test_an_answer_nested_100000_deep_is_one_line_exit_3(forge: _Forge) -> None:
    forge.answer(b'{"a":' * 100_000 + b"1" + b"}" * 100_000)
    with pytest.raises(ForgeError, match="nested more than") as caught:
        ForgeAPI(forge.api, token="").pull("o/r#1")
    assert caught.value.exit_code == ExitCode.UNAVAILABLE


def test_a_huge_rate_limit_reset_is_one_line(forge: _Forge) -> None:
    forge.answer(b"{}", status=403, x_ratelimit_remaining="0", x_ratelimit_reset="9" * 5000)
    with pytest.raises(ForgeError, match="rate limit is spent"):
        ForgeAPI(forge.api, token="").pull("o/r#1")


def test_a_dripped_answer_is_cut_off_at_the_timeout(forge: _Forge) -> None:
    """A byte every 0.2 s keeps each read alive: the whole answer is bounded, not each read."""
    forge.answer(_pull(), drip=0.2)
    started = time.monotonic()
    with pytest.raises(ForgeError, match=r"in time|whole answer"):
        ForgeAPI(forge.api, token="", timeout=1.0).pull("o/r#1")
    assert time.monotonic() - started < 5


def test_control_bytes_from_the_forge_are_escaped_in_every_format(
    forge: _Forge, tmp_path: Path
) -> None:
    """E14: ESC and BEL in `merged_at` reach neither the terminal, the workflow commands nor
    the step summary raw."""
    forge.answer(_pull("2026-11-30\x1b[2J\x1b]0;owned\x07T12:00:00Z"), etag='"e1"')
    state = ForgeAPI(forge.api, token="").pull("o/r#1")
    assert state.merged_at is not None and "\x1b" not in state.merged_at
    registry = tmp_path / "patches"
    folder = add_patch(registry, "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text().replace(
            '[upstream]\nstate = "unsubmitted"\n', '[upstream]\npr = "o/r#1"\nstate = "open"\n'
        )
    )
    summary = tmp_path / "summary.md"
    for fmt in ("table", "json", "markdown", "github"):
        done = run_cli_bytes(
            "--registry", registry, "upstream", "--format", fmt, timeout=120,
            env={"PATCHSET_FORGE_API_URL": forge.api, "GITHUB_TOKEN": "",
                 "GITHUB_STEP_SUMMARY": str(summary), "PATCHSET_CACHE_DIR": str(tmp_path / "c")},
        )  # fmt: skip
        assert done.returncode == ExitCode.ATTENTION, done.stderr
        for raw in (done.stdout, done.stderr):
            assert b"\x1b" not in raw and b"\x07" not in raw, (fmt, raw)
    text = summary.read_bytes()
    assert b"newly-merged" in text and b"\x1b" not in text and b"\x07" not in text


def test_a_rewritten_forge_cache_entry_is_not_believed(forge: _Forge, tmp_path: Path) -> None:
    """E20: an entry rewritten (the state changed, whatever digest recomputed) does not hold
    its keyed seal: asked for again, unconditionally, and the forge's answer taken."""
    cache = tmp_path / "forge"
    forge.answer(_pull(), etag='"e1"')
    ForgeAPI(forge.api, token="", cache_dir=cache).pull("o/r#1")
    (entry,) = list(cache.glob("*.json"))
    key = cache / ".seal-key"
    assert key.stat().st_mode & 0o777 == 0o600
    record = json.loads(entry.read_text())
    record["body"]["state"], record["body"]["merged"] = "open", False
    record["seal"] = hashlib.sha256(json.dumps(record["body"]).encode()).hexdigest()
    entry.write_text(json.dumps(record))
    again = ForgeAPI(forge.api, token="", cache_dir=cache).pull("o/r#1")
    assert (again.state, again.cached, forge.conditional) == ("merged", False, 0)
    third = ForgeAPI(forge.api, token="", cache_dir=cache).pull("o/r#1")
    assert third.state == "merged" and forge.conditional == 1  # a sound entry is still used


def test_a_memo_row_rewritten_with_a_recomputed_sha256_is_not_believed(tmp_path: Path) -> None:
    """E20: the red team's rewrite: every verdict `upstream`, its seal a sha256 recomputed over
    the row as the old memo made it; the keyed seal does not hold, the result is computed."""
    add_patch(tmp_path / "patches", "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    patches = load_registry(tmp_path / "patches").patches
    tree = MemoryTree(ReleaseInfo("0.19.0", "memory"), {"vllm/mod.py": BODY.encode()})
    with Memo(tmp_path / "memo") as made:
        (first,) = check_tree(patches, tree, "0.19.0", memo=made)
    memo = Memo(tmp_path / "memo")
    db = sqlite3.connect(memo.path)
    with db:
        ((key, value),) = db.execute("SELECT key, value FROM results").fetchall()
        forged = value.replace(f'"{first.verdict}"', '"upstream"')
        assert forged != value
        seal = hashlib.sha256("\0".join((key, forged)).encode()).hexdigest()
        db.execute("UPDATE results SET value = ?, seal = ?", (forged, seal))
    db.close()
    (again,) = check_tree(patches, tree, "0.19.0", memo=memo)
    assert again.verdict == first.verdict != "upstream"
    assert (memo.hits, memo.misses) == (0, 1)


def test_a_forge_dripping_its_headers_is_cut_off_at_the_timeout(tmp_path: Path) -> None:
    """E13: a byte a second of the status line and headers (each read gets something, so no
    per-read timeout fires; 1.8 KB of headers would take half an hour): `upstream --timeout 3`
    ends within the timeout (process start aside) with one line, exit 3."""
    registry = tmp_path / "patches"
    folder = add_patch(registry, "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text().replace(
            '[upstream]\nstate = "unsubmitted"\n', '[upstream]\npr = "o/r#1"\nstate = "open"\n'
        )
    )
    forge = FakeForge()
    forge.script.mode = "drip-head"
    try:
        started = time.monotonic()
        done = run_cli(
            "--registry", registry, "upstream", "--timeout", "3", timeout=120,
            env={"PATCHSET_FORGE_API_URL": forge.api, "GITHUB_TOKEN": "",
                 "PATCHSET_CACHE_DIR": str(tmp_path / "c")},
        )  # fmt: skip
        took = time.monotonic() - started
    finally:
        forge.close()
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    said = done.stderr.strip().splitlines()
    assert len(said) == 1 and "no whole answer in 3 s" in said[0], said
    assert took < 3 + 10, took  # the timeout, and the process's start on a loaded machine
