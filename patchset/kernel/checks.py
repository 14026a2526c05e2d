"""A patch's ``[[verify]]`` checks: what the image's entrypoint runs after the start applied
the patch, before vllm serve (`patchset.kernel.manifest` carries them into the image; the
registry's `Verify` is one). A module of its own so that reading a registry, which holds
them, does not build the manifest's types.

Standard library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Check:
    """One `[[verify]]` of a patch: `attribute` (module:attribute exists), `file` holding
    `contains` (relative to the folder holding vllm/), or `expr` over the imported `module`."""

    attribute: str | None = None
    file: str | None = None
    contains: str | None = None
    module: str | None = None
    expr: str | None = None
    timeout: float = 10.0

    def describe(self) -> str:
        if self.attribute:
            return f"{self.attribute} exists"
        if self.file:
            return f"{self.file} contains {self.contains!r}"
        return f"{self.module}: {self.expr}"


__all__ = ["Check"]
