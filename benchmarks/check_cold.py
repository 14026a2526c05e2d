"""Benchmark: a cold `patchset check` (empty cache) of the registry's patches against 25
releases, beside the raw parallel download of the same 25 sdists in the same run.

The check runs as a user runs it (a fresh process, an empty $PATCHSET_CACHE_DIR, pip's
settings read, the index asked, each release's wheel read by range). The baseline only
downloads the sdists (four at a time, sha256-checked) and does nothing with them: a check
that reads whole sdists cannot be faster than that.

Like an installed patchset (pip compiles its bytecode at install), the checked-out code is
compiled once before the timing (its __pycache__ folders, removed afterwards): an editable
install with PYTHONDONTWRITEBYTECODE set would otherwise compile every patchset module on
every run (about 0.15 s here). `--no-bytecode` times it that way instead.

Last line: releases=<n> cold_s=<s> sdist_download_s=<s> ratio=<sdist_download_s/cold_s>
cache_bytes=<n>. Targets: cold under 10 s, ratio at least 1, cache under 50 MB.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.version import Version

from patchset.adapters import net
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index.cache import Cache

REPO = Path(__file__).resolve().parent.parent


def newest(count: int, first: str | None, last: str | None) -> list[str]:
    """`count` releases: from `first` on (to `last`), else the newest."""
    versions = IndexSource().versions()
    if first:
        versions = [v for v in versions if Version(v) >= Version(first)]
    if last:
        versions = [v for v in versions if Version(v) <= Version(last)]
    return versions[:count] if first else versions[-count:]


def download_sdists(versions: list[str], dest: Path, workers: int = 4) -> dict[str, Path]:
    """The releases' sdists, downloaded raw in parallel and checked against the index."""
    index = IndexSource().index

    def one(version: str) -> tuple[str, Path]:
        sdist = index.release(version).sdist
        if sdist is None:
            raise SystemExit(f"vllm {version} has no sdist on the index")
        path = dest / sdist.filename
        net.download(sdist.url, path, sha256=sdist.sha256, transport=index.transport)
        return version, path

    with ThreadPoolExecutor(max_workers=workers) as pool:
        return dict(pool.map(one, versions))


@contextlib.contextmanager
def bytecode(wanted: bool) -> Iterator[None]:
    """patchset's modules compiled, as pip leaves an installed package; the __pycache__
    folders made here are removed after."""
    folders = {p.parent for p in (REPO / "patchset").rglob("*.py")}
    made = [f / "__pycache__" for f in folders if not (f / "__pycache__").exists()]
    try:
        if wanted:
            compiled = subprocess.run(
                [sys.executable, "-m", "compileall", "-q", str(REPO / "patchset")],
                env={**os.environ, "PYTHONDONTWRITEBYTECODE": ""},
                capture_output=True,
                check=False,
            )
            if compiled.returncode != 0:
                raise SystemExit(f"compiling patchset failed: {compiled.stdout.decode()}")
        yield
    finally:
        for folder in made:
            shutil.rmtree(folder, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--first", default="0.17.0", help="first release (default 0.17.0)")
    parser.add_argument("--last", default="0.33.0", help="last release (default 0.33.0)")
    parser.add_argument("--count", type=int, default=25)
    parser.add_argument("--registry", type=Path, default=REPO / "patches")
    parser.add_argument(
        "--no-bytecode",
        action="store_true",
        help="do not compile patchset's bytecode first (time the check as it compiles)",
    )
    args = parser.parse_args()
    versions = newest(args.count, args.first, args.last)
    print(f"releases: {versions[0]}..{versions[-1]} ({len(versions)})")
    with tempfile.TemporaryDirectory(prefix="patchset-cold-") as tmp:
        cache_dir = Path(tmp) / "cache"
        command = [sys.executable, "-m", "patchset", "--registry", str(args.registry), "check"]
        for v in versions:
            command += ["--vllm", v]
        env = {**os.environ, "PATCHSET_CACHE_DIR": str(cache_dir)}
        with bytecode(not args.no_bytecode):
            start = time.perf_counter()
            done = subprocess.run(
                [*command, "--format", "json"], env=env, capture_output=True, check=False
            )
            cold = time.perf_counter() - start
        if done.returncode not in (0, 1):
            raise SystemExit(f"the cold check failed: {done.stderr.decode()}")
        cache_bytes = Cache(cache_dir).usage()[0]
        print(f"cold check: {cold:.2f} s, cache {cache_bytes / 1e6:.1f} MB")
        sdists = Path(tmp) / "sdists"
        start = time.perf_counter()
        paths = download_sdists(versions, sdists)
        raw = time.perf_counter() - start
        size = sum(p.stat().st_size for p in paths.values())
        print(f"raw sdist download: {raw:.2f} s, {size / 1e6:.0f} MB")
    print(
        f"releases={len(versions)} cold_s={cold:.2f} sdist_download_s={raw:.2f}"
        f" ratio={raw / cold:.2f} cache_bytes={cache_bytes}"
    )


if __name__ == "__main__":
    main()
