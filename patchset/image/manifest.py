"""What a patched image says about itself: the in-image manifest and the OCI labels."""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from patchset.image.plugins import impl_module
from patchset.registry import Patch, Variant

LABEL_PREFIX = "io.patchset"
MANIFEST_PATH = "/opt/patchset/manifest.json"
RUNTIME_DIR = "/opt/patchset"


def patch_entry(
    patch: Patch,
    variant: Variant,
    verdict: str,
    files: dict[str, tuple[str, str]],
) -> dict[str, Any]:
    """One patch in the manifest: identity, provenance, and what the runtime needs."""
    entry: dict[str, Any] = {
        "id": patch.id,
        "revision": patch.revision,
        "kind": patch.kind,
        "apply": patch.apply,
        "variant": variant.name,
        "payload_sha256": variant.sha256,
        "upstream": patch.upstream.pr,
        "upstream_state": patch.upstream.state,
        "verdict": verdict,
        "compute_capability": (
            str(patch.hardware.compute_capability) if patch.hardware.compute_capability else None
        ),
        "files": {rel: {"before": b, "after": a} for rel, (b, a) in files.items()},
        # applied before this one; the entrypoint skips it when one of them is not in
        "requires": list(patch.requires),
    }
    if patch.kind == "python":
        entry["touches"] = list(patch.touches)
        entry["module"] = impl_module(patch.id)
    elif patch.kind == "diff":
        entry["hunks"] = {d.path: [h.to_json() for h in d.hunks] for d in variant.diffs}
        # files the diff creates 755 (git's `new file mode 100755`): written executable
        entry["executable"] = [d.path for d in variant.diffs if d.added and d.executable]
    else:
        entry["sites"] = [asdict(site) for site in variant.sites]
    return entry


def labels(
    *,
    base: str,
    base_digest: str,
    version: str,
    created: str,
    revision: str,
    source: str,
    registry: str,
    entries: list[dict[str, Any]],
) -> dict[str, str]:
    """OCI annotations plus patchset's own, all strings as labels must be."""
    summary = [
        {
            key: e[key]
            for key in (
                "id",
                "revision",
                "apply",
                "variant",
                "payload_sha256",
                "upstream",
                "verdict",
            )
        }
        for e in entries
    ]
    return {
        "org.opencontainers.image.base.name": base,
        "org.opencontainers.image.base.digest": base_digest,
        "org.opencontainers.image.version": version,
        "org.opencontainers.image.created": created,
        "org.opencontainers.image.revision": revision,
        "org.opencontainers.image.source": source,
        f"{LABEL_PREFIX}.registry.digest": registry,
        f"{LABEL_PREFIX}.patches": json.dumps(summary, separators=(",", ":")),
        f"{LABEL_PREFIX}.manifest": MANIFEST_PATH,
    }
