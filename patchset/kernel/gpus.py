"""This machine's NVIDIA GPUs as `nvidia-smi` lists them: the one reader of it.

The host (`patchset.adapters.gpu`, for `apply`'s compute-capability scope) and the image
entrypoint (at container start) both call `query`. A real nvidia-smi answers
``--query-gpu=name,compute_cap --format=csv,noheader`` with one
``NVIDIA GeForce RTX 5090, 12.0`` line per GPU. No nvidia-smi, or one that fails or answers
nothing usable, means no GPU, and `Found.how` says why.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass

from .capability import Capability, parse_capability

TIMEOUT = 15.0  # seconds: a driver that hangs must not hang the start


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: Capability


@dataclass(frozen=True)
class Found:
    gpus: tuple[Gpu, ...]
    how: str  # for a start-up line: "12.0 (NVIDIA GeForce RTX 5090)", "none (no nvidia-smi)"


def query(*, timeout: float = TIMEOUT) -> Found:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Found((), "none (no nvidia-smi)")
    try:
        done = subprocess.run(
            [smi, "--query-gpu=name,compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
        )
    except (OSError, subprocess.SubprocessError) as exc:
        return Found((), f"none (nvidia-smi: {exc})")
    if done.returncode != 0:
        said = (done.stdout + done.stderr).strip().splitlines() or ["no output"]
        return Found((), f"none (nvidia-smi exit {done.returncode}: {said[0]})")
    gpus: list[Gpu] = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        name, _, cap = line.rpartition(",")
        try:
            gpus.append(Gpu(name.strip(), parse_capability(cap)))
        except ValueError:
            return Found((), f"none (nvidia-smi said {line.strip()!r})")
    how = ", ".join(f"{g.capability[0]}.{g.capability[1]} ({g.name})" for g in gpus)
    return Found(tuple(gpus), how or "none (nvidia-smi lists no GPU)")


__all__ = ["TIMEOUT", "Found", "Gpu", "query"]
