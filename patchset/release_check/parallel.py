"""A check's patches split among processes: a check of a whole collection is CPU-bound (the
compile check of each patched file, the anchors' searches), and every core is the check's.

`split` groups the patches by the file most of their sites or hunks are in, so that a file's
reading, its first compile and its units are mostly paid in one process, the groups balanced
by an estimate of their cost (`WEIGHTS`); the lightest files no other group reads are left
as pieces that each process takes once its group is done (`Claims`), which evens out the
estimate's error. `Forked` runs one group's check in a child process:
a fork, so the loaded registry, the release cache's state and the options come along as they
are, and only the answer (the group's results) is pickled back. A patch's verdict rests on
the patch and the release's files only, never on the other patches checked with it, so a
split check gives the very results of one process.

Forking is done only where it is safe: Linux (elsewhere a child of a process that loaded
system libraries may not run), no other thread running (a fork copies only the thread that
forks; a lock another thread held would stay held), and a source whose releases a child may
read beside the parent (`ReleaseSource.fork_safe`). Anything else runs in one process. A
child that fails for any reason but a `PatchsetError` (killed, out of memory), or that stops
answering (no CPU used and no byte sent for `STALL` seconds: stopped with SIGSTOP, hung; it is
killed), leaves its group (and the pieces it took) to the parent, which checks it itself: the
answer is never lost.
"""

from __future__ import annotations

import contextlib
import logging
import os
import pickle
import select
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Generic, TypeVar

from patchset.errors import PatchsetError, UsageError

if TYPE_CHECKING:  # `wanted` is all the CLI asks before a report kept from last time
    from patchset.registry import Patch

T = TypeVar("T")
LOG = logging.getLogger(__name__)

ENV = "PATCHSET_JOBS"
"""Processes `patchset check` may use (``1``: one, no fork); unset, one per core, at most
`MOST` (the CLI reads it: `patchset.check` itself uses one process unless given `jobs`)."""

MOST = 8
WEIGHTS = (4.0, 2.0, 0.2, 1.0)
"""`split`'s estimate of a group's cost: per patch, per site or hunk, per site or hunk and KiB
of its file, per KiB of a file the group reads (fitted to each home file's check alone in
benchmarks/runtime_matrix.py's and check_matrix.py's corpora)."""
STALL = 60.0
"""Seconds a child may go without using CPU or sending a byte of its answer (stopped with
SIGSTOP, hung on a lock) before it is killed and its group checked by the parent."""
_POLL = 0.25  # seconds between looks at a quiet child
SMALLEST = 64
"""(patch, release) pairs (or, the memo asked, pairs it lacks) below which a check stays in
one process: a fork and the merging of the answers cost more than they save."""


def wanted(jobs: int | None, environ: dict[str, str] | None = None) -> int:
    """The processes a check uses: `jobs` if given, else ``PATCHSET_JOBS``, else one per
    core (at most `MOST`). A UsageError for a count below 1 or a value that is no count."""
    if jobs is None:
        env = os.environ if environ is None else environ
        said = env.get(ENV, "").strip()
        if not said:
            return max(1, min(_cores(), MOST))
        try:
            jobs = int(said)
        except ValueError:
            raise UsageError(f"{ENV}={said!r}: give a number of processes, 1 or more") from None
    return counted(jobs)


def counted(jobs: int) -> int:
    """`jobs` as a count of processes: a UsageError below 1 (`patchset.check` reads no
    environment: its caller, the CLI, says how many with `wanted`)."""
    if jobs < 1:
        raise UsageError(f"--jobs {jobs}: give a number of processes, 1 or more")
    return jobs


def _cores() -> int:
    """The cores this process may run on (a container's or `taskset`'s limit, not the
    machine's count)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not on Linux
        return os.cpu_count() or 1


def can_fork() -> bool:
    """Whether a child process can be forked safely here (see the module's docstring)."""
    return sys.platform.startswith("linux") and threading.active_count() == 1


@dataclass(frozen=True)
class Split:
    """A check's patches for its processes: `groups`, one per process (the parent's first),
    each checked where it was given; then `shared`, pieces (a home file's patches, the
    heaviest first) that any process takes, one at a time, once its own group is done
    (`Claims`): an estimate's error evens out at the end, and no piece reads a file another
    piece reads, so it costs the same wherever it runs."""

    groups: list[list[Patch]]
    shared: list[list[Patch]] = field(default_factory=list)

    @property
    def processes(self) -> int:
        return len(self.groups)


SHARED = 0.25
"""The part of a split check's estimated cost left to `Split.shared` (at most): the lightest
home files whose files no other home file's patches read."""
_MOST_SHARED = 4096  # pieces numbered in two bytes, all written to the pipe at once


def split(
    patches: Sequence[Patch],
    n: int,
    pairs: int,
    size: Callable[[str], int | None] | None = None,
    stacked_on: Callable[[Patch], Sequence[Patch]] | None = None,
) -> Split:
    """`patches` for `n` processes (each group and piece in their given order), one group
    when `pairs` (patches x releases) is small.

    A patch goes with the file most of its sites or hunks are in (its home; a python patch's,
    the module most of its names are looked up in), so that a file's patches are checked in
    one process. What a home file's patches cost is estimated from measurements of
    the matrix benchmarks (`WEIGHTS`): per patch, per site or hunk, per site or hunk and KiB
    of its file (`size`, as the newest release lists it: a longer file takes longer to search
    and compile), and per KiB of each file the group reads (read, compiled and followed from
    release to release once per process that reads it). A patch stacked on others
    (`stacked_on`: the patches it requires, applied first in every release) is checked with
    theirs applied: their sites, hunks and files count as its own, and its home is where
    most of them all are (beside the patches under it, whose files it reads too).

    The lightest home files that share no file with another (up to `SHARED` of the
    estimate) are left to `Split.shared`, the heaviest first. The others are placed the
    heaviest first, each in the group it leaves the lightest: the one already reading its
    files costs less. The first group is the heaviest (the parent's: it pays no fork)."""
    if n < 2 or len(patches) < 2 or pairs < SMALLEST:
        return Split([list(patches)])
    from patchset.kernel.touches import module_files, parse_touch  # noqa: PLC0415 -- see above

    per_patch, per_unit, per_unit_kib, per_file_kib = WEIGHTS
    kib: dict[str, float] = {}
    home: dict[str, str] = {}
    own: dict[str, float] = {}  # a home file's patches' own cost (their files' aside)
    reads: dict[str, set[str]] = {}  # and the files they read
    for patch in patches:
        per_file: dict[str, int] = {}
        under = stacked_on(patch) if stacked_on is not None and patch.requires else ()
        for variant in (v for each in (*under, patch) for v in each.variants):
            for site in variant.sites:
                per_file[site.file] = per_file.get(site.file, 0) + 1
            for diff in variant.diffs:
                per_file[diff.path] = per_file.get(diff.path, 0) + len(diff.hunks)
        for touch in patch.touches if patch.kind == "python" else ():  # a name's module,
            files = module_files(parse_touch(touch)[0])  # read and parsed there: the file
            file = next((f for f in files if size is not None and size(f)), files[0])  # held
            per_file[file] = per_file.get(file, 0) + 1
        read = {f for each in (*under, patch) for f in each.reads}
        for file in {*per_file, *read} - kib.keys():
            kib[file] = ((size(file) if size is not None else None) or 0) / 1024
        # (of files as many sites or hunks in: the longest, whose reading costs the most)
        first = max(per_file, key=lambda f: (per_file[f], kib[f], f)) if per_file else patch.id
        home[patch.id] = first
        alone = per_patch + sum(k * (per_unit + per_unit_kib * kib[f]) for f, k in per_file.items())
        own[first] = own.get(first, 0) + alone
        reads.setdefault(first, set()).update(read, per_file)

    def files_cost(files: set[str]) -> float:
        return per_file_kib * sum(kib.get(f, 0) for f in files)

    def cost(file: str) -> float:
        return own[file] + files_cost(reads[file])

    heaviest_first = sorted(own, key=lambda f: (-cost(f), f))
    shared = _shared(heaviest_first, reads, cost)
    loads = [0.0] * n
    holds: list[set[str]] = [set() for _ in range(n)]
    group_of: dict[str, int] = {}
    for file in (f for f in heaviest_first if f not in shared):
        after = [loads[g] + own[file] + files_cost(reads[file] - holds[g]) for g in range(n)]
        chosen = after.index(min(after))
        group_of[file] = chosen
        loads[chosen] = after[chosen]
        holds[chosen] |= reads[file]
    cut = _pieces(shared, cost, n)
    piece_of = {file: i for i, files in enumerate(cut) for file in files}
    groups: list[list[Patch]] = [[] for _ in range(n)]
    pieces: list[list[Patch]] = [[] for _ in cut]
    for patch in patches:
        if home[patch.id] in piece_of:
            pieces[piece_of[home[patch.id]]].append(patch)
        else:
            groups[group_of[home[patch.id]]].append(patch)
    heaviest = sorted(range(n), key=lambda g: -loads[g])
    if not pieces:  # no piece for a process with no group of its own to take
        return Split([groups[g] for g in heaviest if groups[g]])
    return Split([groups[g] for g in heaviest], pieces)


def _pieces(shared: list[str], cost: Callable[[str], float], n: int) -> list[list[str]]:
    """The shared home files (the heaviest first) cut into pieces, each about `1 / (2 n)` of
    what is left, the last at least `1 / 64` of them all (guided self-scheduling: the first
    pieces big, few to take, the last small, so that the processes end together)."""
    total = left = sum(cost(f) for f in shared)
    pieces: list[list[str]] = []
    size = 0.0  # the last piece's
    for file in shared:
        if not pieces or size >= max(left / (2 * n), total / 64):
            left -= size
            pieces.append([])
            size = 0.0
        pieces[-1].append(file)
        size += cost(file)
    return pieces


def _shared(
    heaviest_first: list[str], reads: dict[str, set[str]], cost: Callable[[str], float]
) -> list[str]:
    """The home files left to `Split.shared`, the heaviest first: the lightest of those
    reading no file another home file's patches read, up to `SHARED` of the whole cost."""
    readers: dict[str, int] = {}
    for file in heaviest_first:
        for f in reads[file]:
            readers[f] = readers.get(f, 0) + 1
    budget = SHARED * sum(cost(f) for f in heaviest_first)
    taken: list[str] = []
    for file in reversed(heaviest_first):
        if len(taken) >= _MOST_SHARED or cost(file) > budget:
            break
        if all(readers[f] == 1 for f in reads[file]):
            taken.append(file)
            budget -= cost(file)
    return taken[::-1]


class Claims:
    """The pieces of a `Split.shared`, taken one at a time by the processes of a check: their
    numbers are written to a pipe before the fork, and each is read (two bytes at once: every
    process reads whole numbers, so a read is never split) by the one process taking it."""

    def __init__(self, count: int) -> None:
        if not 0 <= count <= _MOST_SHARED:
            raise ValueError(f"{count} pieces: at most {_MOST_SHARED}")
        read_end, write_end = os.pipe()
        try:
            data = memoryview(b"".join(i.to_bytes(2, "big") for i in range(count)))
            while data:  # fits in the pipe's buffer: nothing reads it yet
                data = data[os.write(write_end, data) :]
        finally:
            os.close(write_end)
        self._fd: int | None = read_end
        self.taken: list[int] = []  # the pieces this process took, in order

    def take(self) -> int | None:
        """The next piece no process took yet (now this one's); None when none is left."""
        if self._fd is None:
            return None
        data = os.read(self._fd, 2)
        if len(data) < 2:
            return None
        self.taken.append(int.from_bytes(data, "big"))
        return self.taken[-1]

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def __enter__(self) -> Claims:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class Forked(Generic[T]):
    """`work` run in a forked child; `result` waits for its answer. Closing it (or leaving
    the `with`) before then stops the child."""

    def __init__(self, work: Callable[[], T]) -> None:
        read_end, write_end = os.pipe()
        try:
            pid = os.fork()
        except OSError:  # no process to be had: the caller does the work itself
            os.close(read_end)
            os.close(write_end)
            raise
        if pid == 0:  # the child: work, send the answer, and leave without any cleanup
            os.close(read_end)
            _child(work, write_end)
        os.close(write_end)
        self._pid: int | None = pid
        self._answer = os.fdopen(read_end, "rb")

    def result(self, stall: float | None = None) -> T | None:
        """The child's answer; None when it failed other than with a `PatchsetError` (which
        is raised here), or stopped answering (no CPU used and no byte sent for `stall`
        seconds, `STALL` unless given: it is killed): the caller then does the work itself
        (a warning logged says why)."""
        bound = STALL if stall is None else stall
        data: bytes | None = None
        try:
            data = self._read(bound)
        finally:
            status = self._reap(stop=data is None)  # a stalled child (or an interrupt): killed
        if data is None:
            LOG.warning(
                "a child process stopped answering (no progress for %g s): killed, its work is"
                " done here",
                bound,
            )
            return None
        try:
            how, value = pickle.loads(data)  # noqa: S301 - our own child's, on our own pipe
        except Exception:  # cut short (the child was killed) or not to be read: no answer
            how, value = "failed", _ended(status)
        if how == "error" and isinstance(value, PatchsetError):
            raise value
        if how != "ok":
            LOG.warning("a child process failed (%s): its work is done here", _last_line(value))
            return None
        return value  # type: ignore[no-any-return]

    def close(self) -> None:
        self._reap(stop=True)

    def _read(self, stall: float) -> bytes | None:
        """The whole answer on the pipe; None when the child makes no progress for `stall`
        seconds (neither a byte sent nor CPU time used: stopped, or waiting forever)."""
        fd = self._answer.fileno()
        chunks: list[bytes] = []
        used = _cpu_used(self._pid)
        quiet_since = time.monotonic()
        while True:
            ready, _, _ = select.select([fd], [], [], _POLL)
            if ready:
                chunk = os.read(fd, 1 << 20)
                if not chunk:
                    return b"".join(chunks)
                chunks.append(chunk)
                quiet_since = time.monotonic()
                continue
            now = _cpu_used(self._pid)
            if now is None or now != used:  # working (or not to be told: waited for)
                used, quiet_since = now, time.monotonic()
            elif time.monotonic() - quiet_since > stall:
                return None

    def __enter__(self) -> Forked[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _reap(self, *, stop: bool) -> int | None:
        """Wait for the child (killed first with `stop`); its wait status (None: reaped)."""
        self._answer.close()
        if self._pid is None:
            return None
        pid, self._pid = self._pid, None
        if stop:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        return os.waitpid(pid, 0)[1]


def _cpu_used(pid: int | None) -> int | None:
    """The CPU time (clock ticks) process `pid` has used, from /proc; None where it cannot
    be read (not Linux, the process gone)."""
    if pid is None:
        return None
    try:
        fields = Path(f"/proc/{pid}/stat").read_bytes().rpartition(b")")[2].split()
        return int(fields[11]) + int(fields[12])  # utime, stime
    except (OSError, IndexError, ValueError):
        return None


def _ended(status: int | None) -> str:
    """How a child that sent no answer ended, in words."""
    if status is not None and os.WIFSIGNALED(status):
        return f"killed by signal {os.WTERMSIG(status)}"
    if status is not None and os.WIFEXITED(status):
        return f"exit code {os.WEXITSTATUS(status)}, no answer sent"
    return "no answer sent"


def _last_line(value: object) -> str:
    lines = str(value).strip().splitlines()
    return lines[-1] if lines else "no reason given"


def _child(work: Callable[[], object], write_end: int) -> None:
    code = 0
    try:
        try:
            answer: tuple[str, object] = ("ok", work())
        except PatchsetError as exc:
            answer = ("error", exc)
        except BaseException:  # a fault, an interrupt: the parent does the work (or stops)
            answer = ("failed", traceback.format_exc())
        try:
            data = pickle.dumps(answer, protocol=pickle.HIGHEST_PROTOCOL)
        except Exception:  # an error that does not pickle: the parent does the work itself
            data = pickle.dumps(("failed", traceback.format_exc()))
        with os.fdopen(write_end, "wb") as out:
            out.write(data)
    except BaseException:  # the answer could not be sent: the parent reads none
        code = 1
    finally:
        os._exit(code)  # no atexit, no flushing of the parent's buffers a second time
