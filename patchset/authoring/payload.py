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
    normalize_diff,
    read_diff_file,
)
from patchset.authoring.layout import Layout
from patchset.errors import UsageError
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
    index_url: str | None = None
    offline: bool = False
    no_check: bool = False  # check no release (a tree or overlays still read one)
    allow_deletions: bool = False  # from_tree: more than MAX_DELETIONS files may be deleted
    today: str | None = None  # the date in the origin line; None: today (UTC)


@dataclass(frozen=True)
class Prepared:
    source: ReleaseSource | None  # None: no release is read or checked
    versions: tuple[str, ...]  # the releases to check the new payload against
    payload: DiffPayload
    origin: str  # where it came from, for patch.toml's `origin`
    notes: tuple[str, ...]  # what the user should know about how it was read


def releases(request: PayloadRequest) -> tuple[ReleaseSource | None, list[str]]:
    """The source and the releases a new payload is checked against: `vllm`, else every
    release from `since`, else the releases the source holds without downloading."""
    if request.no_check and not (request.from_tree or request.overlay):
        return None, []
    source = parse_source(
        request.source,
        index_url=request.index_url,
        offline=request.offline,  # never offline unless asked: what a check needs is fetched
        prereleases=request.pre,
    )
    if request.no_check:
        return source, []
    return source, select.for_add(
        source, versions=request.vllm, since=request.since, pre=request.pre
    )


def prepare(request: PayloadRequest) -> Prepared:
    """The releases to check, the new payload, where it came from and the notes on it."""
    source, versions = releases(request)
    today = request.today or datetime.now(UTC).strftime("%Y-%m-%d")
    if request.from_tree is not None:
        payload, origin, notes = _from_tree(request, source, today)
    elif request.overlay:
        payload, origin, notes = _overlays(request, source, versions, today)
    else:
        payload, origin, notes = _diff(request, source, versions, today)
    if versions and not (request.vllm or request.since or request.source):
        notes.append(
            f"checked against the {len(versions)} release{'s' if len(versions) != 1 else ''}"
            f" already in the cache ({listed(versions)}); --vllm X or --since X choose others"
        )
    return Prepared(source, tuple(versions), payload, origin, tuple(notes))


def _from_tree(
    request: PayloadRequest, source: ReleaseSource | None, today: str
) -> tuple[DiffPayload, str, list[str]]:
    folder = request.from_tree
    assert folder is not None
    if not request.vllm or source is None:
        raise UsageError("--from-tree needs --vllm X: the release the tree was installed from")
    version = request.vllm[0]
    with source.open(version) as pristine:
        found = trees.diff_tree(folder, pristine, request.files)
    if not found.files:
        raise UsageError(
            f"no file differs from vLLM {version}"
            + (f" (not text, left out: {', '.join(found.unreadable)})" if found.unreadable else ""),
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
    return payload, f"the edits in {folder.name}/ against vLLM {version} (added {today})", notes


def listed(names: tuple[str, ...] | list[str]) -> str:
    """The first few of `names` and how many more."""
    more = len(names) - SHOWN
    return ", ".join(names[:SHOWN]) + (f" and {more} more" if more > 0 else "")


def _overlays(
    request: PayloadRequest, source: ReleaseSource | None, versions: list[str], today: str
) -> tuple[DiffPayload, str, list[str]]:
    if source is None:
        raise UsageError("--overlay needs releases to compare with: drop --no-check")
    candidates = list(request.vllm) or versions
    if not candidates:
        raise UsageError(
            "--overlay: no release in the cache to compare with; give --vllm X or --since X"
        )
    notes: list[str] = []
    parts = []
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
        also = [v for v in match.same if v != match.version]
        chosen = ""
        if match.next_best is not None:
            chosen = (
                f"; chosen by content among {match.compared} files named {path.name},"
                f" next {match.next_best[0]} at {match.next_best[1]:.0%}"
            )
        notes.append(
            f"{path}: a copy of {match.target} from vLLM {match.version}"
            f" ({match.likeness:.0%} of lines alike"
            + (f"; as alike in {', '.join(also)}" if also else "")
            + chosen
            + ")"
        )
        parts.append(trees.unified(match.target, old, text))
    if not parts:
        raise UsageError(
            "; ".join(identical) + ": nothing to import (an overlay holds a fix only where it"
            " differs from the release it was copied from)",
            path=request.overlay[0].partition("=")[0],
        )
    notes += [f"{line}: nothing to import from it, left out" for line in identical]
    payload = normalize_diff("".join(parts), file=request.overlay[0])
    names = ", ".join(Path(s.partition("=")[0]).name for s in request.overlay)
    return payload, f"overlays {names} (added {today})", notes


def _diff(
    request: PayloadRequest, source: ReleaseSource | None, versions: list[str], today: str
) -> tuple[DiffPayload, str, list[str]]:
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
    detect = detector(source, versions) if source is not None and versions else None
    payload = normalize_diff(text, file=name, layout=request.layout, detect=detect)
    notes: list[str] = []
    if payload.detected is not None:
        notes.append(
            "detected: the diff's paths are relative to the vllm/ package (every file it"
            f" changes is under vllm/ in {payload.detected.version}); --root/--strip say"
            " otherwise"
        )
    return payload, origin, notes
