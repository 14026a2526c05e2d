"""`patchset inspect`: what a patched image says about itself, read without starting it.

Its labels (the OCI ones and patchset's, with the patch list) from the engine's image record,
and the runtime's manifest copied out of the image's file system at `MANIFEST_PATH`.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass

from patchset.adapters import dockerengine
from patchset.errors import BuildError
from patchset.image.manifest import LABEL_PREFIX, MANIFEST_PATH
from patchset.kernel.manifest import Manifest, ManifestError

PATCHES_LABEL = f"{LABEL_PREFIX}.patches"


@dataclass(frozen=True)
class Inspection:
    """One image: its id, tags, labels and runtime manifest (None: not a patchset image)."""

    image: str
    tags: tuple[str, ...]
    labels: Mapping[str, str]
    manifest: Manifest | None

    @property
    def patches(self) -> list[Labelled]:
        """The patches the patches label lists (id, revision, apply, upstream, sha256)."""
        raw = self.labels.get(PATCHES_LABEL, "[]")
        try:
            found = json.loads(raw)
        except (ValueError, RecursionError):
            raise BuildError(f"{self.image}: the label {PATCHES_LABEL} is not JSON") from None
        if not isinstance(found, list):
            raise BuildError(f"{self.image}: the label {PATCHES_LABEL} is not a list")
        return [_labelled(self.image, item) for item in found]

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
            "manifest": None if self.manifest is None else self.manifest.to_json(),
        }


@dataclass(frozen=True)
class Labelled:
    """One patch as the image's patches label lists it."""

    id: str
    revision: int
    apply: str
    upstream: str | None
    payload_sha256: str


def _labelled(image: str, item: object) -> Labelled:
    got = item if isinstance(item, dict) else {}
    patch_id, revision, apply = got.get("id"), got.get("revision"), got.get("apply")
    sha, upstream = got.get("payload_sha256"), got.get("upstream")
    if (
        isinstance(patch_id, str)
        and isinstance(revision, int)
        and isinstance(apply, str)
        and isinstance(sha, str)
        and (upstream is None or isinstance(upstream, str))
    ):
        return Labelled(patch_id, revision, apply, upstream, sha)
    raise BuildError(f"{image}: the label {PATCHES_LABEL} holds an entry that is no patch")


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
        manifest = Manifest.loads(raw) if raw else None
    except ManifestError as exc:
        raise BuildError(f"{ref}: {MANIFEST_PATH}: {exc}") from None
    return Inspection(info.id, tuple(info.tags), dict(info.labels), manifest)
