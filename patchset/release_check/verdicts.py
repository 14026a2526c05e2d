"""The release check: for every (release, patch), one verdict from the released code itself.

Signals, each independent of the others:
- forward: the engine's dry run of the patch (applies, at an offset, partial, conflict);
- reverse: the diff's reverse fits, i.e. the release already holds the very change;
- probe: the patch's declared upstream probe matches the release's file.
The verdict is derived from them in a fixed order, and a disagreement is reported beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Literal, get_args

from patchset.engine.evaluate import Evaluation, State, evaluate
from patchset.engine.order import on_top_of_required
from patchset.errors import ExitCode, UsageError
from patchset.registry import Patch, Probe, Registry, Variant, ranges
from patchset.release_check.moves import moved_files
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

Verdict = Literal["needed", "upstream", "conflict", "partial", "missing-target"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
SCHEMA = "patchset.check/1"
ATTENTION: frozenset[Verdict] = frozenset({"conflict", "partial", "missing-target"})


@dataclass(frozen=True)
class Signals:
    forward: State  # the engine's dry run
    reverse: bool | None  # diff patches only
    probe: bool | None  # None when the patch declares no probe
    ancestry: bool | None = None  # git sources: the release's history holds upstream.commit

    def to_dict(self) -> dict[str, object]:
        return {
            "forward": self.forward,
            "reverse": self.reverse,
            "probe": self.probe,
            "ancestry": self.ancestry,
        }


@dataclass(frozen=True)
class CheckResult:
    vllm: str
    patch: str
    revision: int
    variant: str
    verdict: Verdict
    in_range: bool
    detail: str
    signals: Signals
    disagreement: str | None = None
    locations: tuple[str, ...] = ()  # per hunk or site: where it fits or why it does not
    moved_to: tuple[str, ...] = ()
    shifted: bool = False  # needed, but it fits only at an offset or with fuzz
    # what did not fit, for pointing at the payload (e.g. a `line=` of a GitHub annotation)
    failing_hunks: tuple[tuple[str, int], ...] = ()  # (target file, hunk number from 1)
    failing_sites: tuple[str, ...] = ()  # runtime site names
    missing: tuple[str, ...] = ()  # target files not in the release

    @property
    def needs_attention(self) -> bool:
        return self.in_range and self.verdict in ATTENTION

    def to_dict(self) -> dict[str, object]:
        return {
            "vllm": self.vllm,
            "patch": self.patch,
            "revision": self.revision,
            "variant": self.variant,
            "verdict": self.verdict,
            "in_range": self.in_range,
            "detail": self.detail,
            "signals": self.signals.to_dict(),
            "disagreement": self.disagreement,
            "locations": list(self.locations),
            "moved_to": list(self.moved_to),
        }


@dataclass(frozen=True)
class CheckReport:
    registry: str
    releases: tuple[ReleaseInfo, ...]
    results: tuple[CheckResult, ...]
    suggested: dict[str, tuple[str, ...]] = field(default_factory=dict)

    @property
    def exit_code(self) -> int:
        if any(r.needs_attention for r in self.results):
            return ExitCode.ATTENTION
        return ExitCode.OK

    def result(self, version: str, patch_id: str) -> CheckResult:
        for r in self.results:
            if r.vllm == version and r.patch == patch_id:
                return r
        raise KeyError((version, patch_id))

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": SCHEMA,
            "registry": self.registry,
            "releases": [
                {
                    "vllm": r.version,
                    "origin": r.origin,
                    "sha256": r.digest,
                    "artifact": dict(r.details) if r.details is not None else None,
                }
                for r in self.releases
            ],
            "results": [r.to_dict() for r in self.results],
            "suggested_ranges": {k: list(v) for k, v in self.suggested.items()},
            "exit_code": self.exit_code,
        }


def check(
    registry: Registry,
    versions: Iterable[str],
    *,
    source: ReleaseSource | None = None,
    patches: list[str] | tuple[str, ...] | None = None,
    max_fuzz: int = 0,
    on_release: Callable[[str], None] | None = None,
) -> CheckReport:
    """Check the selected patches against each release; the package index by default."""
    if max_fuzz < 0:
        raise UsageError(f"--fuzz {max_fuzz}: give 0 or more context lines to drop")
    if source is None:
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415 - keep imports light

        source = IndexSource()
    selected = registry.select(patches)
    ordered = sorted(dict.fromkeys(versions), key=ranges.version_key)
    infos: list[ReleaseInfo] = []
    results: list[CheckResult] = []
    for version in ordered:
        with source.open(version) as tree:
            release = tree.info.version if tree.info.version != "unknown" else version
            results.extend(
                check_tree(selected, tree, release, max_fuzz=max_fuzz, registry=registry)
            )
            infos.append(tree.info)  # after the reads: an index tree lists what it checked
        if on_release is not None:
            on_release(version)
    return CheckReport(
        registry=registry.digest,
        releases=tuple(infos),
        results=tuple(results),
        suggested=suggest_ranges(results, [i.version for i in infos]),
    )


def check_tree(
    patches: Iterable[Patch],
    tree: ReleaseTree,
    version: str,
    *,
    max_fuzz: int = 0,
    registry: Registry | None = None,
) -> list[CheckResult]:
    """Each patch on `tree`; one that `requires` others (in `registry`) on top of them."""
    cache: dict[str, bytes | None] = {}
    by_id = {p.id: p for p in registry.patches} if registry else {}

    def read(rel: str) -> bytes | None:
        if rel not in cache:
            cache[rel] = tree.read(rel)
        return cache[rel]

    def read_for(patch: Patch) -> Callable[[str], bytes | None]:
        if not patch.requires or not by_id:
            return read
        version_known = version if ranges.is_version(version) else None
        return on_top_of_required(patch, by_id, read, version_known, max_fuzz=max_fuzz)

    return [_one(patch, tree, version, read_for(patch), max_fuzz) for patch in patches]


def _pick_variant(
    patch: Patch, version: str, read: Callable[[str], bytes | None], max_fuzz: int
) -> tuple[Variant, Evaluation]:
    """The variant meant for the release; failing that, the first that fits it."""
    meant = patch.variant_for(version) if ranges.is_version(version) else None
    if meant is not None:
        return meant, evaluate(patch, meant, read, max_fuzz=max_fuzz)
    tried = [(v, evaluate(patch, v, read, max_fuzz=max_fuzz)) for v in reversed(patch.variants)]
    for variant, ev in tried:
        if ev.state in ("applies", "already-applied"):
            return variant, ev
    return tried[0]


def _python_detail(patch: Patch) -> str | None:
    """A python patch is not applied to files: what `needed` rests on is its names."""
    if patch.kind != "python":
        return None
    return "every name it touches is there: " + ", ".join(patch.touches)


def _one(
    patch: Patch,
    tree: ReleaseTree,
    version: str,
    read: Callable[[str], bytes | None],
    max_fuzz: int,
) -> CheckResult:
    variant, ev = _pick_variant(patch, version, read, max_fuzz)
    probe = patch.upstream.probe
    probe_hit = probe.matches(_text(read(probe.file))) if probe else None
    reverse = ev.reverse_applies if patch.kind == "diff" else None
    ancestry = _ancestry(tree, patch.upstream.commit)
    signals = Signals(ev.state, reverse, probe_hit, ancestry)
    in_range = patch.in_range(version) if ranges.is_version(version) else False
    locations = _locations(ev)
    verdict: Verdict
    disagreement = None
    moved: tuple[str, ...] = ()
    shifted = False
    if ev.state == "missing-target":
        verdict = "missing-target"
        detail, moved, signals, disagreement = _missing(
            tree, variant, ev, probe=probe, read=read, signals=signals
        )
    elif ev.state == "already-applied":
        verdict = "upstream"
        detail = "the release already holds this change (the reverse applies)"
        if patch.kind == "runtime":
            detail = "every site is already in place (its markers are present)"
            if any(site.status == "upstream" for site in ev.sites):
                detail = "every site is in place or its own probe finds the upstream fix"
        if probe_hit is False:
            disagreement = "the upstream probe does not match"
        elif ancestry is False:
            disagreement = "the release's git history lacks upstream.commit"
    elif ancestry:
        verdict = "upstream"
        detail = f"the release's git history holds the upstream fix {patch.upstream.commit}"
        if ev.state == "applies":
            disagreement = "the patch still applies, yet git history holds the upstream fix"
    elif probe_hit:
        verdict = "upstream"
        assert probe is not None
        detail = f"the declared upstream fix is present: {probe.describe()}"
        if ev.state == "applies":
            disagreement = "the patch still applies, yet the probe says upstream fixed it"
        elif ev.state == "partial":
            disagreement = "some of the patch's sites still match"
    elif ev.state == "applies":
        verdict = "needed"
        shifted = bool(ev.warnings)
        detail = "applies with " + "; ".join(ev.warnings) if shifted else "applies cleanly"
        detail = _python_detail(patch) or detail + _skipped(ev)
    elif ev.state == "partial":
        verdict = "partial"
        detail = "; ".join(ev.failures)
    else:
        verdict = "conflict"
        detail = "; ".join(ev.failures)
    return CheckResult(
        vllm=version,
        patch=patch.id,
        revision=patch.revision,
        variant=variant.name,
        verdict=verdict,
        in_range=in_range,
        detail=detail,
        signals=signals,
        disagreement=disagreement,
        locations=locations,
        moved_to=moved,
        shifted=shifted,
        failing_hunks=tuple((f, h.index) for f, h in ev.hunks if h.status == "failed"),
        failing_sites=tuple(
            s.site for s in ev.sites if s.status not in ("applies", "already-applied")
        ),
        missing=ev.missing,
    )


def _skipped(ev: Evaluation) -> str:
    """How many optional sites were left out, for the detail ("" when none were)."""
    n = ev.skipped_optional
    return f" ({n} optional site(s) skipped: no anchor matches)" if n else ""


def _missing(
    tree: ReleaseTree,
    variant: Variant,
    ev: Evaluation,
    *,
    probe: Probe | None,
    read: Callable[[str], bytes | None],
    signals: Signals,
) -> tuple[str, tuple[str, ...], Signals, str | None]:
    """A missing target: where it went, and whether the upstream fix is in the moved file."""
    moves = moved_files(tree, variant, ev.missing)
    moved = tuple(moves.values())
    where = f"; moved to {', '.join(moved)}?" if moved else ""
    detail = f"{', '.join(ev.missing)} not in this release{where}"
    disagreement = None
    if probe is not None and probe.file in moves:
        # The probe names the old path too: look for the upstream fix where the file went.
        hit = probe.matches(_text(read(moves[probe.file])))
        signals = Signals(signals.forward, signals.reverse, hit, signals.ancestry)
        if hit:
            disagreement = (
                f"the upstream probe matches in the moved file {moves[probe.file]}:"
                " the fix looks upstream there"
            )
    elif signals.probe:
        disagreement = f"the upstream probe matches ({probe.describe() if probe else ''})"
    return detail, moved, signals, disagreement


def _ancestry(tree: ReleaseTree, commit: str | None) -> bool | None:
    """The git signal: only trees from a clone can answer (GitTree.contains_commit)."""
    return None if commit is None else tree.contains_commit(commit)


def _locations(ev: Evaluation) -> tuple[str, ...]:
    hunks = ev.reverse if ev.state == "already-applied" and ev.reverse else ev.hunks
    out = [f"{f}: {h.describe()}" for f, h in hunks]
    out += [s.describe() for s in ev.sites]
    return tuple(out)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def suggest_ranges(
    results: Iterable[CheckResult], versions: list[str]
) -> dict[str, tuple[str, ...]]:
    """Per patch, where it is `needed`, as PEP 440 ranges that close only on evidence.

    A range starts at a release where the patch is `needed` and closes (``<X``) only at a
    later release X whose verdict is `upstream` (the reverse applies, the probe matches, git
    history holds the fix). A `conflict`, `partial` or `missing-target` release leaves it
    open (``>=first``): nothing says the fix is upstream there, so the patch stays in range
    and a CI check keeps failing on it until it is refreshed, or its range closed by hand.
    """
    needed: dict[str, set[str]] = {}
    upstream: dict[str, set[str]] = {}
    for r in results:
        needed.setdefault(r.patch, set())
        upstream.setdefault(r.patch, set())
        if r.verdict == "needed":
            needed[r.patch].add(r.vllm)
        elif r.verdict == "upstream":
            upstream[r.patch].add(r.vllm)
    return {
        patch_id: ranges.runs(hits, versions, closing=upstream[patch_id])
        for patch_id, hits in needed.items()
    }
