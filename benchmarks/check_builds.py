"""Benchmark: `patchset check --builds` of 10 definitions x 50 patches, warm.

A real git clone with 10 releases (v0.20.0 ... v0.29.0, each changing a few files), a
registry of 50 diff patches and 10 definitions, one pinned to each release, every one listing
all 50 patches; `--since` the first release, so each definition is also shown on the releases
after its pin. The releases come from a local simple-API index on 127.0.0.1
(tests/helpers/fake_index.py: wheels read by range, as from a real index) or, with `--source git`,
from the clone. The first run fills the cache and the memo; the timed runs are warm, each a
fresh process (`floor_s`: `patchset --version` on the same machine), and the library call in
one process (`inprocess_s`).

Last line: source=<index|git> definitions=<n> patches=<n> results=<n> first_s=<s> warm_s=<median s>
warm_cpu_s=<s> floor_s=<s> inprocess_s=<s>. Target: warm under 1 s.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchset.registry import load_registry  # noqa: E402
from patchset.registry.builds import load_definitions  # noqa: E402
from patchset.release_check.pins import check_builds  # noqa: E402
from patchset.sources.git import GitSource  # noqa: E402
from patchset.sources.package_index import IndexSource  # noqa: E402
from tests.helpers import gitrepos  # noqa: E402
from tests.helpers.fake_index import FakeIndex, FakeServer  # noqa: E402
from tests.helpers.synthetic import BODY, add_patch  # noqa: E402
from tests.helpers.timing import run_patchset  # noqa: E402


def project(
    root: Path, definitions: int, count: int, index: FakeIndex
) -> tuple[Path, Path, Path, list[str]]:
    """The clone (and the same releases on `index`), the registry, the definitions."""
    clone = root / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    names = [f"patch-{n:03d}" for n in range(count)]
    files = {f"vllm/{n}.py": BODY for n in names}
    releases = [f"0.{20 + i}.0" for i in range(definitions)]
    for i, version in enumerate(releases):
        changed = {"vllm/__init__.py": f"# {version}\n"} if i else {"vllm/__init__.py": "", **files}
        if i:  # a few files move on at each release (the tail grows: the patches still fit)
            changed.update(
                {f"vllm/{names[(i * 5 + k) % count]}.py": BODY + f"# {version}\n" for k in range(5)}
            )
        gitrepos.commit(clone, changed, f"v{version}")
        files.update(changed)
        index.add_release(version, {rel: text.encode() for rel, text in files.items()})
    patches = root / "patches"
    patches.mkdir()
    for name in names:
        diff = gitrepos.line_diff(name)
        add_patch(patches, name, diff=diff, targets=[f"vllm/{name}.py"], vllm=">=0.20")
    builds = root / "builds"
    builds.mkdir()
    for version in releases:
        (builds / f"{version}.toml").write_text(gitrepos.definition_text(version, names))
    return clone, patches, builds, releases


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--definitions", type=int, default=10)
    parser.add_argument("--patches", type=int, default=50)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument(
        "--source",
        choices=("index", "git"),
        default="index",
        help="the releases from a local index (warm: its cache) or from the git clone",
    )
    args = parser.parse_args()
    server = FakeServer()
    with tempfile.TemporaryDirectory(prefix="patchset-bench-builds-") as tmp:
        index = FakeIndex(server)
        clone, patches, builds, releases = project(Path(tmp), args.definitions, args.patches, index)
        spec = (
            ["--index-url", index.index_url]
            if args.source == "index"
            else ["--source", f"git:{clone}"]
        )
        cache = Path(tmp) / "cache"
        words = ["--registry", str(patches), "--builds", str(builds), "check", "--builds"]
        words += ["--since", releases[0], *spec, "--format", "json"]
        env = {"PATCHSET_CACHE_DIR": str(cache)}
        first = run_patchset(words, env)[0]
        warm = [run_patchset(words, env)[:2] for _ in range(args.repeat)]
        floor = statistics.median(run_patchset(["--version"], env)[0] for _ in range(args.repeat))
        os.environ["PATCHSET_CACHE_DIR"] = str(cache)
        registry, definitions = load_registry(patches), load_definitions(builds)
        inside = []
        for _ in range(args.repeat):
            start = time.perf_counter()
            source = IndexSource(index.index_url) if args.source == "index" else GitSource(clone)
            report = check_builds(registry, definitions, source=source, versions=releases)
            inside.append(time.perf_counter() - start)
    server.close()
    print(f"runs: {', '.join(f'{t:.3f}' for t, _ in warm)} s")
    print(
        f"source={args.source} definitions={args.definitions} patches={args.patches}"
        f" results={len(report.rows)}"
        f" first_s={first:.3f} warm_s={statistics.median(t for t, _ in warm):.3f}"
        f" warm_cpu_s={statistics.median(c for _, c in warm):.3f} floor_s={floor:.3f}"
        f" inprocess_s={statistics.median(inside):.3f}"
    )


if __name__ == "__main__":
    main()
