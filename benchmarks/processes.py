"""What the matrix benchmarks share about a check split among processes (`--jobs`): the
process time of this process with its children's, and the figure of one process beside it."""

from __future__ import annotations

import json
import resource
import statistics
import time
from collections.abc import Callable

from patchset.release_check import CheckReport


def cpu_now() -> float:
    """Process time so far of this process and of its children that have ended (a split
    check's children are waited for before it returns)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def child_peak_mb() -> float:
    """The largest peak resident memory of a child that has ended, in MB."""
    return resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024


def one_process(
    run: Callable[[int], tuple[float, CheckReport]], repeat: int, split: CheckReport
) -> str:
    """The nomemo check again with ``--jobs 1`` (median of `repeat`), and whether its report
    is the split check's, as one line to print."""
    runs = [run(1) for _ in range(repeat)]
    took = statistics.median(t for t, _ in runs)
    same = all(
        json.dumps(r.to_dict(), sort_keys=True) == json.dumps(split.to_dict(), sort_keys=True)
        for _, r in runs
    )
    return (
        f"nomemo in one process (--jobs 1): {took:.3f} s (median of"
        f" {', '.join(f'{t:.3f}' for t, _ in runs)}); the same report as the split check: {same}"
    )
