"""The package index source against a real local simple-API index on 127.0.0.1 (and a
``file://`` one): pip's settings, the client, wheels read by range, the sdist fallback, the
cache and its checks. The one test marked network reads a real release through the
configured index.
"""

from __future__ import annotations

import base64
import hashlib
import io
import json
import os
import shutil
import socket
import sqlite3
import subprocess
import sys
import threading
import time
import zipfile
from pathlib import Path
from typing import Any

import pytest

from patchset.adapters import net
from patchset.cachedir import cache_location, cache_root
from patchset.errors import IntegrityError, SourceError
from patchset.registry import load_registry
from patchset.release_check import check
from patchset.release_check.memo import Memo
from patchset.sources import package_index, parse_source
from patchset.sources.base import ReleaseSource, ReleaseTree
from patchset.sources.package_index import IndexSource, blobs, packing
from patchset.sources.package_index import cache as cache_module
from patchset.sources.package_index import settings as pip_settings
from patchset.sources.package_index.cache import Cache
from patchset.sources.package_index.client import PackageIndex
from patchset.sources.package_index.settings import IndexSettings, resolve
from tests.helpers.cli import command, run_cli
from tests.helpers.fake_index import (
    FakeIndex,
    FakeServer,
    Reply,
    make_sdist,
    make_wheel,
    wheel_name,
)
from tests.helpers.synthetic import add_patch

UTILS = "vllm/model_executor/layers/fla/ops/utils.py"
SOURCE = b"is_tma_supported = True\n"
REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "BACKOFF_BASE", 0.001)


@pytest.fixture
def index(fake_index: FakeIndex) -> FakeIndex:
    fake_index.add_release("0.1.0", {UTILS: SOURCE, "csrc/ops.cu": b"// kernel\n"})
    fake_index.add_release("0.2.0", {UTILS: b"is_tma_supported = False\n"})
    return fake_index


def settings(url: str) -> IndexSettings:
    """Settings as pip would give them for `url`, without running pip (tests of the
    resolution itself run it)."""
    return IndexSettings(url, "test", net.Transport())


def source(index: FakeIndex, cache: Cache, **kwargs: object) -> IndexSource:
    return IndexSource(index.index_url, cache=cache, settings=settings(index.index_url), **kwargs)  # type: ignore[arg-type]


def offline_source(cache: Cache, **kwargs: object) -> IndexSource:
    url = unreachable_index_url()
    return IndexSource(url, cache=cache, offline=True, settings=settings(url), **kwargs)  # type: ignore[arg-type]


def unreachable_index_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple/"


def read(src: IndexSource, version: str, path: str = UTILS) -> bytes | None:
    with src.open(version) as tree:
        return tree.read(path)


def cache_files(cache: Cache) -> list[str]:
    return sorted(
        p.relative_to(cache.root).as_posix()
        for p in cache.root.rglob("*")
        if p.is_file() and p.parent.name not in {"locks", "settings"}
    )


def cli(
    *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    return run_cli("--registry", REPO / "patches", *args, env=env, timeout=timeout)


# -- pip's settings, by public means ---------------------------------------------------------


def test_index_url_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://configured.invalid/simple\n"
        "extra-index-url = file:///ignored/simple\ncert = /etc/x.pem\n"
        "trusted-host = a.invalid b.invalid:8080\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    for name in ("PIP_INDEX_URL", "PIP_CERT", "PIP_TRUSTED_HOST"):
        monkeypatch.delenv(name, raising=False)
    found = resolve()
    assert (found.index_url, found.chosen_by) == (
        "https://configured.invalid/simple",
        "pip config (index-url)",
    )
    assert found.transport.cafile == "/etc/x.pem"
    assert found.transport.trusted_hosts == ("a.invalid", "b.invalid:8080")
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.invalid/simple/")
    assert resolve().index_url == "https://env.invalid/simple/"
    given = resolve("https://u:p%40ss@given.invalid/simple")
    assert (given.index_url, given.chosen_by) == ("https://given.invalid/simple", "--index-url")
    assert given.transport.credentials == (("given.invalid", "u", "p@ss"),)


def test_default_index_is_pips(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no config file
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    found = resolve(memo=tmp_path / "memo")
    assert found.chosen_by == "pip's default"
    assert found.index_url.startswith("https://") and found.index_url.endswith("/simple")
    assert not (tmp_path / "memo").exists()  # on Linux pip's files are read: nothing to keep
    assert resolve(memo=tmp_path / "memo") == found


def _write(path: Path, text: str) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    "case", ["user", "xdg-user", "legacy-and-xdg", "named-file", "named-missing", "devnull"]
)
def test_pips_files_read_as_pip_config_list_reads_them(
    case: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The reader of pip's files answers what pip itself answers (`pip config list`), for
    each place a user keeps them, with sections, later files and variables overriding."""
    home, xdg = tmp_path / "home", tmp_path / "xdg"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("PIP_CONFIG_FILE", raising=False)
    monkeypatch.setenv("XDG_CONFIG_DIRS", str(tmp_path / "etc-xdg"))
    _write(tmp_path / "etc-xdg" / "pip" / "pip.conf", "[global]\ntimeout = 7\ncert = /g.pem\n")
    user = "[global]\nindex-url = https://user.invalid/simple\n[install]\ncert = /i.pem\n"
    if case == "user":
        _write(home / ".config" / "pip" / "pip.conf", user)
    elif case == "xdg-user":
        monkeypatch.setenv("XDG_CONFIG_HOME", str(xdg))
        _write(xdg / "pip" / "pip.conf", user + "[download]\nTrusted_Host = d.invalid\n")
    elif case == "legacy-and-xdg":
        _write(home / ".pip" / "pip.conf", "[global]\nindex-url = https://legacy.invalid/s\n")
        _write(home / ".config" / "pip" / "pip.conf", user)
    elif case == "named-file":
        _write(home / ".config" / "pip" / "pip.conf", user)  # skipped: the named file exists
        named = _write(tmp_path / "named.conf", "[global]\nindex-url = https://n.invalid/s\n")
        monkeypatch.setenv("PIP_CONFIG_FILE", named)
    elif case == "named-missing":
        _write(home / ".config" / "pip" / "pip.conf", user)  # read: the named file is missing
        monkeypatch.setenv("PIP_CONFIG_FILE", str(tmp_path / "absent.conf"))
    else:
        _write(home / ".config" / "pip" / "pip.conf", user)
        monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)
    monkeypatch.setenv("PIP_TRUSTED_HOST", "env.invalid")
    pip_says = pip_settings.ask_pip_config()
    assert pip_says, "pip config list answered nothing: the comparison would prove nothing"
    assert pip_settings.read_pip_config() == pip_says


def test_remembered_pip_config_follows_a_changed_config(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """pip's answer is remembered per config file stamp and PIP_* variables: an edited file or
    a new variable is asked for again, never answered from the memo."""
    config = tmp_path / "pip.conf"
    config.write_text("[global]\nindex-url = https://first.invalid/simple\n")
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    for name in ("PIP_INDEX_URL", "PIP_CERT", "PIP_TRUSTED_HOST"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(sys, "platform", "darwin")  # where pip's answer is asked and kept
    memo = tmp_path / "memo"
    assert resolve(memo=memo).index_url == "https://first.invalid/simple"
    assert resolve(memo=memo).index_url == "https://first.invalid/simple"  # from the memo
    config.write_text("[global]\nindex-url = https://second.invalid/simple\ncert = /x.pem\n")
    again = resolve(memo=memo)
    assert (again.index_url, again.transport.cafile) == ("https://second.invalid/simple", "/x.pem")
    monkeypatch.setenv("PIP_TRUSTED_HOST", "t.invalid")
    assert resolve(memo=memo).transport.trusted_hosts == ("t.invalid",)
    assert len(list(memo.iterdir())) == 3  # one answer per state of the settings


@pytest.mark.parametrize(
    "url", ["http://[::1/simple", "http://[::1]:99999/simple", "ftp://x/simple"]
)
def test_a_malformed_index_url_is_one_clear_error(url: str) -> None:
    with pytest.raises(SourceError, match=r"the index URL .*(malformed|only https)"):
        resolve(url)


def test_a_malformed_ipv6_index_url_on_the_command_line(tmp_cache: Cache) -> None:
    done = cli("check", "--vllm", "0.1.0", "--index-url", "http://[::1/simple")
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "malformed" in done.stderr
    assert "Traceback" not in done.stderr


def test_netrc_credentials_reach_the_index(
    index: FakeIndex, tmp_cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    netrc = tmp_path / "netrc"
    netrc.write_text("machine 127.0.0.1 login ann password s3cret\n")
    netrc.chmod(0o600)
    monkeypatch.setenv("NETRC", str(netrc))
    net._netrc_entry.cache_clear()
    try:
        assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    finally:
        net._netrc_entry.cache_clear()
    auth = index.server.headers(index.PAGE_PATH)["Authorization"]
    assert auth == "Basic YW5uOnMzY3JldA=="  # ann:s3cret
    assert index.server.headers(index.wheel_path("0.1.0"))["Authorization"] == auth


def test_index_url_credentials_are_sent_and_never_cached(
    index: FakeIndex, tmp_cache: Cache
) -> None:
    url = index.index_url.replace("http://", "http://bob:pw%21@")
    src = IndexSource(url, cache=tmp_cache)  # pip's settings resolved for real
    assert read(src, "0.1.0") == SOURCE
    assert index.server.headers(index.wheel_path("0.1.0"))["Authorization"].startswith("Basic ")
    stored = b"".join(p.read_bytes() for p in tmp_cache.root.rglob("*") if p.is_file())
    assert b"pw!" not in stored and b"pw%21" not in stored


# -- the simple-API client -------------------------------------------------------------------


@pytest.mark.parametrize("html", [False, True], ids=["pep691-json", "pep503-html"])
def test_list_versions(fake_index: FakeIndex, tmp_cache: Cache, html: bool) -> None:
    fake_index.html = html
    for version in ("0.10.0", "0.9.0", "0.3.0rc1", "0.1.0", "0.2.1.post1", "0.11.0.dev0"):
        fake_index.add_release(version)
    fake_index.add_release("0.2.0", yanked=True)
    fake_index.add_release("0.4.0", wheel_only=True)
    fake_index.add_release("0.5.0", sdist_only=True)
    pkg = PackageIndex(
        fake_index.index_url, cache=tmp_cache, settings=settings(fake_index.index_url)
    )
    assert pkg.list_versions() == ["0.1.0", "0.2.1.post1", "0.4.0", "0.5.0", "0.9.0", "0.10.0"]
    assert "0.3.0rc1" in pkg.list_versions(prereleases=True)
    release = pkg.release("v0.1.0")
    assert release.version == "0.1.0"
    assert release.wheel is not None and release.wheel.filename == wheel_name("0.1.0")
    assert release.wheel.url == f"{fake_index.server.url}/packages/{wheel_name('0.1.0')}"
    assert (
        release.sdist is not None
        and release.sdist.sha256 == hashlib.sha256(fake_index.sdists["0.1.0"]).hexdigest()
    )
    accept = fake_index.server.headers(fake_index.PAGE_PATH)["Accept"]
    assert accept.startswith("application/vnd.pypi.simple.v1+json")
    with pytest.raises(SourceError, match=r"^vllm 9\.9\.9 is not on the index at http://"):
        pkg.release("9.9.9")


def test_the_answer_is_cached_and_checked(index: FakeIndex, tmp_cache: Cache) -> None:
    def pkg(*, offline: bool = False, max_age: float = 600.0) -> PackageIndex:
        url = index.index_url
        return PackageIndex(
            url, cache=tmp_cache, settings=settings(url), offline=offline, max_age=max_age
        )

    pkg().list_versions()
    pkg().list_versions()
    assert index.server.hits[index.PAGE_PATH] == 1
    pkg(max_age=0).list_versions()
    assert index.server.hits[index.PAGE_PATH] == 2
    assert pkg(offline=True).list_versions() == ["0.1.0", "0.2.0"]
    # Tampered: a file's sha256 changed without the digest. Never believed; asked again.
    (stored,) = (tmp_cache.root / "index").iterdir()
    stored.write_bytes(stored.read_bytes().replace(b'"sha256": "', b'"sha256": "0', 1))
    with pytest.raises(SourceError, match=r"not cached \(or is damaged\)"):
        pkg(offline=True).list_versions()
    assert not stored.exists()
    assert pkg().list_versions() == ["0.1.0", "0.2.0"]
    assert index.server.hits[index.PAGE_PATH] == 3


def test_a_tampered_answer_keeps_the_cached_release(index: FakeIndex, tmp_cache: Cache) -> None:
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    before = cache_files(tmp_cache)
    (stored,) = (tmp_cache.root / "index").iterdir()
    data = json.loads(stored.read_text())
    data["data"]["files"][0]["sha256"] = "0" * 64
    stored.write_text(json.dumps(data))
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE  # asked again, cache kept
    assert [f for f in before if not f.startswith("index/")] == [
        f for f in cache_files(tmp_cache) if not f.startswith("index/")
    ]


def test_project_missing_from_the_index(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    with pytest.raises(SourceError, match=r"^vllm is not on the index at"):
        source(fake_index, tmp_cache).versions()


def test_an_html_error_page_with_status_200(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    fake_index.server.route(
        fake_index.PAGE_PATH,
        Reply(200, b"<html><body>Service down</body></html>", content_type="text/html"),
    )
    with pytest.raises(SourceError, match=r"lists no vllm wheel or sdist .*error page"):
        source(fake_index, tmp_cache).versions()
    assert not (tmp_cache.root / "index").exists()


def test_an_unparsable_json_page(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    fake_index.server.route(
        fake_index.PAGE_PATH,
        Reply(200, b'{"files": 3}', content_type="application/vnd.pypi.simple.v1+json"),
    )
    with pytest.raises(SourceError, match=r"not a simple-API project page"):
        source(fake_index, tmp_cache).versions()


def test_unreachable_index_says_offline(tmp_cache: Cache) -> None:
    url = unreachable_index_url()
    src = IndexSource(url, cache=tmp_cache, retries=1, settings=settings(url))
    with pytest.raises(net.UnreachableError, match=r"tried 2 times.*--offline"):
        src.versions()


# -- wheels, read by range -----------------------------------------------------------------


def test_a_release_is_read_from_its_wheel_by_range(index: FakeIndex, tmp_cache: Cache) -> None:
    src = source(index, tmp_cache)
    _: ReleaseSource = src  # mypy checks that IndexSource fits the protocol
    assert src.versions() == ["0.1.0", "0.2.0"]
    with src.open("0.1.0") as tree:
        t: ReleaseTree = tree
        assert t.read(UTILS) == SOURCE
        assert t.read("vllm/nope.py") is None
        assert set(t.paths()) == {"vllm/__init__.py", "vllm/_version.py", UTILS}
        info = t.info
    assert info.origin.startswith(f"index wheel {wheel_name('0.1.0')} sha256:")
    assert info.details is not None and info.details["verified"] == "members"
    assert info.details["checked"] == [
        {"path": UTILS, "sha256": hashlib.sha256(SOURCE).hexdigest()}
    ]
    wheel_path = index.wheel_path("0.1.0")
    ranges = index.server.ranges(wheel_path)
    assert ranges and len(ranges) == index.server.hits[wheel_path]  # never the whole file
    assert index.server.hits[index.sdist_path("0.1.0")] == 0
    files = cache_files(tmp_cache)
    assert not [f for f in files if f.endswith((".whl", ".tar.gz", ".tmp", ".part"))]
    assert f"manifests/{wheel_name('0.1.0')}.json" in files


def test_a_second_read_needs_no_network(index: FakeIndex, tmp_cache: Cache) -> None:
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    hits = dict(index.server.hits)
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    assert read(offline_source(tmp_cache), "0.1.0") == SOURCE
    assert offline_source(tmp_cache).versions() == ["0.1.0"]
    assert dict(index.server.hits) == hits


def test_info_lists_each_read_made_since_it_was_last_asked_for(
    index: FakeIndex, tmp_cache: Cache
) -> None:
    """`info` is made when asked for, not after every read: asked before a read, then after,
    it names the file read in between (and a read by digest, `read_listed`, too)."""
    read(source(index, tmp_cache), "0.1.0")  # cached: the offline source below reads it
    with offline_source(tmp_cache).open("0.1.0") as tree:
        assert tree.info.details is not None and tree.info.details["checked"] == []
        assert tree.read(UTILS) == SOURCE
        assert tree.info.details is not None
        assert tree.info.details["checked"] == [
            {"path": UTILS, "sha256": hashlib.sha256(SOURCE).hexdigest()}
        ]
    digest = hashlib.sha256(SOURCE).hexdigest()
    with offline_source(tmp_cache).open("0.1.0") as tree:
        assert tree.info.details is not None and tree.info.details["checked"] == []
        assert tree.read_listed(UTILS, digest) == SOURCE
        assert tree.info.details["checked"] == [{"path": UTILS, "sha256": digest}]


def test_offline_a_release_is_chosen_once_a_run_until_its_list_is_dropped(
    index: FakeIndex, tmp_cache: Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Offline, opening a release again (a check reads a vanished file where it was) takes
    the manifest chosen the first time, without looking through the cache's folder again;
    once that manifest is dropped (damaged), it is looked for again."""
    read(source(index, tmp_cache), "0.1.0")
    src = offline_source(tmp_cache)
    looks: list[str] = []
    wheels = src._cached_wheels

    def looked(name: str) -> list[str]:
        looks.append(name)
        return wheels(name)

    monkeypatch.setattr(src, "_cached_wheels", looked)
    for _ in range(3):
        with src.open("0.1.0") as tree:
            first = tree.manifest
    assert looks == ["0.1.0"]
    src.drop_manifest(first.artifact)
    with pytest.raises(SourceError, match=r"offline, and vllm 0\.1\.0 is not in the cache"):
        src.open("0.1.0").__enter__()
    assert looks == ["0.1.0", "0.1.0"]


def test_prefetch_reads_the_paths_asked_for(index: FakeIndex, tmp_cache: Cache) -> None:
    seen: list[tuple[str, int, int]] = []
    kept = source(index, tmp_cache).prefetch(
        ["0.1.0", "0.2.0"],
        paths=[UTILS, "vllm/_version.py"],
        progress=lambda v, d, t: seen.append((v, d, t)),
    )
    last = {v: (d, t) for v, d, t in seen}  # progress in bytes, release by release
    assert sorted(last) == ["0.1.0", "0.2.0"]
    assert all(0 < d == t for d, t in last.values())  # each ends with all it asked for
    assert any(d < t for _, d, t in seen)  # members asked for before they came
    for version in last:
        received = [d for v, d, _ in seen if v == version]
        assert received == sorted(received)  # counted as they come
    assert list(kept) == ["0.1.0", "0.2.0"] and all(p.is_file() for p in kept.values())
    for version in ("0.1.0", "0.2.0"):
        with offline_source(tmp_cache).open(version) as tree:
            assert (
                tree.read("vllm/_version.py") == f"__version__ = version = '{version}'\n".encode()
            )


def test_the_garbage_collector_is_the_callers(index: FakeIndex, tmp_cache: Cache) -> None:
    """A library call leaves the process's collector as the caller set it (on stays on, off
    stays off, during the call too); the CLI pauses it around its whole run, and the pause
    restores it after."""
    import gc

    from patchset._gc import collector_paused

    during: list[bool] = []
    assert gc.isenabled()
    source(index, tmp_cache).prefetch(["0.1.0"], progress=lambda *_: during.append(gc.isenabled()))
    assert during and all(during) and gc.isenabled()
    gc.disable()  # a caller that runs without it keeps it off
    try:
        source(index, tmp_cache).prefetch(["0.2.0"])
        assert not gc.isenabled()
    finally:
        gc.enable()
    during.clear()
    with collector_paused():  # what `patchset check` wraps its run in
        source(index, tmp_cache).prefetch(
            ["0.2.0"], paths=[UTILS], progress=lambda *_: during.append(gc.isenabled())
        )
    assert during and not any(during) and gc.isenabled()


def member_requests(index: FakeIndex, version: str) -> list[str]:
    """The range requests for a release's members (the directory's suffix read left out)."""
    return [
        r for r in index.server.ranges(index.wheel_path(version)) if not r.startswith("bytes=-")
    ]


def fetched(index: FakeIndex, version: str, member: str) -> bool:
    """Whether a member range request of the release covered `member`'s local header."""
    with zipfile.ZipFile(io.BytesIO(index.wheels[version])) as zf:
        offset = zf.getinfo(member).header_offset
    spans = [r.removeprefix("bytes=").split("-") for r in member_requests(index, version)]
    return any(int(a) <= offset <= int(b) for a, b in spans)


def test_prefetch_fetches_a_file_releases_share_once(
    fake_index: FakeIndex, tmp_cache: Cache
) -> None:
    """A member several releases hold with the same sha256 comes from the oldest of them;
    each release then reads it from the cache, checked against its own RECORD."""
    shared, own = b"shared = 1\n", "vllm/own.py"
    for v in ("0.3.0", "0.4.0", "0.5.0"):
        fake_index.add_release(v, {UTILS: shared, own: f"v = {v!r}\n".encode()})
    source(fake_index, tmp_cache).prefetch(["0.5.0", "0.3.0", "0.4.0"], paths=[UTILS, own])
    assert fetched(fake_index, "0.3.0", UTILS) and fetched(fake_index, "0.3.0", own)
    for v in ("0.4.0", "0.5.0"):
        assert fetched(fake_index, v, own) and not fetched(fake_index, v, UTILS)
        with offline_source(tmp_cache).open(v) as tree:
            assert tree.read(UTILS) == shared
            assert tree.read(own) == f"v = {v!r}\n".encode()
    hits = dict(fake_index.server.hits)
    source(fake_index, tmp_cache).prefetch(["0.3.0", "0.4.0", "0.5.0"], paths=[UTILS, own])
    assert dict(fake_index.server.hits) == hits  # all cached: nothing asked again


def test_prefetch_looks_for_moves_only_of_files_that_were_there(
    fake_index: FakeIndex, tmp_cache: Cache
) -> None:
    """A file a release lacks: the files a moved-file search reads (same name elsewhere) are
    fetched ahead where an older release had it (it vanished), not where only newer ones have
    it (not written yet: no search)."""
    path, elsewhere = "vllm/new/mod.py", "vllm/other/mod.py"
    fake_index.add_release("0.3.0", {elsewhere: b"a = 3\n"})
    fake_index.add_release("0.4.0", {path: b"b = 4\n", elsewhere: b"a = 4\n"})
    fake_index.add_release("0.5.0", {elsewhere: b"a = 5\n"})
    source(fake_index, tmp_cache).prefetch(["0.3.0", "0.4.0", "0.5.0"], paths=[path])
    assert member_requests(fake_index, "0.3.0") == []
    assert fetched(fake_index, "0.5.0", elsewhere)
    with offline_source(tmp_cache).open("0.5.0") as tree:
        assert tree.read(elsewhere) == b"a = 5\n"


def test_prefetch_reads_also_files_where_they_are_without_a_search(
    fake_index: FakeIndex, tmp_cache: Cache
) -> None:
    """`also` (a python patch's modules, looked up, never searched for): fetched where a
    release has them; where one lacks it, no file of the same name is fetched for it."""
    module, package = "vllm/a/mod.py", "vllm/a/mod/__init__.py"
    elsewhere = "vllm/other/mod.py"
    fake_index.add_release("0.3.0", {module: b"m = 3\n", elsewhere: b"a = 3\n"})
    fake_index.add_release("0.4.0", {package: b"m = 4\n", elsewhere: b"a = 4\n"})
    source(fake_index, tmp_cache).prefetch(["0.3.0", "0.4.0"], also=[module, package])

    def cached(data: bytes) -> bool:
        return tmp_cache.has_blob(hashlib.sha256(data).hexdigest())

    assert cached(b"m = 3\n") and cached(b"m = 4\n")
    assert not cached(b"a = 3\n") and not cached(b"a = 4\n")  # mod.py vanished: no search
    with offline_source(tmp_cache).open("0.4.0") as tree:
        assert tree.read(package) == b"m = 4\n"


def test_prefetch_names_what_failed(index: FakeIndex, tmp_cache: Cache) -> None:
    with pytest.raises(SourceError, match=r"1 of 2 releases failed: 9\.9\.9: vllm 9\.9\.9 is not"):
        source(index, tmp_cache).prefetch(["0.1.0", "9.9.9"])


@pytest.mark.parametrize(
    ("reply", "why"),
    [
        (Reply(200, b"", ranges=False), "ignores byte ranges"),
        (Reply(200, b"", wrong_range=True), "the server sent"),
    ],
    ids=["no-range-support", "wrong-206"],
)
def test_a_server_without_ranges_falls_back_to_the_sdist(
    index: FakeIndex, tmp_cache: Cache, reply: Reply, why: str
) -> None:
    path = index.wheel_path("0.1.0")
    index.server.route(
        path, Reply(200, index.wheels["0.1.0"], ranges=reply.ranges, wrong_range=reply.wrong_range)
    )
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
        info = tree.info
    assert info.details is not None and info.details["kind"] == "sdist"
    assert why in str(info.details["fallback"]) and "fallback: sdist" in info.origin
    assert index.server.hits[index.sdist_path("0.1.0")] == 1
    assert not [
        f for f in cache_files(tmp_cache) if f.startswith("downloads/") or f.endswith(".gz")
    ]


def test_a_release_without_a_wheel_reads_the_sdist(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    fake_index.add_release("0.3.0", {UTILS: SOURCE}, sdist_only=True)
    with source(fake_index, tmp_cache).open("0.3.0") as tree:
        assert tree.read(UTILS) == SOURCE
        assert tree.info.details is not None
        assert tree.info.details["fallback"] == "the index has no wheel"


def test_a_file_outside_vllm_comes_from_the_sdist(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.read("csrc/ops.cu") == b"// kernel\n"
        assert tree.read("csrc/none.cu") is None
        assert tree.info.details is not None
        assert "for files outside vllm/" in str(tree.info.details["fallback"])


@pytest.mark.parametrize("artifact", ["sdist", "wheel"])
def test_artifact_can_be_forced(index: FakeIndex, tmp_cache: Cache, artifact: str) -> None:
    with source(index, tmp_cache, artifact=artifact).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
        assert tree.info.details is not None and tree.info.details["kind"] == artifact
    other = index.wheel_path("0.1.0") if artifact == "sdist" else index.sdist_path("0.1.0")
    assert index.server.hits[other] == 0


def test_verify_full_downloads_and_checks_the_whole_wheel(
    index: FakeIndex, tmp_cache: Cache
) -> None:
    with source(index, tmp_cache, verify_full=True).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
        assert tree.info.details is not None and tree.info.details["verified"] == "full"
    assert not index.server.ranges(index.wheel_path("0.1.0"))
    assert not [f for f in cache_files(tmp_cache) if f.startswith("downloads/")]


def test_verify_full_refuses_a_wheel_the_index_disowns(
    fake_index: FakeIndex, tmp_cache: Cache
) -> None:
    fake_index.add_release("0.1.0", {UTILS: SOURCE}, sha256="0" * 64)
    with pytest.raises(IntegrityError, match=r"sha256 .* does not match the index's 0000"):
        read(source(fake_index, tmp_cache, verify_full=True), "0.1.0")
    assert not [f for f in cache_files(tmp_cache) if not f.startswith("index/")]


def _lying_offsets(wheel: bytes) -> bytes:
    """The central directory's offset of UTILS pushed 7 bytes on."""
    at = wheel.find(b"PK\x01\x02")
    while wheel[at + 46 : at + 46 + len(UTILS)] != UTILS.encode():
        at = wheel.find(b"PK\x01\x02", at + 4)
    offset = int.from_bytes(wheel[at + 42 : at + 46], "little") + 7
    return wheel[: at + 42] + offset.to_bytes(4, "little") + wheel[at + 46 :]


def _directory_at(wheel: bytes, offset: int) -> bytes:
    """The end record's directory offset replaced (the wheel has no comment)."""
    return wheel[:-6] + offset.to_bytes(4, "little") + wheel[-2:]


def _flip_member_byte(wheel: bytes, name: str) -> bytes:
    with zipfile.ZipFile(__import__("io").BytesIO(wheel)) as zf:
        info = zf.getinfo(name)
    header = info.header_offset + 30 + len(name.encode())
    data = bytearray(wheel)
    data[header + 2] ^= 0x01
    return bytes(data)


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda w: w[: len(w) - 30], r"no zip end record"),
        (lambda w: _directory_at(w, 10**9), r"lies about where"),
        (lambda w: _directory_at(w, 99), r"a damaged central directory entry at 99"),
        (_lying_offsets, r"lies about vllm/model_executor/layers/fla/ops/utils\.py's offset"),
    ],
    ids=["truncated", "directory-beyond-the-end", "directory-offset", "member-offset"],
)
def test_a_damaged_central_directory_is_one_clear_error(
    fake_index: FakeIndex, tmp_cache: Cache, damage: object, message: str
) -> None:
    wheel = make_wheel("0.1.0", {UTILS: SOURCE}, stored=True)
    fake_index.add_release("0.1.0", {UTILS: SOURCE}, wheel=damage(wheel))  # type: ignore[operator]
    with pytest.raises(IntegrityError, match=message):
        read(source(fake_index, tmp_cache), "0.1.0")
    assert not [f for f in cache_files(tmp_cache) if not f.startswith("index/")]


def test_record_rows_plain_and_quoted() -> None:
    """RECORD's plain rows are split by hand, the rest read as CSV: same answers either way;
    rows without a sha256 are left out, a hash that is not base64 is a damaged wheel."""
    from patchset.sources.package_index.wheel import DamagedWheel, parse_record

    digest = hashlib.sha256(b"x").digest()
    b64 = base64.urlsafe_b64encode(digest).decode().rstrip("=")
    text = (
        f"vllm/a.py,sha256={b64},1\n"
        f'"vllm/odd,name.py",sha256={b64},1\n'
        f"vllm/b.py,md5=abc,1\n"
        "vllm-0.1.0.dist-info/RECORD,,\n"
        "\n"
    )
    assert parse_record(text.encode(), "w.whl") == {
        "vllm/a.py": digest.hex(),
        "vllm/odd,name.py": digest.hex(),
    }
    with pytest.raises(DamagedWheel, match=r"RECORD's hash of vllm/c\.py is not base64"):
        parse_record(b"vllm/c.py,sha256=not!base64,1\n", "w.whl")
    with pytest.raises(DamagedWheel, match="RECORD is not readable"):
        parse_record(b"\xff\xfe,sha256=x,1\n", "w.whl")


def test_a_member_that_lies_is_never_used_and_fetched_again(
    fake_index: FakeIndex, tmp_cache: Cache
) -> None:
    lying = make_wheel("0.1.0", {UTILS: SOURCE}, record={UTILS: "ab" * 32})
    fake_index.add_release("0.1.0", {UTILS: SOURCE}, wheel=lying)
    with pytest.raises(IntegrityError, match=r"utils\.py does not match its sha256 in RECORD"):
        read(source(fake_index, tmp_cache), "0.1.0")
    assert not (tmp_cache.root / "blobs").exists()
    crc = _flip_member_byte(make_wheel("0.1.0", {UTILS: SOURCE}, stored=True), UTILS)
    fake_index.add_release("0.1.0", {UTILS: SOURCE}, wheel=crc)
    with pytest.raises(IntegrityError, match=r"utils\.py does not match its zip CRC"):
        read(source(fake_index, tmp_cache, max_age=0), "0.1.0")
    assert not (tmp_cache.root / "blobs").exists()
    fake_index.add_release("0.1.0", {UTILS: SOURCE})
    assert read(source(fake_index, tmp_cache, max_age=0), "0.1.0") == SOURCE


def flip_a_listed_byte(path: Path) -> None:
    """One bit of a cached manifest's file list flipped (past its header line; the list is
    kept deflated, so no member's name stands in it as text)."""
    raw = path.read_bytes()
    at = raw.index(b"\n") + 1 + (len(raw) - raw.index(b"\n")) // 2
    path.write_bytes(raw[:at] + bytes([raw[at] ^ 1]) + raw[at + 1 :])


def test_a_damaged_manifest_is_rebuilt_not_believed(index: FakeIndex, tmp_cache: Cache) -> None:
    """issue 16 #1: one flipped byte in a member name must not turn a verdict."""
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    flip_a_listed_byte(tmp_cache.manifest_path(wheel_name("0.1.0")))
    with pytest.raises(SourceError, match=r"offline, and vllm 0\.1\.0 is not in the cache"):
        read(offline_source(tmp_cache), "0.1.0")
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE  # built again from the wheel
    assert read(offline_source(tmp_cache), "0.1.0") == SOURCE


def test_a_cached_list_is_read_when_first_used_and_checked_then(
    index: FakeIndex, tmp_cache: Cache
) -> None:
    """A cached manifest opens by its header line: a release read by the digests a memo keeps
    (`read_listed`) never reads the list; a list damaged since is found when it is first
    used, never believed: offline an error naming the release, online built again."""
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    path = tmp_cache.manifest_path(wheel_name("0.1.0"))
    flip_a_listed_byte(path)
    digest = hashlib.sha256(SOURCE).hexdigest()
    with offline_source(tmp_cache).open("0.1.0") as tree:
        assert tree.info.version == "0.1.0"  # the header's
        assert tree.read_listed(UTILS, digest) == SOURCE  # by the memo's digest: no list
        with pytest.raises(SourceError, match=r"0\.1\.0 is not in the cache .*was damaged"):
            tree.listed_digest(UTILS)
    assert not path.exists()  # removed: built again by the next run that may fetch
    path.write_bytes(b"")  # a cached list emptied: not a header, read whole, dropped
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.listed_digest(UTILS) == digest
        assert tree.read(UTILS) == SOURCE
    assert packing.decode(path.read_bytes()) is not None  # built again, and kept


def damage_member(cache: Cache, data: bytes) -> None:
    """The stored member of `data` rewritten by another writer (its row, not its name)."""
    db = sqlite3.connect(cache.root / blobs.NAME)
    with db:
        changed = db.execute(
            "UPDATE blobs SET deflated = ? WHERE sha256 = ?",
            (b"\x00garbage", hashlib.sha256(data).hexdigest()),
        ).rowcount
    db.close()
    assert changed == 1


def test_a_damaged_member_is_fetched_again(index: FakeIndex, tmp_cache: Cache) -> None:
    """issue 16 #9: a damaged cached member is rebuilt, not an error forever."""
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    damage_member(tmp_cache, SOURCE)
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    damage_member(tmp_cache, SOURCE)
    with pytest.raises(SourceError, match=r"offline, and .*utils\.py of .* is not in the cache"):
        read(offline_source(tmp_cache), "0.1.0")


def test_two_readers_read_the_directory_once(index: FakeIndex, tmp_cache: Cache) -> None:
    path = index.wheel_path("0.1.0")
    index.server.route(path, Reply(200, index.wheels["0.1.0"], delay=0.2))
    src = source(index, tmp_cache)
    src.versions()
    results: list[bytes | None] = []
    threads = [threading.Thread(target=lambda: results.append(read(src, "0.1.0"))) for _ in "ab"]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == [SOURCE, SOURCE]
    assert sum(r.startswith("bytes=-") for r in index.server.ranges(path)) == 1


def test_a_held_lock_times_out(
    index: FakeIndex, tmp_cache: Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(cache_module, "LOCK_TIMEOUT", 0.2)
    with tmp_cache.lock(f"artifact-{wheel_name('0.1.0')}"):
        done = subprocess.run(
            [sys.executable, "-c", HOLDER, str(tmp_cache.root), index.index_url],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("LockedError: another patchset process has held"), done.stdout


HOLDER = """
import sys
from patchset.adapters import net
from patchset.errors import LockedError
from patchset.sources.package_index import IndexSource, cache
from patchset.sources.package_index.settings import IndexSettings
cache.LOCK_TIMEOUT = 0.2
url = sys.argv[2]
src = IndexSource(url, cache=cache.Cache(__import__("pathlib").Path(sys.argv[1])),
                  settings=IndexSettings(url, "test", net.Transport()))
try:
    with src.open("0.1.0"):
        pass
except LockedError as exc:
    print(f"LockedError: {exc}")
"""


def test_a_file_index(tmp_path: Path, tmp_cache: Cache) -> None:
    """A static mirror on disk: ``file://.../simple/vllm/index.html`` and the files beside."""
    root = tmp_path / "mirror"
    (root / "simple" / "vllm").mkdir(parents=True)
    (root / "packages").mkdir()
    wheel = make_wheel("0.1.0", {UTILS: SOURCE})
    sdist = make_sdist("0.1.0", {UTILS: SOURCE})
    links = []
    for name, data in ((wheel_name("0.1.0"), wheel), ("vllm-0.1.0.tar.gz", sdist)):
        (root / "packages" / name).write_bytes(data)
        sha = hashlib.sha256(data).hexdigest()
        links.append(f'<a href="../../packages/{name}#sha256={sha}">{name}</a>')
    (root / "simple" / "vllm" / "index.html").write_text("<html><body>" + "".join(links))
    url = (root / "simple").as_uri() + "/"
    src = IndexSource(url, cache=tmp_cache, settings=settings(url))
    assert src.versions() == ["0.1.0"]
    with src.open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
        assert tree.info.details is not None and tree.info.details["kind"] == "wheel"


# -- the cache ---------------------------------------------------------------------------------


def test_cache_location(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(tmp_path / "a"))
    assert cache_location() == (tmp_path / "a", "$PATCHSET_CACHE_DIR")
    monkeypatch.delenv("PATCHSET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "patchset"
    assert "platformdirs" in cache_location()[1]


@pytest.mark.parametrize("kind", ["a-file", "unwritable"])
def test_an_unusable_cache_folder_is_one_clear_line(
    index: FakeIndex, tmp_path: Path, kind: str
) -> None:
    where = tmp_path / "cache"
    if kind == "a-file":
        where.write_text("not a folder")
    else:
        where.mkdir()
        where.chmod(0o500)
    try:
        done = cli(
            "check",
            "--vllm",
            "0.1.0",
            "--index-url",
            index.index_url,
            env={"PATCHSET_CACHE_DIR": str(where)},
        )
    finally:
        if where.is_dir():
            where.chmod(0o700)
    if kind == "unwritable" and os.geteuid() == 0:
        assert done.returncode in (0, 1), done.stderr  # root writes anyway
        return
    assert done.returncode == 3, done.stderr
    assert done.stderr.count("\n") == 1 and "PATCHSET_CACHE_DIR" in done.stderr, done.stderr


def test_cache_info_prune_and_clear(index: FakeIndex, tmp_cache: Cache) -> None:
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    env = {"PATCHSET_CACHE_DIR": str(tmp_cache.root)}
    info = cli("cache", "info", "--format", "json", env=env)
    data = json.loads(info.stdout)
    assert data["chosen_by"] == "$PATCHSET_CACHE_DIR" and data["root"] == str(tmp_cache.root)
    assert data["releases"] == [f"0.1.0 (wheel, {wheel_name('0.1.0')})"] and data["bytes"] > 0
    (tmp_cache.root / "trees").mkdir()
    (tmp_cache.root / "trees" / "0.1.0.zip").write_bytes(b"old format")
    kept = cli("cache", "prune", env=env)
    assert kept.returncode == 0 and "pruned 1 files" in kept.stdout, kept.stdout
    assert read(offline_source(tmp_cache), "0.1.0") == SOURCE  # recent: kept
    old = time.time() - 40 * 86400
    for path in tmp_cache.root.rglob("*"):
        os.utime(path, (old, old))
    db = sqlite3.connect(tmp_cache.root / blobs.NAME)
    with db:  # the members stored as long ago
        db.execute("UPDATE blobs SET stored = ?", (old,))
    db.close()
    assert cli("cache", "prune", "--older-than", "30d", env=env).returncode == 0
    assert not [f for f in cache_files(tmp_cache) if f.startswith("manifests/")]
    assert list(tmp_cache.blobs.stored()) == []  # no manifest names them: dropped
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    cleared = cli("cache", "clear", env=env)
    assert cleared.returncode == 0 and "cleared" in cleared.stdout
    assert cache_files(tmp_cache) == []
    bad = cli("cache", "prune", "--older-than", "soon", env=env)
    assert bad.returncode == 2 and "not an age" in bad.stderr


def test_a_cache_cleared_while_an_entry_is_written_costs_the_entry_alone(tmp_cache: Cache) -> None:
    """`cache clear` between an entry's write and its rename into place (a check's manifest,
    as `test_check_races_cache_prune` met it): the entry is not kept, nothing fails, and the
    next one makes its folder again. Any other missing file is still the clear error."""
    tmp_cache.store_json("before", {"n": 0}, source="test")  # the folder made (and remembered)
    dest = tmp_cache.index_path("k")
    with cache_module._entry_file(dest) as out:
        out.write(b"{}")
        tmp_cache.clear()
    assert not dest.exists() and not dest.parent.exists()
    tmp_cache.store_json("k", {"n": 1}, source="test")
    loaded = tmp_cache.load_json("k")
    assert loaded is not None and loaded[1] == {"n": 1}
    with pytest.raises(SourceError, match="cannot write"), cache_module._entry_file(dest) as out:
        out.write(b"{}")
        (tmp_cache.root / "elsewhere.txt").read_bytes()  # not the rename: a real failure


def test_a_whole_download_outlives_a_cache_clear(tmp_cache: Cache) -> None:
    """An artifact downloaded whole (`--verify-full`, an sdist) is read from a file of no
    name: a `cache clear` while it is written or read takes nothing from it, and the next
    one makes the folder again; none is left behind."""
    with tmp_cache.scratch_file() as out:
        out.write(b"x" * 90 + b"0123456789")
        tmp_cache.clear()
        out.flush()
        assert net.read_range(out, 10, None) == (b"0123456789", 100)
        assert net.read_range(out, 88, 91) == (b"xx01", 100)
    assert not tmp_cache.downloads.exists()
    with tmp_cache.scratch_file() as out:
        out.write(b"y")
        assert list(tmp_cache.downloads.iterdir()) == []


def test_parse_source_index(index: FakeIndex, tmp_cache: Cache) -> None:
    src = parse_source(None, index_url=index.index_url)
    assert isinstance(src, IndexSource)
    assert isinstance(parse_source("index", index_url=index.index_url, offline=True), IndexSource)


def test_check_cli_names_the_wheel_in_json(index: FakeIndex, tmp_cache: Cache) -> None:
    done = cli("check", "--vllm", "0.1.0", "--index-url", index.index_url, "--format", "json")
    assert done.returncode in (0, 1), done.stderr
    (release,) = json.loads(done.stdout)["releases"]
    assert release["artifact"]["kind"] == "wheel"
    assert release["artifact"]["filename"] == wheel_name("0.1.0")
    assert UTILS in [c["path"] for c in release["artifact"]["checked"]]


def test_a_hung_index_ends_after_the_timeout(http_server: FakeServer, tmp_cache: Cache) -> None:
    http_server.route("/simple/vllm/", Reply(200, b"{}", delay=5))
    start = time.monotonic()
    done = cli(
        "check", "--vllm", "0.1.0", "--index-url", f"{http_server.url}/simple/", "--timeout", "0.3"
    )
    assert done.returncode == 3, done.stderr
    assert "timed out (tried once)" in done.stderr and done.stderr.count("\n") == 1
    assert time.monotonic() - start < 30
    assert http_server.hits["/simple/vllm/"] == 1  # the timeout bounds the retries' wait too


def test_ctrl_c_stops_at_once(http_server: FakeServer, index: FakeIndex, tmp_cache: Cache) -> None:
    index.server.route(index.wheel_path("0.1.0"), Reply(200, index.wheels["0.1.0"], delay=20))
    proc = subprocess.Popen(
        command("--registry", REPO / "patches", "check", "--vllm", "0.1.0", "--index-url",
                index.index_url),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    while index.server.hits[index.wheel_path("0.1.0")] == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    start = time.monotonic()
    proc.send_signal(2)
    _, err = proc.communicate(timeout=30)
    assert proc.returncode == 130, err
    assert time.monotonic() - start < 5, "Ctrl-C waited for the download in flight"


@pytest.mark.network
def test_real_release_through_the_configured_index(release_cache: Cache) -> None:
    with IndexSource(cache=release_cache).open("0.19.1") as tree:
        data = tree.read(UTILS)
        assert data is not None and b"is_tma_supported" in data
        assert tree.info.origin.startswith("index wheel vllm-0.19.1-")
    offline = IndexSource(offline=True, cache=release_cache)
    with offline.open("0.19.1") as tree:
        assert tree.read(UTILS) == data


def test_old_format_leftovers_do_not_matter(index: FakeIndex, tmp_cache: Cache) -> None:
    (tmp_cache.root / "sdists").mkdir(parents=True)
    (tmp_cache.root / "sdists" / "vllm-0.1.0.tar.gz").write_bytes(b"old")
    assert read(source(index, tmp_cache), "0.1.0") == SOURCE
    shutil.rmtree(tmp_cache.root / "sdists")


def test_check_memo_reads_by_the_wheels_list(
    index: FakeIndex, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A check's memo key takes each file's sha256 from the wheel's list (RECORD's) rather than
    reading it; a warm check then decodes no release's list and reads no file; an edited patch
    reads its file by that sha256 (checked), still without decoding the list; verdicts stay."""
    diff = f"--- a/{UTILS}\n+++ b/{UTILS}\n@@ -1 +1 @@\n-is_tma_supported = True\n+x = 1\n"
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=diff, targets=[UTILS])
    cache, memo = Cache(tmp_path / "cache"), tmp_path / "memo"
    versions = ["0.1.0", "0.2.0"]
    first = check(load_registry(registry), versions, source=source(index, cache), memo=Memo(memo))
    assert [r.verdict for r in first.results] == ["needed", "conflict"]
    decoded: list[int] = []
    reads: list[str] = []
    real_decode, real_read = packing.Members._decoded, package_index.IndexTree.read

    def counted_decode(self: packing.Members) -> dict[str, str | list[Any]]:
        decoded.append(1)
        return real_decode(self)

    def counted_read(self: package_index.IndexTree, relpath: str) -> bytes | None:
        reads.append(relpath)
        return real_read(self, relpath)

    monkeypatch.setattr(packing.Members, "_decoded", counted_decode)
    monkeypatch.setattr(package_index.IndexTree, "read", counted_read)
    warm = check(load_registry(registry), versions, source=offline_source(cache), memo=Memo(memo))
    assert warm.results == first.results
    assert (decoded, reads) == ([], [])
    toml = registry / "pat" / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    edited = check(load_registry(registry), versions, source=offline_source(cache), memo=Memo(memo))
    assert [r.verdict for r in edited.results] == ["needed", "conflict"]
    assert (decoded, reads) == ([], [])  # read by digest, from the cache's checked blobs


def test_a_member_is_one_row_read_back_checked_and_a_full_disk_is_one_line(
    tmp_cache: Cache,
) -> None:
    """`store_blob` keeps a member as a row of ``blobs.sqlite`` (a folder in the file's place
    replaced), read back checked; a store of the same member again keeps the row; on a full
    disk (SQLite's own "full", at the file's page limit) one error line, the row not there."""
    import zlib

    data = b"x = 1\n" * 100
    sha = hashlib.sha256(data).hexdigest()
    deflater = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    deflated = deflater.compress(data) + deflater.flush()
    (tmp_cache.root / blobs.NAME / "inside").mkdir(parents=True)  # something else in its place
    tmp_cache.store_blob(sha, deflated)
    tmp_cache.store_blob(sha, deflated)
    assert (tmp_cache.root / blobs.NAME).is_file()
    assert tmp_cache.has_blob(sha) and tmp_cache.read_blob(sha) == data
    assert [name for name, _ in tmp_cache.blobs.stored()] == [sha]
    assert not tmp_cache.has_blob(hashlib.sha256(b"y").hexdigest())

    big = os.urandom(1 << 20)  # does not compress: a megabyte of pages
    other = hashlib.sha256(big).hexdigest()
    db = sqlite3.connect(tmp_cache.root / blobs.NAME)
    (pages,) = db.execute("PRAGMA page_count").fetchone()
    db.close()
    tmp_cache.blobs._conn().execute(f"PRAGMA max_page_count = {pages + 2}")
    with pytest.raises(SourceError, match="the cache's disk is full") as failed:
        tmp_cache.store_blob(other, big)
    assert "\n" not in str(failed.value)
    assert not tmp_cache.has_blob(other)
    assert tmp_cache.read_blob(sha) == data  # what was there stays
