"""This machine's NVIDIA GPU, as `nvidia-smi` reports it: its compute capability.

No nvidia-smi, or one that fails or answers nothing, means no GPU (None): a patch scoped to
some compute capability is then left out of an unqualified apply, never applied blindly.
"""

from __future__ import annotations

import logging
import shutil
import subprocess

from patchset.errors import UsageError
from patchset.kernel import capability

LOG = logging.getLogger(__name__)


def parse_capability(text: str) -> tuple[int, int]:
    """`"12.0"` or `"8"` as (major, minor); UsageError otherwise."""
    try:
        return capability.parse_capability(text)
    except ValueError as exc:
        raise UsageError(f"--compute-capability: {exc}") from None


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability from nvidia-smi; None when there is none."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=15,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError) as exc:
        LOG.info("nvidia-smi failed (%s): no GPU assumed", exc)
        return None
    for word in out:
        try:
            return capability.parse_capability(word)
        except ValueError:
            continue
    return None
