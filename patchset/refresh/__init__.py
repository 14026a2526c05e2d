"""Refresh: carry a patch that no longer fits onto a newer vLLM release.

Diff patches: a three-way merge in a scratch git repository. The base is the release the
variant was written against (its `base`, else the newest release inside its range before the
target); one branch holds the base with the variant applied by the engine, the other the
target release's files. A clean merge becomes a new payload variant; a conflict leaves the
merged files, with markers, in a work folder that `finish` turns into the variant once edited.
A target file the release moved is found as `check` finds it (`release_check.moves`): the merge
takes the moved file as the release's side, and the new variant patches the new path.

Runtime patches: for every site whose anchor no longer matches, the windows of the target's
file most like the anchor (the engine's `rank_windows`). A window made only of lines that the
base release also has, unchanged and outside the anchor, is other code, not where the anchor
went; of the rest, one clearly best candidate becomes the proposed anchor.

Either way the new variant is checked against the target release before anything is written,
and the registry is written through `registry.write` (style kept, atomic, re-validated).

The seams: `job` (the job and its results), `merge` (diff patches), `anchors` (runtime
patches), `workdir` (a conflicted merge's work folder and its state), `record` (the registry
edit), `carry` (`refresh --all`: every patch a release shifted, on top of this module); this
module chooses the variant and the base and holds refresh, finish and abort.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from pathlib import Path

from packaging.version import Version

from patchset._fs import sha256_hex
from patchset.adapters.gitrepo import conflict_lines
from patchset.engine.evaluate import evaluate
from patchset.errors import PatchsetError, UsageError
from patchset.refresh.anchors import refresh_runtime
from patchset.refresh.job import (
    AnchorCandidate,
    Conflict,
    Job,
    MovedFile,
    RangeChange,
    RefreshOutcome,
    RefreshResult,
    SiteRefresh,
    stacked_reader,
)
from patchset.refresh.landed import RefusedRefreshError, refuse_landed
from patchset.refresh.merge import diff_of, refresh_diff, write_diff_variant
from patchset.refresh.workdir import (
    STATE,
    WORK_FOLDER,
    default_workdir,
    load_state,
    remove_work,
    work_file,
)
from patchset.registry import Patch, Registry, Variant
from patchset.release_check.moves import moved_homes
from patchset.sources import parse_source, select
from patchset.sources.base import ReleaseSource, ReleaseTree

__all__ = [
    "WORK_FOLDER",
    "AnchorCandidate",
    "Conflict",
    "MovedFile",
    "RangeChange",
    "RefreshOutcome",
    "RefreshResult",
    "RefusedRefreshError",
    "SiteRefresh",
    "abort",
    "default_workdir",
    "finish",
    "refresh",
]


def refresh(
    registry: Registry,
    patch_id: str,
    version: str,
    *,
    source: ReleaseSource | None = None,
    write: bool = True,
    workdir: Path | None = None,
    picks: Mapping[str, int] | None = None,
) -> RefreshResult:
    """Carry `patch_id` onto release `version` ('latest': the newest the source offers).

    `write=False` computes everything and writes nothing (a runtime patch's proposal);
    `picks` chooses, per runtime site name, a candidate by its 1-based number.
    A patch that already fits the release, or whose upstream fix it holds, is refused.
    """
    source = source if source is not None else parse_source(None)
    patch = registry.get(patch_id)
    if patch.kind == "python":
        raise UsageError(
            f"{patch_id} is a python patch: it carries no text to move onto a release; when"
            " `check` says missing-target, edit its touches and plugin.py by hand"
        )
    target, versions = select.one(source, version)
    variant = _from_variant(patch, target, versions)
    target_files, moves = _release_files(
        registry, patch, variant, target, versions=versions, source=source, refuse_if_fits=True
    )
    refuse_landed(patch.id, variant, target, target_files)
    base = _base(variant, target, versions)
    job = Job(registry, patch, variant, target, base, target_files, tuple(versions), moves)
    if patch.kind == "diff":
        if base is None:
            raise UsageError(
                f"{patch.id}: no release inside {variant.name}'s range {variant.vllm} before"
                f' {target} to merge from; give its base (e.g. base = "0.19.1") in patch.toml'
            )
        work = workdir or default_workdir(registry, patch.id)
        return refresh_diff(job, source, base, work, write=write)
    return refresh_runtime(job, source, write=write, picks=picks or {})


def finish(
    registry: Registry,
    patch_id: str,
    *,
    workdir: Path | None = None,
    source: ReleaseSource | None = None,
) -> RefreshResult:
    """Turn the edited files of an unfinished refresh into the new variant.

    Nothing in the work folder is taken on trust: its state is checked against the source
    (the release is one it offers, the variant and base are the ones refresh works out, the
    release's files, read again from the source, have the digests recorded), the edited
    files must be regular files (no symlink), and the new variant is applied to the real
    release before anything is written. Refused while a conflict marker is left, or when the
    patch changed since the refresh began.
    """
    if source is None:
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415 - keep imports light

        source = IndexSource()
    patch = registry.get(patch_id)
    work = workdir or default_workdir(registry, patch.id)
    state = load_state(work, patch.id)
    variant = next((v for v in patch.variants if v.name == state.from_variant), None)
    if (
        variant is None
        or variant.sha256 != state.from_sha256
        or patch.revision != state.revision
        or sorted(state.files) != sorted(variant.files)
        or not set(state.moves) <= set(variant.files)
    ):
        raise UsageError(
            f"{patch.id} changed since its refresh began (revision {state.revision},"
            f" {state.from_variant}); start again: --abort, then refresh --vllm"
            f" {state.vllm}"
        )
    target, versions = select.one(source, state.vllm)
    expected = _from_variant(patch, target, versions)
    base = _base(expected, target, versions)
    if expected.name != variant.name or base != state.base:
        raise UsageError(
            f"the refresh state says {state.from_variant} from base {state.base}, but refresh"
            f" carries {expected.name} from base {base} onto vllm {target}: start again"
            " (--abort)",
            path=work / STATE,
        )
    release, moves = _release_files(
        registry, patch, variant, target, versions=versions, source=source
    )
    recorded = {rel: None if data is None else sha256_hex(data) for rel, data in release.items()}
    if moves != dict(state.moves) or recorded != dict(state.files):
        raise UsageError(
            f"vllm {target}'s files from the {source.name} source are not the ones the refresh"
            " began with: start again (--abort)",
            path=work / STATE,
        )
    edited: dict[str, bytes | None] = {rel: work_file(work, moves.get(rel, rel)) for rel in release}
    left = [
        f"{moves.get(rel, rel)}:{n}"
        for rel, data in edited.items()
        for n in conflict_lines(data or b"")[len(conflict_lines(release[rel] or b"")) :]
    ]
    if left:
        raise UsageError(
            f"conflict markers are left at {', '.join(left[:3])}"
            f"{' and more' if len(left) > 3 else ''}: resolve them, then run --finish again",
            path=work,
        )
    job = Job(registry, patch, variant, target, base, release, tuple(versions), moves)
    payload = diff_of(job, edited)
    if not payload.strip():
        raise UsageError(
            f"the edited files are vllm {target}'s own: nothing is left of {patch.id}", path=work
        )
    result = write_diff_variant(job, payload)  # applied to the release's files before written
    remove_work(work)
    return result


def abort(registry: Registry, patch_id: str, *, workdir: Path | None = None) -> Path:
    """Drop an unfinished refresh's work folder; the registry was never touched by it."""
    patch = registry.get(patch_id)
    work = workdir or default_workdir(registry, patch.id)
    load_state(work, patch.id)  # refuse to delete a folder that is not ours
    remove_work(work)
    return work


def _release_files(
    registry: Registry,
    patch: Patch,
    variant: Variant,
    target: str,
    *,
    versions: list[str],
    source: ReleaseSource,
    refuse_if_fits: bool = False,
) -> tuple[dict[str, bytes | None], dict[str, str]]:
    """The target release's files the variant patches (keyed by the variant's paths, on top
    of the patches it requires) and where the release moved any of them."""
    probe = patch.upstream.probe
    wanted = tuple(dict.fromkeys([*variant.files, *([probe.file] if probe else [])]))
    with source.open(target) as tree:
        # A stacked patch is carried on top of the patches it requires, as `check` reads it.
        read = stacked_reader(registry, patch, tree.read, target)
        release = {rel: read(rel) for rel in wanted}
        if refuse_if_fits:
            _refuse_if_fits(patch, variant, target, release)
        last = _last(source, variant, target, versions)
        moves = _follow_moves(tree, patch, variant, target, release, before=last)
        files = {
            rel: tree.read(moves[rel]) if rel in moves else release[rel] for rel in variant.files
        }
    return files, moves


def _from_variant(patch: Patch, target: str, versions: list[str]) -> Variant:
    """The variant meant for the target, else the one meant for the newest release before it."""
    meant = patch.variant_for(target)
    if meant is not None:
        return meant
    for version in reversed([v for v in versions if Version(v) < Version(target)]):
        variant = patch.variant_for(version)
        if variant is not None:
            return variant
    raise UsageError(f"{patch.id}: no variant covers a release before {target} to carry forward")


def _base(variant: Variant, target: str, versions: list[str]) -> str | None:
    """The release the variant was written against: its `base`, else the newest release
    inside its range before the target."""
    if variant.base is not None:
        if Version(variant.base) >= Version(target):
            raise UsageError(
                f"vllm {target} is not newer than {variant.name}'s base {variant.base}:"
                " refresh carries a patch forward"
            )
        return variant.base
    inside = [
        v
        for v in versions
        if Version(v) < Version(target) and variant.vllm.contains(Version(v), prereleases=True)
    ]
    return inside[-1] if inside else None


def _refuse_if_fits(
    patch: Patch, variant: Variant, target: str, files: dict[str, bytes | None]
) -> None:
    """One clear line when there is nothing to refresh: it fits, or the release has the fix."""
    meant = patch.variant_for(target)
    tried = [meant] if meant is not None else list(patch.variants)
    for candidate in tried:
        ev = evaluate(patch, candidate, files.get)
        if ev.state == "applies":
            how = "; ".join(ev.warnings) or "cleanly"
            hint = "" if candidate is meant else " (outside its range: check --suggest-ranges)"
            raise UsageError(
                f"{patch.id} already fits vllm {target}: {candidate.name} applies {how}{hint};"
                " nothing to refresh"
            )
        if ev.state == "already-applied":
            raise UsageError(
                f"vllm {target} already holds {patch.id}'s change ({candidate.name});"
                " nothing to refresh"
            )
    probe = patch.upstream.probe
    if probe is not None:
        data = files.get(probe.file)
        if data is not None and probe.matches(data.decode("utf-8", errors="replace")):
            raise UsageError(
                f"vllm {target} has {patch.id}'s upstream fix ({probe.describe()});"
                " nothing to refresh"
            )


def _last(
    source: ReleaseSource, variant: Variant, target: str, versions: list[str]
) -> Callable[[str], bytes | None]:
    """A vanished file as the variant's base release held it (how much of it moved, and
    where, is judged on its whole content: `release_check.moves`)."""

    def before(rel: str) -> bytes | None:
        try:
            base = _base(variant, target, versions)
            if base is None:
                return None
            with source.open(base) as old:
                return old.read(rel)
        except PatchsetError:  # no base to read: the lines the patch expects decide
            return None

    return before


def _follow_moves(
    tree: ReleaseTree,
    patch: Patch,
    variant: Variant,
    target: str,
    files: Mapping[str, bytes | None],
    *,
    before: Callable[[str], bytes | None] | None = None,
) -> dict[str, str]:
    """Where the target release moved the variant's missing files (as `check` finds them);
    refused when one has no new home (removed), or for a runtime patch."""
    missing = tuple(
        rel for rel in variant.files if files.get(rel) is None and not _added(variant, rel)
    )
    if not missing:
        return {}
    # each file's one new home: the module carrying most of it, for a package
    moves = {
        rel: home[0] for rel, home in moved_homes(tree, variant, missing, before=before).items()
    }
    gone = [rel for rel in missing if rel not in moves]
    if gone:
        raise UsageError(
            f"vllm {target} has no {', '.join(gone)}, and no file of it holds the lines"
            f" {patch.id} expects there: refresh cannot follow a removed file"
        )
    said = ", ".join(f"{old} -> {new}" for old, new in moves.items())
    homes = list(moves.values())
    if len(set(homes)) != len(homes) or set(homes) & set(variant.files):
        raise UsageError(
            f"vllm {target} moved {said}: files that meet in one are not followed;"
            " write the variant by hand"
        )
    if patch.kind == "runtime":
        raise UsageError(
            f"vllm {target} moved {said}: refresh follows moved files for diff patches only;"
            " edit the sites' file by hand"
        )
    return moves


def _added(variant: Variant, rel: str) -> bool:
    """Whether the variant creates `rel`, or deletes it: absent, neither is a moved file."""
    return any(d.path == rel and (d.added or d.removed) for d in variant.diffs)
