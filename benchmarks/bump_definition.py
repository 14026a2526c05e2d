"""Benchmark: `patchset bump` of a 50-patch build definition onto a new release, warm.

A real git clone with two releases (v0.19.1, v0.20.0) and a registry of N diff patches,
each on its own file: most still needed on 0.20.0, a tenth upstream there (dropped), a tenth
conflicting where the three-way merge is clean (refreshed as a dry run), a tenth whose fix
landed in 0.20.0 with upstream code of its own around it (neither direction of the diff fits:
dropped, not merged into a deletion), a tenth of runtime patches whose best new anchor holds
a line 0.20.0 added (a refresh would delete it: refused, hand work), and a tenth carrying an
upstream probe whose string is in both releases while the patch is still needed (a marker
that is no evidence: hand work, a person decides). The first
run fills the cache (the check's memo); the timed runs are warm, each a fresh process as a
scheduled job runs it (`floor_s`: `patchset --version` on the same machine).

Then, untimed: the bump with --write in a copy, each variant it wrote read back, counting
those that remove a line of 0.20.0 the original patch never removed (its `-` lines against
the original's); and `validate --probes` on the copy's registry.

Lines: patches=<n> kept=<n> dropped=<n> refreshed=<n> first_s=<s> warm_s=<median s>
warm_cpu_s=<s> floor_s=<s>; refreshed_that_delete_upstream=<n> (target 0);
probes_matching_unfixed_releases=<n> (the corpus plants patches/10 such probes, on 2 releases
each). Target: warm under 5 s for 50 patches.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.helpers import gitrepos  # noqa: E402
from tests.helpers.synthetic import BODY, add_patch  # noqa: E402
from tests.helpers.timing import run_patchset  # noqa: E402
from tests.upstream.test_bump_landed import SITES, SPEC_NEW  # noqa: E402 -- pn24 shape


def project(root: Path, count: int) -> tuple[Path, Path, Path]:
    clone = root / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    names = [f"patch-{n:03d}" for n in range(count)]
    gitrepos.commit(
        clone,
        {"vllm/__init__.py": "# the package\n", **{f"vllm/{n}.py": BODY for n in names}},
        "v0.19.1",
    )
    changed = {}
    for i, name in enumerate(names):
        if i % 10 == 1:  # upstream: the release has the patched line
            changed[f"vllm/{name}.py"] = BODY.replace("line 11\n", "line 11 patched\n")
        elif i % 10 == 2:  # a change two lines above: conflicts, merges cleanly
            changed[f"vllm/{name}.py"] = BODY.replace("line 9\n", "line nine\n")
        elif i % 10 == 5:  # the anchor's last line gone, a line of upstream's after it
            changed[f"vllm/{name}.py"] = SPEC_NEW
        elif i % 10 == 3:  # the fix landed, with upstream's own lines around it
            changed[f"vllm/{name}.py"] = BODY.replace(
                "line 10\nline 11\n", "line 10 upstream\nline 11 patched\nupstream = 1\n"
            )
    gitrepos.commit(clone, changed, "v0.20.0")
    patches = root / "patches"
    patches.mkdir()
    for i, name in enumerate(names):
        diff = gitrepos.line_diff(name)
        if i % 10 == 3:  # two telling added lines, so the landing is unmistakable
            diff = diff.replace("+line 11 patched\n", "+line 11 patched\n+upstream = 1\n")
            diff = diff.replace("@@ -9,5 +9,5 @@", "@@ -9,5 +9,6 @@")
        tail = PROBE if i % 10 == 4 else ""
        target = [f"vllm/{name}.py"]
        if i % 10 == 5:
            sites = SITES.replace("vllm/spec.py", f"vllm/{name}.py")
            add_patch(patches, name, sites=sites, targets=target, vllm=">=0.19")
            continue
        add_patch(patches, name, diff=diff, targets=target, vllm=">=0.19", tail=tail)
    builds = root / "builds"
    builds.mkdir()
    definition = builds / "0.19.1.toml"
    definition.write_text(gitrepos.definition_text("0.19.1", names))
    return clone, patches, definition


PROBE = """
[upstream.probe]
file = "vllm/__init__.py"
contains = ["# the package"]
"""


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
        deleting, probes = _evidence(Path(tmp), clone, patches, definition, cache)
    report = json.loads(out)
    actions = [s["action"] for s in report["steps"]]
    print(f"runs: {', '.join(f'{t:.3f}' for t, _, _ in warm)} s")
    print(
        f"patches={args.patches} kept={actions.count('kept')} dropped={actions.count('dropped')}"
        f" refreshed={actions.count('refreshed')} first_s={first:.3f}"
        f" warm_s={statistics.median(t for t, _, _ in warm):.3f}"
        f" warm_cpu_s={statistics.median(c for _, c, _ in warm):.3f} floor_s={floor:.3f}"
    )
    print(f"refreshed_that_delete_upstream={deleting}")
    print(f"probes_matching_unfixed_releases={probes}")


def _evidence(
    tmp: Path, clone: Path, patches: Path, definition: Path, cache: Path
) -> tuple[int, int]:
    """The bump written in a copy: how many refreshed variants remove a line the original
    did not; and how many probe strings `validate --probes` finds on unfixed releases."""
    copy = tmp / "copy"
    shutil.copytree(patches, copy / "patches")
    (copy / "builds").mkdir()
    old = copy / "builds" / definition.name
    shutil.copy(definition, old)
    env = {"PATCHSET_CACHE_DIR": str(cache)}
    words = ["--registry", str(copy / "patches"), "bump", str(old), "--to", "0.20.0", "--write"]
    run_patchset([*words, "--source", f"git:{clone}", "--format", "json"], env)
    deleting = 0
    for folder in sorted((copy / "patches").iterdir()):
        if (folder / "sites.toml").is_file():
            original = _replaced((folder / "sites.toml").read_text())
            variants = [_replaced(v.read_text()) for v in folder.glob("v0.20.0*.sites.toml")]
        else:
            original = _removed((folder / "patch.diff").read_text())
            variants = [_removed(v.read_text()) for v in folder.glob("v0.20.0*.diff")]
        deleting += sum(1 for lines in variants if lines - original)
    probes = ["--registry", str(copy / "patches"), "validate", "--probes", "--format", "json"]
    _, _, out = run_patchset([*probes, "--source", f"git:{clone}"], env)
    return deleting, int(json.loads(out)["probes_matching_unfixed_releases"])


def _replaced(sites: str) -> set[str]:
    """The lines a sites file's replace sites remove (anchor lines their text does not keep)."""
    out: set[str] = set()
    for site in tomllib.loads(sites)["site"]:
        if site["action"] == "replace":
            kept = {" ".join(t.split()) for t in site["text"].splitlines()}
            out |= {" ".join(a.split()) for a in site["anchor"].splitlines()} - kept - {""}
    return out


def _removed(diff: str) -> set[str]:
    """The lines a diff removes, whitespace folded."""
    return {
        " ".join(line[1:].split())
        for line in diff.splitlines()
        if line.startswith("-") and not line.startswith("---")
    }


if __name__ == "__main__":
    main()
