"""This machine's NVIDIA GPUs as `nvidia-smi` lists them: the one reader of it.

The host (`patchset.adapters.gpu`, for `apply`'s compute-capability scope) and the image
entrypoint (at container start) both call `query`. A real nvidia-smi answers
``--query-gpu=name,compute_cap,driver_version --format=csv,noheader`` with one
``NVIDIA GeForce RTX 5090, 12.0, 575.57.08`` line per GPU: the one call gives the GPUs and
the NVIDIA driver's version (for `[applies] driver`; a line without it, or ``[N/A]``, leaves
the driver unknown). No nvidia-smi, or one that fails or answers nothing usable, means no
GPU, and `Found.how` says why.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from typing import NamedTuple

from .capability import Capability, parse_capability

TIMEOUT = 15.0  # seconds: a driver that hangs must not hang the start
QUERY = "--query-gpu=name,compute_cap,driver_version"
_VERSION = re.compile(r"\d+(\.\d+)*")


@dataclass(frozen=True)
class Gpu:
    name: str
    capability: Capability


@dataclass(frozen=True)
class Found:
    gpus: tuple[Gpu, ...]
    how: str  # for a start-up line: "12.0 (NVIDIA GeForce RTX 5090)", "none (no nvidia-smi)"
    driver: str | None = None  # the NVIDIA driver's version ("575.57.08"), None: not said


def query(*, timeout: float = TIMEOUT) -> Found:
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return Found((), "none (no nvidia-smi)")
    try:
        done = subprocess.run(
            [smi, QUERY, "--format=csv,noheader"],
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
    drivers: list[str] = []
    for line in done.stdout.splitlines():
        if not line.strip():
            continue
        try:
            gpu, driver = _gpu_line(line)
        except ValueError:
            return Found((), f"none (nvidia-smi said {line.strip()!r})")
        gpus.append(gpu)
        drivers += [driver] if driver else []
    how = ", ".join(f"{g.capability[0]}.{g.capability[1]} ({g.name})" for g in gpus)
    driver = drivers[0] if gpus and len(drivers) == len(gpus) else None  # one driver serves all
    return Found(tuple(gpus), how or "none (nvidia-smi lists no GPU)", driver)


def _gpu_line(line: str) -> tuple[Gpu, str | None]:
    """One answer line, ``name, compute_cap, driver_version`` (a name may hold commas); a line
    of ``name, compute_cap`` only, or a driver that is no version (``[N/A]``), leaves the
    driver None. ValueError when the line gives no compute capability."""
    name, cap, driver = ([""] * 3 + [part.strip() for part in line.rsplit(",", 2)])[-3:]
    try:
        capability = parse_capability(cap)
    except ValueError:
        name, _, cap = line.rpartition(",")
        return Gpu(name.strip(), parse_capability(cap)), None
    return Gpu(name, capability), driver if _VERSION.fullmatch(driver) else None


class Detected(NamedTuple):
    capabilities: list[Capability]
    names: list[str] | None  # None: not known
    how: str
    driver: str | None  # the NVIDIA driver's version; None: not known


def detect(forced: str | None) -> Detected:
    """Every GPU's compute capability, their names, how they were found, and the driver's
    version: `forced` (PATCHSET_COMPUTE_CAPABILITY: "none" or empty for no GPU; ValueError for
    what is no compute capability) wins, names and driver then unknown; else `query`."""
    if forced is not None:
        if forced.strip().lower() in ("", "none"):
            return Detected([], [], "none (PATCHSET_COMPUTE_CAPABILITY)", None)
        try:
            found = parse_capability(forced)
        except ValueError:
            raise ValueError(
                f"PATCHSET_COMPUTE_CAPABILITY={forced!r} is not a compute capability (e.g. 12.0)"
            ) from None
        return Detected([found], None, f"{found[0]}.{found[1]} (PATCHSET_COMPUTE_CAPABILITY)", None)
    smi = query()
    return Detected(
        [g.capability for g in smi.gpus], [g.name for g in smi.gpus], smi.how, smi.driver
    )


__all__ = ["QUERY", "TIMEOUT", "Detected", "Found", "Gpu", "detect", "query"]
