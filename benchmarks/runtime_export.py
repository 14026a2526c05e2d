"""Benchmark: the stock-image route, `patchset runtime export`, on the stand-in of the stock
0.20.0 image (real vLLM sources at the official layout; no image can be pulled here, and no
GPU is present). Two bundles:

- the recipe: builds/0.20.0.toml (tolist-cudagraph);
- a collection-sized one (issue 24): 300 runtime patches, each inserting a line after a line
  that occurs once in its own file of vLLM 0.20.0, as a collection of Genesis's shape would:
  264 with a switch that is off by default (30 of them switched on at start by their
  variable), 60 with an `[applies]` predicate (a compute-capability range and a served dtype,
  both true here, decided at start), 40 importing one of two support packages
  (`requires_modules`, imported at start), 20 with a `[[verify]]`.

Figures:
- export_s: the export (release files from the cached sdist), median of 3 (recipe) / 1 (300);
- bundle_bytes: every file of the bundle; for the 300-patch one also without support/;
- start_ms: the entrypoint from interpreter start to the exec of vllm serve, from the bundle
  mounted read-only (release check, switches, predicates, module imports, plan, compile check,
  write, read-back, proofs), median of 7 runs inside one container, the files put back between
  runs; PATCHSET_COMPUTE_CAPABILITY=12.0.

Targets (issue 24): a 300-patch start under 1 s, its bundle under 5 MB beyond the support
packages. Last lines: `recipe: ...` and `collection: ...` with the figures.

The switch run (issue 35; `--switches` runs only it): 300 runtime patches, 20 files changed by
5 patches each (100) and 200 files by one, every patch with a switch; one bundle started with
200 random switch combinations (seeded), each a `--prove` start in one container, the files
put back between starts. Printed: `switches: ... refusals_from_other_patches=<n>
reports_naming_on_set=<n>/200 start_ms=<median> start_ms_max=<max>`, where a refusal is a
FAILED line, and a report names its set when its `on` is exactly the patches switched on.
Target: 0 refusals, 200/200, start under 1 s.
"""

from __future__ import annotations

import json
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchset.image.export import export_runtime  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from patchset.registry.builds import load_definition  # noqa: E402
from tests.infra.standin import build_standin_base, for_tests  # noqa: E402

N = 300
OFF = 264
SWITCHED_ON = 30
PREDICATES = 60
SUPPORTED = 40
VERIFIED = 20

# Lines `import x` that occur once in a file of vLLM (as the anchor of one patch each).
FIND = r"""
import json, pathlib, re, importlib.util
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
found = []
for path in sorted(root.rglob("*.py")):
    lines = [l.strip() for l in path.read_text(errors="replace").splitlines()]
    for line in lines:
        if re.fullmatch(r"import [a-z_]+", line) and lines.count(line) == 1:
            found.append([str(path.relative_to(root.parent)), line])
            break
print(json.dumps(found))
"""
TIMER = """
import json, os, pathlib, shutil, subprocess, sys, time
manifest = json.loads(pathlib.Path("/opt/patchset/manifest.json").read_text())
import importlib.util
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent
files = sorted({f for p in manifest["patches"] for f in p["files"]})
saved = {f: (root / f).read_bytes() for f in files}
env = {**os.environ, "PATCHSET_EXEC": "true", "PATCHSET_COMPUTE_CAPABILITY": "12.0",
       **json.loads(sys.argv[1])}
times, lines = [], ""
for _ in range(7):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "/opt/patchset/entrypoint.py"], env=env,
                          capture_output=True, text=True)
    times.append((time.perf_counter() - start) * 1000)
    lines = done.stdout
    if done.returncode != 0:
        print(done.stdout[-2000:], done.stderr[-2000:], file=sys.stderr)
        sys.exit(1)
    for f, data in saved.items():
        (root / f).write_bytes(data)
ready = [l for l in lines.splitlines() if "ready in" in l]
print(json.dumps({"times": times, "states": [l for l in lines.splitlines() if " r1 " in l],
                  "ready": ready}))
"""
PATCH_TOML = """id = "{id}"
title = "benchmark patch {n}"
description = "One line inserted, as a collection's patch would."
kind = "runtime"
revision = 1
vllm = ">=0.20.0"
apply = "startup"
targets = ["{file}"]
origin = "benchmark"
credit = ["benchmark"]
{tables}
[upstream]
state = "unsubmitted"
"""


def anchors(client: Any, image: str) -> list[tuple[str, str]]:
    out = client.containers.run(
        image, ["-c", FIND], entrypoint=["python3"], network_mode="none", remove=True
    )
    return [(f, a) for f, a in json.loads(out.decode().strip().splitlines()[-1])]


def collection(root: Path, found: list[tuple[str, str]]) -> tuple[list[str], dict[str, str]]:
    """The 300-patch registry under `root`; its ids and the variables switching some on."""
    if len(found) < N:
        raise SystemExit(f"only {len(found)} files with a unique import line; need {N}")
    ids, switched = [], {}
    for n, (file, anchor) in enumerate(found[:N]):
        patch_id = f"bench-{n:03d}"
        tables, text, extra = "", f"PS_BENCH_{n} = 1", ""
        if n < OFF:
            tables += f'[switch]\nenv = "PS_BENCH_ENABLE_{n}"\ndefault = false\n'
            if n < SWITCHED_ON:
                switched[f"PS_BENCH_ENABLE_{n}"] = "1"
        if n >= N - PREDICATES:  # 24 of them off by default, 36 on: decided at start
            tables += '[applies]\nall = [{ compute_capability = ">=8.0" }, { dtype = "float16" }]\n'
        if n < SUPPORTED // 2 or n >= N - SUPPORTED // 2:  # all of them on at start
            package = "bench_support_a" if n % 2 else "bench_support_b"
            text = f"from {package} import VALUE as PS_BENCH_{n}"
            extra = f'requires_modules = ["{package}"]\n'
        if n < VERIFIED // 2 or n >= N - VERIFIED // 2:
            tables += f'\n[[verify]]\nfile = "{file}"\ncontains = "PS_BENCH_{n}"\n'
        folder = root / patch_id
        folder.mkdir(parents=True)
        (folder / "patch.toml").write_text(
            PATCH_TOML.format(id=patch_id, n=n, file=file, tables=tables)
        )
        (folder / "sites.toml").write_text(
            f'[[site]]\nname = "s"\nfile = "{file}"\naction = "insert-after"\n'
            f'marker = "patchset: {patch_id}"\nanchor = """\n{anchor}\n"""\n'
            f'text = """\n{text}\n"""\n{extra}'
        )
        ids.append(patch_id)
    for package in ("bench_support_a", "bench_support_b"):
        folder = root / "_support" / package
        (folder / "src" / package).mkdir(parents=True)
        (folder / "support.toml").write_text(
            f'name = "{package}"\nmodules = ["{package}"]\npath = "src"\n'
        )
        (folder / "src" / package / "__init__.py").write_text("VALUE = 1\n")
        # a package of some size, as Genesis's is: 200 modules of 2 KB
        for k in range(200):
            (folder / "src" / package / f"part_{k:03d}.py").write_text(f"# {'x' * 2000}\nN = {k}\n")
    return ids, switched


def start_times(client: Any, image: str, bundle: Path, env: dict[str, str]) -> dict[str, Any]:
    out = client.containers.run(
        image,
        ["-c", TIMER, json.dumps(env)],
        entrypoint=["python3"],
        volumes={str(bundle): {"bind": "/opt/patchset", "mode": "ro"}},
        network_mode="none",
        remove=True,
    )
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def size(folder: Path, *, without: str | None = None) -> int:
    return sum(
        p.stat().st_size
        for p in folder.rglob("*")
        if p.is_file() and (without is None or without not in p.relative_to(folder).parts[:1])
    )


FIND_MANY = r"""
import json, pathlib, re, importlib.util
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
found = []
for path in sorted(root.rglob("*.py")):
    lines = [l.strip() for l in path.read_text(errors="replace").splitlines()]
    unique = [l for l in dict.fromkeys(lines) if re.fullmatch(r"import [a-z_]+", l)
              and lines.count(l) == 1]
    if unique:
        found.append([str(path.relative_to(root.parent)), unique])
print(json.dumps(found))
"""
SWITCH_TIMER = """
import json, os, pathlib, subprocess, sys, time, importlib.util
manifest = json.loads(pathlib.Path("/opt/patchset/manifest.json").read_text())
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent
files = sorted({f for p in manifest["patches"] for f in p["files"]})
saved = {f: (root / f).read_bytes() for f in files}
out = []
for env in json.loads(pathlib.Path(sys.argv[1]).read_text()):
    start = time.perf_counter()
    done = subprocess.run([sys.executable, "/opt/patchset/entrypoint.py", "--prove"],
                          env={**os.environ, "PATCHSET_COMPUTE_CAPABILITY": "none", **env},
                          capture_output=True, text=True)
    ms = (time.perf_counter() - start) * 1000
    report = json.loads(done.stdout.strip().splitlines()[-1])
    out.append({"ms": ms, "code": done.returncode, "on": report["on"],
                "failed": [r["state"] for r in report["results"] if "FAILED" in r["state"]]})
    for f, data in saved.items():
        (root / f).write_bytes(data)
print(json.dumps(out))
"""
STACKED_FILES, PER_FILE, COMBINATIONS = 20, 5, 200


def switch_collection(root: Path, found: list[tuple[str, list[str]]]) -> list[str]:
    """300 switched patches: 5 on each of 20 files (distinct anchors), 1 on 200 others."""
    many = [(f, a) for f, a in found if len(a) >= PER_FILE][:STACKED_FILES]
    if len(many) < STACKED_FILES:
        raise SystemExit(f"only {len(many)} files with {PER_FILE} unique import lines")
    taken = {f for f, _ in many}
    single = [(f, a[:1]) for f, a in found if f not in taken][: N - STACKED_FILES * PER_FILE]
    sites = [(f, a) for f, anchors_of in many for a in anchors_of[:PER_FILE]]
    sites += [(f, a[0]) for f, a in single]
    ids = []
    for n, (file, anchor) in enumerate(sites):
        patch_id = f"sw-{n:03d}"
        tables = f'[switch]\nenv = "PS_SW_{n}"\ndefault = {"true" if n % 2 else "false"}\n'
        folder = root / patch_id
        folder.mkdir(parents=True)
        (folder / "patch.toml").write_text(
            PATCH_TOML.format(id=patch_id, n=n, file=file, tables=tables)
        )
        (folder / "sites.toml").write_text(
            f'[[site]]\nname = "s"\nfile = "{file}"\naction = "insert-after"\n'
            f'marker = "patchset: {patch_id}"\nanchor = """\n{anchor}\n"""\n'
            f'text = """\nPS_SW_{n} = 1\n"""\n'
        )
        ids.append(patch_id)
    return ids


def switch_run(client: Any, image: str, work: Path) -> None:
    """The switch run (issue 35): one line of figures."""
    out = client.containers.run(
        image, ["-c", FIND_MANY], entrypoint=["python3"], network_mode="none", remove=True
    )
    found = [(f, a) for f, a in json.loads(out.decode().strip().splitlines()[-1])]
    ids = switch_collection(work / "sw-patches", found)
    builds = work / "sw-builds"
    builds.mkdir(parents=True)
    text = for_tests((REPO / "builds" / "0.20.0.toml").read_text())
    (builds / "sw.toml").write_text(
        text.replace('patches = ["tolist-cudagraph"]', f"patches = {json.dumps(ids)}")
    )
    bundle = work / "sw-bundle"
    started = time.perf_counter()
    export_runtime(load_definition(builds / "sw.toml"), load_registry(work / "sw-patches"), bundle)
    export_s = time.perf_counter() - started
    rng = random.Random(35)  # noqa: S311 - a seeded choice of switches, not a secret
    combos = [
        {f"PS_SW_{n}": rng.choice("01") for n in range(len(ids))} for _ in range(COMBINATIONS)
    ]
    (work / "combos.json").write_text(json.dumps(combos))
    out = client.containers.run(
        image,
        ["-c", SWITCH_TIMER, "/opt/combos/combos.json"],
        entrypoint=["python3"],
        volumes={
            str(bundle): {"bind": "/opt/patchset", "mode": "ro"},
            str(work): {"bind": "/opt/combos", "mode": "ro"},
        },
        network_mode="none",
        remove=True,
    )
    runs = json.loads(out.decode().strip().splitlines()[-1])
    refusals = sum(len(r["failed"]) for r in runs) + sum(1 for r in runs if r["code"] != 0)
    named = sum(
        1
        for r, env in zip(runs, combos, strict=True)
        if r["on"] == sorted(f"sw-{int(k[6:]):03d}" for k, v in env.items() if v == "1")
    )
    times = [r["ms"] for r in runs]
    print(
        f"switches: patches={len(ids)} stacked_files={STACKED_FILES} per_file={PER_FILE}"
        f" combinations={len(runs)} export_s={export_s:.2f}"
        f" refusals_from_other_patches={refusals} reports_naming_on_set={named}/{len(runs)}"
        f" start_ms={statistics.median(times):.0f} start_ms_max={max(times):.0f}"
    )


def main() -> None:
    client = docker.from_env()
    image = build_standin_base(client, "0.20.0")
    if "--switches" in sys.argv[1:]:
        with tempfile.TemporaryDirectory() as tmp:
            switch_run(client, image, Path(tmp))
        return
    keep = Path(sys.argv[1]) if len(sys.argv) > 1 else None  # a folder to keep the bundles in
    with tempfile.TemporaryDirectory() as tmp:
        work = keep or Path(tmp)
        builds = work / "builds"
        builds.mkdir(parents=True)
        (builds / "0.20.0.toml").write_text(
            for_tests((REPO / "builds" / "0.20.0.toml").read_text())
        )
        definition = load_definition(builds / "0.20.0.toml")
        recipe = work / "recipe"
        took = []
        for _ in range(3):
            start = time.perf_counter()
            export_runtime(definition, load_registry(REPO / "patches"), recipe)
            took.append(time.perf_counter() - start)
        recipe_run = start_times(client, image, recipe, {})
        registry_root = work / "patches"
        ids, switched = collection(registry_root, anchors(client, image))
        text = (
            (builds / "0.20.0.toml")
            .read_text()
            .replace('patches = ["tolist-cudagraph"]', f"patches = {json.dumps(ids)}")
        )
        (builds / "300.toml").write_text(text)
        start = time.perf_counter()
        registry = load_registry(registry_root)
        load_s = time.perf_counter() - start
        big = work / "collection"
        start = time.perf_counter()
        export_runtime(load_definition(builds / "300.toml"), registry, big)
        big_export = time.perf_counter() - start
        big_run = start_times(client, image, big, switched)
        states = big_run["states"]
        counts: dict[str, int] = {}
        for line in states:
            word = line.split("): ", 1)[1].split(" ", 1)[0]
            counts[word] = counts.get(word, 0) + 1
        print(f"recipe start runs (ms): {', '.join(f'{t:.0f}' for t in recipe_run['times'])}")
        print(f"300-patch start runs (ms): {', '.join(f'{t:.0f}' for t in big_run['times'])}")
        print(f"300-patch outcomes at start: {json.dumps(counts, sort_keys=True)}")
        print(f"entrypoint's own figure: {big_run['ready']}")
        print(
            f"recipe: export_s={statistics.median(took):.2f} bundle_bytes={size(recipe)}"
            f" start_ms={statistics.median(recipe_run['times']):.0f}"
        )
        print(
            f"collection: patches={N} load_s={load_s:.2f} export_s={big_export:.2f}"
            f" bundle_bytes={size(big)} bundle_bytes_without_support={size(big, without='support')}"
            f" start_ms={statistics.median(big_run['times']):.0f}"
        )
        switch_run(client, image, work)


if __name__ == "__main__":
    main()
