"""This machine's NVIDIA GPU, as `nvidia-smi` reports it: its compute capability.

No nvidia-smi, or one that fails or answers nothing, means no GPU (None): a patch scoped to
some compute capability is then left out of an unqualified apply, never applied blindly.
"""

from __future__ import annotations

import logging
import re
import shutil
import subprocess

from patchset.errors import UsageError

LOG = logging.getLogger(__name__)
_CAPABILITY = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*$")


def parse_capability(text: str) -> tuple[int, int]:
    """`"12.0"` or `"8"` as (major, minor); UsageError otherwise."""
    match = _CAPABILITY.match(text)
    if match is None:
        raise UsageError(f"{text!r} is not a compute capability (major.minor, e.g. 12.0)")
    return int(match[1]), int(match[2] or 0)


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
        if _CAPABILITY.match(word):
            return parse_capability(word)
    return None
