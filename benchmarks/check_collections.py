"""Benchmark: `patchset check --since 0.17.0` of a project holding both imported collections.

    PATCHSET_GENESIS_DIR=... PATCHSET_CLUB3090_DIR=... python3 benchmarks/check_collections.py

Without those variables the checkouts are taken from the local git mirrors named by
PATCHSET_GENESIS_MIRROR / PATCHSET_CLUB3090_MIRROR (bare repositories: `git archive HEAD`).
Genesis is imported with `--source index` and club-3090 with `--run-scripts` into one fresh
project (their releases from a cache of the benchmark's own, `--cache DIR` to keep it between
runs). Then the check, as a user runs it (`python -m patchset check`, a fresh process, the
processes it picks itself), is timed these ways:

- cold_s: an empty cache folder: the index asked, each release's wheel read by range from it
  (the cache is the product's only download store, so cold includes the network);
- nomemo_s: the files cached (the cold run's cache, its memo removed);
- warm_s: the memo filled (the best of three);
- one_edit_s: the first patch's title edited (its results computed again, the others from
  the report kept by the runs before; its JSON compared with the whole check's, run after it
  with no report kept): the median of three such runs, each from the same cache (a run of a
  third of a second is at the mercy of the machine's other work: one run alone is a poor
  figure);
- every edit: each patch's title edited in turn and checked once (from the same cache: its
  memo folder as before the edits), as a user edits one patch: the median, the 90th
  percentile and the slowest (whose JSON is compared with the whole check's). The first
  patch is one draw; an edit's cost is that of the patch edited (its files' sizes, the
  patches stacked on it).

Cold, no memo and one edit are each the median of three runs (cold: three empty caches, the
median run's cache kept for the others; no memo: three copies of it; each run printed).

CPU seconds (`*_cpu_s`: the check's process and the children it forked), the largest
process's peak memory (peak_mb) and the cache's size after the cold run (cache_mb) go beside
them. Every run's JSON must be the same bytes, and the edit's those of the whole check
(same=yes|no); `--json FILE` keeps the cold run's.
Two cores are shared with other work here: the CPU seconds say more than the wall clock.
patchset's modules are byte-compiled once (into a folder of the benchmark's own, as a
wheel's install compiles them), whatever PYTHONDONTWRITEBYTECODE says.

Last line: patches=<n> releases=<n> results=<n> cold_s=<s> cold_cpu_s=<s> nomemo_s=<s>
nomemo_cpu_s=<s> warm_s=<s> warm_cpu_s=<s> one_edit_s=<s> one_edit_cpu_s=<s>
edit_median_s=<s> edit_p90_s=<s> edit_max_s=<s> peak_mb=<n> cache_mb=<n> same=<yes|no>.
Targets (2 cores): cold < 10 s, no memo < 3 s, warm < 0.5 s, one edit < 0.3 s, peak < 500
MB, cache < 50 MB.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, TypeVar

REPO = Path(__file__).resolve().parent.parent
SINCE = "0.17.0"
RUNS = 3  # cold, no-memo and one-edit runs: the median run taken
PYCACHE = Path(tempfile.gettempdir()) / "patchset-check-collections-pycache"
MIRRORS = {
    "genesis": ("PATCHSET_GENESIS_DIR", "PATCHSET_GENESIS_MIRROR"),
    "club-3090": ("PATCHSET_CLUB3090_DIR", "PATCHSET_CLUB3090_MIRROR"),
}


def checkout(collection: str, scratch: Path) -> Path:
    """The collection's checkout: the folder its variable names, else its mirror archived."""
    folder_var, mirror_var = MIRRORS[collection]
    if folder := os.environ.get(folder_var):
        return Path(folder)
    mirror = os.environ.get(mirror_var)
    if not mirror:
        raise SystemExit(f"set {folder_var} (a checkout) or {mirror_var} (a bare git mirror)")
    dest = scratch / collection
    dest.mkdir(parents=True)
    archive = subprocess.run(
        ["git", "-C", mirror, "archive", "HEAD"], check=True, capture_output=True
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def patchset(cwd: Path, cache: Path, *args: str) -> tuple[float, float, float, str]:
    """`python -m patchset ARGS` in `cwd`: wall seconds, CPU seconds and peak memory (MB) of
    its process and the children it forked (`os.wait4`), its stdout."""
    env = {**os.environ, "PATCHSET_CACHE_DIR": str(cache), "PYTHONPATH": str(REPO)}
    # Byte-compiled once, as an installed patchset is (a wheel's install compiles it): with
    # PYTHONDONTWRITEBYTECODE every run compiled ~80 modules afresh (0.3 s of a warm check).
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(PYCACHE)
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        start = time.perf_counter()
        child = subprocess.Popen(
            [sys.executable, "-m", "patchset", *args], cwd=cwd, env=env, stdout=out, stderr=err
        )
        _, status, usage = os.wait4(child.pid, 0)
        wall = time.perf_counter() - start
        child.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        if child.returncode not in (0, 1):
            said = err.read().decode(errors="replace")
            raise SystemExit(f"patchset {' '.join(args)}: exit {child.returncode}\n{said}")
        cpu = usage.ru_utime + usage.ru_stime
        return wall, cpu, usage.ru_maxrss / 1024, out.read().decode()


Run = TypeVar("Run", bound=tuple[Any, ...])


def median(runs: list[Run]) -> Run:
    """The run of median wall seconds (its first field)."""
    return sorted(runs, key=lambda run: run[0])[len(runs) // 2]


def said(runs: list[tuple[Any, ...]]) -> str:
    """ "median of 1.00, 1.20, 1.10 s": each run's wall seconds, in the order run."""
    return "median of " + ", ".join(f"{run[0]:.2f}" for run in runs) + " s"


def size_mb(folder: Path) -> float:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file()) / 1e6


def every_edit(
    project: Path, cache: Path, scratch: Path, check: tuple[str, ...]
) -> tuple[list[tuple[float, str]], bool]:
    """Each patch's title edited in turn, checked once from the same cache (its memo folder
    as before the first edit): each run's wall seconds and the patch, and whether the
    slowest edit's JSON is the whole check's. `cache` as it was afterwards."""
    patches = sorted(p.parent for p in (project / "patches").glob("*/patch.toml"))
    memo = cache / "memo"
    kept = scratch / "memo-before-edits"
    shutil.rmtree(kept, ignore_errors=True)
    shutil.copytree(memo, kept)
    runs: list[tuple[float, str]] = []
    try:
        for folder in patches:
            toml = folder / "patch.toml"
            original = toml.read_text()
            shutil.rmtree(memo)
            shutil.copytree(kept, memo)
            toml.write_text(original.replace('title = "', 'title = "edited ', 1))
            try:
                runs.append((patchset(project, cache, *check)[0], folder.name))
            finally:
                toml.write_text(original)
        shutil.rmtree(memo)
        shutil.copytree(kept, memo)
        slowest = max(runs)[1]
        _, _, same = one_edit(project, cache, scratch, check, slowest, runs=1)
    finally:
        shutil.rmtree(memo, ignore_errors=True)
        shutil.copytree(kept, memo)
    return runs, same


def one_edit(
    project: Path,
    cache: Path,
    scratch: Path,
    check: tuple[str, ...],
    patch: str,
    *,
    runs: int = RUNS,
) -> tuple[float, float, bool]:
    """The patch's title edited, checked `runs` times from the same cache: the median run's
    wall and CPU seconds, and whether every run's JSON is the whole check's (run after, with
    no report kept). The patch is as it was afterwards; `cache` as after the last run."""
    first = project / "patches" / patch
    toml = first / "patch.toml"
    original = toml.read_text()
    before = scratch / "before-edit"
    shutil.rmtree(before, ignore_errors=True)
    shutil.copytree(cache, before)
    toml.write_text(original.replace('title = "', 'title = "edited ', 1))
    try:
        edits = []
        for _ in range(runs):
            shutil.rmtree(cache)
            shutil.copytree(before, cache)
            edits.append(patchset(project, cache, *check))
        whole = scratch / "whole"  # the same check with no report kept: the whole of it
        shutil.rmtree(whole, ignore_errors=True)
        shutil.copytree(cache, whole)
        for kept in (whole / "memo").glob("reports-*"):
            kept.unlink()
        edit_whole = patchset(project, whole, *check)[3]
    finally:
        toml.write_text(original)
    edit, edit_cpu, _, _ = median(edits)
    print(f"one edit ({first.name}): {said(edits)} ({edit_cpu:.2f} s CPU)", flush=True)
    return edit, edit_cpu, all(e[3] == edit_whole for e in edits)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", type=Path, help="the imports' release cache (kept)")
    parser.add_argument("--project", type=Path, help="an imported project to reuse")
    parser.add_argument("--json", type=Path, help="write the cold run's JSON here")
    args = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="patchset-check-collections-"))
    try:
        project = args.project
        if project is None:
            imports = args.cache or scratch / "import-cache"
            project = scratch / "project"
            project.mkdir()
            genesis = checkout("genesis", scratch / "src")
            club = checkout("club-3090", scratch / "src")
            patchset(project, imports, "import", "genesis", str(genesis), "--source", "index")
            patchset(project, imports, "import", "club-3090", str(club), "--run-scripts")
        patches = sum(1 for p in (project / "patches").glob("*/patch.toml"))
        check = ("check", "--since", SINCE, "--format", "json")

        # each from an empty cache of its own
        colds = [(*patchset(project, scratch / f"cache-{i}", *check), i) for i in range(RUNS)]
        cold, cold_cpu, peak_mb, cold_out, chosen = median(colds)
        cache = scratch / f"cache-{chosen}"  # the median run's: the runs below start from it
        cache_mb = size_mb(cache)
        if args.json is not None:
            args.json.write_text(cold_out)
        report = json.loads(cold_out)
        print(f"cold: {said(colds)} ({cold_cpu:.2f} s CPU), cache {cache_mb:.1f} MB", flush=True)

        nomemos = []  # each from a copy of that cache, its memo removed
        for i in range(RUNS):
            files = scratch / f"files-{i}"
            shutil.copytree(cache, files)
            shutil.rmtree(files / "memo")
            nomemos.append(patchset(project, files, *check))
        nomemo, nomemo_cpu, _, _ = median(nomemos)
        print(f"no memo: {said(nomemos)} ({nomemo_cpu:.2f} s CPU)", flush=True)

        warm_runs = [patchset(project, cache, *check) for _ in range(3)]
        warm, warm_cpu, _, warm_out = min(warm_runs)
        print(f"warm: best of 3 {warm:.2f} s ({warm_cpu:.2f} s CPU)", flush=True)

        first = sorted(p.parent.name for p in (project / "patches").glob("*/patch.toml"))[0]
        edit, edit_cpu, edit_same = one_edit(project, cache, scratch, check, first)
        edits, every_same = every_edit(project, cache, scratch, check)
        walls = sorted(wall for wall, _ in edits)
        slow_s, slowest = max(edits)
        under = sum(1 for wall in walls if wall < 0.3)
        print(
            f"every edit: {len(edits)} patches, median {statistics.median(walls):.2f} s,"
            f" 90th percentile {walls[int(0.9 * (len(walls) - 1))]:.2f} s, slowest {slow_s:.2f} s"
            f" ({slowest}), {under} under 0.3 s",
            flush=True,
        )

        same = (
            len({run[3] for run in [*colds, *nomemos]}) == 1
            and cold_out == warm_out
            and edit_same
            and every_same
        )
        print(
            f"patches={patches} releases={len(report['releases'])}"
            f" results={len(report['results'])} cold_s={cold:.2f} cold_cpu_s={cold_cpu:.2f}"
            f" nomemo_s={nomemo:.2f} nomemo_cpu_s={nomemo_cpu:.2f} warm_s={warm:.2f}"
            f" warm_cpu_s={warm_cpu:.2f} one_edit_s={edit:.2f} one_edit_cpu_s={edit_cpu:.2f}"
            f" edit_median_s={statistics.median(walls):.2f}"
            f" edit_p90_s={walls[int(0.9 * (len(walls) - 1))]:.2f} edit_max_s={slow_s:.2f}"
            f" peak_mb={peak_mb:.0f} cache_mb={cache_mb:.0f} same={'yes' if same else 'no'}"
        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
