"""Benchmark: the moved-file hint ("moved to X?") of `patchset check` on real releases.

Corpus: every vLLM source file (`vllm/**.py`) that vanished between two consecutive releases
on the index, 0.17.0 (or --since) to the newest. Each becomes one diff patch on that file: the
last real change to it between two earlier consecutive releases (git's own diff), or, for a
file that never changed in the window, a one-line change in the middle of it. Every patch is
checked against every release (the index source, as `patchset check` does), so the corpus
also holds releases where the file has not been written yet (no hint may be given there).

Ground truth, a rename test on the releases themselves (sdists), like git's -M50% measured on
the vanished file's content lines (`release_check.moves.content_lines`: boilerplate left out):
a hint is right when the file(s) it names together hold at least half of the content lines
the file had in the last release that still had it; a file "has a home" when one file of the
release, or the modules of the package it became (`foo.py` -> `foo/...`), hold that half.
A hint for a file that existed in no earlier release is wrong.

precision = right hints / hints; recall = right hints / missing targets that have a home.

The check reads a vanished file's content in the last earlier release of the run that held it,
so with the whole history the hint and the ground truth measure the same lines; only the
places looked at (same name, the package, the same folder) and wheel-versus-sdist bytes can
make them differ. `--no-history` checks each release on its own: the content is then read in
the lowest release the patch's range allows. `--patch-lines` judges, in the release right
after each file vanished, by the lines the patch itself expects in the file alone (what is
left when no earlier release can be read: offline, or a range with no floor).
Last line: hints=<n> right=<n> precision=<p> recall=<r>
"""

from __future__ import annotations

import argparse
import functools
import itertools
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path, PurePosixPath

from packaging.version import Version

from patchset.registry import Registry, load_registry
from patchset.release_check import CheckResult, check
from patchset.release_check.moves import MIN_LINES, MOVED_SHARE, content_lines, moved_homes
from patchset.sources.base import MemoryTree, ReleaseInfo
from patchset.sources.package_index import IndexSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_matrix import _git_diff, _sources, sdists  # the sibling script, found by path

PATCH_TOML = """\
id = "{id}"
title = "moved-hint corpus: {path}"
description = "a change to a file that vanished in {gone}"
kind = "diff"
revision = 1
vllm = ">={base},<{after}"
apply = "build"
targets = ["{path}"]
origin = "benchmarks/moved_hint.py"
credit = ["vLLM"]

[upstream]
state = "unsubmitted"
"""


@functools.cache
def files(archive: Path) -> dict[str, bytes]:
    return _sources(archive)


@functools.cache
def lines_of(archive: Path, path: str) -> frozenset[str]:
    data = files(archive).get(path)
    return frozenset(content_lines(data.decode("utf-8", "replace").splitlines()) if data else ())


def carried(archive: Path, paths: tuple[str, ...], wanted: frozenset[str]) -> bool:
    """Whether `paths` of this release together hold MOVED_SHARE of `wanted`."""
    held: set[str] = set()
    for path in paths:
        held |= lines_of(archive, path) & wanted
    return bool(wanted) and len(held) >= MOVED_SHARE * len(wanted)


@functools.lru_cache(maxsize=2)
def holders(archive: Path) -> dict[str, list[str]]:
    """Content line -> the release's files holding it (results come release by release)."""
    index: dict[str, list[str]] = {}
    for path in files(archive):
        for line in lines_of(archive, path):
            index.setdefault(line, []).append(path)
    return index


def has_home(archive: Path, gone: str, wanted: frozenset[str]) -> bool:
    """One file of the release, or the package `gone` became, holds half of `wanted`."""
    index = holders(archive)
    counts = Counter(path for line in wanted for path in index.get(line, ()))
    if counts and counts.most_common(1)[0][1] >= MOVED_SHARE * len(wanted):
        return True
    pure = PurePosixPath(gone)
    package = f"{pure.parent}/{pure.stem}/"
    return carried(archive, tuple(p for p in files(archive) if p.startswith(package)), wanted)


def corpus(archives: dict[str, Path], versions: list[str], root: Path) -> dict[str, str]:
    """One patch per vanished file, written into `root`; patch id -> the file."""
    made: dict[str, str] = {}
    kinds: Counter[str] = Counter()
    for n, (before, gone_in) in enumerate(itertools.pairwise(versions)):
        old, new = files(archives[before]), files(archives[gone_in])
        for path in sorted(old.keys() - new.keys()):
            base, after, diff = _change(archives, versions[: n + 1], path)
            if not diff:
                continue
            kinds["synthetic" if after == "99" else "real"] += 1
            patch_id = f"moved-{len(made):03d}"
            folder = root / patch_id
            folder.mkdir(parents=True)
            (folder / "patch.toml").write_text(
                PATCH_TOML.format(id=patch_id, path=path, gone=gone_in, base=base, after=after)
            )
            (folder / "patch.diff").write_text(diff)
            made[patch_id] = path
    print(f"corpus: {len(made)} vanished files ({dict(kinds)})", flush=True)
    return made


def _change(archives: dict[str, Path], upto: list[str], path: str) -> tuple[str, str, str]:
    """The last real change to `path` between consecutive releases of `upto`, else a one-line
    change in the middle of its last version; (base, release after, diff)."""
    for base, after in reversed(list(itertools.pairwise(upto))):
        a, b = files(archives[base]).get(path), files(archives[after]).get(path)
        if a is not None and b is not None and a != b:
            diff = _git_diff(a, b, path)
            if 0 < diff.count("\n") <= 400:
                return base, after, diff
    last = files(archives[upto[-1]])[path]
    lines = last.decode("utf-8", "replace").splitlines(keepends=True)
    middle = [i for i in range(len(lines) // 3, len(lines)) if len(lines[i].strip()) > 8]
    if not middle:
        return "", "", ""
    i = middle[0]
    changed = [*lines[:i], lines[i].rstrip("\n") + "  # patched\n", *lines[i + 1 :]]
    return upto[-1], "99", _git_diff(last, "".join(changed).encode(), path)


def patch_lines(
    registry: Registry,
    made: dict[str, str],
    archives: dict[str, Path],
    versions: list[str],
    *,
    verbose: bool,
) -> None:
    """The rule on the patch's own lines, in the release right after each file vanished."""
    hints = right = homes = 0
    for before, after in itertools.pairwise(versions):
        names = files(archives[after])
        tree = MemoryTree(ReleaseInfo(after, "sdist"), dict(names))
        for patch in registry.patches:
            gone = made[patch.id]
            if gone not in files(archives[before]) or gone in names:
                continue
            got = moved_homes(tree, patch.variants[0], (gone,)).get(gone, ())
            wanted = lines_of(archives[before], gone)
            home = len(wanted) >= MIN_LINES and has_home(archives[after], gone, wanted)
            ok = bool(got) and carried(archives[after], got, wanted)
            homes += home or ok
            hints += bool(got)
            right += ok
            if got and not ok and verbose:
                print(f"  wrong: {after} {gone} -> {', '.join(got)}")
    precision = right / hints if hints else 1.0
    recall = right / homes if homes else 1.0
    print(f"hints={hints} right={right} precision={precision:.2f} recall={recall:.2f}")


def score(
    results: list[CheckResult],
    made: dict[str, str],
    archives: dict[str, Path],
    versions: list[str],
    *,
    verbose: bool,
) -> None:
    """Each missing-target result's hint against the ground truth; the figure line."""
    hints = right = homes = 0
    wrong: Counter[str] = Counter()
    for r in results:
        if r.verdict != "missing-target":
            continue
        gone = made[r.patch]
        archive = archives[r.vllm]
        earlier = [v for v in versions if Version(v) < Version(r.vllm)]
        last = next((v for v in reversed(earlier) if gone in files(archives[v])), None)
        wanted = lines_of(archives[last], gone) if last else frozenset()
        home = last is not None and len(wanted) >= MIN_LINES and has_home(archive, gone, wanted)
        ok = bool(r.moved_to) and last is not None and carried(archive, r.moved_to, wanted)
        homes += home or ok
        if home and not r.moved_to and verbose:
            print(f"  missed: {r.vllm} {gone}")
        if r.moved_to:
            hints += 1
            right += ok
            if not ok:
                why = "never written before" if last is None else "holds too little"
                wrong[why] += 1
                if verbose:
                    print(f"  wrong: {r.vllm} {gone} -> {', '.join(r.moved_to)} ({why})")
    print(f"wrong hints: {dict(wrong)}; missing targets with a home: {homes}")
    precision = right / hints if hints else 1.0
    recall = right / homes if homes else 1.0
    print(f"hints={hints} right={right} precision={precision:.2f} recall={recall:.2f}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="0.17.0", help="first release")
    parser.add_argument("--work", type=Path, help="keep the sdists and corpus here")
    parser.add_argument("-v", "--verbose", action="store_true", help="list wrong and missed")
    parser.add_argument(
        "--no-history", action="store_true", help="check each release on its own (see above)"
    )
    parser.add_argument(
        "--patch-lines", action="store_true", help="the patch's own lines only (see above)"
    )
    args = parser.parse_args()
    source = IndexSource()
    versions = [v for v in source.versions() if Version(v) >= Version(args.since)]
    work = args.work or Path(tempfile.mkdtemp(prefix="moved-hint-"))
    archives = sdists(versions, work)
    registry_dir = work / "patches"
    if registry_dir.exists():
        import shutil  # noqa: PLC0415 - only for a rerun in the same --work

        shutil.rmtree(registry_dir)
    made = corpus(archives, versions, registry_dir)
    registry = load_registry(registry_dir)
    if args.patch_lines:
        patch_lines(registry, made, archives, versions, verbose=args.verbose)
        return
    start = time.perf_counter()
    if args.no_history:
        results = [
            r for v in versions for r in check(registry, [v], source=source, explain="none").results
        ]
    else:
        results = list(check(registry, versions, source=source, explain="none").results)
    print(f"check: {len(results)} verdicts in {time.perf_counter() - start:.1f} s")

    score(results, made, archives, versions, verbose=args.verbose)


if __name__ == "__main__":
    main()
