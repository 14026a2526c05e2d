"""Benchmark: `patchset bump` of a 50-patch build definition onto a new release, warm.

A real git clone with two releases (v0.19.1, v0.20.0) and a registry of N diff patches,
each on its own file: most still needed on 0.20.0, a tenth upstream there (dropped), a tenth
conflicting where the three-way merge is clean (refreshed as a dry run). The first run fills
the cache (the check's memo); the timed runs are warm, each a fresh process as a scheduled
job runs it (`floor_s`: `patchset --version` on the same machine).

Last line: patches=<n> kept=<n> dropped=<n> refreshed=<n> first_s=<s> warm_s=<median s>
warm_cpu_s=<s> floor_s=<s>. Target: warm under 5 s for 50 patches.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests import gitrepos  # noqa: E402
from tests.synthetic import BODY, add_patch  # noqa: E402
from tests.timing import run_patchset  # noqa: E402


def project(root: Path, count: int) -> tuple[Path, Path, Path]:
    clone = root / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    names = [f"patch-{n:03d}" for n in range(count)]
    gitrepos.commit(
        clone, {"vllm/__init__.py": "", **{f"vllm/{n}.py": BODY for n in names}}, "v0.19.1"
    )
    changed = {}
    for i, name in enumerate(names):
        if i % 10 == 1:  # upstream: the release has the patched line
            changed[f"vllm/{name}.py"] = BODY.replace("line 11\n", "line 11 patched\n")
        elif i % 10 == 2:  # a change two lines above: conflicts, merges cleanly
            changed[f"vllm/{name}.py"] = BODY.replace("line 9\n", "line nine\n")
    gitrepos.commit(clone, changed, "v0.20.0")
    patches = root / "patches"
    patches.mkdir()
    for name in names:
        add_patch(
            patches, name, diff=gitrepos.line_diff(name), targets=[f"vllm/{name}.py"], vllm=">=0.19"
        )
    builds = root / "builds"
    builds.mkdir()
    definition = builds / "0.19.1.toml"
    definition.write_text(gitrepos.definition_text("0.19.1", names))
    return clone, patches, definition


def run(clone: Path, patches: Path, definition: Path, cache: Path) -> tuple[float, float, str]:
    words = ["--registry", str(patches), "bump", str(definition), "--to", "0.20.0"]
    words += ["--source", f"git:{clone}", "--format", "json"]
    return run_patchset(words, {"PATCHSET_CACHE_DIR": str(cache)})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--patches", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="patchset-bench-bump-") as tmp:
        clone, patches, definition = project(Path(tmp), args.patches)
        cache = Path(tmp) / "cache"
        first, _, out = run(clone, patches, definition, cache)
        warm = [run(clone, patches, definition, cache) for _ in range(args.repeat)]
        env = {"PATCHSET_CACHE_DIR": str(cache)}
        floor = statistics.median(run_patchset(["--version"], env)[0] for _ in range(args.repeat))
    report = json.loads(out)
    actions = [s["action"] for s in report["steps"]]
    print(f"runs: {', '.join(f'{t:.3f}' for t, _, _ in warm)} s")
    print(
        f"patches={args.patches} kept={actions.count('kept')} dropped={actions.count('dropped')}"
        f" refreshed={actions.count('refreshed')} first_s={first:.3f}"
        f" warm_s={statistics.median(t for t, _, _ in warm):.3f}"
        f" warm_cpu_s={statistics.median(c for _, c, _ in warm):.3f} floor_s={floor:.3f}"
    )


if __name__ == "__main__":
    main()
