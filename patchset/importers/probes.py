"""A collection's markers weighed before they are written (issue 36).

A draft's `[upstream.probe]` string that a release holds where the draft is still needed by its
own anchors (every hunk or site applies, the reverse does not) and its change is absent is no
evidence of the upstream fix: a comment upstream has had all along, or a spelling upstream
never used (`release_check.verdicts.probe_matches_unfixed`, what `validate --probes` reads).
The import drops each such string from what it writes, one line each in its report; a probe
left with no string goes whole. Only the releases the import reads are asked (`--source`, for
club-3090 the index by default), those of each draft's range.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from patchset.errors import PatchsetError
from patchset.importers.common import Releases
from patchset.importers.model import Draft
from patchset.registry import load_patch
from patchset.registry.write import TomlData, write_patch_folder
from patchset.release_check.probes import releases_of
from patchset.release_check.verdicts import probe_matches_unfixed


def drop_unfixed_probes(drafts: list[Draft], releases: Releases) -> list[str]:
    """Drop from each draft's upstream probe the strings an unfixed release holds; one line
    per string dropped, naming the patch, the string, the file and the first such release."""
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="patchset-import-probes-") as tmp:
        for draft in drafts:
            probe = _probe(draft.meta)
            if probe is None:
                continue
            dropped = _unfixed(draft, releases, Path(tmp))
            if not dropped:
                continue
            _drop(draft.meta, probe, dropped)
            notes += [
                f"{draft.id}: dropped its upstream probe string {string!r}: it is in"
                f" {probe.get('file')} of vllm {version}, where the patch still applies and its"
                " change is absent (no evidence of the fix)"
                for string, version in dropped.items()
            ]
    return notes


def _probe(meta: TomlData) -> TomlData | None:
    upstream = meta.get("upstream")
    probe = upstream.get("probe") if isinstance(upstream, dict) else None
    return probe if isinstance(probe, dict) else None


def _unfixed(draft: Draft, releases: Releases, scratch: Path) -> dict[str, str]:
    """The probe strings of `draft` an unfixed release holds, each with the first such."""
    folder = scratch / draft.id
    write_patch_folder(folder, draft.meta, draft.payloads, durable=False)
    try:
        patch = load_patch(folder)
    except PatchsetError:
        return {}  # the import's own load says why, once landed
    found: dict[str, str] = {}
    for version in releases_of(patch, releases.versions()):
        try:
            hits = probe_matches_unfixed(patch, releases.tree(version), version)
        except PatchsetError:
            continue  # a release that cannot be read is no evidence either way
        for string in hits:
            found.setdefault(string, version)
    return found


def _drop(meta: TomlData, probe: TomlData, dropped: dict[str, str]) -> None:
    for key in ("contains", "any"):
        if isinstance(probe.get(key), list):
            kept = [s for s in probe[key] if s not in dropped]
            if kept:
                probe[key] = kept
            else:
                del probe[key]
    if f"/{probe.get('regex')}/" in dropped:
        del probe["regex"]
    if not any(key in probe for key in ("contains", "any", "regex")):
        del meta["upstream"]["probe"]
