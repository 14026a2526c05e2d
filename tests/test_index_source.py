"""The package-index client, the cache and IndexSource, against a real local HTTP server.

The one test marked network reads a real release through the configured index.
"""

from __future__ import annotations

import io
import json
import os
import socket
import tarfile
import threading
import time
import zipfile
from pathlib import Path

import pytest
from pip._internal.models.index import PyPI

from patchset.adapters import net
from patchset.errors import IntegrityError, LockedError, SourceError
from patchset.sources import parse_source
from patchset.sources.base import ReleaseSource, ReleaseTree
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index import cache as cache_module
from patchset.sources.package_index.cache import Cache, TreeZip, cache_root
from patchset.sources.package_index.client import (
    PackageIndex,
    index_json_base,
    json_base_from_index_url,
)
from tests.fake_index import FakeIndex, Reply, make_sdist

UTILS = "vllm/model_executor/layers/fla/ops/utils.py"
SOURCE = b"is_tma_supported = True\n"


@pytest.fixture(autouse=True)
def fast_backoff(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(net, "BACKOFF_BASE", 0.001)


@pytest.fixture
def index(fake_index: FakeIndex) -> FakeIndex:
    fake_index.add_release("0.1.0", {UTILS: SOURCE})
    fake_index.add_release("0.2.0", {UTILS: b"is_tma_supported = False\n"})
    return fake_index


def source(index: FakeIndex, cache: Cache, **kwargs: object) -> IndexSource:
    return IndexSource(index.index_url, cache=cache, **kwargs)  # type: ignore[arg-type]


def unreachable_index_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple"


def open_release(src: IndexSource, version: str) -> None:
    with src.open(version):
        pass


def cache_files(cache: Cache) -> list[str]:
    return sorted(
        p.relative_to(cache.root).as_posix()
        for p in cache.root.rglob("*")
        if p.is_file() and p.parent.name != "locks"
    )


# -- where the index is -------------------------------------------------------------------


@pytest.mark.parametrize(
    ("index_url", "json_base"),
    [
        ("https://mirror.example/simple", "https://mirror.example/pypi"),
        ("https://mirror.example/simple/", "https://mirror.example/pypi"),
        ("https://u:p@mirror.example/repo/x/simple/", "https://u:p@mirror.example/repo/x/pypi"),
        ("https://mirror.example/root/+simple/", "https://mirror.example/root/pypi"),
        ("https://mirror.example/pypi", "https://mirror.example/pypi"),
    ],
)
def test_json_base_from_index_url(index_url: str, json_base: str) -> None:
    assert json_base_from_index_url(index_url) == json_base


def test_index_url_resolution_order(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config = tmp_path / "pip.conf"
    config.write_text(
        "[global]\nindex-url = https://configured.example/simple\n"
        "extra-index-url = file:///ignored/simple\n"
    )
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert index_json_base() == "https://configured.example/pypi"
    monkeypatch.setenv("PIP_INDEX_URL", "https://env.example/simple/")
    assert index_json_base() == "https://env.example/pypi"
    assert index_json_base("https://given.example/simple") == "https://given.example/pypi"


def test_default_index_is_pips(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PIP_CONFIG_FILE", os.devnull)  # pip then reads no config file
    monkeypatch.delenv("PIP_INDEX_URL", raising=False)
    assert index_json_base() == PyPI.pypi_url


def test_cache_root_from_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PATCHSET_CACHE_DIR", str(tmp_path / "a"))
    assert cache_root() == tmp_path / "a"
    monkeypatch.delenv("PATCHSET_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert cache_root() == tmp_path / "xdg" / "patchset"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert cache_root() == tmp_path / "home" / ".cache" / "patchset"


# -- the index's answers -------------------------------------------------------------------


def test_list_versions(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    for version in ("0.10.0", "0.9.0", "0.3.0rc1", "0.1.0", "0.2.1.post1", "0.11.0.dev0"):
        fake_index.add_release(version)
    fake_index.add_release("0.2.0", yanked=True)
    fake_index.add_release("0.4.0", wheel_only=True)
    fake_index.releases["not-a-version"] = fake_index.releases["0.1.0"]
    fake_index.publish()
    pkg = PackageIndex(fake_index.index_url, cache=tmp_cache)
    assert pkg.list_versions() == ["0.1.0", "0.2.1.post1", "0.9.0", "0.10.0"]
    assert pkg.list_versions(prereleases=True) == [
        "0.1.0",
        "0.2.1.post1",
        "0.3.0rc1",
        "0.9.0",
        "0.10.0",
        "0.11.0.dev0",
    ]


def test_release_files(index: FakeIndex, tmp_cache: Cache) -> None:
    pkg = PackageIndex(index.index_url, cache=tmp_cache)
    sdist = pkg.release_files("v0.1.0")
    assert sdist.version == "0.1.0"
    assert sdist.filename == "vllm-0.1.0.tar.gz"
    assert sdist.url == f"{index.server.url}/packages/vllm-0.1.0.tar.gz"  # made absolute
    assert sdist.size == len(index.sdists["0.1.0"])
    assert len(sdist.sha256) == 64
    with pytest.raises(SourceError, match=r"^vllm 9\.9\.9 is not on the index at http://"):
        pkg.release_files("9.9.9")
    index.add_release("0.4.0", wheel_only=True)
    pkg.forget()
    with pytest.raises(SourceError, match=r"vllm 0\.4\.0 has no sdist"):
        pkg.release_files("0.4.0")


def test_project_json_is_cached(index: FakeIndex, tmp_cache: Cache) -> None:
    PackageIndex(index.index_url, cache=tmp_cache).list_versions()
    PackageIndex(index.index_url, cache=tmp_cache).list_versions()
    assert index.server.hits[index.JSON_PATH] == 1
    PackageIndex(index.index_url, cache=tmp_cache, max_age=0).list_versions()
    assert index.server.hits[index.JSON_PATH] == 2
    offline = PackageIndex(index.index_url, cache=tmp_cache, offline=True, max_age=0)
    assert offline.list_versions() == ["0.1.0", "0.2.0"]
    assert index.server.hits[index.JSON_PATH] == 2
    (stored,) = (tmp_cache.root / "index").iterdir()
    assert set(json.loads(stored.read_text())) == {"fetched_at", "source", "data"}


def test_offline_without_a_cached_answer(index: FakeIndex, tmp_cache: Cache) -> None:
    with pytest.raises(SourceError, match=r"not cached .* run once without --offline"):
        PackageIndex(index.index_url, cache=tmp_cache, offline=True).list_versions()
    assert index.server.hits[index.JSON_PATH] == 0


def test_project_missing_from_the_index(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    with pytest.raises(SourceError, match=r"^vllm is not on the index at"):
        PackageIndex(fake_index.index_url, cache=tmp_cache).list_versions()


def test_unreachable_index_says_offline(tmp_cache: Cache) -> None:
    pkg = PackageIndex(unreachable_index_url(), cache=tmp_cache, retries=1)
    with pytest.raises(net.UnreachableError, match=r"tried 2 times.*--offline"):
        pkg.list_versions()


# -- IndexSource and the cache -------------------------------------------------------------


def test_open_reads_a_release_and_fills_the_cache(index: FakeIndex, tmp_cache: Cache) -> None:
    src = source(index, tmp_cache)
    _: ReleaseSource = src  # mypy checks that IndexSource fits the protocol
    assert src.versions() == ["0.1.0", "0.2.0"]
    with src.open("0.1.0") as tree:
        assert isinstance(tree, ReleaseTree)
        assert tree.read(UTILS) == SOURCE
        assert tree.read("vllm/missing.py") is None
        assert tree.read("setup.py") is None  # only vllm/ is kept
        assert list(tree.paths()) == ["vllm/__init__.py", "vllm/_version.py", UTILS]
        assert tree.info.version == "0.1.0"
        assert tree.info.digest == src.index.release_files("0.1.0").sha256
        assert tree.info.origin.startswith("index sdist vllm-0.1.0.tar.gz sha256:")
    assert cache_files(tmp_cache) == [
        f"index/{src.index.cache_key}.json",
        "sdists/vllm-0.1.0.tar.gz",
        "trees/0.1.0.json",
        "trees/0.1.0.zip",
    ]
    with zipfile.ZipFile(tmp_cache.tree_path("0.1.0")) as zf:
        assert json.loads(zf.comment)["sha256"] == tree.info.digest
        assert zf.infolist()[0].compress_type == zipfile.ZIP_DEFLATED


def test_second_open_needs_no_network(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
    assert index.server.hits[index.sdist_path("0.1.0")] == 1
    assert index.server.hits[index.JSON_PATH] == 1
    for url in (index.index_url, unreachable_index_url()):  # with and without its answer
        offline = IndexSource(url, offline=True, cache=tmp_cache)
        with offline.open("0.1.0") as tree:
            assert tree.read(UTILS) == SOURCE
    assert index.server.hits[index.sdist_path("0.1.0")] == 1


def test_warm_read_is_fast(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    src = IndexSource(index.index_url, offline=True, cache=tmp_cache)
    start = time.perf_counter()
    with src.open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
        assert tree.read("vllm/_version.py")
    assert time.perf_counter() - start < 0.5  # milliseconds in practice; generous for CI


def test_offline_release_not_cached(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    offline = source(index, tmp_cache, offline=True)
    with pytest.raises(SourceError, match=r"offline, and vllm 0\.2\.0 is not in the cache"):
        open_release(offline, "0.2.0")
    assert IndexSource(unreachable_index_url(), offline=True, cache=tmp_cache).versions() == [
        "0.1.0"
    ]


def test_wrong_sha256_leaves_the_cache_consistent(index: FakeIndex, tmp_cache: Cache) -> None:
    good = index.sdists["0.1.0"]
    index.add_release("0.1.0", sdist=good, sha256="f" * 64)
    with pytest.raises(IntegrityError, match="does not match"):
        open_release(source(index, tmp_cache), "0.1.0")
    assert not [f for f in cache_files(tmp_cache) if not f.startswith("index/")]
    index.add_release("0.1.0", sdist=good)  # the index is fixed; the stale answer was dropped
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE


def test_bad_cached_sdist_is_replaced(index: FakeIndex, tmp_cache: Cache) -> None:
    bad = tmp_cache.sdist_path("vllm-0.1.0.tar.gz")
    bad.parent.mkdir(parents=True)
    bad.write_bytes(b"not the release")
    with source(index, tmp_cache).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
    assert bad.read_bytes() == index.sdists["0.1.0"]
    assert index.server.hits[index.sdist_path("0.1.0")] == 1


def test_tree_of_another_sdist_is_rebuilt(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    index.add_release("0.1.0", {UTILS: b"republished\n"})
    with source(index, tmp_cache, max_age=0).open("0.1.0") as tree:
        assert tree.read(UTILS) == b"republished\n"


def test_damaged_tree_is_rebuilt_from_the_cached_sdist(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    tmp_cache.tree_path("0.1.0").write_bytes(b"garbage")
    with source(index, tmp_cache, offline=True).open("0.1.0") as tree:
        assert tree.read(UTILS) == SOURCE
    assert index.server.hits[index.sdist_path("0.1.0")] == 1


def test_member_index_is_optional_and_checked(index: FakeIndex, tmp_cache: Cache) -> None:
    with source(index, tmp_cache).open("0.1.0"):
        pass
    zip_path = tmp_cache.tree_path("0.1.0")
    sidecar = zip_path.with_suffix(".json")
    record = json.loads(sidecar.read_text())
    sidecar.unlink()
    tree = tmp_cache.open_tree("0.1.0")
    assert tree is not None and not tree.indexed
    with tree:
        assert tree.read(UTILS) == SOURCE  # read through zipfile instead
    assert json.loads(sidecar.read_text()) == record  # and the index is written again
    record["members"][UTILS][0] = 0  # the offset of another member
    sidecar.write_text(json.dumps(record))
    tree = TreeZip.open(zip_path)
    assert tree is not None and tree.indexed
    with tree, pytest.raises(SourceError, match="damaged in the cache"):
        tree.read(UTILS)
    record["zip"][1] += 1  # an index made for another zip is not used
    sidecar.write_text(json.dumps(record))
    tree = TreeZip.open(zip_path)
    assert tree is not None and not tree.indexed
    with tree:
        assert tree.read(UTILS) == SOURCE


def tar_member(name: str, kind: bytes = tarfile.REGTYPE, target: str = "") -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    info.size = 1 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "name", ["vllm-0.1.0/vllm/../../evil.py", "/etc/vllm/x.py", "vllm-0.1.0/../vllm/x.py"]
)
def test_unsafe_sdist_member_is_refused(fake_index: FakeIndex, tmp_cache: Cache, name: str) -> None:
    fake_index.add_release("0.1.0", sdist=make_sdist("0.1.0", {}, extra=[tar_member(name)]))
    with pytest.raises(SourceError, match="unsafe member"):
        open_release(source(fake_index, tmp_cache), "0.1.0")
    assert not tmp_cache.tree_path("0.1.0").exists()


def test_links_in_the_sdist_are_skipped(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    links = [
        tar_member("vllm-0.1.0/vllm/sym.py", tarfile.SYMTYPE, "/etc/passwd"),
        tar_member("vllm-0.1.0/vllm/hard.py", tarfile.LNKTYPE, "vllm-0.1.0/vllm/__init__.py"),
    ]
    fake_index.add_release("0.1.0", sdist=make_sdist("0.1.0", {UTILS: SOURCE}, extra=links))
    with source(fake_index, tmp_cache).open("0.1.0") as tree:
        assert tree.read("vllm/sym.py") is None
        assert tree.read("vllm/hard.py") is None
        assert tree.read(UTILS) == SOURCE


def test_sdist_without_vllm_package(fake_index: FakeIndex, tmp_cache: Cache) -> None:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        info = tarfile.TarInfo("vllm-0.1.0/setup.py")
        tar.addfile(info, io.BytesIO(b""))
    fake_index.add_release("0.1.0", sdist=out.getvalue())
    with pytest.raises(SourceError, match="holds no vllm/ package"):
        open_release(source(fake_index, tmp_cache), "0.1.0")


def test_two_readers_download_once(index: FakeIndex, tmp_cache: Cache) -> None:
    index.server.route(
        index.sdist_path("0.1.0"), Reply(200, index.sdists["0.1.0"], delay=0.2)
    )  # slow enough that both readers want it at once
    results: list[bytes | None] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            with source(index, tmp_cache).open("0.1.0") as tree:
                results.append(tree.read(UTILS))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=read) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    assert results == [SOURCE, SOURCE]
    assert index.server.hits[index.sdist_path("0.1.0")] == 1


def test_a_held_lock_times_out(
    index: FakeIndex, tmp_cache: Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another process building the same release holds its lock (a lock file of its own)."""
    monkeypatch.setattr(cache_module, "LOCK_TIMEOUT", 0.1)
    with tmp_cache.lock("release-0.1.0"), pytest.raises(LockedError, match="another patchset"):
        open_release(source(index, tmp_cache), "0.1.0")
    assert not tmp_cache.tree_path("0.1.0").exists()


def test_prefetch_in_parallel_reports_each_download(index: FakeIndex, tmp_cache: Cache) -> None:
    index.add_release("0.3.0", {UTILS: b"three\n"})
    seen: dict[str, tuple[int, int]] = {}
    lock = threading.Lock()

    def progress(version: str, done: int, total: int) -> None:
        with lock:
            seen[version] = (done, total)

    versions = ["0.1.0", "0.2.0", "0.3.0"]
    paths = source(index, tmp_cache).prefetch(versions, progress=progress)
    assert sorted(seen) == versions
    assert all(done == total > 0 for done, total in seen.values())
    assert list(paths) == versions
    assert all(path.is_file() for path in paths.values())
    assert all(index.server.hits[index.sdist_path(v)] == 1 for v in paths)


def test_prefetch_names_what_failed(index: FakeIndex, tmp_cache: Cache) -> None:
    with pytest.raises(SourceError, match=r"1 of 2 releases failed: 7\.0: vllm 7\.0 is not"):
        source(index, tmp_cache).prefetch(["0.1.0", "7.0"], workers=2)
    assert tmp_cache.tree_path("0.1.0").is_file()


def test_download_progress_callback(index: FakeIndex, tmp_cache: Cache) -> None:
    seen: list[tuple[str, int, int]] = []
    src = source(index, tmp_cache, progress=lambda v, done, total: seen.append((v, done, total)))
    with src.open("0.1.0"):
        pass
    size = len(index.sdists["0.1.0"])
    assert seen[-1] == ("0.1.0", size, size)


def test_parse_source_index(index: FakeIndex, tmp_cache: Cache) -> None:
    src = parse_source(None, index_url=index.index_url)
    assert isinstance(src, IndexSource)
    assert src.name == "index"
    assert src.versions() == ["0.1.0", "0.2.0"]
    assert isinstance(parse_source("index", index_url=index.index_url, offline=True), IndexSource)


# -- a real release ------------------------------------------------------------------------


@pytest.mark.network
def test_real_release_through_the_configured_index(
    release_cache: Cache, monkeypatch: pytest.MonkeyPatch
) -> None:
    with IndexSource(cache=release_cache).open("0.19.1") as tree:
        data = tree.read(UTILS)
        assert data is not None and b"is_tma_supported" in data
        assert tree.info.version == "0.19.1"

    def no_network(*args: object, **kwargs: object) -> None:
        raise AssertionError("the second open went to the network")

    monkeypatch.setattr(net, "_open", no_network)
    offline = IndexSource(unreachable_index_url(), offline=True, cache=release_cache)
    with offline.open("0.19.1") as tree:
        assert tree.read(UTILS) == data
        assert "vllm/envs.py" in set(tree.paths())
