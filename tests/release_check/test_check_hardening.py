"""The check's third hardening round (issue 23), grouped by class: wheels that contradict
themselves, cache entries that are not what they seem, hostile index pages, and output that
people (and pull-request comments) can read."""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import hashlib
import io
import json
import os
import shutil
import sqlite3
import struct
import tracemalloc
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from rich.text import Text

from patchset.cli import check_report
from patchset.cli.main import main
from patchset.errors import ExitCode
from patchset.registry import Registry, load_registry
from patchset.release_check import CheckReport, CheckResult, Signals, check
from patchset.release_check.memo import Memo
from patchset.sources.base import MemoryTree, ReleaseInfo, ReleaseSource
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index import cache as cache_module
from patchset.sources.package_index import wheel as wheel_module
from patchset.sources.package_index.cache import Cache
from tests.helpers.fake_index import FakeIndex, Reply, make_sdist, wheel_name
from tests.helpers.hardening import cli, error_line
from tests.helpers.synthetic import add_patch

TARGET = "vllm/model/target.py"
DIFF = f"""\
    --- a/{TARGET}
    +++ b/{TARGET}
    @@ -1,3 +1,3 @@
     a = 1
    -b = 2
    +b = 3
     c = 4
    """
FILES = {TARGET: b"a = 1\nb = 2\nc = 4\n", "vllm/model/other.py": b"x = 1\n"}


def synthetic_wheel(version: str, files: dict[str, bytes], *, extra_record: str = "") -> bytes:
    """A small wheel laid out like vLLM's (dist-info, RECORD with every sha256)."""
    members = {
        "vllm/__init__.py": b"",
        "vllm/_version.py": f"__version__ = version = '{version}'\n".encode(),
        **files,
        f"vllm-{version}.dist-info/METADATA": f"Name: vllm\nVersion: {version}\n".encode(),
    }
    rows = [
        f"{name},sha256={base64.urlsafe_b64encode(hashlib.sha256(d).digest()).rstrip(b'=').decode()},{len(d)}"
        for name, d in members.items()
    ]
    rows += [extra_record] if extra_record else []
    rows.append(f"vllm-{version}.dist-info/RECORD,,")
    out = io.BytesIO()
    with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        for name, data in members.items():
            zf.writestr(name, data)
        zf.writestr(f"vllm-{version}.dist-info/RECORD", "\n".join(rows) + "\n")
    return out.getvalue()


def garble_directory_name(data: bytes, name: str, new: str) -> bytes:
    """One name changed in the central directory only (its last occurrence)."""
    at = data.rindex(name.encode())
    return data[:at] + new.encode() + data[at + len(name) :]


def garble_local_name(data: bytes, name: str, new: str) -> bytes:
    """One name changed in its local header only (its first occurrence)."""
    at = data.index(name.encode())
    return data[:at] + new.encode() + data[at + len(name) :]


def publish(index: FakeIndex, version: str, wheel: bytes) -> None:
    index.add_release(version, sdist=make_sdist(version, FILES), wheel=wheel, wheel_only=True)


@pytest.fixture
def registry(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    add_patch(root, "edit-target", diff=DIFF, targets=[TARGET])
    return root


def run_check(registry: Path, index: FakeIndex, *args: str) -> int:
    argv = ["check", "--registry", str(registry), "--index-url", index.index_url]
    return main([*argv, "--vllm", "0.1.0", *args])


def manifests(cache: Cache) -> list[str]:
    folder = cache.root / "manifests"
    return sorted(p.name for p in folder.iterdir()) if folder.is_dir() else []


class TestWheelDirectoryAgainstRecord:
    """Issue 23 item 1: a wheel whose central directory and RECORD disagree is damaged."""

    @pytest.mark.parametrize(
        "doctor",
        [
            pytest.param(
                lambda w: garble_directory_name(w, TARGET, TARGET.replace("target", "tarxet")),
                id="directory-name-garbled",
            ),
            pytest.param(
                lambda w: garble_local_name(w, TARGET, TARGET.replace("target", "tarxet")),
                id="local-header-name-differs",
            ),
            pytest.param(None, id="record-path-missing-from-directory"),
        ],
    )
    def test_a_damaged_wheel_is_exit_3_and_nothing_is_cached(
        self,
        doctor: object,
        registry: Path,
        fake_index: FakeIndex,
        tmp_cache: Cache,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        if doctor is None:
            extra = f"vllm/model/phantom.py,sha256={'A' * 43},3"
            wheel = synthetic_wheel("0.1.0", FILES, extra_record=extra)
        else:
            wheel = doctor(synthetic_wheel("0.1.0", FILES))  # type: ignore[operator]
        publish(fake_index, "0.1.0", wheel)
        assert run_check(registry, fake_index) == ExitCode.UNAVAILABLE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and wheel_name("0.1.0") in err[0], err
        assert manifests(tmp_cache) == []  # the damaged file list never reaches the cache
        assert run_check(registry, fake_index, "--offline") == ExitCode.UNAVAILABLE
        assert "not in the cache" in capsys.readouterr().err

    def test_the_sound_wheel_checks(
        self, registry: Path, fake_index: FakeIndex, tmp_cache: Cache
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        assert run_check(registry, fake_index) == 0
        assert manifests(tmp_cache) == [f"{wheel_name('0.1.0')}.json"]

    def test_record_and_signatures_are_aside(self) -> None:
        """RECORD (no hash of its own) and signature files are not asked to be in RECORD."""
        wheel = synthetic_wheel("0.1.0", FILES)
        out = io.BytesIO(wheel)
        with zipfile.ZipFile(out, "a") as zf:
            zf.writestr("vllm-0.1.0.dist-info/RECORD.jws", b"{}")
        data = out.getvalue()
        directory = wheel_module.read_directory(
            lambda n: (data[-n:], len(data)), lambda a, b: data[a : b + 1], "w.whl"
        )
        assert TARGET in directory.record


class TestInflationBound:
    """Issue 23 item 2: a member is inflated only as far as the directory says it is long."""

    def test_a_bomb_is_refused_without_inflating_it(self) -> None:
        bomb = b"\0" * (64 << 20)
        out = io.BytesIO()
        with zipfile.ZipFile(out, "w", compression=zipfile.ZIP_DEFLATED) as zf:
            zf.writestr("vllm/bomb.py", bomb)
        data = bytearray(out.getvalue())
        # both headers say 10 bytes: the data inflates to 64 MiB
        local = data.index(b"PK\x03\x04")
        struct.pack_into("<L", data, local + 22, 10)
        central = data.index(b"PK\x01\x02")
        struct.pack_into("<L", data, central + 24, 10)
        raw = bytes(data)
        name = "vllm/bomb.py"
        entries = wheel_module._parse_central(
            raw[central : raw.index(b"PK\x05\x06")], 1, central, "bomb.whl"
        )
        directory = wheel_module.Directory(len(raw), central, entries, {name: "0" * 64})
        tracemalloc.start()
        try:
            with pytest.raises(wheel_module.DamagedWheel, match="inflates past its stated size"):
                wheel_module.read_members(
                    directory, [name], lambda a, b: raw[a : b + 1], "bomb.whl"
                )
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 8 << 20, f"{peak} bytes held while refusing a 10-byte member"


class TestCacheEntries:
    """Issue 23 items 9, 14 and 15: the cache's entries checked before use; a full disk."""

    def test_a_full_disk_under_the_cache_is_one_line_exit_3(
        self,
        registry: Path,
        fake_index: FakeIndex,
        tmp_cache: Cache,
        monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        real_fdopen = os.fdopen

        def full(fd: int, mode: str = "r", *args: object, **kwargs: object) -> object:
            if "w" in mode:  # every cache write lands on a full disk
                os.close(fd)
                return open("/dev/full", "wb")  # noqa: PTH123 -- the caller closes it
            return real_fdopen(fd, mode, *args, **kwargs)  # type: ignore[call-overload]

        monkeypatch.setattr(cache_module.os, "fdopen", full)  # type: ignore[attr-defined]
        assert run_check(registry, fake_index) == ExitCode.UNAVAILABLE
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "the cache's disk is full" in err[0], err
        leftovers = [p.name for p in tmp_cache.root.rglob("*.tmp")]
        assert leftovers == []

    @pytest.mark.parametrize("kind", ["folder", "fifo"])
    def test_an_entry_that_is_not_a_file_is_fetched_again(
        self, kind: str, registry: Path, fake_index: FakeIndex, tmp_path: Path
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        env = {"PATCHSET_CACHE_DIR": str(tmp_path / "cache")}
        argv = ("check", "--registry", str(registry), "--index-url", fake_index.index_url)
        first = cli(*argv, "--vllm", "0.1.0", "--format", "json", env=env)
        assert first.returncode == 0, first.stderr
        cache = Cache(tmp_path / "cache")
        entries = [
            cache.root / "blobs.sqlite",  # the members, one file
            *(p for folder in ("manifests", "index") for p in (cache.root / folder).rglob("*")),
        ]
        entries = [p for p in entries if p.is_file()]
        assert {p.parent.name for p in entries} >= {cache.root.name, "manifests", "index"}
        shutil.rmtree(cache.root / "memo")  # results worked out again: the files are read
        for path in entries:
            path.unlink()
            if kind == "folder":
                (path / "inside").mkdir(parents=True)
            else:
                os.mkfifo(path)
        again = cli(*argv, "--vllm", "0.1.0", "--format", "json", env=env, timeout=60)
        assert again.returncode == 0, again.stderr
        assert json.loads(again.stdout)["results"] == json.loads(first.stdout)["results"]
        assert all(p.is_file() for p in entries if p.exists())
        offline = cli(*argv, "--vllm", "0.1.0", "--offline", "--format", "json", env=env)
        assert offline.returncode == 0, offline.stderr

    def test_a_rewritten_memo_row_is_not_believed(
        self, registry: Path, fake_index: FakeIndex, tmp_cache: Cache
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        patches = load_registry(registry)
        source = IndexSource(fake_index.index_url, cache=tmp_cache)
        memo = Memo(tmp_cache.root / "memo")
        first = check(patches, ["0.1.0"], source=source, memo=memo)
        assert first.result("0.1.0", "edit-target").verdict == "needed"
        db = sqlite3.connect(memo.path)
        with db:
            (value,) = db.execute("SELECT value FROM results").fetchone()
            forged = value.replace('"needed"', '"upstream"')
            assert forged != value and json.loads(forged)  # still a row, the verdict changed
            db.execute("UPDATE results SET value = ?", (forged,))
        db.close()
        memo = Memo(tmp_cache.root / "memo")
        again = check(patches, ["0.1.0"], source=source, memo=memo)
        assert again.result("0.1.0", "edit-target").verdict == "needed"
        assert memo.hits == 0  # the forged row was dropped, the result computed again


class TestIndexPages:
    """Issue 23 item 22: what an index page lists is taken as pip takes it, and bounded."""

    def test_another_projects_wheel_on_the_page_is_skipped(
        self,
        registry: Path,
        fake_index: FakeIndex,
        tmp_cache: Cache,
        capsys: pytest.CaptureFixture[str],
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        torch = synthetic_wheel("0.2.0", {TARGET: b"a = 1\nb = 3\nc = 4\n"})
        name = "torch-0.2.0-py3-none-any.whl"
        fake_index.server.route(f"/packages/{name}", Reply(200, torch))
        entry = {**FakeIndex._entry(name, torch, None, False), "filename": name}
        fake_index.files["0.2.0"] = [entry]
        fake_index.publish()
        source = IndexSource(fake_index.index_url, cache=tmp_cache)
        assert source.versions() == ["0.1.0"]
        argv = ["check", "--registry", str(registry), "--index-url", fake_index.index_url]
        assert main([*argv, "--vllm", "0.2.0"]) == ExitCode.UNAVAILABLE
        assert "vllm 0.2.0 is not on the index" in capsys.readouterr().err

    def test_a_version_of_thousands_of_digits_is_refused_in_one_line(
        self, registry: Path, fake_index: FakeIndex, tmp_cache: Cache
    ) -> None:
        huge = "0." + "9" * 5000
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        name = f"vllm-{huge}-py3-none-any.whl"
        data = synthetic_wheel("0.1.0", FILES)
        fake_index.files[huge] = [FakeIndex._entry(name, data, None, False)]
        fake_index.publish()
        argv = ("check", "--registry", str(registry), "--index-url", fake_index.index_url)
        listed = cli(*argv, "--since", "0.1.0", "--format", "json")
        assert listed.returncode == 0, listed.stderr
        assert [r["vllm"] for r in json.loads(listed.stdout)["releases"]] == ["0.1.0"]
        named = cli(*argv, "--vllm", huge)
        assert named.returncode == ExitCode.BAD_INPUT
        assert "is not a PEP 440 version" in error_line(named)
        assert len(error_line(named)) < 200

    def test_since_is_bounded_and_says_so(
        self, registry: Path, fake_index: FakeIndex, tmp_cache: Cache
    ) -> None:
        data = synthetic_wheel("0.1.0", FILES)
        for minor in range(250):
            version = f"0.{minor}.0"
            fake_index.files[version] = [FakeIndex._entry(wheel_name(version), data, None, False)]
        fake_index.publish()
        argv = ("check", "--registry", str(registry), "--index-url", fake_index.index_url)
        proc = cli(*argv, "--since", "0.0.0")
        assert proc.returncode == ExitCode.BAD_INPUT
        assert "selects 250 releases" in error_line(proc)
        assert "at most 200" in error_line(proc)


class Releases(ReleaseSource):
    """Releases held in memory: `files(version)` gives each one's files."""

    name = "memory"

    def __init__(self, versions: list[str], files: Callable[[str], dict[str, bytes]]) -> None:
        self.held, self.files = versions, files

    def versions(self) -> list[str]:
        return list(self.held)

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[MemoryTree]:
        yield MemoryTree(ReleaseInfo(version, "memory"), self.files(version))


LONG = "a-long-patch-name-that-wrapped"
VERSIONS = [f"0.{minor}.0" for minor in range(1, 26)]


def _release(version: str) -> dict[str, bytes]:
    minor = int(version.split(".")[1])
    if minor > 18:
        return {}  # the file is gone: missing-target
    return {TARGET: b"a = 1\nb = 3\nc = 4\n" if minor > 6 else FILES[TARGET]}


@pytest.fixture
def many(tmp_path: Path) -> tuple[Registry, CheckReport]:
    root = tmp_path / "patches"
    add_patch(root, LONG, diff=DIFF, targets=[TARGET], vllm=">=0.1")
    add_patch(root, "short", diff=DIFF, targets=[TARGET], vllm=">=0.10")
    registry = load_registry(root)
    report = check(registry, VERSIONS, source=Releases(VERSIONS, _release), use_memo=False)
    return registry, report


def _printed(
    monkeypatch: pytest.MonkeyPatch,
    width: int,
    many: tuple[Registry, CheckReport],
    *,
    wide: bool = False,
) -> list[str]:
    """What `patchset check` prints on a terminal `width` columns wide."""
    from rich.console import Console

    out = io.StringIO()
    monkeypatch.setattr(
        check_report, "console", lambda: Console(file=out, width=width, soft_wrap=False)
    )
    registry, report = many
    check_report.show_table(report, registry, suggest=False, wide=wide)
    return out.getvalue().splitlines()


class TestOutputForPeople:
    """Issue 23 items 29 and 11: a summary first, a grid that fits, markdown that fits a
    pull-request comment, and nothing in it rendered as HTML."""

    def test_the_grid_fits_80_columns_and_names_never_wrap(
        self, many: tuple[Registry, CheckReport], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        lines = _printed(monkeypatch, 120, many)
        assert lines[0].startswith("2 patch(es) x 25 release(s) (0.1.0..0.25.0 (25)): ")
        assert "need attention in range" in lines[0]
        assert lines[1].startswith("from 0.24.0 to 0.25.0: no verdict changed")
        table = [line for line in lines if line[:1] in "┏┃┡│└"]
        assert table and max(len(line) for line in table) <= 80, "\n".join(table)
        assert len([line for line in table if LONG in line]) == 1, table  # whole, one line
        assert not any("1/9" in line for line in lines)

    def test_wide_shows_a_column_per_release(
        self, many: tuple[Registry, CheckReport], monkeypatch: pytest.MonkeyPatch
    ) -> None:
        lines = _printed(monkeypatch, 400, many, wide=True)
        head = next(line for line in lines if "patch" in line and "┃" in line)
        assert head.count("┃") == 25 + 2  # the patch column and one per release

    def test_releases_are_a_strip_when_ranges_do_not_fit(self) -> None:
        rs = [_result(v, "needed" if i < 6 else "upstream", True) for i, v in enumerate(VERSIONS)]
        assert check_report.strip(rs, lambda m, _: Text(m)).plain == "NNNNNN " + "U" * 19

    def test_markdown_summarises_under_60000_characters(self, tmp_path: Path) -> None:
        root = tmp_path / "patches"
        for n in range(206):
            add_patch(root, f"runtime-patch-{n:03}", diff=DIFF, targets=[TARGET])
        registry = load_registry(root)
        report = check(registry, VERSIONS, source=Releases(VERSIONS, _release), use_memo=False)
        md = check_report.render_markdown(report, registry)
        assert len(md) <= check_report.MAX_MARKDOWN
        assert "206 patch(es) x 25 release(s)" in md.splitlines()[2]
        assert f"| `runtime-patch-205` r1 | `{'N' * 6} {'U' * 12} {'M' * 7}` |" in md
        assert "`--format json`" in md

    def test_markdown_escapes_html_in_site_names(self, tmp_path: Path) -> None:
        root = tmp_path / "patches"
        add_patch(root, "edit-target", diff=DIFF, targets=[TARGET])
        registry = load_registry(root)
        evil = "<img src=x onerror=alert(1)> | cell"
        report = CheckReport(
            registry.digest,
            (ReleaseInfo("0.1.0", "memory"),),
            (
                dataclasses.replace(
                    _result("0.1.0", "partial", True), detail=f"site {evil}: anchor-not-found"
                ),
            ),
        )
        md = check_report.render_markdown(report, registry)
        assert "<img" not in md and "&lt;img src=x onerror=alert(1)&gt; \\| cell" in md

    def test_a_warm_prefetch_reports_no_bytes(
        self, fake_index: FakeIndex, tmp_cache: Cache
    ) -> None:
        publish(fake_index, "0.1.0", synthetic_wheel("0.1.0", FILES))
        IndexSource(fake_index.index_url, cache=tmp_cache).prefetch(["0.1.0"], paths=[TARGET])
        heard: list[tuple[int, int]] = []
        warm = IndexSource(fake_index.index_url, cache=tmp_cache)
        warm.prefetch(["0.1.0"], paths=[TARGET], progress=lambda v, d, t: heard.append((d, t)))
        assert heard == [(0, 0)]  # nothing fetched: not "1/1 bytes"
        from rich.progress import Progress

        from patchset.cli.progress import _Bytes

        bar = Progress(disable=True)
        bar.add_task("vllm releases 1/1", total=None)
        bar.add_task("vllm releases 0/1", total=2048, completed=1024)
        warm_task, cold_task = bar.tasks
        assert _Bytes().render(warm_task).plain == ""
        assert _Bytes().render(cold_task).plain == "1.0/2.0 kB"


def _result(version: str, verdict: str, in_range: bool) -> CheckResult:
    return CheckResult(
        vllm=version,
        patch="edit-target",
        revision=1,
        variant="patch.diff",
        verdict=verdict,  # type: ignore[arg-type]
        in_range=in_range,
        detail=verdict,
        signals=Signals("applies", None, None),
    )
