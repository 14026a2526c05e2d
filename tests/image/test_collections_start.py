"""The real collections started (issue 35, opt in: `collections`, with PATCHSET_GENESIS_DIR and
PATCHSET_CLUB3090_DIR naming checkouts): every definition their import writes is exported and
started with its default switches on the stand-in of its release (`entrypoint.py --prove`:
the start without the exec), and every switch of one Genesis definition is flipped alone,
each a start of its own in one container, vLLM's files put back between starts. Which
patches are off never makes another fail: a flip may fail no patch but the flipped one, and
that one only for want of torch (the stand-in has none: a patch whose `requires_modules`
import it fails by itself, and is named).

When no Genesis definition the import writes exports (or it writes none: its pins are
nightly builds the package index lacks), the flips run on one this test writes for
PATCHSET_GENESIS_RELEASE (default 0.20.0, whose stand-in needs no download): every imported
Genesis patch whose range holds it, less what the planner refuses (planned again until it
refuses nothing), switches at Genesis's defaults. Each start's figures are printed (`-s`
shows them)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from patchset.errors import PatchsetError
from patchset.image.export import export_runtime
from patchset.image.plan import plan
from patchset.importers import import_collection
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources import parse_source
from tests.infra.standin import build_standin_base, for_tests

NO_TORCH = "No module named 'torch'"
pytestmark = [
    pytest.mark.collections,
    pytest.mark.docker,
    pytest.mark.network,
    pytest.mark.slow,
    pytest.mark.skipif(
        not (os.environ.get("PATCHSET_GENESIS_DIR") and os.environ.get("PATCHSET_CLUB3090_DIR")),
        reason="PATCHSET_GENESIS_DIR or PATCHSET_CLUB3090_DIR unset",
    ),
]

# In the stand-in: each environment of argv[1] (a JSON list) one `--prove` start, vLLM's files
# put back after each; one JSON line: per start, its exit code, failed lines and `on` set.
STARTS = """
import json, os, pathlib, subprocess, sys, importlib.util
manifest = json.loads(pathlib.Path("/opt/patchset/manifest.json").read_text())
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations))).parent
files = sorted({f for p in manifest["patches"] for f in p.get("files", {})})
saved = {f: (root / f).read_bytes() if (root / f).exists() else None for f in files}
out = []
for env in json.loads(pathlib.Path(sys.argv[1]).read_text()):
    done = subprocess.run([sys.executable, "/opt/patchset/entrypoint.py", "--prove"],
                          env={**os.environ, "PATCHSET_COMPUTE_CAPABILITY": "8.6", **env},
                          capture_output=True, text=True)
    lines = done.stdout.strip().splitlines()
    try:
        report = json.loads(lines[-1])
    except (IndexError, ValueError):
        report = {"results": [], "on": [], "error": done.stderr[-500:]}
    out.append({"env": env, "code": done.returncode, "on": report.get("on", []),
                "error": report.get("error"),
                "failed": [r["patch"] + ": " + r["state"] for r in report["results"]
                           if "FAILED" in r["state"]]})
    for f, data in saved.items():
        if data is None:
            (root / f).unlink(missing_ok=True)
        else:
            (root / f).write_bytes(data)
print(json.dumps(out))
"""


def _starts(client: Any, image: str, bundle: Path, envs: list[dict[str, str]]) -> list[Any]:
    (bundle.parent / "envs.json").write_text(json.dumps(envs))
    out = client.containers.run(
        image,
        ["-c", STARTS, "/opt/envs/envs.json"],
        entrypoint=["python3"],
        volumes={
            str(bundle): {"bind": "/opt/patchset", "mode": "ro"},
            str(bundle.parent): {"bind": "/opt/envs", "mode": "ro"},
        },
        network_mode="none",
        remove=True,
    )
    runs: list[Any] = json.loads(out.decode().strip().splitlines()[-1])
    return runs


def _export(definition: Path, registry: Path, image: str, folder: Path) -> list[tuple[str, bool]]:
    """The bundle of `definition` (its release read from the stand-in itself); its switches
    (variable, default), sorted."""
    export_runtime(
        load_definition(definition),
        load_registry(registry),
        folder,
        source=parse_source(f"image:{image}"),
    )
    patches = _manifest(folder)["patches"]
    return sorted((p["switch"]["env"], p["switch"]["default"]) for p in patches if p["switch"])


def _manifest(folder: Path) -> Any:
    return json.loads((folder / "manifest.json").read_text())


def _failed(run: Any) -> dict[str, str]:
    """patch id -> its FAILED state, of one start."""
    return {line.split(" r", 1)[0]: line.split(": ", 1)[1] for line in run["failed"]}


def _own_genesis_definition(project: Path, image: str, release: str) -> Path:
    """A definition of every imported Genesis patch whose range holds `release`, less what the
    planner refuses, planned again until it refuses nothing."""
    registry = load_registry(project / "patches")
    listed = [p.id for p in registry.patches if p.in_range(release)]
    path = project / "builds" / f"own-{release}.toml"
    path.parent.mkdir(parents=True, exist_ok=True)
    source = parse_source(f"image:{image}")
    for _ in range(8):
        path.write_text(
            for_tests(
                f'vllm = "{release}"\ncuda = "cu130"\nbase = "vllm/vllm-openai:v{release}-cu130"\n'
                f'repository = "r"\ntags = ["t"]\npatches = {json.dumps(listed)}\n\n'
                '[serve]\nargs = ["--model", "Qwen/Qwen3-0.6B"]\n'
            )
        )
        definition = load_definition(path)
        with source.open(release) as tree:
            planned = plan(definition, registry, lambda wanted: {r: tree.read(r) for r in wanted})
        refused = {r.patch for r in planned.refusals}
        if not refused:
            break
        listed = [p for p in listed if p not in refused]
    assert listed, "no Genesis patch left to start"
    return path


def test_every_written_definition_starts_and_every_switch_flips(
    tmp_path: Path, docker_client: Any
) -> None:
    written: list[tuple[str, Path, Path]] = []  # (collection, definition, registry)
    for name, variable, options in (
        ("genesis", "PATCHSET_GENESIS_DIR", {"sources": ["index"]}),
        ("club-3090", "PATCHSET_CLUB3090_DIR", {"run_scripts": True}),
    ):
        project = tmp_path / name
        report = import_collection(
            name, os.environ[variable], project / "patches", builds=project / "builds", **options
        )
        print(f"{name}: {len(report.builds)} definition(s) written: {report.builds}")
        written += [(name, project / "builds" / b, project / "patches") for b in report.builds]
    problems: list[str] = []
    exported: list[Path] = []  # the Genesis definitions that export
    for name, path, registry in written:
        release = load_definition(path).vllm
        image = build_standin_base(docker_client, release)
        bundle = tmp_path / "rt" / f"{name}-{path.stem}"
        try:
            _export(path, registry, image, bundle)
        except PatchsetError as exc:
            problems.append(f"{path.name}: does not export: {exc}")
            print(problems[-1])
            continue
        exported += [path] if name == "genesis" else []
        (run,) = _starts(docker_client, image, bundle, [{}])
        print(f"{name} {path.name}: exit {run['code']}, {len(run['on'])} on, {run['failed']}")
        problems += [f"{path.name}: {k}: {v}" for k, v in _failed(run).items() if NO_TORCH not in v]
        if run["code"] != 0 and not run["failed"]:
            problems.append(f"{path.name}: exit {run['code']}: {run['error']}")
    release = os.environ.get("PATCHSET_GENESIS_RELEASE", "0.20.0")
    if exported:
        chosen, release = exported[0], load_definition(exported[0]).vllm
    image = build_standin_base(docker_client, release)
    if not exported:
        chosen = _own_genesis_definition(tmp_path / "genesis", image, release)
    bundle = tmp_path / "rt" / f"flips-{chosen.stem}"
    switches = _export(chosen, tmp_path / "genesis" / "patches", image, bundle)
    envs: list[dict[str, str]] = [{}] + [{env: "0" if on else "1"} for env, on in sorted(switches)]
    runs = _starts(docker_client, image, bundle, envs)
    by_env = {p["switch"]["env"]: p["id"] for p in _manifest(bundle)["patches"] if p["switch"]}
    baseline = _failed(runs[0])
    # The stand-in has no torch: a patch whose requires_modules import it fails by itself
    # (noted); any other failure, or one only another patch's switch brings, is a problem.
    alone = {k: v for k, v in baseline.items() if NO_TORCH in v}
    problems += [f"defaults: {k}: {v}" for k, v in baseline.items() if NO_TORCH not in v]
    clean = 0
    for env, run in zip(envs[1:], runs[1:], strict=True):
        (name,) = env
        failed = {k: v for k, v in _failed(run).items() if k not in baseline}
        flipped = by_env[name]
        if flipped in failed and NO_TORCH in failed[flipped]:
            alone[flipped] = failed.pop(flipped)
        problems += [f"{env}: {k}: {v}" for k, v in failed.items()]
        if run["code"] != 0 and not run["failed"]:
            problems.append(f"{env}: exit {run['code']}: {run['error']}")
        clean += not failed
    flipped_on = sum(1 for _, on in switches if not on)
    print(
        f"flips of {chosen.name} (vLLM {release}): {len(switches)} switches"
        f" ({flipped_on} default-off switched on, {len(switches) - flipped_on} default-on off):"
        f" {clean}/{len(switches)} flips fail no other patch; {len(alone)} patch(es) fail alone"
        f" for want of torch in the stand-in: {', '.join(sorted(alone))}"
    )
    assert not problems, "\n".join(problems)
