"""Benchmark: the stock-image route, `patchset runtime export` of builds/0.20.0.toml, on the
stand-in of the stock 0.20.0 image (real vLLM sources at the official layout; no image can be
pulled here, and no GPU is present).

- export_s: the export (release files from the cached sdist), median of 3;
- bundle_bytes: every file of the bundle (runtime, kernel, manifest, payloads, compose, script);
- stock_start_ms: the entrypoint from interpreter start to the exec of vllm serve, run from the
  bundle mounted read-only, applying tolist-cudagraph to the container's vLLM (release check,
  plan, compile check, write, read-back), median of 7 runs inside one container, the file put
  back between runs.

Last line: export_s=<s> bundle_bytes=<n> stock_start_ms=<ms>
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchset.image.definition import load_definition  # noqa: E402
from patchset.image.export import export_runtime  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from tests.infra.standin import build_standin_base  # noqa: E402

TIMER = """
import importlib.util, json, os, pathlib, shutil, subprocess, sys, time
root = pathlib.Path(next(iter(importlib.util.find_spec("vllm").submodule_search_locations)))
target = root / "v1/attention/backends/turboquant_attn.py"
shutil.copy(target, "/tmp/pristine")
times = []
for _ in range(7):
    start = time.perf_counter()
    subprocess.run([sys.executable, "/opt/patchset/entrypoint.py"], check=True,
                   env={**os.environ, "PATCHSET_EXEC": "true"}, stdout=subprocess.DEVNULL)
    times.append((time.perf_counter() - start) * 1000)
    shutil.copy("/tmp/pristine", target)
print(json.dumps(times))
"""


def main() -> None:
    client = docker.from_env()
    image = build_standin_base(client, "0.20.0")
    definition = load_definition(REPO / "builds" / "0.20.0.toml")
    registry = load_registry(REPO / "patches")
    with tempfile.TemporaryDirectory() as tmp:
        bundle = Path(tmp) / "bundle"
        took = []
        for _ in range(3):
            start = time.perf_counter()
            export_runtime(definition, registry, bundle)
            took.append(time.perf_counter() - start)
        size = sum(p.stat().st_size for p in bundle.rglob("*") if p.is_file())
        out = client.containers.run(
            image,
            ["-c", TIMER],
            entrypoint=["python3"],
            volumes={str(bundle): {"bind": "/opt/patchset", "mode": "ro"}},
            network_mode="none",
            remove=True,
        )
    times = json.loads(out.decode().strip().splitlines()[-1])
    print(f"stock start runs (ms): {', '.join(f'{t:.0f}' for t in times)}")
    print(
        f"export_s={statistics.median(took):.2f} bundle_bytes={size}"
        f" stock_start_ms={statistics.median(times):.0f}"
    )


if __name__ == "__main__":
    main()
