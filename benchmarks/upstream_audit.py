"""Benchmark: `patchset upstream` over 300 patches from cached answers.

A registry of N patches, each with its own `[upstream] pr`, and a fake forge on 127.0.0.1
that speaks the REST API's shape with ETags (tests/helpers/fake_forge.py). The first run asks for
every pull request and keeps the answers; the timed runs ask again with If-None-Match and get
304 for each (what a weekly job does with its cache kept). Each run is a fresh process, as in
CI, so the figure includes Python's start and the imports.

Beside the wall time of a fresh process (`cached_s`, which on a loaded machine is mostly
Python's start and patchset's imports: `floor_s` is `patchset --version` on the same
machine), the CPU time that process used (`cached_cpu_s`) and the library call itself in
one process (`inprocess_s`: the registry loaded and every pull request asked, 304 each).

Last line: patches=<n> first_s=<s> cached_s=<median s> cached_cpu_s=<s> floor_s=<s>
inprocess_s=<s> conditional=<304s per run>. Target: cached under 1 s for 300 patches.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchset.adapters.forge import ForgeAPI  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from patchset.upstream import audit  # noqa: E402
from tests.helpers.fake_forge import FakeForge  # noqa: E402
from tests.helpers.synthetic import MOD_DIFF, add_patch  # noqa: E402
from tests.helpers.timing import run_patchset  # noqa: E402


def registry(root: Path, forge: FakeForge, count: int) -> Path:
    patches = root / "patches"
    patches.mkdir()
    states = ("open", "closed", "merged")
    for n in range(1, count + 1):
        folder = add_patch(patches, f"patch-{n:04d}", diff=MOD_DIFF, targets=["vllm/mod.py"])
        toml = folder / "patch.toml"
        text = toml.read_text().replace(
            'state = "unsubmitted"', f'pr = "team/vllm#{n}"\nstate = "open"'
        )
        toml.write_text(text)
        state = states[n % 3]
        forge.pull(
            f"team/vllm#{n}",
            "open" if state == "open" else "closed",
            merged=state == "merged",
            sha=f"{n:040x}" if state == "merged" else None,
        )
    return patches


def run(patches: Path, forge: FakeForge, cache: Path, *args: str) -> tuple[float, float]:
    """One fresh `patchset` process: (wall seconds, CPU seconds it used)."""
    env = {"PATCHSET_FORGE_API_URL": forge.api, "PATCHSET_CACHE_DIR": str(cache)}
    env["GITHUB_TOKEN"] = ""
    words = list(args or ("--registry", str(patches), "upstream", "-q", "--format", "json"))
    return run_patchset(words, env)[:2]


def in_process(patches: Path, forge: FakeForge, cache: Path) -> float:
    start = time.perf_counter()
    audit(load_registry(patches, tolerant=True), ForgeAPI(forge.api, token="", cache_dir=cache))
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=300)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    forge = FakeForge()
    try:
        with tempfile.TemporaryDirectory(prefix="patchset-bench-upstream-") as tmp:
            patches = registry(Path(tmp), forge, args.patches)
            cache = Path(tmp) / "cache"
            first, _ = run(patches, forge, cache)
            before = sum(forge.script.conditional.values())
            cached = [run(patches, forge, cache) for _ in range(args.repeat)]
            conditional = (sum(forge.script.conditional.values()) - before) // args.repeat
            floor = statistics.median(
                run(patches, forge, cache, "--version")[0] for _ in range(args.repeat)
            )
            inside = statistics.median(
                in_process(patches, forge, cache / "forge") for _ in range(args.repeat)
            )
    finally:
        forge.close()
    print(f"runs: {', '.join(f'{t:.3f}' for t, _ in cached)} s")
    print(
        f"patches={args.patches} first_s={first:.3f}"
        f" cached_s={statistics.median(t for t, _ in cached):.3f}"
        f" cached_cpu_s={statistics.median(c for _, c in cached):.3f} floor_s={floor:.3f}"
        f" inprocess_s={inside:.3f} conditional={conditional}"
    )


if __name__ == "__main__":
    main()
