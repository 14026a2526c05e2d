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
from pathlib import PurePosixPath
from typing import Literal

from packaging.version import Version

from patchset.engine.evaluate import Evaluation, evaluate
from patchset.errors import ExitCode
from patchset.kernel.hunks import HunkResult
from patchset.registry import Patch, Probe, Registry, Variant
from patchset.release_check.similarity import ratio
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

Verdict = Literal["needed", "upstream", "conflict", "partial", "missing-target"]
VERDICTS: tuple[Verdict, ...] = ("needed", "upstream", "conflict", "partial", "missing-target")
SCHEMA = "patchset.check/1"
ATTENTION: frozenset[str] = frozenset({"conflict", "partial", "missing-target"})
Explain = Literal["none", "in-range", "all"]  # which failures get the nearest-lines text
HunkState = Literal["applies", "present", "conflicts", "both"]


@dataclass(frozen=True)
class Signals:
    forward: str  # applies | already-applied | conflict | partial | target-missing
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
                {"vllm": r.version, "origin": r.origin, "sha256": r.digest} for r in self.releases
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
    explain: Explain = "in-range",
) -> CheckReport:
    """Check the selected patches against each release; the package index by default.

    `explain` says which failing hunks get the "nearest lines" text, the costly part of a
    failure: none, those of releases in the patch's range (what a table shows), or all.
    """
    if source is None:
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415 - keep imports light

        source = IndexSource()
    selected = registry.select(patches)
    ordered = sorted(dict.fromkeys(versions), key=_version_key)
    infos: list[ReleaseInfo] = []
    results: list[CheckResult] = []
    for version in ordered:
        with source.open(version) as tree:
            infos.append(tree.info)
            release = tree.info.version if tree.info.version != "unknown" else version
            results.extend(check_tree(selected, tree, release, max_fuzz=max_fuzz, explain=explain))
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
    explain: Explain = "in-range",
) -> list[CheckResult]:
    cache: dict[str, bytes | None] = {}

    def read(rel: str) -> bytes | None:
        if rel not in cache:
            cache[rel] = tree.read(rel)
        return cache[rel]

    return [
        _one(patch, tree, version, read, max_fuzz=max_fuzz, explain=explain) for patch in patches
    ]


def _pick_variant(
    patch: Patch, version: str, read: Callable[[str], bytes | None], max_fuzz: int, nearest: bool
) -> tuple[Variant, Evaluation]:
    """The variant meant for the release; failing that, the first that fits it."""

    def run(variant: Variant) -> Evaluation:
        return evaluate(patch, variant, read, max_fuzz=max_fuzz, nearest=nearest, ratio=ratio)

    meant = patch.variant_for(version) if _is_version(version) else None
    if meant is not None:
        return meant, run(meant)
    tried = [(v, run(v)) for v in reversed(patch.variants)]
    for variant, ev in tried:
        if ev.state in ("applies", "already-applied"):
            return variant, ev
    return tried[0]


@dataclass(frozen=True)
class _Decision:
    verdict: Verdict
    detail: str
    disagreement: str | None = None
    moved: tuple[str, ...] = ()
    signals: Signals | None = None  # when the decision revised a signal (a moved probe file)


def _one(
    patch: Patch,
    tree: ReleaseTree,
    version: str,
    read: Callable[[str], bytes | None],
    *,
    max_fuzz: int,
    explain: Explain,
) -> CheckResult:
    in_range = patch.in_range(version) if _is_version(version) else False
    nearest = explain == "all" or (explain == "in-range" and in_range)
    variant, ev = _pick_variant(patch, version, read, max_fuzz, nearest)
    probe = patch.upstream.probe
    probe_hit = probe.matches(_text(read(probe.file))) if probe else None
    reverse = ev.reverse_applies if patch.kind == "diff" else None
    signals = Signals(ev.state, reverse, probe_hit, _ancestry(tree, patch.upstream.commit))
    states = hunk_states(ev)
    if ev.state == "target-missing":
        detail, moved, signals, disagreement = _missing(
            tree, variant, ev, probe=probe, read=read, signals=signals
        )
        decision = _Decision("missing-target", detail, disagreement, moved)
    else:
        decision = _decide(patch, ev, signals, states)
    return CheckResult(
        vllm=version,
        patch=patch.id,
        revision=patch.revision,
        variant=variant.name,
        verdict=decision.verdict,
        in_range=in_range,
        detail=decision.detail,
        signals=signals,
        disagreement=decision.disagreement,
        locations=_locations(ev, states),
        moved_to=decision.moved,
        failing_hunks=tuple((f, h.index) for f, h in ev.hunks if h.status == "failed"),
        failing_sites=tuple(
            s.site for s in ev.sites if s.status not in ("applies", "already-applied")
        ),
        missing=ev.missing,
    )


def _decide(
    patch: Patch, ev: Evaluation, signals: Signals, states: list[tuple[str, HunkResult, HunkState]]
) -> _Decision:
    """The decision table of docs/check.md, first matching row wins."""
    probe_hit, ancestry = signals.probe, signals.ancestry
    if ev.state == "already-applied":
        detail = "the release already holds this change (the reverse applies)"
        if patch.kind == "runtime":
            detail = "every site is already in place (its markers are present)"
        if probe_hit is False:
            return _Decision("upstream", detail, "the upstream probe does not match")
        if ancestry is False:
            return _Decision("upstream", detail, "the release's git history lacks upstream.commit")
        return _Decision("upstream", detail)
    if ancestry:
        detail = f"the release's git history holds the upstream fix {patch.upstream.commit}"
        if ev.state == "applies":
            why = "the patch still applies, yet git history holds the upstream fix"
            return _Decision("upstream", detail, why)
        return _Decision("upstream", detail)
    if probe_hit:
        probe = patch.upstream.probe
        assert probe is not None
        detail = f"the declared upstream fix is present: {probe.describe()}"
        if ev.state == "applies":
            why = "the patch still applies, yet the probe says upstream fixed it"
            return _Decision("upstream", detail, why)
        if ev.state == "partial":
            return _Decision("upstream", detail, "some of the patch's sites still match")
        return _Decision("upstream", detail)
    if ev.state == "applies" and ev.reverse_applies:
        return _both_ways(ev, probe_hit)
    if ev.state == "applies":
        shifted = list(ev.warnings)
        detail = "applies cleanly" if not shifted else "applies with " + "; ".join(shifted)
        return _Decision("needed", detail)
    if ev.state == "partial":
        return _Decision("partial", "; ".join(ev.failures))
    if any(state == "present" for _, _, state in states):
        return _Decision("partial", _partial_detail(states))
    return _Decision("conflict", "; ".join(ev.failures))


def _both_ways(ev: Evaluation, probe_hit: bool | None) -> _Decision:
    """Forward and reverse both fit (the probe and git history, if any, said nothing): the
    direction whose hunks sit nearer the diff's own line numbers wins; a tie is `needed`."""
    forward = sum(abs(h.offset) for _, h in ev.hunks)
    backward = sum(abs(h.offset) for _, h in ev.reverse)
    where = (
        f"forward and reverse both fit (forward {forward} lines from the diff's line numbers,"
        f" reverse {backward})"
    )
    no_probe = "" if probe_hit is None else "; the upstream probe does not match"
    if backward < forward:
        return _Decision(
            "upstream",
            "the release already holds this change: the reverse fits nearer the diff's lines",
            f"{where}: chose upstream, the nearer{no_probe}",
        )
    why = "the nearer" if forward < backward else "a tie, and applying is the safe side"
    return _Decision(
        "needed", "applies; " + "; ".join(ev.warnings), f"{where}: chose needed, {why}{no_probe}"
    )


def hunk_states(ev: Evaluation) -> list[tuple[str, HunkResult, HunkState]]:
    """Each hunk of a diff patch: applies, already present, conflicts, or fits both ways."""
    back = {(f, h.index): h for f, h in ev.reverse}
    out: list[tuple[str, HunkResult, HunkState]] = []
    for f, h in ev.hunks:
        r = back.get((f, h.index))
        fwd, rev = h.status != "failed", r is not None and r.status != "failed"
        state: HunkState = (
            "both" if fwd and rev else "applies" if fwd else "present" if rev else "conflicts"
        )
        out.append((f, h, state))
    return out


def _reverse_hit(ev: Evaluation, file: str, index: int) -> HunkResult | None:
    return next((h for f, h in ev.reverse if f == file and h.index == index), None)


def _partial_detail(states: list[tuple[str, HunkResult, HunkState]]) -> str:
    words = {"present": "already present", "applies": "still applies", "conflicts": "conflicts"}
    parts: dict[str, list[str]] = {}
    for f, h, state in states:
        parts.setdefault(words.get(state, "fits both ways"), []).append(f"{f}#{h.index}")
    return "; ".join(f"{what}: {', '.join(hunks)}" for what, hunks in parts.items())


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
    contains = getattr(tree, "contains_commit", None)
    if commit is None or contains is None:
        return None
    answer = contains(commit)
    return answer if isinstance(answer, bool) else None


def _locations(ev: Evaluation, states: list[tuple[str, HunkResult, HunkState]]) -> tuple[str, ...]:
    """Per hunk (its state and line) or per site: where it fits or why it does not."""
    out: list[str] = []
    for f, h, state in states:
        r = _reverse_hit(ev, f, h.index)
        back = r.line if r is not None else None
        if state == "applies":
            shift = f" (offset {h.offset:+d} lines)" if h.offset else ""
            fuzz = f" with fuzz {h.fuzz}" if h.fuzz else ""
            out.append(f"{f}: hunk #{h.index} applies at line {h.line}{fuzz}{shift}")
        elif state == "present":
            out.append(f"{f}: hunk #{h.index} already present at line {back}")
        elif state == "both":
            out.append(
                f"{f}: hunk #{h.index} fits both ways: applies at line {h.line},"
                f" already present at line {back}"
            )
        else:
            out.append(f"{f}: {h.describe().replace(' does not match', ' conflicts, no match')}")
    out += [s.describe() for s in ev.sites]
    return tuple(out)


def _text(data: bytes | None) -> str | None:
    return None if data is None else data.decode("utf-8", errors="replace")


def moved_files(tree: ReleaseTree, variant: Variant, missing: tuple[str, ...]) -> dict[str, str]:
    """Where each missing file went: the release file (of the same name, else in a folder of
    the same name) holding most of the lines the variant expects, at least half of them.

    Missing files with no such home are left out. `check` reports these as `moved_to`;
    `refresh` carries a patch onto them.
    """
    found: dict[str, str] = {}
    paths = [p for p in tree.paths() if p.endswith(".py")]  # only when a target is missing
    for rel in missing:
        expected = {
            line.strip()
            for d in variant.diffs
            if d.path == rel
            for h in d.hunks
            for line in h.old
            if len(line.strip()) > 8
        } | {
            line.strip()
            for s in variant.sites
            if s.file == rel
            for line in s.anchor_lines
            if line.strip()
        }
        if not expected:
            continue
        pure = PurePosixPath(rel)
        suffix = f"/{pure.name}"
        same_name = [p for p in paths if p.endswith(suffix)]
        best = _best_home(tree, same_name, expected)
        if best is None:  # renamed inside a folder that kept its name
            infix = f"/{pure.parent.name}/"
            folder = [p for p in paths if infix in p and p.rsplit("/", 1)[0].endswith(infix[:-1])]
            best = _best_home(tree, folder, expected)
        if best is not None:
            found[rel] = best
    return found


def _best_home(tree: ReleaseTree, candidates: list[str], expected: set[str]) -> str | None:
    best: tuple[float, str] | None = None
    needles = [line.encode() for line in expected]
    for path in candidates:
        data = tree.read(path)
        if data is None:
            continue
        score = sum(needle in data for needle in needles) / len(needles)
        if score >= 0.5 and (best is None or score > best[0]):
            best = (score, path)
    return None if best is None else best[1]


def _is_version(text: str) -> bool:
    try:
        Version(text)
    except ValueError:
        return False
    return True


def _version_key(text: str) -> tuple[int, Version | str]:
    return (0, Version(text)) if _is_version(text) else (1, text)


def suggest_ranges(
    results: Iterable[CheckResult], versions: list[str]
) -> dict[str, tuple[str, ...]]:
    """Per patch, the checked releases where it is `needed`, as PEP 440 ranges.

    Each run of consecutive checked releases becomes ``>=first,<next-checked`` (or
    ``>=first`` when it reaches the newest release checked).
    """
    ordered = sorted({v for v in versions if _is_version(v)}, key=Version)
    needed: dict[str, set[str]] = {}
    for r in results:
        needed.setdefault(r.patch, set())
        if r.verdict == "needed":
            needed[r.patch].add(r.vllm)
    ranges: dict[str, tuple[str, ...]] = {}
    for patch_id, hits in needed.items():
        runs: list[str] = []
        start: str | None = None
        for i, version in enumerate(ordered):
            if version in hits and start is None:
                start = version
            if start is not None and (version not in hits):
                runs.append(f">={start},<{version}")
                start = None
            elif start is not None and i == len(ordered) - 1:
                runs.append(f">={start}")
        ranges[patch_id] = tuple(runs)
    return ranges
