"""The patch registry: its model (frozen dataclasses), loader, TOML reader, diff parsing and writes.

`patchset.registry.model` holds the types, `patchset.registry.load` the loader; this package
re-exports both so callers write `from patchset.registry import Patch, load_registry`.
"""

from __future__ import annotations

from patchset.registry.load import (
    LoadProblem,
    load_patch,
    load_registry,
    patch_problems,
)
from patchset.registry.model import (
    KINDS,
    PATCH_FILE,
    STATES,
    WHENS,
    Hardware,
    Kind,
    Patch,
    Probe,
    Registry,
    Upstream,
    UpstreamState,
    Variant,
    When,
)
from patchset.registry.sites import load_sites

__all__ = [
    "KINDS",
    "PATCH_FILE",
    "STATES",
    "WHENS",
    "Hardware",
    "Kind",
    "LoadProblem",
    "Patch",
    "Probe",
    "Registry",
    "Upstream",
    "UpstreamState",
    "Variant",
    "When",
    "load_patch",
    "load_registry",
    "load_sites",
    "patch_problems",
]
