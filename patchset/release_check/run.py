"""The check's run: every selected patch against each release, results memoised by content.

`check` is `patchset.check`: it selects the releases (``latest``, `since`), fetches what the
check will read (`files_needed`) ahead in parallel, and evaluates; `check_tree` is one release.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from packaging.version import Version

from patchset.engine.order import on_top_of_required, required_chain
from patchset.errors import PatchsetError, UsageError
from patchset.kernel import kept
from patchset.kernel.touches import touch_files
from patchset.registry import Patch, Registry, Variant, ranges
from patchset.release_check import parallel
from patchset.release_check.memo import Memo, file_digest
from patchset.release_check.prefetch import Prefetch, ProgressBar
from patchset.release_check.releasefiles import ReleaseFiles, Releases
from patchset.release_check.report import CheckReport, CheckResult, Explain, suggest_ranges
from patchset.release_check.verdicts import ancestry, is_base_release, one
from patchset.sources import parse_source, select
from patchset.sources.base import (
    KnowsDigests,
    ReleaseInfo,
    ReleaseSource,
    ReleaseTree,
)

VERSION_FILE = "vllm/_version.py"  # fetched with every check: where a release says its version


def check(
    registry: Registry,
    versions: Iterable[str] = (),
    *,
    since: str | None = None,
    pre: bool = False,
    source: ReleaseSource | None = None,
    patches: list[str] | tuple[str, ...] | None = None,
    max_fuzz: int = 0,
    on_release: Callable[[str], None] | None = None,
    explain: Explain = "in-range",
    memo: Memo | None = None,
    use_memo: bool = True,
    served: Mapping[str, str] | None = None,
    prefetch: bool = True,
    progress: ProgressBar | None = None,
    jobs: int = 1,
) -> CheckReport:
    """Check the selected patches against each release; the package index by default.

    The releases are `versions` (``latest`` among them: the newest) and every release from
    `since` on, pre-releases only with `pre` (`sources.select.for_check`; a source other than
    the index, given neither, checks its own releases). An empty report when `since` is given
    and no release is at or after it yet. With `prefetch`, what the check reads
    (`files_needed`) is fetched ahead, in parallel, before the first release is evaluated.

    `explain` says which failing hunks get the "nearest lines" text, the costly part of a
    failure: none, those of releases in the patch's range (what a table shows), or all.
    Results are memoised by content in the cache (`memo`; `use_memo=False` for none).
    The caller's garbage collector is left alone (the CLI pauses it around the whole run).
    A check of many patches may be split among `jobs` processes (one by default: a library
    call forks nothing unless asked; the same results as one process gives). The CLI picks
    the count (`parallel.wanted`: ``--jobs``, ``$PATCHSET_JOBS``, the cores).
    """
    if max_fuzz < 0:
        raise UsageError(f"--fuzz {max_fuzz}: give 0 or more context lines to drop")
    source = source if source is not None else parse_source(None)
    selected = list(registry.select(patches))
    wanted = select.for_check(source, versions=list(versions), since=since, pre=pre)
    ordered = sorted(wanted, key=ranges.version_key)
    fetch = None
    if prefetch and ordered and not source.offline:  # a python patch's modules too
        rests = _rests_on(selected, _by_id(registry))
        fetch = Prefetch(source, ordered, files_needed(selected), progress, also=rests)
    memo = memo if memo is not None or not use_memo else Memo()
    if memo is None and fetch is not None:
        fetch()  # every result worked out: every file read
    options = _Options(ordered, source, registry, max_fuzz, explain, served, fetch)
    processes = parallel.counted(jobs)
    try:
        split = _split(selected, options, memo, processes)
        if split.processes > 1:
            runs = _forked(split, options, memo, on_release)
        else:
            runs = [_run(selected, options, memo, on_release)]
    finally:
        if memo is not None:
            memo.close()
    infos = [ReleaseInfo.joined([run.infos[i] for run in runs]) for i in range(len(ordered))]
    rank = {p.id: i for i, p in enumerate(selected)}
    results = [
        r
        for i in range(len(ordered))
        for r in sorted((r for run in runs for r in run.results[i]), key=lambda r: rank[r.patch])
    ]
    checked = {r.patch for r in results}
    return CheckReport(
        registry=registry.digest,
        releases=tuple(infos),
        results=tuple(results),
        suggested=suggest_ranges(results, [i.version for i in infos]),
        patches={p.id: p.gates() for p in registry.patches if p.id in checked},
    )


def _split(
    selected: list[Patch], options: _Options, memo: Memo | None, jobs: int
) -> parallel.Split:
    """The check's patches split for `jobs` processes (`parallel.split`), or one group:
    where a fork is not safe (or the source's trees are not: `ReleaseSource.fork_safe`), or
    where the memo answers nearly all (the first release's misses, times the releases, fewer
    than `parallel.SMALLEST`: a warm check, one patch edited). Each release is opened here
    first, so that the children are forked with its file list read; the lists give the
    files' sizes (the largest a file has in any release: a file may be gone from the newest)."""
    ordered, source = options.ordered, options.source
    pairs = len(selected) * len(ordered)
    if jobs < 2 or pairs < parallel.SMALLEST or source is None or not source.fork_safe:
        return parallel.Split([selected])
    source.settle()  # its own threads done (pip's settings asked for meanwhile)
    if not parallel.can_fork():
        return parallel.Split([selected])
    if memo is not None:
        with source.open(ordered[0]) as tree:
            misses = _misses(selected, tree, ordered[0], memo, options)
        if misses * len(ordered) < parallel.SMALLEST:
            return parallel.Split([selected])
    if options.fetch is not None and not options.fetch.done:
        options.fetch()  # here, before the children are forked: they share what it fetched
        source.settle()
        if not parallel.can_fork():
            return parallel.Split([selected])
    sizes: dict[str, int] = {}
    by_id = _by_id(options.registry)

    def stacked_on(patch: Patch) -> tuple[Patch, ...]:
        return required_chain(patch, by_id) if by_id else ()

    read = {
        f for p in selected for each in (*stacked_on(p), p) for f in (*each.reads, *_named(each))
    }
    for version in ordered:
        with source.open(version) as tree:
            if isinstance(tree, KnowsDigests):
                for f in read:
                    sizes[f] = max(sizes.get(f, 0), tree.listed_size(f) or 0)
    return parallel.split(selected, jobs, pairs, sizes.get, stacked_on)


def _misses(
    selected: list[Patch], tree: ReleaseTree, version: str, memo: Memo, options: _Options
) -> int:
    """How many of `selected` the memo has no result for in this (the first) release."""
    files, state = ReleaseFiles.of(tree, memo), _State(None, memo)
    name = _release_name(tree, version)
    plans, found = _plans(selected, tree, name, release=files, state=state, options=options)
    return sum(key is None or key not in found for *_, key in plans)


@dataclass(frozen=True)
class _Options:
    """What every group of a check shares: the releases (in order) and how to check them
    (`check_tree`: one release, no source)."""

    ordered: list[str]
    source: ReleaseSource | None
    registry: Registry | None
    max_fuzz: int
    explain: Explain
    served: Mapping[str, str] | None
    fetch: Prefetch | None = None  # the prefetch, done when first needed


class _State:
    """What one run carries from release to release: the last earlier release holding each
    target file (`seen`: a vanished file is only said to have moved when it existed before),
    what each patch's record says (`_Facts`, worked out once), and the vanished files read
    back where they were last seen (from `source`; None: they are not); and its `memo`."""

    def __init__(self, source: ReleaseSource | None, memo: Memo | None) -> None:
        self.seen: dict[str, str] = {}  # target file -> the last earlier release holding it
        self.source = source
        self.memo = memo
        self._facts: dict[int, _Facts] = {}
        self._earlier: dict[tuple[str, str], bytes | None] = {}  # a file, once a release

    def facts(self, patch: Patch) -> _Facts:
        fact = self._facts.get(id(patch))
        if fact is None or fact.patch is not patch:
            fact = self._facts[id(patch)] = _Facts(patch)
        return fact

    def earlier(self, rel: str, version: str) -> bytes | None:
        """`rel` as the earlier release `version` holds it (`source` is not None)."""
        if (rel, version) not in self._earlier and self.source is not None:
            with self.source.open(version) as tree:
                self._earlier[rel, version] = tree.read(rel)
        return self._earlier.get((rel, version))


@dataclass(frozen=True)
class _Run:
    """One group's check: its results and each release's info, release by release (the
    memo's counts beside them, for a child's to be added to the parent's)."""

    results: list[list[CheckResult]]
    infos: list[ReleaseInfo]
    hits: int = 0
    misses: int = 0


def _forked(
    split: parallel.Split,
    options: _Options,
    memo: Memo | None,
    on_release: Callable[[str], None] | None,
) -> list[_Run]:
    """The first group checked here (it drives `on_release`), each other in a child process
    (with a memo of its own on the same file); then each process takes the shared pieces one
    at a time until none is left. A group whose child failed is checked here, and so are the
    pieces it took."""
    folder = memo.path.parent if memo is not None else None
    groups, shared = split.groups, split.shared
    claims = parallel.Claims(len(shared))

    def taken(own: Memo | None, releases: Releases) -> list[_Run]:
        return [_run(shared[i], options, own, None, releases) for i in iter(claims.take, None)]

    def child(group: list[Patch]) -> Callable[[], _Answer]:
        def work() -> _Answer:
            own = Memo(folder) if folder is not None else None
            releases = Releases(own)
            try:
                runs = [_run(group, options, own, None, releases), *taken(own, releases)]
                releases.keep()
                return _Answer(runs, tuple(claims.taken))
            finally:
                if own is not None:
                    own.close()

        return work

    children: list[parallel.Forked[_Answer] | None] = []
    try:
        with claims:
            for group in groups[1:]:
                try:
                    children.append(parallel.Forked(child(group)))
                except OSError:  # no process to be had (a limit reached): checked here
                    children.append(None)
            releases = Releases(memo)
            runs = [_run(groups[0], options, memo, on_release, releases), *taken(memo, releases)]
        done = set(claims.taken)
        for forked, group in zip(children, groups[1:], strict=True):
            theirs = forked.result() if forked is not None else None
            if theirs is None:  # the child failed: this process checks its group
                runs.append(_run(group, options, memo, None, releases))
                continue
            runs += theirs.runs
            done.update(theirs.taken)
            if memo is not None:
                memo.hits += sum(run.hits for run in theirs.runs)
                memo.misses += sum(run.misses for run in theirs.runs)
        # the pieces a failed child took (the pipe is empty: every other one was taken)
        runs += [
            _run(piece, options, memo, None, releases)
            for i, piece in enumerate(shared)
            if i not in done
        ]
        releases.keep()
    finally:
        for forked in children:
            if forked is not None:
                forked.close()
    return runs


@dataclass(frozen=True)
class _Answer:
    """A child's answer: its group's run and those of the shared pieces it took."""

    runs: list[_Run]
    taken: tuple[int, ...]


def _run(
    selected: list[Patch],
    options: _Options,
    memo: Memo | None,
    on_release: Callable[[str], None] | None,
    releases: Releases | None = None,
) -> _Run:
    """`selected` checked against each release in order (in this process). The release files'
    digests taken are kept in the memo at the end (or by the caller, with its `releases`:
    those of all the groups a process checks, kept once)."""
    ledger = releases if releases is not None else Releases(memo)
    source = options.source
    assert source is not None
    infos: list[ReleaseInfo] = []
    results: list[list[CheckResult]] = []
    state = _State(source, memo)
    rests = _rests_on(selected, _by_id(options.registry))
    hits, misses = (memo.hits, memo.misses) if memo is not None else (0, 0)
    for version in options.ordered:
        with source.open(version) as tree:
            files = ledger.files(tree)
            name = _release_name(tree, version)
            results.append(
                _check_release(selected, tree, name, release=files, state=state, options=options)
            )
            infos.append(_checked_info(tree, rests, files))
        if on_release is not None:
            on_release(version)
    if releases is None:
        ledger.keep()
    if memo is None:
        return _Run(results, infos)
    return _Run(results, infos, memo.hits - hits, memo.misses - misses)


def check_tree(
    patches: Iterable[Patch],
    tree: ReleaseTree,
    version: str,
    *,
    max_fuzz: int = 0,
    explain: Explain = "in-range",
    memo: Memo | None = None,
    registry: Registry | None = None,
    served: Mapping[str, str] | None = None,
) -> list[CheckResult]:
    """Every patch against one release (a release of its own: no earlier one of a run to
    say where a vanished file was); one that `requires` others (in `registry`) on top of
    them."""
    options = _Options([version], None, registry, max_fuzz, explain, served)
    ledger = Releases(memo)
    files = ledger.files(tree)
    state = _State(None, memo)
    results = _check_release(
        list(patches), tree, version, release=files, state=state, options=options
    )
    ledger.keep()
    return results


def _check_release(
    patches: list[Patch],
    tree: ReleaseTree,
    version: str,
    *,
    release: ReleaseFiles,
    state: _State,
    options: _Options,
) -> list[CheckResult]:
    """`check_tree` within a run: `state` carries what earlier releases told (it is updated
    with this release's files), `release` reads this release's files."""
    max_fuzz, explain, served, seen = options.max_fuzz, options.explain, options.served, state.seen
    memo = state.memo
    known_version = Version(version) if ranges.is_version(version) else None
    by_id = _by_id(options.registry)
    read, digest = release.read, release.digest

    stacked: dict[tuple[str, ...], Callable[[str], bytes | None]] = {}  # by required chain

    def read_for(patch: Patch) -> Callable[[str], bytes | None]:
        if not patch.requires or not by_id:
            return read
        chain = tuple(r.id for r in required_chain(patch, by_id))  # all it reads of `patch`
        if chain not in stacked:
            version_known = version if ranges.is_version(version) else None
            stacked[chain] = on_top_of_required(
                patch, by_id, read, version_known, max_fuzz=max_fuzz
            )
        return stacked[chain]

    plans, found = _plans(patches, tree, version, release=release, state=state, options=options)
    if options.fetch is not None and any(k is None or k not in found for *_, k in plans):
        options.fetch()  # a result to work out: what the check reads fetched ahead first
    results: list[CheckResult] = []
    store: dict[str, CheckResult] = {}
    for patch, in_range, meant, fact, files, key in plans:
        memoised = memo.get(key) if memo is not None else None
        if memoised is not None:
            results.append(memoised.at(version, in_range=in_range))
            continue
        existed = _existed(fact.written_before(known_version), files, seen)
        with kept.kept_in(memo):  # what a release's files told (their units, names), kept
            r = one(
                patch,
                tree,
                version,
                read_for(patch),
                max_fuzz=max_fuzz,
                explain=explain,
                existed=existed,
                before=_last_content(patch, version, state),
                python_files=release.python_files,
                served=served,
                in_range=in_range,
                meant=meant,
            )
        results.append(r)
        if key is not None:
            store[key] = r
    for *_, files, _ in plans:  # every patch's `_declared` files
        seen.update(
            (f, version) for f in files if (digest(f) if memo else file_digest(read(f))) != "-"
        )
    if memo is not None:
        memo.put_many(store)
    return results


def _rests_on(selected: Iterable[Patch], by_id: Mapping[str, Patch]) -> list[str]:
    """The files the verdicts of `selected` rest on in a release: each patch's `_declared` and
    `_named` files, and those of the patches it is stacked on (sorted)."""
    files: set[str] = set()
    for patch in selected:
        chain = required_chain(patch, by_id) if patch.requires and by_id else ()
        for each in (*chain, patch):
            files.update(_declared(each), _named(each))
    return sorted(files)


def _checked_info(tree: ReleaseTree, rests: list[str], files: ReleaseFiles) -> ReleaseInfo:
    """The release's info with its ``checked`` files (a tree that lists them: the index's)
    those of `rests` it holds, each with the sha256 the memo or the release's list gives (what
    a read is checked against): the same list whether the memo answered, which process read
    which file, or what a moved-file search read besides (the report does not depend on how
    it was made)."""
    details = tree.info.details
    if details is None or not isinstance(details.get("checked"), list):
        return tree.info
    listed = {rel: said for rel in rests if (said := files.digest(rel)) != "-"}
    info = tree.info  # made again after any read (a file from the sdist names its fallback)
    checked = [{"path": rel, "sha256": listed[rel]} for rel in sorted(listed)]
    return dataclasses.replace(info, details={**(info.details or {}), "checked": checked})


def _release_name(tree: ReleaseTree, version: str) -> str:
    """The release as its tree names it (its own version), else as it was asked for."""
    return tree.info.version if tree.info.version != "unknown" else version


def files_needed(patches: Iterable[Patch]) -> list[str]:
    """Every file a check of `patches` reads in a release (what a prefetch fetches): each
    patch's `_declared` files and the release's ``vllm/_version.py``."""
    return sorted({VERSION_FILE, *(f for p in patches for f in _declared(p))})


def _tried(required: Patch, version: str) -> str | None:
    """The variant of a required patch applied beneath a stacked one (`on_top_of_required`):
    the one meant for the release; None for the first (decided by the patch's digest)."""
    meant = required.variant_for(version) if ranges.is_version(version) else None
    return meant.name if meant is not None else None


def _declared(patch: Patch) -> list[str]:
    """Every file the patch's evaluation reads: each variant's targets and the probe's file."""
    return list(patch.reads)


def _named(patch: Patch) -> list[str]:
    """The files a python patch's names are looked up in (each touched module's ``a/b.py``
    and ``a/b/__init__.py``): part of its key, since the verdict rests on them."""
    if patch.kind != "python":
        return []
    return sorted({f for touch in patch.touches for f in touch_files(touch)})


def _last_content(
    patch: Patch, version: str, state: _State
) -> Callable[[str], bytes | None] | None:
    """A vanished target's content where it was last seen: the last earlier release of the
    run holding it, else the release the variant was written against (its `base`), else the
    lowest release the patch's range allows (what `_written_before` rests on)."""
    if state.source is None or not ranges.is_version(version):
        return None
    seen, reader = state.seen, state.earlier

    def older() -> list[str]:  # asked only for a vanished file no earlier release held
        meant = patch.variant_for(version)
        floors = [meant.base] if meant is not None and meant.base else []
        floors += [s.version for s in patch.vllm if s.operator in (">=", "==", "~=", "===")]
        return [f for f in floors if ranges.is_version(f) and Version(f) < Version(version)]

    def before(rel: str) -> bytes | None:
        for release in [seen[rel]] if rel in seen else older()[:1]:
            try:
                return reader(rel, release)
            except PatchsetError:  # not to be had (offline, no such release): the patch's lines
                return None
        return None

    return before


def _existed(written_before: bool, files: list[str], seen: Mapping[str, str]) -> set[str]:
    """Which of `files` are known to have existed before this release: all when the patch's
    record says so (`_Facts.written_before`), else those an earlier release of the run held."""
    return {f for f in files if written_before or f in seen}


class _Facts:
    """What a patch's record says that a check asks for in every release: the files it reads
    (`_declared`, `_named`) and the releases its targets existed in (`written_before`)."""

    def __init__(self, patch: Patch) -> None:
        self.patch = patch  # held: the facts are kept by the patch's id
        self.declared = _declared(patch)
        self.named = _named(patch)
        floors = [Version(v.base) for v in patch.variants if v.base and ranges.is_version(v.base)]
        floors += [
            Version(spec.version)
            for spec in patch.vllm
            if spec.operator in (">=", ">", "==", "~=", "===") and ranges.is_version(spec.version)
        ]
        self.floor = min(floors) if floors else None

    def written_before(self, release: Version | None) -> bool:
        """Whether the record says the targets existed before `release`: it is newer than the
        base of a variant or than the lowest release the range allows (None: not a version)."""
        return release is not None and self.floor is not None and release > self.floor


def _by_id(registry: Registry | None) -> dict[str, Patch]:
    return {p.id: p for p in registry.patches} if registry is not None else {}


_Plan = tuple[Patch, bool, Variant | None, _Facts, list[str], str | None]


def _plans(
    patches: Iterable[Patch],
    tree: ReleaseTree,
    version: str,
    *,
    release: ReleaseFiles,
    state: _State,
    options: _Options,
) -> tuple[list[_Plan], dict[str, CheckResult]]:
    """Each patch's plan on one release (whether in range, the variant meant, its facts and
    files, its memo key: None when not to be memoised) and the results the memo holds."""
    served, max_fuzz, explain, seen = options.served, options.max_fuzz, options.explain, state.seen
    memo, by_id = state.memo, _by_id(options.registry)
    known_version = Version(version) if ranges.is_version(version) else None
    pinned = tree.info.digest
    digest = release.digest
    configuration = sorted(served.items()) if served is not None else None  # in every key
    plans: list[_Plan] = []
    for patch in patches:
        fact = state.facts(patch)
        in_range, meant = patch.placed(version) if known_version is not None else (False, None)
        declared = fact.declared
        key = None
        # A stacked patch reads its files as the patches it requires leave them: its key holds
        # each of those (in order, transitively: id, digest, the variant tried) and the files
        # they read.
        chain = required_chain(patch, by_id) if patch.requires and by_id else ()
        if memo is not None:  # a python patch reads its targets too
            digests = [(f, digest(f)) for f in declared]  # sorted, as fact.named is
            named = [(f, digest(f)) for f in fact.named]
            beneath = {
                f: digest(f)
                for r in chain
                for f in (*state.facts(r).declared, *state.facts(r).named)
            }
            gone = [f for f, d in digests if d == "-"]
            existed = _existed(fact.written_before(known_version), gone, seen) if gone else set()
            if not gone or pinned:
                nearest = explain == "all" or (explain == "in-range" and in_range)
                key = memo.key(
                    patch.id,
                    patch.digest,
                    meant.name if meant else None,
                    max_fuzz,
                    nearest,
                    digests,
                    [pinned, sorted(existed), [seen.get(f) for f in gone]] if gone else None,
                    ancestry(tree, patch.upstream.commit),  # git clones: history is a signal
                    configuration,
                    [(r.id, r.digest, _tried(r, version)) for r in chain],
                    sorted(beneath.items()) if beneath else [],
                    named,
                    meant is not None and is_base_release(patch, meant, version),  # probe
                )
        plans.append((patch, in_range, meant, fact, declared, key))
    found = memo.get_many(k for *_, k in plans if k) if memo is not None else {}
    return plans, found
