"""A collection's markers weighed before they are written (issue 36).

A draft's `[upstream.probe]` string that a release holds where the draft is still needed by its
own anchors (every hunk or site applies, the reverse does not) and its change is absent is no
evidence of the upstream fix: a comment upstream has had all along, or a spelling upstream
never used (`release_check.verdicts.probe_matches_unfixed`, what `validate --probes` reads).
The import drops each such string found so in the release the patch was written against (its
variant's `base`, else the oldest release of its range the import reads): a string there
predates the patch, so it cannot tell the fix. One line each in its report; a probe left with
no string goes whole. A string found so only in a later release is kept, with a line: it came
with upstream code of that release, maybe the fix made another way (Genesis's drift markers
are often such lines), which the check reports there as a disagreement for a person to weigh.
Only the releases the import reads are asked (`--source`, for club-3090 the index by default),
those of each draft's range.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from patchset.errors import PatchsetError
from patchset.importers.common import Releases
from patchset.importers.model import Draft
from patchset.registry import Patch, load_patch
from patchset.registry.ranges import version_key
from patchset.registry.write import TomlData, write_patch_folder
from patchset.release_check.probes import releases_of
from patchset.release_check.verdicts import probe_matches_unfixed


def drop_unfixed_probes(drafts: list[Draft], releases: Releases) -> list[str]:
    """Drop from each draft's upstream probe the strings its base release holds unfixed; one
    line per string dropped (the patch, the string, the file, the release), and one per string
    kept that only a later unfixed release holds."""
    notes: list[str] = []
    with tempfile.TemporaryDirectory(prefix="patchset-import-probes-") as tmp:
        for draft in drafts:
            probe = _probe(draft.meta)
            if probe is None:
                continue
            dropped, later, base = _unfixed(draft, releases, Path(tmp))
            if dropped:
                _drop(draft.meta, probe, dropped)
            where = f"{probe.get('file')} of vllm"
            notes += [
                f"{draft.id}: dropped its upstream probe string {string!r}: it is in {where}"
                f" {version}, where the patch still applies and its change is absent (no"
                " evidence of the fix)"
                for string, version in dropped.items()
            ]
            notes += [
                f"{draft.id}: kept its upstream probe string {string!r}, though it is in {where}"
                f" {version} where the patch still applies and its change is absent: not so in"
                f" {base}, the release it was written against, so it may be the fix made"
                " another way (the check says so there, a disagreement)"
                for string, version in later.items()
            ]
    return notes


def _probe(meta: TomlData) -> TomlData | None:
    upstream = meta.get("upstream")
    probe = upstream.get("probe") if isinstance(upstream, dict) else None
    return probe if isinstance(probe, dict) else None


def _unfixed(
    draft: Draft, releases: Releases, scratch: Path
) -> tuple[dict[str, str], dict[str, str], str | None]:
    """The probe strings of `draft` its base release holds unfixed (each with that release),
    those only a later release holds so (each with the first such), and the base release."""
    folder = scratch / draft.id
    write_patch_folder(folder, draft.meta, draft.payloads, durable=False)
    try:
        patch = load_patch(folder)
    except PatchsetError:
        return {}, {}, None  # the import's own load says why, once landed
    versions = releases_of(patch, releases.versions())
    base = _base(patch, versions)
    dropped: dict[str, str] = {}
    later: dict[str, str] = {}
    for version in sorted(versions, key=lambda v: (v != base, version_key(v))):
        try:
            hits = probe_matches_unfixed(patch, releases.tree(version), version)
        except PatchsetError:
            continue  # a release that cannot be read is no evidence either way
        for string in hits:
            if version == base:
                dropped[string] = version
            elif string not in dropped:
                later.setdefault(string, version)
    return dropped, later, base


def _base(patch: Patch, versions: list[str]) -> str | None:
    """The release the patch was written against among `versions`: its variants' `base`
    (the oldest), else the oldest release of its range."""
    bases = [v.base for v in patch.variants if v.base is not None and v.base in versions]
    if bases:
        return min(bases, key=version_key)
    return min(versions, key=version_key) if versions else None


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
