"""The release check: for every (release, patch), one verdict from the released code itself.

Signals, each independent of the others:
- forward: the engine's dry run of the patch (applies, at an offset, partial, conflict);
- reverse: the diff's reverse fits, i.e. the release already holds the very change;
- probe: the patch's declared upstream probe matches the release's file.
The verdict is derived from them in a fixed order, and a disagreement is reported beside it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal, get_args

from packaging.version import Version

from patchset._gc import collector_paused
from patchset.engine.evaluate import Evaluation, State, evaluate
from patchset.engine.order import on_top_of_required
from patchset.errors import ExitCode, PatchsetError, UsageError
from patchset.kernel.hunks import HunkResult
from patchset.kernel.sites import SiteResult
from patchset.registry import Patch, Probe, Registry, Variant, ranges
from patchset.release_check.memo import Memo, file_digest
from patchset.release_check.moves import PythonFiles, moved_homes
from patchset.release_check.similarity import ratio
from patchset.sources.base import KnowsDigests, ReleaseInfo, ReleaseSource, ReleaseTree

Verdict = Literal["needed", "upstream", "conflict", "partial", "missing-target"]
VERDICTS: tuple[Verdict, ...] = get_args(Verdict)
SCHEMA = "patchset.check/1"
ATTENTION: frozenset[Verdict] = frozenset({"conflict", "partial", "missing-target"})
Explain = Literal["none", "in-range", "all"]  # which failures get the nearest-lines text
HunkState = Literal["applies", "present", "moved", "conflicts", "both"]


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

    def to_memo(self) -> dict[str, object]:
        """What the memo keeps: everything but the release and the range (given on reading)."""
        data = self.to_dict()
        del data["vllm"], data["in_range"]
        data["shifted"] = self.shifted
        data["failing_hunks"] = [list(pair) for pair in self.failing_hunks]
        data["failing_sites"] = list(self.failing_sites)
        data["missing"] = list(self.missing)
        return data

    @classmethod
    def from_memo(cls, data: dict[str, Any], *, vllm: str, in_range: bool) -> CheckResult:
        """A result read back from the memo, for this release and range."""
        return cls(
            vllm=vllm,
            patch=data["patch"],
            revision=data["revision"],
            variant=data["variant"],
            verdict=data["verdict"],
            in_range=in_range,
            detail=data["detail"],
            signals=Signals(**data["signals"]),
            disagreement=data["disagreement"],
            locations=tuple(data["locations"]),
            moved_to=tuple(data["moved_to"]),
            shifted=data["shifted"],
            failing_hunks=tuple((f, int(i)) for f, i in data["failing_hunks"]),
            failing_sites=tuple(data["failing_sites"]),
            missing=tuple(data["missing"]),
        )

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
    # per patch: its switch and default, lifecycle and predicate (`Patch.gates`)
    patches: dict[str, dict[str, object]] = field(default_factory=dict)

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
            "patches": self.patches,
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
    memo: Memo | None = None,
    use_memo: bool = True,
    served: Mapping[str, str] | None = None,
) -> CheckReport:
    """Check the selected patches against each release; the package index by default.

    `explain` says which failing hunks get the "nearest lines" text, the costly part of a
    failure: none, those of releases in the patch's range (what a table shows), or all.
    Results are memoised by content in the cache (`memo`; `use_memo=False` for none).
    """
    if max_fuzz < 0:
        raise UsageError(f"--fuzz {max_fuzz}: give 0 or more context lines to drop")
    if source is None:
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415 - keep imports light

        source = IndexSource()
    selected = registry.select(patches)
    ordered = sorted(dict.fromkeys(versions), key=ranges.version_key)
    infos: list[ReleaseInfo] = []
    results: list[CheckResult] = []
    memo = memo if memo is not None or not use_memo else Memo()
    seen: dict[str, str] = {}  # target file -> the last earlier release of this run holding it

    def earlier(rel: str, version: str) -> bytes | None:
        with source.open(version) as tree:
            return tree.read(rel)

    # The collector paused for the whole check, not per release: each time it came back on
    # it walked all that the release had left (results, lines, the file lists).
    try:
        with collector_paused():
            for version in ordered:
                with source.open(version) as tree:
                    release = tree.info.version if tree.info.version != "unknown" else version
                    results.extend(
                        check_tree(
                            selected,
                            tree,
                            release,
                            max_fuzz=max_fuzz,
                            explain=explain,
                            memo=memo,
                            seen=seen,
                            registry=registry,
                            earlier=earlier,
                            served=served,
                        )
                    )
                    infos.append(tree.info)  # after the reads: an index tree lists what it checked
                if on_release is not None:
                    on_release(version)
    finally:
        if memo is not None:
            memo.close()
    return CheckReport(
        registry=registry.digest,
        releases=tuple(infos),
        results=tuple(results),
        suggested=suggest_ranges(results, [i.version for i in infos]),
        patches={
            p.id: p.gates() for p in registry.patches if any(r.patch == p.id for r in results)
        },
    )


def check_tree(
    patches: Iterable[Patch],
    tree: ReleaseTree,
    version: str,
    *,
    max_fuzz: int = 0,
    explain: Explain = "in-range",
    memo: Memo | None = None,
    seen: dict[str, str] | None = None,
    registry: Registry | None = None,
    earlier: Callable[[str, str], bytes | None] | None = None,
    served: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Every patch against one release; one that `requires` others (in `registry`) on top of
    them. `seen` maps the target files found in earlier releases to the last release holding
    them (a vanished file is only said to have moved when it existed before, and `earlier`
    reads it there); it is updated with this release's."""
    seen = {} if seen is None else seen
    by_id = {p.id: p for p in registry.patches} if registry else {}
    # A release whose digest pins its content (the index's) keeps its files' digests in the
    # memo: a warm check then reads no file.
    pinned = tree.info.digest
    release = _Files(tree, memo.digests(pinned) if memo is not None and pinned else {})
    read, digest = release.read, release.digest

    def read_for(patch: Patch) -> Callable[[str], bytes | None]:
        if not patch.requires or not by_id:
            return read
        version_known = version if ranges.is_version(version) else None
        return on_top_of_required(patch, by_id, read, version_known, max_fuzz=max_fuzz)

    plans: list[tuple[Patch, bool, list[str], str | None]] = []
    for patch in patches:
        in_range = patch.in_range(version) if ranges.is_version(version) else False
        files = _declared(patch)
        key = None
        # A stacked patch reads its files as the patches it requires leave them: not memoised.
        if memo is not None and patch.kind in ("diff", "runtime") and not patch.requires:
            digests = {f: digest(f) for f in files}
            gone = sorted(f for f, d in digests.items() if d == "-")
            existed = _existed(patch, version, gone, seen) if gone else set()
            if not gone or pinned:
                meant = patch.variant_for(version) if ranges.is_version(version) else None
                nearest = explain == "all" or (explain == "in-range" and in_range)
                key = memo.key(
                    patch.id,
                    patch.digest,
                    meant.name if meant else None,
                    max_fuzz,
                    nearest,
                    sorted(digests.items()),
                    [pinned, sorted(existed), [seen.get(f) for f in gone]] if gone else None,
                    _ancestry(tree, patch.upstream.commit),  # git clones: history is a signal
                    sorted(served.items()) if served is not None else None,
                )
        plans.append((patch, in_range, files, key))
    found = memo.get_many(k for *_, k in plans if k) if memo is not None else {}
    results: list[CheckResult] = []
    store: dict[str, dict[str, object]] = {}
    for patch, in_range, files, key in plans:
        if key is not None and key in found and memo is not None:
            results.append(CheckResult.from_memo(found[key], vllm=version, in_range=in_range))
            memo.hits += 1
            continue
        existed = _existed(patch, version, files, seen)
        r = _one(
            patch,
            tree,
            version,
            read_for(patch),
            max_fuzz=max_fuzz,
            explain=explain,
            existed=existed,
            before=_last_content(patch, version, seen, earlier),
            python_files=release.python_files,
            served=served,
        )
        results.append(r)
        if key is not None:
            store[key] = r.to_memo()
    for patch in patches:
        seen.update(
            (f, version)
            for f in _declared(patch)
            if (digest(f) if memo else file_digest(read(f))) != "-"
        )
    if memo is not None:
        memo.put_many(store)
        if pinned:
            memo.put_digests(pinned, release.fresh)
    return results


class _Files:
    """One release's files as a check reads them: each file read once; a digest taken from
    the memo, else from the tree's own list (the wheel's RECORD), else by reading the file;
    the release's python files listed once (for moved-file hints)."""

    def __init__(self, tree: ReleaseTree, known: dict[str, str]) -> None:
        self.tree = tree
        self.known = known
        self.fresh: dict[str, str] = {}  # digests not from the memo, to store in it
        self._cache: dict[str, bytes | None] = {}
        self._lists = tree if isinstance(tree, KnowsDigests) else None
        self._python: PythonFiles | None = None

    def read(self, rel: str) -> bytes | None:
        if rel not in self._cache:
            said = self.known.get(rel) if self._lists is not None else None
            if said == "-":  # the release's list, as the memo keeps it, has no such file
                self._cache[rel] = None
            elif said is not None and self._lists is not None:
                self._cache[rel] = self._lists.read_listed(rel, said)
            else:
                self._cache[rel] = self.tree.read(rel)
        return self._cache[rel]

    def digest(self, rel: str) -> str:
        if rel not in self.known:
            said = self._lists.listed_digest(rel) if self._lists is not None else None
            self.known[rel] = self.fresh[rel] = (
                said if said is not None else file_digest(self.read(rel))
            )
        return self.known[rel]

    def python_files(self) -> PythonFiles:
        if self._python is None:
            self._python = PythonFiles(self.tree.paths())
        return self._python


def _declared(patch: Patch) -> list[str]:
    """Every file the patch's evaluation reads: each variant's targets and the probe's file."""
    files = {f for variant in patch.variants for f in variant.files}
    if patch.upstream.probe is not None:
        files.add(patch.upstream.probe.file)
    return sorted(files)


def _last_content(
    patch: Patch,
    version: str,
    seen: dict[str, str],
    earlier: Callable[[str, str], bytes | None] | None,
) -> Callable[[str], bytes | None] | None:
    """A vanished target's content where it was last seen: the last earlier release of the
    run holding it, else the release the variant was written against (its `base`), else the
    lowest release the patch's range allows (what `_written_before` rests on)."""
    if earlier is None or not ranges.is_version(version):
        return None
    reader = earlier
    meant = patch.variant_for(version)
    floors = [meant.base] if meant is not None and meant.base else []
    floors += [s.version for s in patch.vllm if s.operator in (">=", "==", "~=", "===")]
    older = [f for f in floors if ranges.is_version(f) and Version(f) < Version(version)]

    def before(rel: str) -> bytes | None:
        for release in [seen[rel]] if rel in seen else older[:1]:
            try:
                return reader(rel, release)
            except PatchsetError:  # not to be had (offline, no such release): the patch's lines
                return None
        return None

    return before


def _existed(patch: Patch, version: str, files: list[str], seen: Mapping[str, str]) -> set[str]:
    """Which of `files` are known to have existed before this release."""
    before = _written_before(patch, version)
    return {f for f in files if before or f in seen}


def _written_before(patch: Patch, version: str) -> bool:
    """Whether the patch's own record says its targets existed before this release: the
    release is newer than the base of a variant or than the lowest release its range allows."""
    if not ranges.is_version(version):
        return False
    current = Version(version)
    floors = [Version(v.base) for v in patch.variants if v.base and ranges.is_version(v.base)]
    floors += [
        Version(spec.version)
        for spec in patch.vllm
        if spec.operator in (">=", ">", "==", "~=", "===") and ranges.is_version(spec.version)
    ]
    return any(current > floor for floor in floors)


def _pick_variant(
    patch: Patch,
    version: str,
    read: Callable[[str], bytes | None],
    max_fuzz: int,
    nearest: bool,
    *,
    served: Mapping[str, str] | None = None,
) -> tuple[Variant, Evaluation]:
    """The variant meant for the release; failing that, the first that fits it."""

    def run(variant: Variant) -> Evaluation:
        return evaluate(
            patch, variant, read, max_fuzz=max_fuzz, nearest=nearest, ratio=ratio, served=served
        )

    meant = patch.variant_for(version) if ranges.is_version(version) else None
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


def _one(
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
) -> CheckResult:
    in_range = patch.in_range(version) if ranges.is_version(version) else False
    nearest = explain == "all" or (explain == "in-range" and in_range)
    variant, ev = _pick_variant(patch, version, read, max_fuzz, nearest, served=served)
    ev, aside = _conditional_sites(
        patch, variant, ev, read, max_fuzz=max_fuzz, nearest=nearest, served=served
    )
    probe = patch.upstream.probe
    probe_hit = probe.matches(_text(read(probe.file))) if probe else None
    reverse = ev.reverse_applies if patch.kind == "diff" else None
    signals = Signals(ev.state, reverse, probe_hit, _ancestry(tree, patch.upstream.commit))
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
        decision = _decide(patch, ev, signals, states)
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


def _decide(
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


def _ancestry(tree: ReleaseTree, commit: str | None) -> bool | None:
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
