"""Benchmark: a registry of 300+ runtime (anchored-site) patches against every vLLM release
from 0.17.0 to the newest.

The sites are cut from vLLM's own release files (as the package index serves them, read
through patchset's cache as check_matrix.py reads its releases), in the shapes real
collections use: an upstream fix as a `replace` with the site's own probe (the next release's
line), several sites per patch, several files per patch, `optional` sites on lines a later
release drops, `after`-scoped anchors on lines the file holds more than once, alternative
anchors (the next release's shape first, the base's second), anchors written at column 0 or
with the file's own (nested) indentation, anchors whose spaces differ from the file's
(whitespace-folded), `insert-after` a `def ...:` line (into the block), lines unique in one
release and repeated in another (ambiguous), files that later vanish (missing targets) and a
patch-level upstream probe. Each patch is declared for the release it was cut from.

Every (patch, release) verdict, and the sites that failed, is compared with a plain-Python
reference of the rules of docs/registry.md ("Runtime payloads") and docs/check.md (the
decision table), written here apart from patchset's code.

- nomemo: the memo and every in-memory cache cleared, the release files cached (median of
  --repeat runs);
- warm: again with the memo filled (best of --repeat);
- one edit: one patch's title edited, the matrix checked again;
- cold: `patchset check` of the registry as a fresh process on an empty cache (the index
  asked, each release's files read by range);
- apply: `apply` of a registry of --apply-patches runtime patches cut from one release to a
  tree holding that release's files (median of --repeat, the tree put back between runs).

Last line: runtime_patches=<n> sites=<n> releases=<n> warm_s=<s> nomemo_s=<s> one_edit_s=<s>
cold_s=<s> agree=<right>/<total> (then apply_patches=<n> apply_s=<s> on the line before).

    python benchmarks/runtime_matrix.py [--work DIR [--reuse]] [--skip-cold] [--profile]
"""

from __future__ import annotations

import argparse
import cProfile
import json
import os
import pstats
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

from packaging.version import Version

from patchset._gc import collector_paused
from patchset.engine import apply as engine_apply
from patchset.engine import evaluate
from patchset.registry import load_registry, ranges
from patchset.release_check import CheckReport, check, memo, moves, parallel
from patchset.sources.package_index import IndexSource, client

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_cold import bytecode  # the sibling script, found by path  # noqa: E402
from processes import child_peak_mb, cpu_now, one_process  # noqa: E402 - the sibling module
from runtime_corpus import (  # noqa: E402 - the sibling module, found by path
    Cutter,
    PatchSpec,
    Releases,
    SiteSpec,
    _apart,
    _asdict,
    _fold,
    _indent,
    _insert,
    _rank,
    _replace,
    cut,
    write_registry,
)

# ---------------------------------------------------------------------------------------------
# The reference: the rules of docs/registry.md and docs/check.md, in plain Python


def ref_block(text: str) -> list[str]:
    lines = [line.rstrip("\r") for line in text.split("\n")]
    while lines and not lines[0].strip():
        lines = lines[1:]
    while lines and not lines[-1].strip():
        lines = lines[:-1]
    return lines


def ref_find(lines: list[str], block: list[str], start: int = 0) -> list[int]:
    want = [_fold(b) for b in block]
    have = [_fold(x) for x in lines]
    return [i for i in range(start, len(have) - len(want) + 1) if have[i : i + len(want)] == want]


def ref_shift(lines: list[str], written: str, actual: str) -> list[str]:
    out = []
    for line in lines:
        if not line.strip():
            out.append("")
        elif len(actual) >= len(written):
            out.append(actual[len(written) :] + line)
        else:
            cut = len(written) - len(actual)
            out.append(line[cut:] if line[:cut].strip() == "" else line.lstrip())
    return out


def ref_site(site: SiteSpec, marker: str, lines: list[str]) -> tuple[str, list[str]]:
    """A site's status on `lines` and the lines after it (changed only when it applies)."""
    if any(x.strip() == f"# {marker}" for x in lines):
        return "already-applied", lines
    if site.probe and all(needle in "\n".join(lines) for needle in site.probe):
        return "upstream", lines
    shapes = [(site.anchor, site.after)] + [
        (a["anchor"], a.get("after")) for a in site.alternatives
    ]
    for anchor, after in shapes:
        block = ref_block(anchor)
        if after is not None:
            scope = ref_find(lines, ref_block(after))
            found = ref_find(lines, block, scope[0] + len(ref_block(after)))[:1] if scope else []
        else:
            found = ref_find(lines, block)
        if len(found) > 1:
            return "ambiguous", lines
        if len(found) == 1:
            return "applies", ref_edit(site, marker, block, found[0], lines)
    return ("skipped" if site.optional else "anchor-not-found"), lines


def ref_edit(
    site: SiteSpec, marker: str, anchor: list[str], at: int, lines: list[str]
) -> list[str]:
    size = len(anchor)
    own = lines[at : at + size]
    text = ref_shift(ref_block(site.text), _indent(anchor[0]), _indent(lines[at]))
    if site.action == "insert-after" and own[-1].rstrip().endswith(":"):
        nxt = next(x for x in lines[at + size :] if x.strip())
        if len(_indent(text[0])) <= len(_indent(own[-1])):
            text = ref_shift(text, _indent(text[0]), _indent(nxt))
    mark = _indent(text[0]) + "# " + marker
    new = {
        "replace": [mark, *text],
        "insert-after": [*own, mark, *text],
        "insert-before": [mark, *text, *own],
    }[site.action]
    return lines[:at] + new + lines[at + size :]


def _compiles(text: str) -> bool:
    try:
        compile(text, "<ref>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError):
        return False
    return True


def reference(p: PatchSpec, releases: Releases, version: str) -> tuple[str, tuple[str, ...]]:
    """(verdict, the sites not applying nor present) of the patch on the release."""
    files = {s.file: releases.text(version, s.file) for s in p.sites}
    if any(t is None for t in files.values()):
        return "missing-target", ()
    current = {f: t.split("\n") for f, t in files.items() if t is not None}
    statuses: list[tuple[str, str]] = []
    for s in p.sites:
        status, current[s.file] = ref_site(s, f"patchset: {p.id} {s.name}", current[s.file])
        statuses.append((s.name, status))
    failing = tuple(name for name, st in statuses if st not in ("applies", "already-applied"))
    kinds = {st for _, st in statuses}
    if p.probe is not None:
        probe_text = releases.text(version, p.probe[0])
        if probe_text is not None and all(x in probe_text for x in p.probe[1]):
            return "upstream", failing
    if kinds - {"applies", "already-applied", "upstream", "skipped"}:
        return ("partial" if kinds & {"applies", "already-applied"} else "conflict"), failing
    if "applies" not in kinds:
        return ("upstream" if kinds & {"already-applied", "upstream"} else "conflict"), failing
    for f, lines in current.items():
        before = files[f]
        changed = before is not None and "\n".join(lines) != before
        if changed and _compiles(before or "") and not _compiles("\n".join(lines)):
            return "conflict", failing
    return "needed", failing


# ---------------------------------------------------------------------------------------------
# Timing


def clear_caches() -> None:
    """Nothing known in memory from an earlier check, as in a fresh process."""
    memo.clear()
    clear = getattr(evaluate, "clear_caches", None)  # the engine's own (not in older code)
    if clear is not None:
        clear()
    else:
        getattr(evaluate, "_compile_error").cache_clear()  # noqa: B009 - older code only
    moves.forget_lines()
    client._parse_version.cache_clear()
    ranges.is_version.cache_clear()


CPU: list[float] = []  # the process time of each timed check (steadier on a busy machine)


JOBS: list[int | None] = [None]  # --jobs (None: the CLI's default, one process per core)


def timed_check(
    registry_dir: Path, versions: list[str], jobs: int | None = None
) -> tuple[float, CheckReport]:
    registry = load_registry(registry_dir)
    jobs = jobs if jobs is not None else JOBS[0]
    start, cpu = time.perf_counter(), cpu_now()
    with collector_paused():  # as `patchset check` runs it (the library leaves the GC alone)
        report = check(
            registry, versions, source=IndexSource(offline=True), jobs=parallel.wanted(jobs)
        )  # the processes `patchset check` would use
    CPU.append(cpu_now() - cpu)  # a split check's children's too
    return time.perf_counter() - start, report


def cold_check(registry_dir: Path, versions: list[str]) -> float:
    with tempfile.TemporaryDirectory(prefix="runtime-cold-") as tmp:
        command = [sys.executable, "-m", "patchset", "--registry", str(registry_dir), "check"]
        for v in versions:
            command += ["--vllm", v]
        env = {**os.environ, "PATCHSET_CACHE_DIR": str(Path(tmp) / "cache")}
        with bytecode(True):
            start = time.perf_counter()
            cpu = resource.getrusage(resource.RUSAGE_CHILDREN)
            done = subprocess.run(
                [*command, "--format", "json"], env=env, capture_output=True, check=False
            )
            took = time.perf_counter() - start
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode not in (0, 1):
        raise SystemExit(f"the cold check failed: {done.stderr.decode()[-2000:]}")
    process = used.ru_utime + used.ru_stime - cpu.ru_utime - cpu.ru_stime
    print(
        f"cold: {took:.2f} s (process time {process:.2f} s; load {os.getloadavg()[0]:.1f})",
        flush=True,
    )
    return took


def apply_figure(
    cutter: Cutter, work: Path, count: int, repeat: int
) -> tuple[int, int, float, Counter[str]]:
    """A registry of `count` runtime patches cut from one release, applied to a tree holding
    that release's files: (patches, sites, median seconds, outcomes)."""
    version = cutter.v[-1]
    specs: list[PatchSpec] = []
    files = cutter.files_in(version, "apply")
    k = 0
    for rel in files:
        stmts = _apart(
            sorted(cutter.unique_stmts(version, rel), key=lambda s: _rank(rel, str(s.line))), 40
        )
        for i in range(0, len(stmts) - 2, 3):
            n = len(specs)
            trio = stmts[i : i + 3]
            sites = [
                (_insert if j % 2 else _replace)(n, j, rel, s, (n + j) % 3)
                for j, s in enumerate(trio)
            ]
            specs.append(PatchSpec(f"ap-{n}", "apply", version, None, sites))
            k += len(sites)
            if len(specs) == count:
                break
        if len(specs) == count:
            break
    registry_dir = write_registry(work / "apply", specs)
    tree = work / "apply-tree"
    if tree.exists():
        shutil.rmtree(tree)
    (tree / "vllm").mkdir(parents=True)
    (tree / "vllm" / "__init__.py").write_text("")
    originals: dict[str, str] = {}
    for rel in {s.file for p in specs for s in p.sites}:
        text = cutter.r.text(version, rel)
        assert text is not None
        (tree / rel).parent.mkdir(parents=True, exist_ok=True)
        (tree / rel).write_text(text, encoding="utf-8", errors="surrogateescape")
        originals[rel] = text
    registry = load_registry(registry_dir)
    took = []
    outcomes: Counter[str] = Counter()
    for _ in range(repeat):
        clear_caches()
        start, cpu = time.perf_counter(), time.process_time()
        report = engine_apply.apply(registry, tree, version=version, compute_capability=None)
        took.append(time.perf_counter() - start)
        CPU.append(time.process_time() - cpu)
        outcomes = Counter(r.outcome for r in report.results)
        for rel, text in originals.items():
            (tree / rel).write_text(text, encoding="utf-8", errors="surrogateescape")
    return len(specs), k, statistics.median(took), outcomes


def main() -> None:  # noqa: PLR0915 - the benchmark's steps, in order
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="0.17.0", help="first release of the matrix")
    parser.add_argument("--patches", type=int, default=320, help="runtime patches to cut")
    parser.add_argument("--sites", type=int, default=900, help="at least this many sites")
    parser.add_argument("--apply-patches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--work", type=Path, help="keep the project here (default: a temp dir)")
    parser.add_argument("--reuse", action="store_true", help="reuse the corpus kept in --work")
    parser.add_argument("--skip-cold", action="store_true")
    parser.add_argument("--skip-apply", action="store_true")
    parser.add_argument("--profile", type=Path, help="write a cProfile of one nomemo run here")
    parser.add_argument("-v", "--verbose", action="store_true", help="print every disagreement")
    parser.add_argument("--jobs", type=int, help="processes of each check (default: patchset's)")
    args = parser.parse_args()
    JOBS[0] = args.jobs
    work = args.work or Path(tempfile.mkdtemp(prefix="runtime-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    source = IndexSource()
    versions = [v for v in source.versions() if Version(v) >= Version(args.since)]
    start = time.perf_counter()
    releases = Releases(versions)
    cutter = Cutter(releases)
    saved = work / "corpus.json"
    if args.reuse and saved.is_file():
        raw = json.loads(saved.read_text())
        patches = [PatchSpec(**{**p, "sites": [SiteSpec(**s) for s in p["sites"]]}) for p in raw]
    else:
        patches = cut(cutter, args.patches, args.sites)
        saved.write_text(json.dumps([_asdict(p) for p in patches]))
    registry_dir = write_registry(work / "project", patches)
    n_sites = sum(len(p.sites) for p in patches)
    shapes = Counter(p.shape for p in patches)
    print(
        f"corpus: {len(patches)} patches, {n_sites} sites ({dict(sorted(shapes.items()))})"
        f" from {len(versions)} releases ({versions[0]}..{versions[-1]})"
        f" in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    start = time.perf_counter()
    check(load_registry(registry_dir), versions, source=source)  # the release cache filled
    print(f"first check (fills the release cache): {time.perf_counter() - start:.1f} s", flush=True)

    runs = []
    for i in range(args.repeat):
        clear_caches()
        if args.profile and i == 0:
            prof = cProfile.Profile()
            prof.enable()
            runs.append(timed_check(registry_dir, versions))
            prof.disable()
            prof.dump_stats(args.profile)
            pstats.Stats(prof).sort_stats("cumulative").print_stats(25)
        else:
            runs.append(timed_check(registry_dir, versions))
    nomemo, report = sorted(runs, key=lambda run: run[0])[len(runs) // 2]
    print(
        f"nomemo: {len(report.results)} verdicts in {nomemo:.3f} s (median of"
        f" {', '.join(f'{t:.3f}' for t, _ in runs)}; process time, children's included,"
        f" {', '.join(f'{t:.3f}' for t in CPU[-len(runs) :])}; load {os.getloadavg()[0]:.1f};"
        f" --jobs {JOBS[0] or 'default'})",
        flush=True,
    )
    if JOBS[0] != 1:

        def serial(jobs: int) -> tuple[float, CheckReport]:
            clear_caches()
            return timed_check(registry_dir, versions, jobs)

        print(one_process(serial, args.repeat, report), flush=True)
    warm = min(timed_check(registry_dir, versions)[0] for _ in range(args.repeat))
    print(
        f"warm (memo): best of {args.repeat}: {warm:.3f} s"
        f" (process time best {min(CPU[-args.repeat :]):.3f} s)",
        flush=True,
    )
    first = sorted(p.id for p in patches)[0]
    toml = registry_dir / first / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    one_edit, _ = timed_check(registry_dir, versions)
    print(f"one edit ({first}): {one_edit:.3f} s (process time {CPU[-1]:.3f} s)", flush=True)

    counts = Counter(r.verdict for r in report.results)
    print("verdicts:", dict(sorted(counts.items())))
    by_id = {p.id: p for p in patches}
    right = 0
    differ: Counter[str] = Counter()
    for r in report.results:
        want = reference(by_id[r.patch], releases, r.vllm)
        got = (r.verdict, tuple(r.failing_sites))
        if got == want:
            right += 1
            continue
        differ[f"{by_id[r.patch].shape}: reference {want[0]}, patchset {got[0]}"] += 1
        if args.verbose:
            print(
                f"  differs: {r.vllm} {r.patch}: reference {want}, patchset {got}: {r.detail[:300]}"
            )
    for what, k in differ.most_common():
        print(f"  {k} x {what}")
    total = len(report.results)
    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(
        f"peak memory: {rss:.0f} MB (a child of a split check: {child_peak_mb():.0f} MB)",
        flush=True,
    )
    if args.skip_apply:
        print("apply_patches=0 apply_s=0")
    else:
        n, k, apply_s, outcomes = apply_figure(cutter, work, args.apply_patches, args.repeat)
        print(
            f"apply: {n} patches, {k} sites, outcomes {dict(outcomes)}"
            f" (process time {', '.join(f'{t:.3f}' for t in CPU[-args.repeat :])})"
        )
        print(f"apply_patches={n} apply_sites={k} apply_s={apply_s:.3f}", flush=True)
    cold = 0.0 if args.skip_cold else cold_check(registry_dir, versions)
    print(
        f"runtime_patches={len(patches)} sites={n_sites} releases={len(versions)}"
        f" warm_s={warm:.3f} nomemo_s={nomemo:.3f} one_edit_s={one_edit:.3f}"
        f" cold_s={cold:.2f} agree={right}/{total}"
    )


if __name__ == "__main__":
    main()
