"""This machine's NVIDIA GPU, as `nvidia-smi` reports it: its compute capability.

No nvidia-smi, or one that fails or answers nothing, means no GPU (None): a patch scoped to
some compute capability is then left out of an unqualified apply, never applied blindly.
nvidia-smi is read by `patchset.kernel.gpus`, which the image entrypoint uses too.
"""

from __future__ import annotations

import logging

from patchset.errors import UsageError
from patchset.kernel import capability, gpus

LOG = logging.getLogger(__name__)


def parse_capability(text: str) -> tuple[int, int]:
    """`"12.0"` or `"8"` as (major, minor); UsageError otherwise."""
    try:
        return capability.parse_capability(text)
    except ValueError as exc:
        raise UsageError(f"--compute-capability: {exc}") from None


def compute_capability() -> tuple[int, int] | None:
    """The first GPU's compute capability from nvidia-smi; None when there is none."""
    found = gpus.query()
    if not found.gpus:
        LOG.info("GPU: %s", found.how)
        return None
    return found.gpus[0].capability
