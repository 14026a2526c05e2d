"""`validate --probes`: the upstream probes that match releases where their patch is still
needed (every hunk or site applies, none of their changes is there). Such a string is no
evidence of the upstream fix: a comment or code upstream has had all along, or a spelling
upstream never used. Each finding names the patch, the string and the release."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from packaging.version import Version

from patchset.errors import PatchsetError
from patchset.registry import Patch, Registry, ranges
from patchset.release_check.verdicts import probe_matches_unfixed
from patchset.sources.base import ReleaseSource


@dataclass(frozen=True)
class ProbeFinding:
    patch: str
    string: str
    release: str
    file: str

    def describe(self) -> str:
        return (
            f"{self.patch}: its upstream probe string {self.string!r} is in {self.file} of"
            f" vllm {self.release}, where the patch still applies and its change is absent:"
            " not evidence of the fix"
        )

    def to_dict(self) -> dict[str, str]:
        return {**self.__dict__, "problem": self.describe()}


def releases_of(patch: Patch, versions: Sequence[str], cached: Sequence[str] = ()) -> list[str]:
    """The releases of `versions` inside the patch's range (final releases, and its
    variants' bases), and any final release in `cached` (read without a download)."""
    bases = {v.base for v in patch.variants if v.base is not None}
    held = set(cached)
    return [
        v
        for v in versions
        if ranges.is_version(v)
        and (v in bases or (not Version(v).is_prerelease and (patch.in_range(v) or v in held)))
    ]


def audit_probes(
    registry: Registry,
    source: ReleaseSource,
    *,
    versions: Sequence[str] | None = None,
    patches: Sequence[str] | None = None,
    unread: list[str] | None = None,
) -> list[ProbeFinding]:
    """Every probe string of the registry's patches that matches an unfixed release: the
    releases of each patch's range, and every release already at hand (cached: a probe that
    matches before the range began is no evidence either)."""
    unread = unread if unread is not None else []  # filled: (patch, release) not read, why
    offered = list(versions) if versions is not None else source.versions()
    cached = source.cached_versions() if versions is None else []
    chosen = [registry.get(p) for p in patches] if patches else list(registry.patches)
    found: list[ProbeFinding] = []
    unread.clear()
    for patch in chosen:
        probe = patch.upstream.probe
        if probe is None:
            continue
        for version in releases_of(patch, offered, cached):
            try:
                with source.open(version) as tree:
                    hits = probe_matches_unfixed(patch, tree, version)
            except PatchsetError as exc:  # offline and not cached, a release that cannot open
                unread.append(f"{patch.id} on {version}: {exc}")
                continue
            found += [ProbeFinding(patch.id, s, version, probe.file) for s in hits]
    return found
