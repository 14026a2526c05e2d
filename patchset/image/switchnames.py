"""The switch names a bundle (and a built image, in /opt/patchset) carries for the start to
check (``switches.json``, `patchset.kernel.switchnames`): the registry's switch prefixes, the
aliases its switches declare, and its other switch names with why each patch is not in the
bundle."""

from __future__ import annotations

from collections.abc import Sequence

from patchset.kernel.manifest import PatchEntry
from patchset.kernel.switchnames import FILE, Names, prefixes
from patchset.registry import Patch, Registry
from patchset.registry.builds import BuildDefinition


def why_not_in(patch: Patch, definition: BuildDefinition, at: str = "export") -> str:
    """Why a patch of the registry is not in `definition`'s bundle (`at`: export) or image
    (build), in a few words."""
    if patch.id not in definition.patches:
        return f"not listed in {definition.file.name}"
    if patch.lifecycle.retired(definition.vllm):
        return f"retired for vLLM {definition.vllm}"
    if patch.variant_for(definition.vllm) is None:
        return f"no payload for vLLM {definition.vllm}"
    return f"left out at {at}: its [applies] is false here, or the release holds its fix"


def bundle_names(
    registry: Registry,
    definition: BuildDefinition,
    entries: Sequence[PatchEntry],
    at: str = "export",
) -> Names:
    """What ``switches.json`` holds for a bundle (`at`: export) or an image (build) of
    `entries`."""
    inside = {e.id for e in entries}
    every: list[str] = []
    aliases: dict[str, str] = {}
    others: dict[str, tuple[str, str]] = {}
    for patch in registry.patches:
        if patch.switch is None:
            continue
        every += patch.switch.names
        aliases.update(dict.fromkeys(patch.switch.aliases, patch.switch.env))
        if patch.id not in inside:
            others[patch.switch.env] = (patch.id, why_not_in(patch, definition, at))
    return Names(tuple(prefixes(every)), aliases, others)


__all__ = ["FILE", "bundle_names", "why_not_in"]
