"""A check split among processes (`release_check.parallel`) gives the very report one process
gives: every verdict kind across releases, the memo's rows and counts, the files each release
lists as checked; a child that dies or fails leaves its group to the parent, a child's
`PatchsetError` is the check's; the split keeps a file's patches together and its groups
balanced; the connection pools of the parent are not a child's."""

from __future__ import annotations

import io
import json
import os
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from rich.console import Console

from patchset.adapters.net import pools, transport
from patchset.authoring.runtime_sites import sites_from_edit, sites_toml
from patchset.authoring.tree import unified
from patchset.cli.main import main
from patchset.cli.progress import download_bar
from patchset.errors import ExitCode, SourceError, UsageError
from patchset.registry import Patch, Registry, load_registry
from patchset.release_check import check, parallel
from patchset.release_check.memo import Memo
from patchset.release_check.report import CheckReport
from patchset.sources.base import ReleaseInfo
from patchset.sources.folder import FolderSource
from patchset.sources.git import GitSource
from patchset.sources.image import ImageSource
from patchset.sources.package_index import IndexSource, client, settings
from patchset.sources.package_index.members import each_done
from tests.helpers.synthetic import MemoryReleases, add_patch

VERSIONS = [f"0.3{i}.0" for i in range(8)]


@pytest.fixture(autouse=True)
def _no_other_thread() -> None:
    """A check forks only when no other thread runs (`parallel.can_fork`): a thread another
    test left (a server it did not join) would keep every check here in one process. Such a
    thread is waited for a little, then named, before the test counts a single fork."""
    deadline = time.monotonic() + 10.0
    for thread in threading.enumerate():
        if thread is not threading.main_thread():
            thread.join(timeout=max(0.0, deadline - time.monotonic()))
    others = [t for t in threading.enumerate() if t is not threading.main_thread()]
    assert not others, f"threads left by an earlier test keep a check from forking: {others}"


def _module(n: int, version: int) -> str:
    """A module of a few functions; later releases change some lines (so edits stop fitting)
    and, from the fifth release on, hold the first function's edit themselves (upstream)."""
    body = []
    for f in range(6):
        limit = 8 if not (f == 0 and version >= 5) else 4
        body.append(
            f"def fn_{n}_{f}(x):\n"
            f"    # part {f} of module {n}\n"
            f"    split = min(x.split, {limit if f == 0 else 8 + f})\n"
            f"    return run(x, split)  # release {version if f == 3 else 0}\n\n\n"
        )
    return "import os\n\n\n" + "".join(body)


def _releases() -> dict[str, dict[str, str]]:
    releases: dict[str, dict[str, str]] = {}
    for v, version in enumerate(VERSIONS):
        files = {}
        for n in range(6):
            home = f"vllm/m{n}.py" if not (n == 5 and v >= 6) else "vllm/moved/m5.py"
            files[home] = _module(n, v)
        files["vllm/_version.py"] = f"__version__ = '{version}'\n"
        releases[version] = files
    return releases


def _registry(root: Path) -> Registry:
    """Per module: a diff and a runtime patch of its first function (upstream later), of its
    fourth (whose line each release changes: a conflict after the first) and of its second."""
    original = {n: _module(n, 0) for n in range(6)}
    for n, text in original.items():
        file = f"vllm/m{n}.py"
        for f, old, new in (
            (0, "min(x.split, 8)", "min(x.split, 4)"),
            (3, "return run(x, split)  # release 0\n", "return run(x, split or 1)  # release 0\n"),
            (1, "min(x.split, 9)", "min(x.split, 2)"),
        ):
            part = f"    # part {f} of module {n}\n"
            start = text.index(part)
            edited = text[:start] + text[start:].replace(old, new, 1)
            add_patch(root, f"d{n}-{f}", diff=unified(file, text, edited), targets=[file])
            sites = sites_toml(f"r{n}-{f}", sites_from_edit(text, edited, file))
            add_patch(root, f"r{n}-{f}", sites=sites, targets=[file])
    return load_registry(root)


def _report_json(report: CheckReport) -> str:
    return json.dumps(report.to_dict(), sort_keys=True)


def _checked_in_one_process(tmp_path: Path) -> tuple[Registry, MemoryReleases, CheckReport]:
    """The registry of `_registry`, the releases of `_releases` and their check by one
    process (what a split check is held to)."""
    registry = _registry(tmp_path / "patches")
    source = MemoryReleases(_releases())
    return registry, source, check(registry, VERSIONS, source=source, use_memo=False, jobs=1)


class _Counted(parallel.Forked):  # type: ignore[type-arg]
    made = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]


def test_a_split_check_gives_the_report_of_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, source, one = _checked_in_one_process(tmp_path)
    monkeypatch.setattr(parallel, "Forked", _Counted)
    _Counted.made = 0
    split = check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert _Counted.made == 1  # one child forked: the check was really split
    assert _report_json(split) == _report_json(one)
    verdicts = {r.verdict for r in one.results}
    assert {"needed", "upstream", "conflict", "missing-target"} <= verdicts
    assert len(one.results) == len(registry.patches) * len(VERSIONS)
    three = check(registry, VERSIONS, source=source, use_memo=False, jobs=3)
    assert _report_json(three) == _report_json(one)


def test_a_split_check_fills_and_reads_the_memo_as_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The memo is filled by both processes; a check the memo answers (warm, or one patch
    edited) is not split: a fork would cost more than the lookups."""
    monkeypatch.setattr(parallel, "Forked", _Counted)
    _Counted.made = 0
    registry = _registry(tmp_path / "patches")
    source = MemoryReleases(_releases())
    plain = check(registry, VERSIONS, source=source, use_memo=False, jobs=1)
    # a missing target in a tree with no digest of its own is never memoised (its key
    # would depend on the rest of the tree)
    pairs = len(plain.results)
    kept = sum(r.verdict != "missing-target" for r in plain.results)
    assert 0 < kept < pairs
    memo = Memo(tmp_path / "memo")
    cold = check(registry, VERSIONS, source=source, memo=memo, jobs=2)
    assert (memo.hits, memo.misses) == (0, pairs)  # the child's counted with the parent's
    assert _Counted.made == 1
    warm_memo = Memo(tmp_path / "memo")
    warm = check(registry, VERSIONS, source=source, memo=warm_memo, jobs=2)
    assert (warm_memo.hits, warm_memo.misses) == (kept, pairs - kept)  # both ones' rows kept
    one_memo = Memo(tmp_path / "memo")
    again = check(registry, VERSIONS, source=source, memo=one_memo, jobs=1)
    assert (one_memo.hits, one_memo.misses) == (kept, pairs - kept)
    assert _Counted.made == 1  # the warm checks were not split
    edited = registry.patches[0]
    toml = tmp_path / "patches" / edited.id / "patch.toml"
    toml.write_text(toml.read_text().replace("revision = 1", "revision = 2"))
    edit_memo = Memo(tmp_path / "memo")
    check(load_registry(tmp_path / "patches"), VERSIONS, source=source, memo=edit_memo, jobs=2)
    assert _Counted.made == 1  # one patch edited: 8 pairs to check, in this process
    assert edit_memo.misses == pairs - kept + len(VERSIONS)
    assert _report_json(cold) == _report_json(warm) == _report_json(again) == _report_json(plain)


def test_a_child_that_dies_leaves_its_group_to_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, source, one = _checked_in_one_process(tmp_path)
    parent = os.getpid()
    real_open = MemoryReleases.open

    def dying(self: MemoryReleases, version: str):  # type: ignore[no-untyped-def]
        if os.getpid() != parent:
            os._exit(9)  # killed in the middle of its work, no answer sent
        return real_open(self, version)

    monkeypatch.setattr(MemoryReleases, "open", dying)
    split = check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert _report_json(split) == _report_json(one)


def test_a_childs_patchset_error_is_the_checks(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = _registry(tmp_path / "patches")
    source = MemoryReleases(_releases())
    parent = os.getpid()
    real_open = MemoryReleases.open

    def failing(self: MemoryReleases, version: str):  # type: ignore[no-untyped-def]
        if os.getpid() != parent and version == VERSIONS[3]:
            raise SourceError(f"release {version}: the index is unreachable (in the child)")
        return real_open(self, version)

    monkeypatch.setattr(MemoryReleases, "open", failing)
    with pytest.raises(SourceError, match="in the child") as caught:
        check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert caught.value.exit_code == ExitCode.UNAVAILABLE


def test_forked_answers_raises_and_gives_up_plainly(caplog: pytest.LogCaptureFixture) -> None:
    answer = parallel.Forked(lambda: {"pid": os.getpid()}).result()
    assert answer is not None and answer["pid"] != os.getpid()  # worked out in the child
    with pytest.raises(UsageError, match="bad count"):
        parallel.Forked(_raise_usage).result()
    caplog.set_level("WARNING", logger=parallel.__name__)
    assert parallel.Forked(_raise_value).result() is None  # a fault: the caller redoes it
    assert "ValueError: a fault in the child" in caplog.text
    assert parallel.Forked(lambda: os._exit(3)).result() is None
    assert "exit code 3, no answer sent" in caplog.text
    assert parallel.Forked(lambda: os.kill(os.getpid(), 9)).result() is None
    assert "killed by signal 9" in caplog.text
    assert parallel.Forked(lambda: lambda: 1).result() is None  # an answer that cannot pickle
    assert "its work is done here" in caplog.records[-1].getMessage()
    slow = parallel.Forked(lambda: __import__("time").sleep(60))
    slow.close()  # stopped, not waited for a minute


def _raise_usage() -> None:
    raise UsageError("bad count")


def _raise_value() -> None:
    raise ValueError("a fault in the child")


def test_a_child_keeps_none_of_the_parents_connection_pools() -> None:
    pools._manager("http://127.0.0.1:9/", transport.DEFAULT_TRANSPORT)
    assert pools._MANAGERS
    assert parallel.Forked(lambda: len(pools._MANAGERS)).result() == 0
    assert pools._MANAGERS  # the parent's own are left alone


def test_split_keeps_order_and_a_files_patches_together(tmp_path: Path) -> None:
    registry = _registry(tmp_path / "patches")
    patches = list(registry.patches)
    split = parallel.split(patches, 2, 1000)
    assert split.processes == 2
    every = [*split.groups, *split.shared]
    assert sorted(p.id for g in every for p in g) == sorted(p.id for p in patches)
    rank = {p.id: i for i, p in enumerate(patches)}
    for group in every:
        assert [rank[p.id] for p in group] == sorted(rank[p.id] for p in group)
    home = {p.id: i for i, g in enumerate(every) for p in g}
    for p in patches:  # every patch of a file in one group or piece
        assert {home[q.id] for q in patches if q.targets == p.targets} == {home[p.id]}
    # six files alike: the lightest left to share (a quarter of the cost at most: one file's
    # patches), the others in the two groups
    assert [len(piece) for piece in split.shared] == [6]
    sizes = sorted(len(g) for g in split.groups)
    assert sizes == [12, 18]  # balanced within a file's patches
    assert parallel.split(patches, 2, parallel.SMALLEST - 1).groups == [patches]  # small: one
    assert parallel.split(patches, 1, 1000) == parallel.Split([patches])
    big = {"vllm/m0.py": 200 * 1024}  # a long file weighs more: it gets a group of its own
    heavy = parallel.split(patches, 2, 1000, big.get)
    assert {p.targets[0] for p in heavy.groups[0]} == {"vllm/m0.py"}


def test_split_shares_the_lightest_files_read_by_no_other(tmp_path: Path) -> None:
    """Pieces (the lightest home files, the heaviest piece first) read no file a group or
    another piece reads; a patch stacked on another goes with it, whose file it reads."""
    root = tmp_path / "patches"
    for n in range(12):
        file = f"vllm/s{n}.py"
        text = _module(n, 0)
        edited = text.replace("min(x.split, 8)", "min(x.split, 4)", 1)
        add_patch(root, f"small-{n}", diff=unified(file, text, edited), targets=[file])
    big = _module(99, 0)
    for f in range(1, 6):  # a heavy file, and a patch of another file stacked on one of it
        edited = big.replace(f"min(x.split, {8 + f})", "min(x.split, 1)", 1)
        add_patch(
            root, f"big-{f}", diff=unified("vllm/big.py", big, edited), targets=["vllm/big.py"]
        )
    other = _module(98, 0)
    edited = other.replace("min(x.split, 8)", "min(x.split, 3)", 1)
    add_patch(root, "on-top", diff=unified("vllm/o.py", other, edited), targets=["vllm/o.py"])
    toml = root / "on-top" / "patch.toml"
    toml.write_text(toml.read_text().replace("revision = 1", 'revision = 1\nrequires = ["big-1"]'))
    registry = load_registry(root)
    by_id = {p.id: p for p in registry.patches}
    sizes = {"vllm/big.py": 400 * 1024} | {f"vllm/s{n}.py": (n + 1) * 1024 for n in range(12)}

    def stacked_on(patch: Patch) -> list[Patch]:
        return [by_id[r] for r in patch.requires]

    split = parallel.split(registry.patches, 2, 1000, sizes.get, stacked_on)
    where = {p.id: ("group", i) for i, g in enumerate(split.groups) for p in g}
    where |= {p.id: ("piece", i) for i, g in enumerate(split.shared) for p in g}
    assert where["on-top"] == where["big-1"]  # stacked: with the patches under it
    assert all(where[f"big-{f}"] == where["big-1"] for f in range(1, 6))
    assert split.shared, "no piece shared"
    shared = [p.id for piece in split.shared for p in piece]
    assert set(shared) <= {f"small-{n}" for n in range(12)}  # the light files read by no other
    assert "small-0" in shared  # the lightest
    costs = [sum(sizes[p.targets[0]] for p in piece) for piece in split.shared]
    assert costs == sorted(costs, reverse=True)  # the heaviest piece first


def test_claims_hand_each_piece_to_one_process_once() -> None:
    with parallel.Claims(500) as claims:
        child = parallel.Forked(lambda: [claims.take() for _ in range(250)])
        mine = [claims.take() for _ in range(250)]
        theirs = child.result()
        assert claims.take() is None  # all taken
    assert theirs is not None
    assert sorted(n for n in mine + theirs if n is not None) == list(range(500))
    assert None not in mine + theirs
    assert claims.take() is None  # closed
    with pytest.raises(ValueError, match="at most"):
        parallel.Claims(1 << 16)


def test_a_child_that_dies_holding_a_piece_leaves_it_to_the_parent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The child takes a shared piece and is killed before it answers: the parent checks
    the child's group and that piece (the report is one process's)."""
    registry, source, one = _checked_in_one_process(tmp_path)
    parent = os.getpid()
    marker = tmp_path / "child-took-a-piece"
    real_take = parallel.Claims.take

    def take(self: parallel.Claims) -> int | None:
        if os.getpid() != parent:
            took = real_take(self)
            marker.write_text(str(took))
            os._exit(9)
        deadline = time.monotonic() + 60
        while not marker.exists() and time.monotonic() < deadline:
            time.sleep(0.05)  # the child takes first
        return real_take(self)

    monkeypatch.setattr(parallel.Claims, "take", take)
    split = check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert marker.read_text() == "0"  # the child held the first piece when it died
    assert _report_json(split) == _report_json(one)


def test_jobs_wanted_from_the_argument_the_environment_or_the_cores() -> None:
    assert parallel.wanted(3) == 3
    assert parallel.wanted(None, {"PATCHSET_JOBS": "1"}) == 1
    assert parallel.wanted(None, {}) == max(1, min(len(os.sched_getaffinity(0)), parallel.MOST))
    with pytest.raises(UsageError, match="PATCHSET_JOBS='many'"):
        parallel.wanted(None, {"PATCHSET_JOBS": "many"})
    with pytest.raises(UsageError, match="--jobs 0"):
        parallel.wanted(0)


def test_release_infos_joined_list_the_files_any_process_checked() -> None:
    def info(*paths: str) -> ReleaseInfo:
        checked = [{"path": p, "sha256": p[-1] * 4} for p in paths]
        return ReleaseInfo("0.30.0", "index", "ab", {"kind": "wheel", "checked": checked})

    joined = ReleaseInfo.joined([info("vllm/b", "vllm/c"), info("vllm/a", "vllm/b")])
    assert joined.details is not None
    checked = joined.details["checked"]
    assert isinstance(checked, list)
    assert [c["path"] for c in checked] == ["vllm/a", "vllm/b", "vllm/c"]
    assert joined.details["kind"] == "wheel" and joined.origin == "index"
    plain = ReleaseInfo("0.30.0", "memory")
    assert ReleaseInfo.joined([plain, plain]) is plain


def test_the_cli_refuses_a_bad_jobs_count(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(["--registry", str(tmp_path), "check", "--vllm", "0.20.0", "--jobs", "0"])
    assert code == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert "--jobs 0: give a number of processes, 1 or more" in err
    assert "Traceback" not in err


def test_the_index_reads_leave_no_thread_running() -> None:
    """A check forks only with no other thread running: the threads of a parallel read of
    release files are done once the last result is handed over (they were left to end)."""
    before = threading.active_count()
    done = list(each_done(lambda n: n * 2, list(range(40)), workers=8))
    assert sorted(v for _, v, _ in done if v is not None) == [n * 2 for n in range(40)]
    assert threading.active_count() == before


def test_an_index_source_settles_its_own_threads_before_a_fork(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """An index source asks pip for its settings in a thread of its own as it is made; a
    check waits for it (`settle`) before forking, so the check is split all the same."""
    real = settings.resolve_soon

    def slow(*args: Any, **kwargs: Any) -> Any:
        time.sleep(0.3)  # pip taking its time
        return real(*args, **kwargs)

    def soon(*args: Any, **kwargs: Any) -> Any:
        worker = threading.Thread(target=lambda: answer.append(slow(*args, **kwargs)()))
        answer: list[Any] = []
        worker.start()

        def result() -> Any:
            worker.join()
            return answer[0]

        return result

    monkeypatch.setattr(client, "resolve_soon", soon)
    source = IndexSource(offline=True)
    assert not parallel.can_fork()  # pip is still being asked
    source.settle()
    assert threading.active_count() == 1, threading.enumerate()
    assert parallel.can_fork()
    assert source.index.settings is not None  # the answer kept


def test_a_source_not_safe_to_fork_is_checked_in_one_process(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A git clone's trees read through gitpython's cat-file processes, an image's through
    the engine's connection: a child would share them with the parent, so no child is made."""
    registry = _registry(tmp_path / "patches")
    source = MemoryReleases(_releases())
    source.fork_safe = False
    monkeypatch.setattr(parallel, "Forked", _Counted)
    _Counted.made = 0
    report = check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert _Counted.made == 0 and len(report.results) == len(registry.patches) * len(VERSIONS)
    assert FolderSource.fork_safe and IndexSource.fork_safe
    assert not GitSource.fork_safe and not ImageSource.fork_safe


def test_the_check_progress_bar_runs_no_thread() -> None:
    """`patchset check` draws its prefetch bar on a terminal, then checks: rich's own refresh
    thread, stopped but not waited for, would keep that check from splitting."""

    screen = io.StringIO()
    console = Console(file=screen, force_terminal=True, width=100)
    before = threading.active_count()
    with download_bar(console, ["0.30.0", "0.31.0"]) as report:
        report("0.30.0", 10, 20)
        assert threading.active_count() == before  # drawn by the reports, not by a thread
        report("0.30.0", 20, 20)
        report("0.31.0", 0, 0)
    assert threading.active_count() == before
    assert "vllm releases 2/2" in screen.getvalue()
