"""The patch registry: its model (frozen dataclasses), loader, TOML reader, diff parsing and writes.

`patchset.registry.model` holds the types, `patchset.registry.load` the loader; this package
re-exports both so callers write `from patchset.registry import Patch, load_registry`.
"""
# Each name is imported on first use: a module of this package is imported without the rest
# (`patchset check` answering from a kept report imports none of the loader).

from __future__ import annotations

from typing import TYPE_CHECKING

from patchset._lazy import exports

if TYPE_CHECKING:
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

_WHERE = {
    **dict.fromkeys(
        (
            "KINDS",
            "PATCH_FILE",
            "STATES",
            "WHENS",
            "Hardware",
            "Kind",
            "Patch",
            "Probe",
            "Registry",
            "Upstream",
            "UpstreamState",
            "Variant",
            "When",
        ),
        "patchset.registry.model",
    ),
    **dict.fromkeys(
        ("LoadProblem", "load_patch", "load_registry", "patch_problems"), "patchset.registry.load"
    ),
    **dict.fromkeys(("load_sites",), "patchset.registry.sites"),
}

__getattr__, __dir__ = exports(__name__, _WHERE, __all__)
