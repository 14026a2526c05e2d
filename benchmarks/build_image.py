"""Benchmark: the patched image of builds/0.20.0.toml (a startup patch) and 0.19.1 (a build
patch) on the stand-in bases (real vLLM sources at the official layout; no image can be
pulled here).

- added_bytes: what the patched 0.19.1 image adds over its base;
- rebuild_s: a rebuild after a one-line edit of the TMA patch, base and layer cache warm;
- entrypoint_ms: the wrapper's time from interpreter start to the exec of vllm serve,
  applying the 0.20.0 startup patch (median of 7 runs, inside the container).

Last line: added_bytes=<n> rebuild_s=<s> entrypoint_ms=<ms>
"""

from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import docker

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from patchset.adapters import dockerengine  # noqa: E402
from patchset.image.build import build  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from patchset.registry.builds import load_definition  # noqa: E402
from tests.infra.standin import build_standin_base  # noqa: E402

TIMER = """
import json, os, subprocess, sys, time
times = []
for _ in range(7):
    start = time.perf_counter()
    subprocess.run([sys.executable, "/opt/patchset/entrypoint.py"], check=True,
                   env={**os.environ, "PATCHSET_EXEC": "true"}, stdout=subprocess.DEVNULL)
    times.append((time.perf_counter() - start) * 1000)
    # put the pristine file back so every run applies the patch again
    subprocess.run(["cp", "/tmp/pristine", os.environ["TARGET"]], check=True)
print(json.dumps(times))
"""


def main() -> None:
    client = docker.from_env()
    build_standin_base(client, "0.19.1")
    build_standin_base(client, "0.20.0")
    engine = dockerengine.connect()
    with tempfile.TemporaryDirectory() as tmp:
        patches = Path(tmp) / "patches"
        shutil.copytree(REPO / "patches", patches)
        d191 = load_definition(REPO / "builds" / "0.19.1.toml")
        first = build(d191, load_registry(patches), engine=engine)
        added = first.added_bytes
        diff = patches / "fla-tma-sm12x" / "patch.diff"
        diff.write_text(
            diff.read_text().replace("# but its descriptor", "# but its TMA descriptor")
        )
        start = time.perf_counter()
        build(d191, load_registry(patches), engine=engine)
        rebuild = time.perf_counter() - start
    d200 = load_definition(REPO / "builds" / "0.20.0.toml")
    image = build(d200, load_registry(REPO / "patches"), engine=engine)
    manifest = json.loads(
        engine.copy_out(image.image_id, ["/opt/patchset/manifest.json"])[
            "/opt/patchset/manifest.json"
        ]
        or b"{}"
    )
    target = f"{manifest['vllm_root']}/{manifest['patches'][0]['sites'][0]['file']}"
    code = f"import shutil; shutil.copy({target!r}, '/tmp/pristine')\n" + TIMER
    out = client.containers.run(
        image.image_id,
        ["-c", code],
        entrypoint=["python3"],
        environment={"TARGET": target},
        network_mode="none",
        remove=True,
    )
    times = json.loads(out.decode().strip().splitlines()[-1])
    entry = statistics.median(times)
    print(f"0.19.1 image {first.image_id[:19]} tags {', '.join(first.tags)}")
    print(f"entrypoint runs (ms): {', '.join(f'{t:.0f}' for t in times)}")
    print(f"added_bytes={added} rebuild_s={rebuild:.2f} entrypoint_ms={entry:.0f}")


if __name__ == "__main__":
    main()
