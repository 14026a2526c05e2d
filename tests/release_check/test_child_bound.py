"""A check's processes: a child that stops answering (stopped with SIGSTOP) is killed after a
bound and its group checked by the parent, with a warning, the report unchanged; the library
call `patchset.check` uses one process unless given `jobs` (it reads no $PATCHSET_JOBS)."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import pytest

from patchset.authoring.tree import unified
from patchset.errors import UsageError
from patchset.registry import Registry, load_registry
from patchset.release_check import check, parallel
from patchset.release_check.report import CheckReport
from tests.helpers.synthetic import MemoryReleases, add_patch
from tests.release_check.forks import Counted

VERSIONS = [f"0.5{i}.0" for i in range(6)]


def _module(n: int, v: int) -> str:
    limit = 4 if v >= 4 else 8
    return (
        f"import os\n\n\ndef one_{n}(x):\n    return min(x, {limit})\n\n\n"
        f"def two_{n}(x):\n    return x\n"
    )


def _setup(root: Path) -> tuple[Registry, MemoryReleases]:
    releases = {
        version: {f"vllm/m{n}.py": _module(n, v) for n in range(6)}
        for v, version in enumerate(VERSIONS)
    }
    for n in range(6):
        file, text = f"vllm/m{n}.py", _module(n, 0)
        for part, new in (("a", "min(x, 4)"), ("b", "min(x, 5)")):
            diff = unified(file, text, text.replace("min(x, 8)", new))
            add_patch(root, f"d{n}-{part}", diff=diff, targets=[file])
    return load_registry(root), MemoryReleases(releases)


def _json(report: CheckReport) -> str:
    return json.dumps(report.to_dict(), sort_keys=True)


def test_a_stopped_child_is_killed_after_the_bound_and_its_group_redone(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    registry, source = _setup(tmp_path / "patches")
    one = check(registry, VERSIONS, source=source, use_memo=False)
    parent = os.getpid()
    real_open = MemoryReleases.open

    def stopping(self: MemoryReleases, version: str):  # type: ignore[no-untyped-def]
        if os.getpid() != parent:
            os.kill(os.getpid(), signal.SIGSTOP)  # stops answering, no CPU, nothing sent
        return real_open(self, version)

    monkeypatch.setattr(MemoryReleases, "open", stopping)
    monkeypatch.setattr(parallel, "STALL", 1.0)
    monkeypatch.setattr(parallel, "Forked", Counted)
    caplog.set_level("WARNING", logger=parallel.__name__)
    Counted.made = 0
    start = time.monotonic()
    split = check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert Counted.made == 1  # the check was split: its child stopped itself
    assert time.monotonic() - start < 30  # bounded: not waited for forever
    assert _json(split) == _json(one)  # its group checked here
    assert "stopped answering" in caplog.text and "its work is done here" in caplog.text


def test_forked_kills_a_stopped_child_but_waits_for_a_working_one(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level("WARNING", logger=parallel.__name__)
    stopped = parallel.Forked(_stop_then_answer)
    pid = stopped._pid
    assert pid is not None
    start = time.monotonic()
    assert stopped.result(stall=0.5) is None
    assert time.monotonic() - start < 10
    with pytest.raises(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)  # killed and reaped: nothing left behind
    assert "no progress for 0.5 s" in caplog.text

    def busy() -> int:  # two seconds of CPU, longer than the bound: never quiet
        end, n = time.process_time() + 2.0, 0
        while time.process_time() < end:
            n += 1
        return n

    assert (parallel.Forked(busy).result(stall=0.5) or 0) > 0


def _stop_then_answer() -> str:
    os.kill(os.getpid(), signal.SIGSTOP)
    return "late"


def test_the_library_call_uses_one_process_unless_given_jobs(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry, source = _setup(tmp_path / "patches")
    monkeypatch.setenv("PATCHSET_JOBS", "4")
    monkeypatch.setattr(parallel, "Forked", Counted)
    Counted.made = 0
    report = check(registry, VERSIONS, source=source, use_memo=False)
    assert Counted.made == 0 and len(report.results) == 12 * len(VERSIONS)
    check(registry, VERSIONS, source=source, use_memo=False, jobs=2)
    assert Counted.made == 1  # asked for: split
    with pytest.raises(UsageError, match="--jobs 0"):
        check(registry, VERSIONS, source=source, use_memo=False, jobs=0)
