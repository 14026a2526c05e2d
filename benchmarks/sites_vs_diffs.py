"""Benchmark: one edit, two forms. One-line edits of real vLLM files (a unique line of code
ending in `)` gets a trailing comment, in files chosen at random with a fixed seed), each
written as a diff (three lines of context, as `add --from-tree` makes it) and as anchored
runtime sites (`add --from-tree --runtime`: `authoring.runtime_sites.sites_from_edit`), then
checked on every later release in the cache (files the cache lacks are fetched).

Last line: edits=<n> pairs=<n> diff_needed=<n> sites_needed=<n> diff_only=<n> (diff_only:
pairs where the diff fits and the sites do not: a release that added a second copy of the
one line the site is anchored on makes it ambiguous, where the diff's context still tells
the two apart).
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path

from packaging.version import Version

from patchset.authoring.runtime_sites import sites_from_edit, sites_toml
from patchset.authoring.tree import unified
from patchset.registry import load_registry
from patchset.release_check import check
from patchset.sources.package_index import IndexSource

PATCH_TOML = """\
id = "{id}"
title = "benchmark {id}"
description = "a one-line edit"
kind = "{kind}"
revision = 1
vllm = ">=0.1"
apply = "build"
targets = ["{target}"]
origin = "benchmarks/sites_vs_diffs.py"
credit = ["benchmark"]

[upstream]
state = "unsubmitted"
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--base", default="0.27.0", help="the release the edits are made in")
    parser.add_argument("--files", type=int, default=40, help="files to edit (some have no line)")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    source = IndexSource()
    later = [
        v for v in IndexSource(offline=True).cached_versions() if Version(v) >= Version(args.base)
    ]
    rng = random.Random(args.seed)  # noqa: S311 - a reproducible sample, not a secret
    with tempfile.TemporaryDirectory() as tmp:
        registry = Path(tmp) / "patches"
        registry.mkdir()
        made = 0
        with source.open(args.base) as tree:
            paths = sorted(p for p in tree.paths() if p.endswith(".py") and "/model_executor/" in p)
            for rel in rng.sample(paths, min(args.files, len(paths))):
                data = tree.read(rel)
                if not data:
                    continue
                text = data.decode()
                lines = text.split("\n")
                lines_seen = {line: lines.count(line) for line in set(lines)}
                candidates = [
                    i
                    for i, line in enumerate(lines)
                    if line.strip().endswith(")")
                    and not line.strip().startswith("#")
                    and lines_seen[line] == 1
                ]
                if not candidates:
                    continue
                at = rng.choice(candidates)
                edited = "\n".join(
                    line + "  # patched" if i == at else line for i, line in enumerate(lines)
                )
                made += 1
                for prefix, kind in (("d", "diff"), ("s", "runtime")):
                    folder = registry / f"{prefix}{made:03}"
                    folder.mkdir()
                    toml = PATCH_TOML.format(id=folder.name, kind=kind, target=rel)
                    (folder / "patch.toml").write_text(toml)
                    if kind == "diff":
                        (folder / "patch.diff").write_text(unified(rel, text, edited))
                    else:
                        sites = sites_from_edit(text, edited, rel)
                        (folder / "sites.toml").write_text(sites_toml(folder.name, sites))
        report = check(load_registry(registry), later, source=source, use_memo=False)
    verdict = {(r.vllm, r.patch): r.verdict for r in report.results if r.vllm != args.base}
    pairs = [(v, p[1:]) for v, p in verdict if p.startswith("d")]
    diff_needed = sum(verdict[(v, "d" + n)] == "needed" for v, n in pairs)
    sites_needed = sum(verdict[(v, "s" + n)] == "needed" for v, n in pairs)
    diff_only = sum(
        verdict[(v, "d" + n)] == "needed" and verdict[(v, "s" + n)] != "needed" for v, n in pairs
    )
    print(f"releases {later[1] if len(later) > 1 else '-'}..{later[-1]} after {args.base}")
    print(
        f"edits={made} pairs={len(pairs)} diff_needed={diff_needed}"
        f" sites_needed={sites_needed} diff_only={diff_only}"
    )


if __name__ == "__main__":
    main()
