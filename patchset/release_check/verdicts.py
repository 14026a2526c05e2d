"""The decision ladder: for one (release, patch), one verdict from the released code itself.

Signals, each independent of the others:
- forward: the engine's dry run of the patch (applies, at an offset, partial, conflict);
- reverse: the diff's reverse fits, i.e. the release already holds the very change;
- probe: the patch's declared upstream probe matches the release's file.
The verdict is derived from them in a fixed order (`decide`, the table of docs/check.md), and
a disagreement is reported beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Literal

from packaging.version import Version

from patchset.engine.evaluate import Evaluation, evaluate
from patchset.kernel.hunks import HunkResult
from patchset.kernel.sites import SiteProbe, SiteResult
from patchset.registry import Patch, Probe, Variant, ranges
from patchset.release_check.landed import landed
from patchset.release_check.moves import PythonFiles, moved_homes
from patchset.release_check.report import CheckResult, Explain, Signals, Verdict
from patchset.release_check.similarity import ratio
from patchset.sources.base import ReleaseTree

HunkState = Literal["applies", "present", "moved", "conflicts", "both"]


def _pick_variant(
    patch: Patch,
    version: str,
    read: Callable[[str], bytes | None],
    max_fuzz: int,
    nearest: bool,
    *,
    served: Mapping[str, str] | None = None,
    meant: Variant | None = None,
) -> tuple[Variant, Evaluation]:
    """The variant meant for the release (`meant`, when the caller knows it); failing that,
    the first that fits it."""

    def run(variant: Variant) -> Evaluation:
        return evaluate(
            patch, variant, read, max_fuzz=max_fuzz, nearest=nearest, ratio=ratio, served=served
        )

    if meant is None and ranges.is_version(version):
        meant = patch.variant_for(version)
    if meant is not None:
        return meant, run(meant)
    tried = [(v, run(v)) for v in reversed(patch.variants)]
    for variant, ev in tried:
        if ev.state in ("applies", "already-applied"):
            return variant, ev
    return tried[0]


def _python_detail(patch: Patch) -> str | None:
    """A python patch is not applied to files: what `needed` rests on is its names."""
    if patch.kind != "python":
        return None
    return "every name it touches is there: " + ", ".join(patch.touches)


@dataclass(frozen=True)
class _Decision:
    verdict: Verdict
    detail: str
    disagreement: str | None = None
    moved: tuple[str, ...] = ()
    shifted: bool = False  # needed, but it fits only at an offset or with fuzz


def one(
    patch: Patch,
    tree: ReleaseTree,
    version: str,
    read: Callable[[str], bytes | None],
    *,
    max_fuzz: int,
    explain: Explain,
    existed: set[str] | None = None,
    before: Callable[[str], bytes | None] | None = None,
    python_files: Callable[[], PythonFiles] | None = None,
    served: Mapping[str, str] | None = None,
    in_range: bool | None = None,
    meant: Variant | None = None,
) -> CheckResult:
    """The verdict of one patch on one release. `in_range` and `meant` (the variant meant
    for the release), when the caller worked them out already, are not worked out again."""
    if in_range is None:
        in_range = patch.in_range(version) if ranges.is_version(version) else False
    nearest = explain == "all" or (explain == "in-range" and in_range)
    variant, ev = _pick_variant(patch, version, read, max_fuzz, nearest, served=served, meant=meant)
    ev, aside = _conditional_sites(
        patch, variant, ev, read, max_fuzz=max_fuzz, nearest=nearest, served=served
    )
    probe = patch.upstream.probe
    probe_hit = probe.matches(_text(read(probe.file))) if probe else None
    reverse = ev.reverse_applies if patch.kind == "diff" else None
    signals = Signals(ev.state, reverse, probe_hit, ancestry(tree, patch.upstream.commit))
    states = hunk_states(ev)
    if ev.state == "missing-target":
        detail, moved, signals, disagreement = _missing(
            tree,
            variant,
            ev,
            probe=probe,
            read=read,
            signals=signals,
            existed=existed,
            before=before,
            python_files=python_files,
        )
        decision = _Decision("missing-target", detail, disagreement, moved)
    else:
        decision = decide(patch, ev, signals, states)
        if decision.verdict == "upstream" and signals.probe and not signals.ancestry:
            decision = _weigh_probe(patch, variant, ev, decision, read=read, version=version)
    if aside:
        names = ", ".join(r.site for r in aside)
        decision = dataclasses.replace(
            decision,
            detail=f"{decision.detail}; site(s) {names} depend on the served configuration",
        )
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
        locations=_locations(ev, states) + tuple(_conditional_line(r, variant) for r in aside),
        moved_to=decision.moved,
        shifted=decision.shifted,
        failing_hunks=tuple((f, h.index) for f, h in ev.hunks if h.status == "failed"),
        failing_sites=tuple(
            s.site for s in ev.sites if s.status not in ("applies", "already-applied")
        ),
        missing=ev.missing,
    )


def _conditional_sites(
    patch: Patch,
    variant: Variant,
    ev: Evaluation,
    read: Callable[[str], bytes | None],
    *,
    max_fuzz: int,
    nearest: bool,
    served: Mapping[str, str] | None,
) -> tuple[Evaluation, tuple[SiteResult, ...]]:
    """Sites with `when` that the served configuration leaves out (`--served`), or, with it
    unknown, whose anchor does not match here, depend on the served configuration: they are
    set aside, and the other sites decide. When every site would be set aside, nothing else is
    there to decide: the sites' text does, every one of them looked at."""
    if patch.kind != "runtime" or ev.state == "missing-target":
        return ev, ()
    conditional = {s.name for s in variant.sites if s.when}
    aside = tuple(
        r for r in ev.sites if r.site in conditional and r.status in _NOT_FOUND and not r.optional
    )
    if not aside:
        return ev, ()
    if ev.state in ("applies", "already-applied"):  # only sites `--served` left out: relabelled
        return dataclasses.replace(ev, sites=tuple(r for r in ev.sites if r not in aside)), aside
    if len(aside) == len(variant.sites):
        if served is None:
            return ev, ()
        again = evaluate(patch, variant, read, max_fuzz=max_fuzz, nearest=nearest, ratio=ratio)
        return _conditional_sites(
            patch, variant, again, read, max_fuzz=max_fuzz, nearest=nearest, served=None
        )
    names = {r.site for r in aside}
    rest = dataclasses.replace(
        variant, sites=tuple(s for s in variant.sites if s.name not in names)
    )
    ev = evaluate(patch, rest, read, max_fuzz=max_fuzz, nearest=nearest, ratio=ratio, served=served)
    return ev, aside


_NOT_FOUND = ("anchor-not-found", "ambiguous", "skipped")


def _conditional_line(result: SiteResult, variant: Variant) -> str:
    site = next(s for s in variant.sites if s.name == result.site)
    why = result.detail or result.status
    return (
        f"{result.file}: site {result.site}: conditional, depends on the served configuration"
        f" (when {site.describe_when()}): {why}"
    )


def decide(
    patch: Patch, ev: Evaluation, signals: Signals, states: list[tuple[str, HunkResult, HunkState]]
) -> _Decision:
    """The decision table of docs/check.md, first matching row wins."""
    probe_hit, ancestry = signals.probe, signals.ancestry
    if ev.state == "already-applied":
        detail = "the release already holds this change (the reverse applies)"
        if patch.kind == "runtime":
            detail = "every site is already in place (its markers are present)"
            if any(site.status == "upstream" for site in ev.sites):
                detail = "every site is in place or its own probe finds the upstream fix"
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
        shifted = bool(ev.warnings)
        detail = "applies with " + "; ".join(ev.warnings) if shifted else "applies cleanly"
        return _Decision("needed", _python_detail(patch) or detail + _skipped(ev), shifted=shifted)
    if ev.state == "partial":
        return _Decision("partial", "; ".join(ev.failures))
    kinds = {state for _, _, state in states}
    if "moved" in kinds and kinds <= {"present", "moved"}:
        moved = [f"{f}#{h.index}" for f, h, state in states if state == "moved"]
        return _Decision(
            "upstream",
            "the release already holds this change; "
            + ", ".join(moved)
            + " no longer where git looks for it (code was added around it)",
            "git apply -R --check fails: an anchored hunk's change is present, but no longer at"
            " the end (or top) of the file",
        )
    if kinds & {"present", "moved"}:
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
        "needed",
        "applies; " + "; ".join(ev.warnings),
        f"{where}: chose needed, {why}{no_probe}",
        shifted=any(h.status != "exact" for _, h in ev.hunks),
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
        if state == "conflicts" and r is not None and r.elsewhere is not None:
            state = "moved"  # the change is there whole, only no longer at the file's end/top
        out.append((f, h, state))
    return out


def _reverse_hit(ev: Evaluation, file: str, index: int) -> HunkResult | None:
    return next((h for f, h in ev.reverse if f == file and h.index == index), None)


def _partial_detail(states: list[tuple[str, HunkResult, HunkState]]) -> str:
    words = {
        "present": "already present",
        "moved": "already present",
        "applies": "still applies",
        "conflicts": "conflicts",
    }
    parts: dict[str, list[str]] = {}
    for f, h, state in states:
        parts.setdefault(words.get(state, "fits both ways"), []).append(f"{f}#{h.index}")
    return "; ".join(f"{what}: {', '.join(hunks)}" for what, hunks in parts.items())


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
    existed: set[str] | None,
    before: Callable[[str], bytes | None] | None,
    python_files: Callable[[], PythonFiles] | None = None,
) -> tuple[str, tuple[str, ...], Signals, str | None]:
    """A missing target: where it went, and whether the upstream fix is in the moved file."""
    moves = moved_homes(
        tree, variant, ev.missing, existed=existed, before=before, python_files=python_files
    )
    moved = tuple(home for homes in moves.values() for home in homes)
    where = f"; moved to {', '.join(moved)}?" if moved else ""
    detail = f"{', '.join(ev.missing)} not in this release{where}"
    disagreement = None
    if probe is not None and probe.file in moves:
        # The probe names the old path too: look for the upstream fix where the file went.
        hits = [home for home in moves[probe.file] if probe.matches(_text(read(home)))]
        signals = Signals(signals.forward, signals.reverse, bool(hits), signals.ancestry)
        if hits:
            disagreement = (
                f"the upstream probe matches in the moved file {hits[0]}:"
                " the fix looks upstream there"
            )
    elif signals.probe:
        disagreement = f"the upstream probe matches ({probe.describe() if probe else ''})"
    return detail, moved, signals, disagreement


def ancestry(tree: ReleaseTree, commit: str | None) -> bool | None:
    """The git signal: only trees from a clone can answer (GitTree.contains_commit)."""
    return None if commit is None else tree.contains_commit(commit)


def _locations(ev: Evaluation, states: list[tuple[str, HunkResult, HunkState]]) -> tuple[str, ...]:
    """Per hunk (its state and line) or per site: where it fits or why it does not."""
    out: list[str] = []
    for f, h, state in states:
        r = _reverse_hit(ev, f, h.index)
        back = r.line if r is not None else None
        if state == "applies" and h.detail:  # a whole-file hunk: a deletion
            out.append(f"{f}: hunk #{h.index} applies: {h.detail}")
        elif state == "applies":
            shift = f" (offset {h.offset:+d} lines)" if h.offset else ""
            fuzz = f" with fuzz {h.fuzz}" if h.fuzz else ""
            out.append(f"{f}: hunk #{h.index} applies at line {h.line}{fuzz}{shift}")
        elif state == "present" and back is None and r is not None and r.detail:
            out.append(f"{f}: hunk #{h.index} already present: {r.detail}")
        elif state == "present":
            out.append(f"{f}: hunk #{h.index} already present at line {back}")
        elif state == "moved":
            where = r.elsewhere if r is not None else None
            out.append(
                f"{f}: hunk #{h.index} already present at line {where}, no longer at the end"
                " (or top) of the file where git looks for it"
            )
        elif state == "both":
            out.append(
                f"{f}: hunk #{h.index} fits both ways: applies at line {h.line},"
                f" already present at line {back}"
            )
        else:
            out.append(f"{f}: {h.describe().replace(' does not match', ' conflicts, no match')}")
    out += [s.describe() for s in ev.sites]
    return tuple(out)


PROBE_ALONE = "the upstream probe finds"  # a disagreement's opening: the probe alone said it


def probe_hits(probe: Probe | SiteProbe, text: str | None) -> tuple[str, ...]:
    """The strings of `probe` found in `text` (its `contains` and `any`, and its regex when
    it matches), when the probe matches; else none."""
    if text is None or not probe.matches(text):
        return ()
    found = [s for s in (*probe.contains, *probe.any) if s in text]
    if probe.regex is not None:
        found.append(f"/{probe.regex}/")
    return tuple(found)


def probe_matches_unfixed(
    patch: Patch, tree: ReleaseTree, version: str | None = None
) -> tuple[str, ...]:
    """The probe strings of `patch` that a release holds where the patch is needed by its own
    anchors and none of its change is there: every hunk or site applies forward, the reverse
    does not fit, no hunk's or site's added lines are in the file. Such a string is no
    evidence of the upstream fix (the import drops it; `validate --probes` names it)."""
    probe = patch.upstream.probe
    if probe is None:
        return ()
    hits = probe_hits(probe, _text(tree.read(probe.file)))
    if not hits:
        return ()
    version = version if version is not None else tree.info.version
    variant, ev = _pick_variant(patch, version, tree.read, 0, False)
    return hits if _unfixed(patch, variant, ev, tree.read) else ()


def is_base_release(patch: Patch, variant: Variant, version: str) -> bool:
    """Whether `version` is the release the patch was written against: the variant's
    `base`, else the lower bound of its range (the oldest release it covers)."""
    if variant.base is not None:
        return variant.base == version
    if not ranges.is_version(version):
        return False
    floors = [s.version for s in (*variant.vllm, *patch.vllm) if s.operator in (">=", "==")]
    return any(Version(f) == Version(version) for f in floors if ranges.is_version(f))


def _unfixed(
    patch: Patch, variant: Variant, ev: Evaluation, read: Callable[[str], bytes | None]
) -> bool:
    """Every hunk or site applies, the reverse does not, and no change of theirs is there."""
    if ev.state != "applies" or ev.reverse_applies or patch.kind == "python":
        return False
    files = {rel: read(rel) for rel in variant.files}
    return not any(x.present for x in landed(variant, files))


def _weigh_probe(
    patch: Patch,
    variant: Variant,
    ev: Evaluation,
    decision: _Decision,
    *,
    read: Callable[[str], bytes | None],
    version: str,
) -> _Decision:
    """An `upstream` that rests on the probe alone, while every hunk or site still applies and
    none of their changes is there: a disagreement naming the probe's strings and the sites;
    on the release the patch was written against, `needed` (a probe alone never makes it
    upstream there)."""
    probe = patch.upstream.probe
    if probe is None or not _unfixed(patch, variant, ev, read):
        return decision
    strings = ", ".join(repr(s) for s in probe_hits(probe, _text(read(probe.file))))
    where = ", ".join(
        [f"site {r.site} ({r.file}:{r.line})" for r in ev.sites]
        + [f"{f}#{h.index} (line {h.line})" for f, h in ev.hunks]
    )
    said = (
        f"{PROBE_ALONE} {strings} in {probe.file}, yet every site or hunk still"
        f" applies and none of their changes is there: {where}"
    )
    if is_base_release(patch, variant, version):
        return _Decision(
            "needed",
            f"applies ({version} is the release it was written against: its probe alone is"
            " not evidence)",
            said,
            shifted=bool(ev.warnings),
        )
    return dataclasses.replace(decision, disagreement=said)


def _text(data: bytes | None) -> str | None:
    """A probe's file as text: decoded once per bytes object (a release's file is one object
    for every patch whose probe reads it)."""
    if data is None:
        return None
    seen = _TEXTS.get(id(data))
    if seen is not None and seen[0] is data:
        return seen[1]
    text = data.decode("utf-8", errors="replace")
    if len(_TEXTS) >= _TEXTS_KEPT:
        del _TEXTS[next(iter(_TEXTS))]
    _TEXTS[id(data)] = (data, text)  # the bytes held: their id is no other object's
    return text


_TEXTS: dict[int, tuple[bytes, str]] = {}
_TEXTS_KEPT = 16
