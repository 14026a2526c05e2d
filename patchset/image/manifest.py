"""What a patched image says about itself: the in-image manifest and the OCI labels.

The manifest's types, and its reading and writing, are the kernel's
(`patchset.kernel.manifest`, shipped into the image so the entrypoint reads the same types);
this module makes a patch's entry from the registry and the labels from the entries.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from urllib.parse import urlsplit, urlunsplit

from patchset.image.plugins import impl_module
from patchset.kernel.manifest import Check, FileDigests, PatchEntry
from patchset.registry import Patch, Variant

LABEL_PREFIX = "io.patchset"
MANIFEST_PATH = "/opt/patchset/manifest.json"
RUNTIME_DIR = "/opt/patchset"
LABEL_KEYS = ("id", "revision", "apply", "variant", "payload_sha256", "upstream", "verdict")


def patch_entry(
    patch: Patch,
    variant: Variant,
    verdict: str,
    files: dict[str, tuple[str, str]],
    *,
    switches: Mapping[str, bool] | None = None,
) -> PatchEntry:
    """One patch in the manifest: identity, provenance, and what the runtime needs.
    `switches` (a definition's) turn a patch's switch on or off by default in the image."""
    switch = patch.switch
    default = True if switch is None else (switches or {}).get(switch.env, switch.default)
    python, diff = patch.kind == "python", patch.kind == "diff"
    scope = patch.hardware.compute_capability
    return PatchEntry(
        id=patch.id,
        revision=patch.revision,
        kind=patch.kind,
        apply=patch.apply,
        variant=variant.name,
        payload_sha256=variant.sha256,
        verdict=verdict,
        files={rel: FileDigests(b, a) for rel, (b, a) in files.items()},
        upstream=patch.upstream.pr,
        upstream_state=patch.upstream.state,
        compute_capability=str(scope) if scope else None,
        requires=tuple(patch.requires),
        touches=tuple(patch.touches) if python else (),
        module=impl_module(patch.id) if python else None,
        hunks={d.path: tuple(d.hunks) for d in variant.diffs} if diff else {},
        # files the diff creates 755 (git's `new file mode 100755`): written executable
        executable=tuple(d.path for d in variant.diffs if d.added and d.executable) if diff else (),
        sites=tuple(variant.sites) if patch.kind == "runtime" else (),
        switch=None if switch is None else switch.env,
        switch_default=default,
        applies=patch.applies,
        policy=patch.failure.policy,
        policy_env=patch.failure.env,
        requires_modules=patch.modules_needed(),
        verify=tuple(
            Check(v.attribute, v.file, v.contains, v.module, v.expr, v.timeout)
            for v in patch.verify
        ),
    )


def labels(
    *,
    base: str,
    base_digest: str,
    version: str,
    created: str,
    revision: str,
    source: str | None,
    registry: str,
    entries: list[PatchEntry] | tuple[PatchEntry, ...],
) -> dict[str, str]:
    """OCI annotations plus patchset's own, all strings as labels must be. `source` (where
    the registry's repository lives) is left out when there is none to point at."""
    summary = [e.summary(LABEL_KEYS) for e in entries]
    found = {
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
    return {key: value for key, value in found.items() if value is not None}


def public_source(source: str | None) -> str | None:
    """Where the registry's repository can be found, fit for a pushed image's label: a remote
    URL with any credentials taken out; None for what is no URL (a folder of the build
    machine, which would leak its path and point nowhere)."""
    if not source:
        return None
    if "://" not in source:  # scp-like `git@host:owner/repo.git` names a host; a path does not
        user_host, colon, path = source.partition(":")
        if colon and "/" not in user_host and path and not source.startswith("/"):
            return source  # scp-like syntax holds no password
        return None
    parts = urlsplit(source)
    if parts.scheme == "file" or not parts.hostname:
        return None
    host = parts.hostname + (f":{parts.port}" if parts.port else "")
    return urlunsplit((parts.scheme, host, parts.path, "", ""))
