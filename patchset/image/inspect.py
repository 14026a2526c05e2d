"""`patchset inspect`: what a patched image says about itself, read without starting it.

Its labels (the OCI ones and patchset's, with the patch list) from the engine's image record,
and the runtime's manifest copied out of the image's file system at `MANIFEST_PATH`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from patchset.adapters import dockerengine
from patchset.errors import BuildError
from patchset.image.manifest import LABEL_PREFIX, MANIFEST_PATH

PATCHES_LABEL = f"{LABEL_PREFIX}.patches"


@dataclass(frozen=True)
class Inspection:
    """One image: its id, tags, labels and runtime manifest (None: not a patchset image)."""

    image: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    manifest: dict[str, Any] | None

    @property
    def patches(self) -> list[dict[str, Any]]:
        """The patch entries of the patches label (id, revision, apply, upstream, sha256)."""
        raw = self.labels.get(PATCHES_LABEL, "[]")
        try:
            found = json.loads(raw)
        except ValueError:
            raise BuildError(f"{self.image}: the label {PATCHES_LABEL} is not JSON") from None
        return [p for p in found if isinstance(p, dict)] if isinstance(found, list) else []

    @property
    def described_by(self) -> dict[str, str]:
        """The OCI and patchset labels other than the patch list, by name."""
        return {
            key: value
            for key, value in sorted(self.labels.items())
            if key.startswith(("org.opencontainers", LABEL_PREFIX)) and key != PATCHES_LABEL
        }

    def to_dict(self) -> dict[str, object]:
        return {
            "image": self.image,
            "tags": list(self.tags),
            "labels": dict(self.labels),
            "manifest": self.manifest,
        }


def inspect_image(ref: str, *, engine: dockerengine.Engine | None = None) -> Inspection:
    """Inspect the local image `ref` (DockerError when there is none)."""
    own = engine is None
    engine = engine or dockerengine.connect()
    try:
        info = engine.inspect(ref)
        copied = engine.copy_out(info.id, [MANIFEST_PATH])
    finally:
        if own:
            engine.close()
    raw = copied.get(MANIFEST_PATH)
    try:
        manifest = json.loads(raw) if raw else None
    except ValueError:
        raise BuildError(f"{ref}: {MANIFEST_PATH} is not JSON") from None
    return Inspection(info.id, tuple(info.tags), dict(info.labels), manifest)
