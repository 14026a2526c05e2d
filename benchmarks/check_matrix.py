"""Benchmark: a registry of 100+ real patches against every vLLM release from 0.17.0 to the newest.

The corpus is cut from vLLM's own history: for each pair of consecutive releases on the index,
a few of the files that changed between them become a patch (git's own `diff --no-index`):
one-hunk, multi-hunk, multi-file, new files, deletions and end-of-file appends. Each is added
with `patchset add --diff` to a fresh project (`patchset init`), declared for the release it was
cut from. The whole matrix is then checked:

- nomemo: the memo cleared, the release files cached (the first check after an upgrade; the
  median of --repeat runs, each from a cleared memo and nothing kept in memory);
- warm: again, the memo filled (best of --repeat);
- one edit: one patch's description edited (its digest changes), the matrix checked again;
- naive: each sdist unpacked, then `git apply --check` and `git apply --reverse --check` per patch.

Every verdict is compared with git's (forward fits / reverse fits / neither / both); each
difference is printed with patchset's reason. The moved-file hint's precision is measured
against a rename test on the releases themselves (the named file, or a package's named
modules together, hold at least half of the vanished file's content lines, as git's -M50%;
benchmarks/moved_hint.py measures it on every vanished file).

Last line: patches=<n> releases=<n> warm_s=<s> nomemo_s=<s> one_edit_s=<s> naive_s=<s>
ratio=<naive/nomemo> agree=<same>/<total>
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from patchset._gc import collector_paused
from patchset.cachedir import cache_root
from patchset.engine import evaluate
from patchset.registry import load_registry, ranges
from patchset.release_check import CheckReport, CheckResult, check, memo, moves, parallel
from patchset.release_check.moves import content_lines
from patchset.sources.package_index import IndexSource, client

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_cold import download_sdists  # the sibling script, found by path
from processes import cpu_now, one_process  # the sibling module

KINDS = ("onehunk", "multihunk", "multifile", "newfile", "deletion", "eofappend")


@dataclass(frozen=True)
class Cut:
    kind: str
    base: str  # the release the diff applies to
    after: str  # the next release, which holds the change
    files: tuple[str, ...]
    diff: str


@functools.lru_cache(maxsize=3)
def _sources(sdist: Path) -> dict[str, bytes]:
    """Every .py file under vllm/ of an sdist (the release as published), by path."""
    out: dict[str, bytes] = {}
    with tarfile.open(sdist) as tar:
        for member in tar:
            _top, _, rel = member.name.partition("/")
            if member.isfile() and rel.startswith("vllm/") and rel.endswith(".py"):
                handle = tar.extractfile(member)
                if handle is not None:
                    out[rel] = handle.read()
    return out


def sdists(versions: list[str], work: Path) -> dict[str, Path]:
    """The releases' sdists: kept in --work (or an older cache's copy), else downloaded."""
    folder = work / "sdists"
    folder.mkdir(parents=True, exist_ok=True)
    found: dict[str, Path] = {}
    for v in versions:
        for place in (folder, cache_root() / "sdists"):
            if (place / f"vllm-{v}.tar.gz").is_file():
                found[v] = place / f"vllm-{v}.tar.gz"
                break
    missing = [v for v in versions if v not in found]
    if missing:
        found.update(download_sdists(missing, folder))
    return {v: found[v] for v in versions}


def _git_diff(old: bytes | None, new: bytes | None, rel: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a", rel), Path(tmp, "b", rel)
        for path, data in ((a, old), (b, new)):
            if data is not None:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_bytes(data)
        left = f"a/{rel}" if old is not None else "/dev/null"
        right = f"b/{rel}" if new is not None else "/dev/null"
        out = subprocess.run(
            ["git", "diff", "--no-index", "--no-color", left, right],
            cwd=tmp,
            capture_output=True,
            check=False,
        ).stdout.decode("utf-8", "replace")
    return out.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")


def _hunks(diff: str) -> list[list[str]]:
    hunks: list[list[str]] = []
    for line in diff.splitlines():
        if line.startswith("@@"):
            hunks.append([])
        elif hunks and line[:1] in " +-\\":
            hunks[-1].append(line)
    return hunks


def _eof_append(diff: str, new: bytes) -> bool:
    hunks = _hunks(diff)
    if len(hunks) != 1:
        return False
    body = [line for line in hunks[0] if not line.startswith("\\")]
    return bool(body) and all(not t.startswith("-") for t in body) and body[-1].startswith("+")


def _rank(base: str, rel: str) -> str:
    return hashlib.sha256(f"{base}\0{rel}".encode()).hexdigest()


def cut_corpus(archives: dict[str, Path], versions: list[str], per_pair: int) -> list[Cut]:
    """A spread of real changes between consecutive releases, the same on every run."""
    cuts: list[Cut] = []
    for base, after in itertools.pairwise(versions):
        old, new = _sources(archives[base]), _sources(archives[after])
        changed = sorted(
            (p for p in old.keys() & new.keys() if old[p] != new[p]),
            key=lambda p: _rank(base, p),
        )
        added = sorted(new.keys() - old.keys(), key=lambda p: _rank(base, p))
        gone = sorted(old.keys() - new.keys(), key=lambda p: _rank(base, p))
        picked: dict[str, Cut] = {}
        singles: list[tuple[str, str, int]] = []
        for rel in changed[:400]:
            a, b = old[rel], new[rel]
            diff = _git_diff(a, b, rel)
            size, count = diff.count("\n"), len(_hunks(diff))
            if size > 400 or not count:
                continue
            if "eofappend" not in picked and _eof_append(diff, b):
                picked["eofappend"] = Cut("eofappend", base, after, (rel,), diff)
                continue
            kind = "onehunk" if count == 1 else "multihunk" if count <= 8 else ""
            if kind and kind not in picked:
                picked[kind] = Cut(kind, base, after, (rel,), diff)
            elif count <= 3:
                singles.append((rel, diff, count))
            if {"eofappend", "onehunk", "multihunk"} <= picked.keys() and len(singles) >= 6:
                break
        if len(singles) >= 2:
            (r1, d1, _), (r2, d2, _) = singles[0], singles[1]
            picked["multifile"] = Cut("multifile", base, after, (r1, r2), d1 + d2)
        for rel in added:
            data = new[rel]
            if 0 < data.count(b"\n") <= 200:
                picked["newfile"] = Cut("newfile", base, after, (rel,), _git_diff(None, data, rel))
                break
        for rel in gone:
            data = old[rel]
            if 0 < data.count(b"\n") <= 200:
                picked["deletion"] = Cut(
                    "deletion", base, after, (rel,), _git_diff(data, None, rel)
                )
                break
        extra = iter(singles[2:])
        while len(picked) < per_pair:
            nxt = next(extra, None)
            if nxt is None:
                break
            picked[f"onehunk{len(picked)}"] = Cut("onehunk", base, after, (nxt[0],), nxt[1])
        for kind in ("multifile", "newfile")[len(cuts) % 2 :]:
            if len(picked) > per_pair:
                picked.pop(kind, None)
        cuts += list(picked.values())[:per_pair]
    return cuts


def build_project(root: Path, cuts: list[Cut]) -> tuple[Path, dict[str, Cut], list[str]]:
    """`patchset init` + one `patchset add --diff` per cut; the ids added and the refusals."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}
    patchset = [sys.executable, "-m", "patchset"]
    subprocess.run([*patchset, "init", str(root)], check=True, capture_output=True, env=env)
    registry = root / "patches"
    added: dict[str, Cut] = {}
    refused: list[str] = []
    diffs = root / "diffs"
    diffs.mkdir()
    for n, cut in enumerate(cuts):
        patch_id = f"{cut.kind}-{cut.base.replace('.', '-')}-{n}"
        path = diffs / f"{patch_id}.diff"
        path.write_text(cut.diff)
        done = subprocess.run(
            [
                *patchset,
                "--registry",
                str(registry),
                "add",
                patch_id,
                "--diff",
                str(path),
                "--no-check",
                "--range",
                f">={cut.base},<{cut.after}",
                "--title",
                f"vLLM {cut.base} -> {cut.after}: {', '.join(cut.files)}"[:200],
            ],
            capture_output=True,
            text=True,
            env=env,
            check=False,
        )
        if done.returncode == 0:
            added[patch_id] = cut
        else:
            refused.append(f"{patch_id}: {(done.stderr or done.stdout).strip()[:160]}")
    return registry, added, refused


CPU: list[float] = []  # each timed check's process time (the steadier figure on a shared machine)


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


def nomemo_check(
    registry_dir: Path, versions: list[str], jobs: int | None = None
) -> tuple[float, CheckReport]:
    """The check with the memo cleared and nothing kept in memory from an earlier check, as
    in a fresh process: the release files are cached, nothing else is known."""
    memo.clear()
    evaluate.clear_caches()  # nothing compiled yet, no target file read
    moves.forget_lines()  # nor any release file's lines
    client._parse_version.cache_clear()  # nor any version parsed
    ranges.is_version.cache_clear()
    return timed_check(registry_dir, versions, jobs)


def naive(
    registry_dir: Path, archives: dict[str, Path]
) -> tuple[float, dict[tuple[str, str], tuple[bool, bool]]]:
    """Unpack every release, then git apply --check / --reverse --check per patch."""
    registry = load_registry(registry_dir)
    verdicts: dict[tuple[str, str], tuple[bool, bool]] = {}
    start = time.perf_counter()
    for version, archive in archives.items():
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(archive) as tar:
                tar.extractall(tmp, filter="data")
            root = Path(tmp) / f"vllm-{version}"
            for patch in registry.patches:
                diff = str(patch.folder / patch.variants[0].name)
                fits = []
                for extra in ([], ["--reverse"]):
                    done = subprocess.run(
                        ["git", "apply", "--check", *extra, diff],
                        cwd=root,
                        capture_output=True,
                        check=False,
                    )
                    fits.append(done.returncode == 0)
                verdicts[(version, patch.id)] = (fits[0], fits[1])
    return time.perf_counter() - start, verdicts


def git_class(forward: bool, reverse: bool) -> str:
    return {(True, False): "needed", (False, True): "upstream", (True, True): "both"}.get(
        (forward, reverse), "conflict"
    )


def our_class(r: CheckResult) -> str:
    if r.signals.forward == "applies" and r.signals.reverse:
        return "both"
    return {"partial": "conflict", "missing-target": "conflict"}.get(r.verdict, r.verdict)


def reason(r: CheckResult, git: str) -> str:
    lines = [f for f in r.locations if "ambiguous" in f or "not at the" in f]
    if lines:
        return lines[0]
    return f"{r.verdict}: {r.detail[:200]}"


def _git_fits(files: dict[str, bytes], diff: Path, *, reverse: bool) -> bool:
    with tempfile.TemporaryDirectory() as tmp:
        for rel, data in files.items():
            (Path(tmp) / rel).parent.mkdir(parents=True, exist_ok=True)
            (Path(tmp) / rel).write_bytes(data)
        extra = ["--reverse"] if reverse else []
        command = ["git", "apply", "--check", *extra, str(diff)]
        done = subprocess.run(command, cwd=tmp, capture_output=True, check=False)
    return done.returncode == 0


def artifact_reason(
    r: CheckResult, registry_dir: Path, archives: dict[str, Path]
) -> tuple[str, str] | None:
    """When git (on the sdist) and patchset (on the wheel) read different bytes: the files that
    differ, and git's own verdict on the wheel's files (None when the bytes are the same)."""
    patch = load_registry(registry_dir).get(r.patch)
    variant = patch.variants[0]
    sdist = _sources(archives[r.vllm])
    wheel: dict[str, bytes] = {}
    with IndexSource(offline=True).open(r.vllm) as tree:
        for rel in variant.files:
            data = tree.read(rel)
            if data is not None:
                wheel[rel] = data
    differ = [rel for rel in variant.files if wheel.get(rel) != sdist.get(rel)]
    if not differ:
        return None
    diff = patch.folder / variant.name
    on_wheel = git_class(
        _git_fits(wheel, diff, reverse=False), _git_fits(wheel, diff, reverse=True)
    )
    return ", ".join(differ), on_wheel


def moved_precision(
    report: CheckReport, archives: dict[str, Path], versions: list[str]
) -> tuple[int, int, list[str]]:
    """Hints whose named file(s) hold at least half the vanished file's content lines (a
    package move names several modules: together) / all hints."""
    hinted = sorted(
        (r for r in report.results if r.verdict == "missing-target" and r.moved_to),
        key=lambda r: Version(r.vllm),
    )
    names = {v: set(_sources(archives[v])) for v in versions} if hinted else {}
    good = total = 0
    wrong: list[str] = []
    for r in hinted:
        total += 1
        patch_files = [line.split(":", 1)[0] for line in r.detail.split(", ")]
        gone = r.detail.split(" not in this release")[0].split(", ")[0]
        earlier = [v for v in versions if Version(v) < Version(r.vllm) and gone in names[v]]
        target = ", ".join(r.moved_to)
        ok = False
        if earlier:
            was = _sources(archives[earlier[-1]])[gone]
            now = b"\n".join(_sources(archives[r.vllm]).get(t, b"") for t in r.moved_to)
            old = content_lines(was.decode("utf-8", "replace").splitlines())
            new = content_lines(now.decode("utf-8", "replace").splitlines())
            ok = bool(old) and len(old & new) / len(old) >= 0.5
        good += ok
        if not ok:
            wrong.append(f"{r.vllm} {r.patch}: {gone} -> {target}")
        del patch_files
    return good, total, wrong


def corpus(
    args: argparse.Namespace, archives: dict[str, Path], versions: list[str]
) -> tuple[Path, dict[str, Cut]]:
    """The project of real patches: cut and added, or the one kept in --work with --reuse."""
    work = args.work or Path(tempfile.mkdtemp(prefix="check-matrix-"))
    work.mkdir(parents=True, exist_ok=True)
    project = work / "project"
    start = time.perf_counter()
    saved = work / "cuts.json"
    if args.reuse and saved.is_file():
        cuts = [Cut(**{**c, "files": tuple(c["files"])}) for c in json.loads(saved.read_text())]
    else:
        cuts = cut_corpus(archives, versions, args.per_pair)
        saved.write_text(json.dumps([c.__dict__ for c in cuts]))
    refused: list[str] = []
    if args.reuse and project.exists():
        registry_dir = project / "patches"
        ids = {p.id for p in load_registry(registry_dir).patches}
        added = {f"{c.kind}-{c.base.replace('.', '-')}-{n}": c for n, c in enumerate(cuts)}
        added = {k: c for k, c in added.items() if k in ids}
    else:
        if project.exists():
            shutil.rmtree(project)
        registry_dir, added, refused = build_project(project, cuts)
    kinds = Counter(c.kind for c in added.values())
    print(
        f"corpus: {len(added)} patches added ({dict(sorted(kinds.items()))}),"
        f" {len(refused)} refused, in {time.perf_counter() - start:.1f} s",
        flush=True,
    )
    for line in refused:
        print(f"  refused: {line}")
    return registry_dir, added


def agreement(
    report: CheckReport,
    git: dict[tuple[str, str], tuple[bool, bool]],
    registry_dir: Path,
    archives: dict[str, Path],
) -> int:
    """How many verdicts are git's; each other one is printed with its reason: a documented
    rule where git is wrong (docs/check.md, row 8), or git and patchset reading different bytes
    (git the sdist, patchset the wheel, which a release may have rebuilt: then git is asked
    again on the wheel's files)."""
    same = 0
    differ: Counter[str] = Counter()
    why: Counter[str] = Counter()
    for r in report.results:
        theirs = git_class(*git[(r.vllm, r.patch)]) if git else our_class(r)
        if theirs == our_class(r):
            same += 1
            continue
        differ[f"git {theirs}, patchset {r.verdict}"] += 1
        text = reason(r, theirs)
        if "not at the" in text or "no longer where git looks" in r.detail:
            why["row 8: an end-of-file append upstream, followed by more code"] += 1
        elif (found := artifact_reason(r, registry_dir, archives)) is not None:
            files, on_wheel = found
            same_as_ours = "as patchset" if on_wheel == our_class(r) else "NOT as patchset"
            text = (
                f"the wheel patchset reads differs from the sdist git read in {files};"
                f" git on the wheel's files: {on_wheel}, {same_as_ours}"
            )
            why[f"wheel differs from sdist (git on the wheel: {same_as_ours})"] += 1
        else:
            why["unexplained"] += 1
        print(f"  differs: {r.vllm} {r.patch}: git {theirs}, patchset {our_class(r)}: {text}")
    for what, n in differ.most_common():
        print(f"  {n} x {what}")
    for what, n in why.most_common():
        print(f"  reason: {n} x {what}")
    return same


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="0.17.0", help="first release of the matrix")
    parser.add_argument("--per-pair", type=int, default=5, help="patches cut per release pair")
    parser.add_argument(
        "--repeat", type=int, default=3, help="runs of nomemo (the median) and warm (the best)"
    )
    parser.add_argument("--work", type=Path, help="keep the project here (default: a temp dir)")
    parser.add_argument("--skip-naive", action="store_true")
    parser.add_argument(
        "--reuse", action="store_true", help="keep the project already in --work (no rebuild)"
    )
    parser.add_argument("--jobs", type=int, help="processes of each check (default: patchset's)")
    args = parser.parse_args()
    JOBS[0] = args.jobs
    source = IndexSource()
    versions = [v for v in source.versions() if Version(v) >= Version(args.since)]
    work = args.work or Path(tempfile.mkdtemp(prefix="check-matrix-"))
    args.work = work
    start = time.perf_counter()
    archives = sdists(versions, work)
    print(
        f"releases={len(versions)} ({versions[0]}..{versions[-1]})"
        f" sdists_s={time.perf_counter() - start:.1f}",
        flush=True,
    )
    registry_dir, added = corpus(args, archives, versions)
    start = time.perf_counter()
    check(load_registry(registry_dir), versions, source=source)  # the cache filled, online
    print(f"first check (fills the release cache): {time.perf_counter() - start:.1f} s")

    runs = [nomemo_check(registry_dir, versions) for _ in range(args.repeat)]
    nomemo, report = sorted(runs, key=lambda run: run[0])[len(runs) // 2]  # the median
    print(
        f"nomemo: {len(report.results)} verdicts in {nomemo:.3f} s (median of"
        f" {', '.join(f'{t:.3f}' for t, _ in runs)}; process time"
        f" {', '.join(f'{t:.3f}' for t in CPU[-len(runs) :])} (children's included);"
        f" load {os.getloadavg()[0]:.1f}; --jobs {JOBS[0] or 'default'})",
        flush=True,
    )
    if JOBS[0] != 1:
        serial = functools.partial(nomemo_check, registry_dir, versions)
        print(one_process(serial, args.repeat, report), flush=True)
    warm = min(timed_check(registry_dir, versions)[0] for _ in range(args.repeat))
    print(
        f"warm (memo): best of {args.repeat}: {warm:.3f} s"
        f" (process time best {min(CPU[-args.repeat :]):.3f} s)",
        flush=True,
    )
    first = sorted(added)[0]
    toml = registry_dir / first / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    one_edit, _ = timed_check(registry_dir, versions)
    print(f"one edit ({first}): {one_edit:.3f} s", flush=True)

    counts = Counter(r.verdict for r in report.results)
    print("verdicts:", dict(sorted(counts.items())))
    good, hints, wrong = moved_precision(report, archives, versions)
    print(
        f"moved-file hints: {good}/{hints} name a file holding at least half of the vanished"
        f" file's lines (precision {good / hints if hints else 1:.2f})"
    )
    for line in wrong:
        print(f"  wrong hint: {line}")

    naive_s, git = (0.0, {}) if args.skip_naive else naive(registry_dir, archives)
    print(f"naive: unpack + git apply --check / --reverse --check: {naive_s:.1f} s", flush=True)
    same = agreement(report, git, registry_dir, archives)
    total = len(report.results)
    ratio = naive_s / nomemo if nomemo else 0.0
    print(
        f"patches={len(added)} releases={len(versions)} warm_s={warm:.3f} nomemo_s={nomemo:.3f}"
        f" one_edit_s={one_edit:.3f} naive_s={naive_s:.1f} ratio={ratio:.0f}"
        f" agree={same}/{total}"
    )


if __name__ == "__main__":
    main()
