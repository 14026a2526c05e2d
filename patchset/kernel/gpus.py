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


def detect(forced: str | None) -> tuple[list[Capability], list[str] | None, str]:
    """Every GPU's compute capability, their names (None: not known), and how they were
    found: `forced` (PATCHSET_COMPUTE_CAPABILITY: "none" or empty for no GPU; ValueError for
    what is no compute capability) wins, else `query`."""
    if forced is not None:
        if forced.strip().lower() in ("", "none"):
            return [], [], "none (PATCHSET_COMPUTE_CAPABILITY)"
        try:
            found = parse_capability(forced)
        except ValueError:
            raise ValueError(
                f"PATCHSET_COMPUTE_CAPABILITY={forced!r} is not a compute capability (e.g. 12.0)"
            ) from None
        return [found], None, f"{found[0]}.{found[1]} (PATCHSET_COMPUTE_CAPABILITY)"
    smi = query()
    return [g.capability for g in smi.gpus], [g.name for g in smi.gpus], smi.how


__all__ = ["TIMEOUT", "Found", "Gpu", "detect", "query"]
