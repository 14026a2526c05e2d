"""Benchmark: every patch against every vLLM release from 0.17.0 to the newest, warm cache.

patchset's check (the cache's manifests and members, as the default source leaves them) is
timed beside a naive baseline in the same run: unpack each whole sdist, then `git apply
--check` and `git apply --reverse --check` per diff patch (and a plain anchor search per
runtime site). The releases and the sdists are fetched first so both sides start warm.

Last line: warm_s=<patchset, whole matrix> naive_s=<baseline> ratio=<naive/patchset>
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

from packaging.version import Version

from patchset.registry import load_registry
from patchset.release_check.verdicts import check
from patchset.sources.package_index import IndexSource

sys.path.insert(0, str(Path(__file__).resolve().parent))
from check_cold import download_sdists  # the sibling script, found by path

REPO = Path(__file__).resolve().parent.parent


def naive(registry_dir: Path, sdists: dict[str, Path]) -> float:
    registry = load_registry(registry_dir)
    start = time.perf_counter()
    for version, sdist in sdists.items():
        with tempfile.TemporaryDirectory() as tmp:
            with tarfile.open(sdist) as tar:
                tar.extractall(tmp, filter="data")
            root = Path(tmp) / f"vllm-{version}"
            for patch in registry.patches:
                for variant in patch.variants:
                    if patch.kind == "diff":
                        diff = str(patch.folder / variant.name)
                        for extra in ([], ["--reverse"]):
                            subprocess.run(
                                ["git", "apply", "--check", *extra, diff],
                                cwd=root,
                                capture_output=True,
                                check=False,
                            )
                    else:
                        for site in variant.sites:
                            path = root / site.file
                            if path.is_file():
                                _ = site.anchor_lines[0].strip() in path.read_text()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--since", default="0.17.0", help="first release of the matrix")
    parser.add_argument("--registry", type=Path, default=REPO / "patches")
    parser.add_argument("--repeat", type=int, default=5, help="warm runs; the best is kept")
    args = parser.parse_args()
    source = IndexSource()
    versions = [v for v in source.versions() if Version(v) >= Version(args.since)]
    registry = load_registry(args.registry)
    cold_start = time.perf_counter()
    check(registry, versions, source=source)  # fills the cache as a first check does
    cold = time.perf_counter() - cold_start
    print(f"releases={len(versions)} ({versions[0]}..{versions[-1]}) fetch_s={cold:.2f}")
    offline = IndexSource(offline=True)
    runs = []
    for _ in range(args.repeat):
        start = time.perf_counter()
        report = check(registry, versions, source=offline)
        runs.append(time.perf_counter() - start)
    warm = min(runs)
    cells = len(report.results)
    print(f"patchset: {cells} (release, patch) verdicts, best of {args.repeat}: {warm:.3f} s")
    with tempfile.TemporaryDirectory(prefix="patchset-sdists-") as tmp:
        sdist_paths = download_sdists(versions, Path(tmp))
        slow = naive(args.registry, sdist_paths)
    print(f"naive: unpack + git apply --check/--reverse per patch: {slow:.2f} s")
    print(f"warm_s={warm:.3f} naive_s={slow:.2f} ratio={slow / warm:.1f}")


if __name__ == "__main__":
    main()
