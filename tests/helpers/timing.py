"""A fresh `patchset` process, timed: wall seconds and the CPU seconds it used."""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from collections.abc import Mapping


def run_patchset(words: list[str], env: Mapping[str, str]) -> tuple[float, float, str]:
    """`python -m patchset WORDS` with `env` added: (wall s, CPU s, stdout); exit 0 or 1."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        [sys.executable, "-m", "patchset", *words],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=False,
    )
    took = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"patchset exited {done.returncode}: {done.stderr}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return took, cpu, done.stdout
