"""A new payload from a tree, overlays, a diff or a pull request: what `add` and `update` write.

`prepare(PayloadRequest(...))` chooses the releases to check (the source, `--vllm`/`--since`,
else the releases already cached), reads the payload from where the request says, and returns
it with the origin line for patch.toml and the notes for the user. The CLI parses and prints.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from patchset.adapters import forge
from patchset.authoring import tree as trees
from patchset.authoring.diff import (
    NO_PREAMBLE,
    DiffPayload,
    detector,
    newest_detector,
    normalize_diff,
    read_diff_file,
)
from patchset.authoring.layout import Layout
from patchset.authoring.runtime_sites import SiteEdit, sites_from_edit
from patchset.errors import UsageError
from patchset.registry import ranges
from patchset.sources import parse_source, select
from patchset.sources.base import ReleaseSource

MAX_DELETIONS = 5  # more files deleted by an edited tree are refused unless allowed
SHOWN = 3  # names shown of a long list


@dataclass(frozen=True)
class PayloadRequest:
    """Where a new payload comes from (exactly one of from_tree, overlay, diff, pr) and which
    releases it is checked against."""

    from_tree: Path | None = None  # an edited vLLM tree, diffed against release vllm[0]
    files: tuple[str, ...] = ()  # with from_tree: only these files
    overlay: tuple[str, ...] = ()  # FILE or FILE=vllm/PATH
    diff: str | None = None  # a diff file, '-' for stdin
    pr: str | None = None  # owner/repo#n: its diff is fetched when no other source is given
    forge_url: str | None = None
    layout: Layout = field(default_factory=Layout)
    vllm: tuple[str, ...] = ()  # the releases named (from_tree: the first is the tree's)
    since: str | None = None
    pre: bool = False
    source: str | None = None  # a source spec (see parse_source); None: the package index
    source_version: str | None = None  # the release a folder or git:PATH@REF tree holds
    index_url: str | None = None
    offline: bool = False
    no_check: bool = False  # check no release (a tree or overlays still read one)
    allow_deletions: bool = False  # from_tree: more than MAX_DELETIONS files may be deleted
    runtime: bool = False  # from_tree/overlay: anchored runtime sites instead of a diff
    today: str | None = None  # the date in the origin line; None: today (UTC)


@dataclass(frozen=True)
class Prepared:
    source: ReleaseSource | None  # None: no release is read or checked
    versions: tuple[str, ...]  # the releases to check the new payload against
    payload: DiffPayload
    origin: str  # where it came from, for patch.toml's `origin`
    notes: tuple[str, ...]  # what the user should know about how it was read
    base: str | None = None  # the release the payload was made against, when known
    sites: tuple[SiteEdit, ...] = ()  # with `runtime`: the payload as anchored sites


@dataclass(frozen=True)
class _Read:
    payload: DiffPayload
    origin: str
    notes: list[str]
    base: str | None = None
    edits: tuple[tuple[str, str | None, str | None], ...] = ()  # path, release's text, new


def releases(request: PayloadRequest) -> tuple[ReleaseSource | None, list[str]]:
    """The source and the releases a new payload is checked against: `vllm` and every release
    from `since` (both when both are given), else the releases the source holds without
    downloading."""
    if request.no_check and not (request.from_tree or request.overlay):
        return None, []
    source = parse_source(
        request.source,
        index_url=request.index_url,
        offline=request.offline,  # never offline unless asked: what a check needs is fetched
        prereleases=request.pre,
        version=request.source_version,
    )
    if request.no_check:
        return source, []
    named = select.for_add(source, versions=request.vllm) if request.vllm else []
    since = select.for_add(source, since=request.since, pre=request.pre) if request.since else []
    if named or since:
        return source, _in_order([*named, *since])
    return source, select.for_add(source)


def _in_order(versions: list[str]) -> list[str]:
    """Each once, oldest first (what is not a version keeps its place at the end)."""
    unique = list(dict.fromkeys(versions))
    known = sorted((v for v in unique if ranges.is_version(v)), key=ranges.version_key)
    return known + [v for v in unique if not ranges.is_version(v)]


def prepare(request: PayloadRequest) -> Prepared:
    """The releases to check, the new payload, where it came from and the notes on it."""
    source, versions = releases(request)
    today = request.today or datetime.now(UTC).strftime("%Y-%m-%d")
    if request.runtime and not (request.from_tree or request.overlay):
        raise UsageError(
            "--runtime makes sites from an edited tree or overlays (--from-tree DIR --vllm X,"
            " --overlay FILE); alone it lays out a skeleton"
        )
    if request.from_tree is not None:
        read = _from_tree(request, source, today)
    elif request.overlay:
        read = _overlays(request, source, versions, today)
    else:
        read = _diff(request, source, versions, today)
    notes = read.notes
    sites = _sites(read) if request.runtime else ()
    if sites:
        notes.append(
            f"{len(sites)} runtime site{'s' if len(sites) != 1 else ''}, each anchored on the"
            " fewest of the release's lines that occur once in the file"
        )
    if versions and not (request.vllm or request.since or request.source):
        notes.append(
            f"checked against the {len(versions)} release{'s' if len(versions) != 1 else ''}"
            f" already in the cache ({listed(versions)}); --vllm X or --since X choose others"
        )
    return Prepared(
        source, tuple(versions), read.payload, read.origin, tuple(notes), read.base, sites
    )


def _sites(read: _Read) -> tuple[SiteEdit, ...]:
    """The edit of every file as anchored sites: a runtime patch changes files the release
    has, so a created or deleted file is refused."""
    out: list[SiteEdit] = []
    for rel, old, new in read.edits:
        if old is None or new is None:
            made = "creates" if old is None else "deletes"
            raise UsageError(
                f"--runtime: the edit {made} {rel}; runtime sites change files the release"
                " has (leave out --runtime for a diff patch, or --file the others)"
            )
        out += sites_from_edit(old, new, rel)
    return tuple(out)


def _from_tree(request: PayloadRequest, source: ReleaseSource | None, today: str) -> _Read:
    folder = request.from_tree
    assert folder is not None
    if not request.vllm or source is None:
        raise UsageError("--from-tree needs --vllm X: the release the tree was installed from")
    version = request.vllm[0]
    with source.open(version) as pristine:
        found = trees.diff_tree(folder, pristine, request.files, deletions=request.allow_deletions)
    if not found.files:
        raise UsageError(
            f"no file differs from vLLM {version}"
            + (f" (not text, left out: {', '.join(found.unreadable)})" if found.unreadable else "")
            + (
                f" ({len(found.absent)} of its files absent from the edited tree, not deleted:"
                " --allow-deletions deletes them)"
                if found.absent
                else ""
            ),
            path=folder,
        )
    notes: list[str] = []
    if found.unreadable:
        notes.append(f"left out (not UTF-8 text): {listed(found.unreadable)}")
    if found.not_held:
        notes.append(
            f"not compared: vLLM {version}'s folders the edited tree does not have"
            f" ({listed(found.not_held)}); nothing in them is deleted (--file vllm/PATH names"
            " a file to delete)"
        )
    if found.absent:
        notes.append(
            f"not deleted: {len(found.absent)} file(s) of vLLM {version} absent from the edited"
            f" tree ({listed(found.absent)}); --allow-deletions deletes them, --file vllm/PATH"
            " names one to delete"
        )
    if found.deleted:
        count = len(found.deleted)
        if count > MAX_DELETIONS and not (request.allow_deletions or request.files):
            raise UsageError(
                f"would delete {count} files of vLLM {version} absent from the edited tree"
                f" ({listed(found.deleted)}): more than {MAX_DELETIONS} are refused;"
                " --allow-deletions keeps them, --file vllm/PATH limits the patch to the"
                " files named",
                path=folder,
            )
        notes.append(
            f"deletes {count} file{'s' if count != 1 else ''} of vLLM {version} absent from"
            f" the edited tree: {listed(found.deleted)}"
            + ("" if request.files else "; --file vllm/PATH limits the patch to the files named")
        )
    # diff_tree writes the registry's form already: no lenient reading (a 60 MB new file
    # is then read once more by the registry's loader, not three times more).
    targets = tuple(f for f in found.files if f not in found.unreadable)
    payload = DiffPayload(found.text, targets, (), NO_PREAMBLE)
    origin = f"the edits in {folder.name}/ against vLLM {version} (added {today})"
    return _Read(payload, origin, notes, version, found.edits)


def listed(names: tuple[str, ...] | list[str]) -> str:
    """The first few of `names` and how many more."""
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def _overlays(
    request: PayloadRequest, source: ReleaseSource | None, versions: list[str], today: str
) -> _Read:
    """One diff for all overlays against one release: the newest that every overlay is most
    alike to; overlays whose best releases have none in common are refused, each named with
    its own (give --vllm X to diff them all against X)."""
    if source is None:
        raise UsageError("--overlay needs releases to compare with: drop --no-check")
    candidates = list(request.vllm) or versions
    if not candidates:
        raise UsageError(
            "--overlay: no release in the cache to compare with; give --vllm X or --since X"
        )
    found: list[tuple[Path, str, trees.OverlayMatch, str]] = []
    identical: list[str] = []
    for spec in request.overlay:
        name, _, target = spec.partition("=")
        path = Path(name)
        text = read_diff_file(path, what="overlays")
        match, old = trees.match_overlay(path, text, source, candidates, target or None)
        if old == text:
            also = [v for v in match.same if v != match.version]
            identical.append(
                f"{path} is identical to {match.target} of vLLM {match.version}"
                + (f" (and of {', '.join(also)})" if also else "")
            )
            continue
        found.append((path, text, match, old))
    if not found:
        raise UsageError(
            "; ".join(identical) + ": nothing to import (an overlay holds a fix only where it"
            " differs from the release it was copied from)",
            path=request.overlay[0].partition("=")[0],
        )
    base = _common_base([match for _, _, match, _ in found])
    notes: list[str] = []
    edits: list[tuple[str, str | None, str | None]] = []
    for path, text, match, best in found:
        old = best
        if match.version != base:  # as alike in the common release: diff against its text
            with source.open(base) as tree:
                data = tree.read(match.target)
            old = data.decode("utf-8", errors="replace") if data is not None else best
        also = [v for v in match.same if v != base]
        chosen = ""
        if match.next_best is not None:
            chosen = (
                f"; chosen by content among {match.compared} files named {path.name},"
                f" next {match.next_best[0]} at {match.next_best[1]:.0%}"
            )
        notes.append(
            f"{path}: a copy of {match.target} from vLLM {base}"
            f" ({match.likeness:.0%} of lines alike"
            + (f"; as alike in {', '.join(also)}" if also else "")
            + chosen
            + ")"
        )
        edits.append((match.target, old, text))
    if len(found) > 1:
        notes.append(f"the {len(found)} overlays come from one release: vLLM {base} (the base)")
    notes += [f"{line}: nothing to import from it, left out" for line in identical]
    text = "".join(trees.unified(rel, old, new) for rel, old, new in edits)
    payload = normalize_diff(text, file=request.overlay[0])
    names = ", ".join(Path(s.partition("=")[0]).name for s in request.overlay)
    return _Read(payload, f"overlays {names} (added {today})", notes, base, tuple(edits))


def _common_base(matches: list[trees.OverlayMatch]) -> str:
    """The newest release every overlay is most alike to; UsageError when there is none."""
    common = set(matches[0].same)
    for match in matches[1:]:
        common &= set(match.same)
    if common:
        return max(common, key=ranges.version_key)
    each = "; ".join(f"{m.overlay} from {m.version}" for m in matches)
    raise UsageError(
        f"the overlays come from different releases ({each}): no release is the base of all"
        " of them, so the patch would fit none; give --vllm X to diff them all against X, or"
        " add them as separate patches"
    )


def _diff(
    request: PayloadRequest, source: ReleaseSource | None, versions: list[str], today: str
) -> _Read:
    pr = request.pr
    if request.diff is not None:
        name = "<stdin>" if request.diff == "-" else request.diff
        text = read_diff_file(request.diff)
        origin = f"{pr + ', ' if pr else ''}diff {Path(name).name} (added {today})"
    elif pr is not None:
        name = forge.pr_diff_url(pr, request.forge_url)
        text = forge.fetch_pr_diff(pr, request.forge_url)
        origin = f"{pr} (its diff, fetched {today})"
    else:
        raise UsageError(
            "say where the payload comes from: --pr OWNER/REPO#N, --diff FILE, --from-tree DIR"
            " or --overlay FILE"
        )
    detect = None
    if source is not None:  # no release at hand: the source's newest one is asked for
        detect = detector(source, versions) if versions else newest_detector(source)
    payload = normalize_diff(text, file=name, layout=request.layout, detect=detect)
    notes: list[str] = []
    if payload.detected is not None:
        notes.append(
            "detected: the diff's paths are relative to the vllm/ package (every file it"
            f" changes is under vllm/ in {payload.detected.version}); --root/--strip say"
            " otherwise"
        )
    # one release named: the diff is taken as made against it (kept if the check agrees)
    base = request.vllm[0] if len(request.vllm) == 1 else None
    return _Read(payload, origin, notes, base)
