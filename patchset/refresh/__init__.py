"""Refresh: carry a patch that no longer fits onto a newer vLLM release.

Diff patches: a three-way merge in a scratch git repository. The base is the release the
variant was written against (its `base`, else the newest release inside its range before the
target); one branch holds the base with the variant applied by the engine, the other the
target release's files. A clean merge becomes a new payload variant; a conflict leaves the
merged files, with markers, in a work folder that `finish` turns into the variant once edited.
A target file the release moved is found as `check` finds it (`check.moved_files`): the merge
takes the moved file as the release's side, and the new variant patches the new path.

Runtime patches: for every site whose anchor no longer matches, the windows of the target's
file most like the anchor (the engine's `rank_windows`). A window made only of lines that the
base release also has, unchanged and outside the anchor, is other code, not where the anchor
went; of the rest, one clearly best candidate becomes the proposed anchor.

Either way the new variant is checked against the target release before anything is written,
and the registry is written through `registry_write` (style kept, atomic, re-validated).
"""

from __future__ import annotations

import dataclasses
import difflib
import hashlib
import json
import logging
import shutil
import tempfile
import textwrap
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version
from tomlkit.toml_document import TOMLDocument

from patchset.adapters.gitrepo import MergeLabels, conflict_lines, scratch_repo
from patchset.engine.evaluate import evaluate
from patchset.errors import ExitCode, PatchsetError, RegistryError, UsageError
from patchset.kernel.hunks import rank_windows, split_text
from patchset.kernel.sites import Site, SiteStatus, check_site, find_block
from patchset.registry import Kind, Patch, Registry, Variant, load_sites
from patchset.registry.diffs import parse_diff
from patchset.registry.toml import did_you_mean
from patchset.registry.write import RegistryChange, range_text
from patchset.release_check.verdicts import moved_files
from patchset.sources.base import ReleaseSource, ReleaseTree

Outcome = Literal["written", "proposed", "conflict", "unresolved"]
MIN_SIMILARITY = 0.6  # a proposed anchor is at least this much like the old one
MARGIN = 0.1  # and this much ahead of the next candidate
WORK_FOLDER = ".patchset-refresh"  # beside the registry: <registry>/../.patchset-refresh/<id>
STATE = ".patchset/refresh.json"  # inside the work folder, with the release's files beside it
STATE_SCHEMA = "patchset.refresh-state/1"
LOG = logging.getLogger(__name__)


@dataclass(frozen=True)
class AnchorCandidate:
    line: int  # 1-based, in the target release's file
    similarity: float
    lines: tuple[str, ...]
    unchanged: bool = False  # every line is a base-release line outside the anchor


@dataclass(frozen=True)
class SiteRefresh:
    """One runtime site against the target release, and the anchor proposed for it."""

    site: str
    file: str
    status: SiteStatus  # in the target release, with the old anchor
    line: int | None = None  # where the old anchor still matches
    candidates: tuple[AnchorCandidate, ...] = ()
    anchor: str | None = None  # the proposed anchor (dedented); None: unchanged or no proposal
    picked: int | None = None  # the 1-based candidate it came from
    text_follows: bool = False  # a replace site's text held the old anchor; now the new one
    reason: str = ""  # why there is no proposal

    @property
    def resolved(self) -> bool:
        return self.status == "applies" or self.anchor is not None

    def to_dict(self) -> dict[str, object]:
        return {
            "site": self.site,
            "file": self.file,
            "status": self.status,
            "line": self.line,
            "candidates": [
                {
                    "line": c.line,
                    "similarity": round(c.similarity, 3),
                    "lines": list(c.lines),
                    "unchanged": c.unchanged,
                }
                for c in self.candidates
            ],
            "anchor": self.anchor,
            "picked": self.picked,
            "text_follows": self.text_follows,
            "reason": self.reason,
        }


@dataclass(frozen=True)
class RangeChange:
    what: str  # "vllm" (the patch's own range) or a payload file name
    old: str | None  # None: a new variant
    new: str


@dataclass(frozen=True)
class Conflict:
    file: str
    lines: tuple[int, ...]  # 1-based lines of the conflict markers in the work folder's copy


@dataclass(frozen=True)
class MovedFile:
    old: str  # the path the variant patches
    new: str  # where the target release has the file: the new variant patches this path


@dataclass(frozen=True)
class RefreshResult:
    patch: str
    kind: Kind
    vllm: str  # the target release
    from_variant: str  # the payload carried forward
    base: str | None  # the release it was written against (the merge base)
    outcome: Outcome
    variant: str | None = None  # the new payload's file name
    revision: int | None = None  # the patch's revision once written
    payload: str = ""  # diff: the new diff; runtime: the new sites file as a diff of the old
    ranges: tuple[RangeChange, ...] = ()
    conflicts: tuple[Conflict, ...] = ()
    workdir: Path | None = None
    sites: tuple[SiteRefresh, ...] = ()
    written: tuple[Path, ...] = ()
    moved: tuple[MovedFile, ...] = ()  # target files the release moved, followed

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.outcome in ("written", "proposed") else ExitCode.ATTENTION

    def to_dict(self) -> dict[str, object]:
        return {
            "patch": self.patch,
            "kind": self.kind,
            "vllm": self.vllm,
            "from_variant": self.from_variant,
            "base": self.base,
            "outcome": self.outcome,
            "variant": self.variant,
            "revision": self.revision,
            "payload": self.payload,
            "ranges": [{"what": r.what, "old": r.old, "new": r.new} for r in self.ranges],
            "conflicts": [{"file": c.file, "lines": list(c.lines)} for c in self.conflicts],
            "workdir": None if self.workdir is None else str(self.workdir),
            "sites": [s.to_dict() for s in self.sites],
            "written": [str(p) for p in self.written],
            "moved": [{"old": m.old, "new": m.new} for m in self.moved],
            "exit_code": self.exit_code,
        }


@dataclass(frozen=True)
class _Job:
    """One refresh: the patch, the variant carried forward, and the releases involved."""

    registry: Registry
    patch: Patch
    variant: Variant
    target: str
    base: str | None
    files: dict[str, bytes | None]  # the target release's copies, at the variant's paths
    versions: tuple[str, ...]
    moves: Mapping[str, str] = dataclasses.field(default_factory=dict)  # variant's -> release's

    def at_release_paths(self, files: Mapping[str, bytes | None]) -> dict[str, bytes | None]:
        """`files` (keyed by the variant's paths) keyed by where the target release has them."""
        return {self.moves.get(rel, rel): data for rel, data in files.items()}

    def result(self, outcome: Outcome, **fields: Any) -> RefreshResult:
        moved = tuple(MovedFile(old, new) for old, new in self.moves.items())
        return RefreshResult(
            self.patch.id,
            self.patch.kind,
            self.target,
            self.variant.name,
            self.base,
            outcome,
            moved=moved,
            **fields,
        )


def default_workdir(registry: Registry, patch_id: str) -> Path:
    return registry.root.resolve().parent / WORK_FOLDER / patch_id


# -- the entry points --------------------------------------------------------------------------


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
    if source is None:
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415 - keep imports light

        source = IndexSource()
    patch = registry.get(patch_id)
    if patch.kind == "python":
        raise UsageError(
            f"{patch_id} is a python patch: it carries no text to move onto a release; when"
            " `check` says missing-target, edit its touches and plugin.py by hand"
        )
    versions = source.versions()
    target = _resolve(version, versions, source.name)
    variant = _from_variant(patch, target, versions)
    probe = patch.upstream.probe
    wanted = tuple(dict.fromkeys([*variant.files, *([probe.file] if probe else [])]))
    with source.open(target) as tree:
        release = {rel: tree.read(rel) for rel in wanted}
        _refuse_if_fits(patch, variant, target, release)
        moves = _follow_moves(tree, patch, variant, target, release)
        target_files = {
            rel: tree.read(moves[rel]) if rel in moves else release[rel] for rel in variant.files
        }
    base = _base(variant, target, versions)
    job = _Job(registry, patch, variant, target, base, target_files, tuple(versions), moves)
    if patch.kind == "diff":
        if base is None:
            raise UsageError(
                f"{patch.id}: no release inside {variant.name}'s range {variant.vllm} before"
                f' {target} to merge from; give its base (e.g. base = "0.19.1") in patch.toml'
            )
        work = workdir or default_workdir(registry, patch.id)
        return _refresh_diff(job, source, base, work, write=write)
    return _refresh_runtime(job, source, write=write, picks=picks or {})


def finish(registry: Registry, patch_id: str, *, workdir: Path | None = None) -> RefreshResult:
    """Turn the edited files of an unfinished refresh into the new variant.

    Refused while a conflict marker is left, or when the patch changed since the refresh began.
    """
    patch = registry.get(patch_id)
    work = workdir or default_workdir(registry, patch.id)
    state = _load_state(work, patch.id)
    variant = next((v for v in patch.variants if v.name == state["from_variant"]), None)
    moves = state.get("moves", {})
    if (
        variant is None
        or variant.sha256 != state["from_sha256"]
        or patch.revision != state["revision"]
        or sorted(state["files"]) != sorted(variant.files)
        or not set(moves) <= set(variant.files)
    ):
        raise UsageError(
            f"{patch.id} changed since its refresh began (revision {state['revision']},"
            f" {state['from_variant']}); start again: --abort, then refresh --vllm"
            f" {state['vllm']}"
        )
    target: str = state["vllm"]
    release: dict[str, bytes | None] = {}
    edited: dict[str, bytes | None] = {}
    for rel, sha in state["files"].items():
        release[rel] = _stored_release(work, rel, sha)
        at = moves.get(rel, rel)
        path = work / at
        if not path.is_file():
            raise UsageError(f"{at} is missing from the work folder", path=work)
        edited[rel] = path.read_bytes()
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
    job = _Job(
        registry, patch, variant, target, state["base"], release, tuple(state["versions"]), moves
    )
    payload = _diff_of(job, edited)
    if not payload.strip():
        raise UsageError(
            f"the edited files are vllm {target}'s own: nothing is left of {patch.id}", path=work
        )
    result = _write_diff_variant(job, payload)
    _remove_work(work)
    return result


def abort(registry: Registry, patch_id: str, *, workdir: Path | None = None) -> Path:
    """Drop an unfinished refresh's work folder; the registry was never touched by it."""
    patch = registry.get(patch_id)
    work = workdir or default_workdir(registry, patch.id)
    _load_state(work, patch.id)  # refuse to delete a folder that is not ours
    _remove_work(work)
    return work


def _remove_work(work: Path) -> None:
    try:
        shutil.rmtree(work)
        if work.parent.name == WORK_FOLDER and not any(work.parent.iterdir()):
            work.parent.rmdir()
    except OSError as exc:  # the registry is written: a leftover folder is only clutter
        LOG.warning("could not remove the work folder %s: %s", work, exc.strerror)


# -- choosing what to refresh ------------------------------------------------------------------


def _resolve(version: str, versions: list[str], source_name: str) -> str:
    if not versions:
        raise UsageError(f"the {source_name} source offers no release")
    if version == "latest":
        return versions[-1]
    try:
        wanted = Version(version)
    except InvalidVersion:
        raise UsageError(f"--vllm {version!r} is not a PEP 440 version") from None
    for known in versions:
        if Version(known) == wanted:
            return known
    raise UsageError(
        f"vllm {version} is not a release the {source_name} source offers"
        f"{did_you_mean(version, versions)}"
    )


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


def _read(source: ReleaseSource, version: str, files: tuple[str, ...]) -> dict[str, bytes | None]:
    with source.open(version) as tree:
        return {rel: tree.read(rel) for rel in files}


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


def _follow_moves(
    tree: ReleaseTree,
    patch: Patch,
    variant: Variant,
    target: str,
    files: Mapping[str, bytes | None],
) -> dict[str, str]:
    """Where the target release moved the variant's missing files (as `check` finds them);
    refused when one has no new home (removed), or for a runtime patch."""
    missing = tuple(
        rel for rel in variant.files if files.get(rel) is None and not _added(variant, rel)
    )
    if not missing:
        return {}
    moves = moved_files(tree, variant, missing)
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
    return any(d.path == rel and d.added for d in variant.diffs)


# -- diff patches: the three-way merge ---------------------------------------------------------


def _refresh_diff(
    job: _Job, source: ReleaseSource, base: str, work: Path, *, write: bool
) -> RefreshResult:
    patch, variant, target = job.patch, job.variant, job.target
    files = variant.files
    base_files = _read(source, base, files)
    ev = evaluate(patch, variant, base_files.get)
    if ev.state != "applies":
        raise UsageError(
            f"{patch.id}: {variant.name} does not apply to vllm {base} ({ev.state}), the release"
            " taken as the one it was written against; give its base in patch.toml"
        )
    patched = {rel: ev.changes.get(rel, base_files[rel]) for rel in files}
    labels = MergeLabels(
        ours=f"vllm {target}", base=f"vllm {base} (base)", theirs=f"{patch.id} on vllm {base}"
    )
    with (
        tempfile.TemporaryDirectory(prefix="patchset-refresh-") as tmp,
        scratch_repo(Path(tmp) / "repo") as repo,
    ):
        base_commit = repo.commit_files(base_files, f"vllm {base}")
        repo.branch("patched", base_commit)
        repo.commit_files(patched, f"{patch.id} {variant.name} on vllm {base}")
        repo.branch("release", base_commit)
        release_commit = repo.commit_files(job.files, f"vllm {target}")
        conflicted = repo.merge("patched", labels)
        merged = {rel: repo.read(rel) for rel in files}
        clean = not conflicted and not job.moves
        payload = repo.diff(release_commit, "HEAD", files) if clean else b""
    if job.moves and not conflicted:  # the diff names the paths the release has
        payload = _diff_of(job, merged)
    if conflicted:
        conflicts = tuple(
            Conflict(job.moves.get(rel, rel), tuple(conflict_lines(merged[rel] or b"")))
            for rel in files
            if rel in conflicted
        )
        if write:
            _write_work(job, work, merged)
        return job.result("conflict", conflicts=conflicts, workdir=work if write else None)
    if not payload.strip():
        raise UsageError(
            f"merging {patch.id} into vllm {target} changes nothing: the release holds an"
            " equivalent change; nothing to refresh"
        )
    if not write:
        return job.result(
            "proposed",
            variant=_payload_name(patch, target, ".diff"),
            payload=payload.decode("utf-8", errors="replace"),
        )
    return _write_diff_variant(job, payload)


def _diff_of(job: _Job, edited: Mapping[str, bytes | None]) -> bytes:
    """`git diff` of the target release's files against `edited` (both keyed by the variant's
    paths), at the paths the release has them."""
    release = job.at_release_paths(job.files)
    with (
        tempfile.TemporaryDirectory(prefix="patchset-refresh-") as tmp,
        scratch_repo(Path(tmp) / "repo") as repo,
    ):
        release_commit = repo.commit_files(release, f"vllm {job.target}")
        edited_commit = repo.commit_files(
            job.at_release_paths(edited), f"{job.patch.id} edited onto vllm {job.target}"
        )
        return repo.diff(release_commit, edited_commit, tuple(release))


def _write_diff_variant(job: _Job, payload: bytes) -> RefreshResult:
    name = _payload_name(job.patch, job.target, ".diff")
    diffs = parse_diff(payload.decode("utf-8", errors="surrogateescape"), file=name)
    check = Variant(name, SpecifierSet(f">={job.target}"), "", diffs=diffs)
    ev = evaluate(job.patch, check, job.at_release_paths(job.files).get)
    if ev.state != "applies" or ev.warnings:
        raise PatchsetError(  # pragma: no cover -- git's own diff of the very files
            f"{name} does not apply cleanly to vllm {job.target}: {'; '.join(ev.failures)}"
        )
    written, ranges, revision = _record(job, name, payload)
    return job.result(
        "written",
        variant=name,
        revision=revision,
        payload=payload.decode("utf-8", errors="replace"),
        ranges=ranges,
        written=written,
    )


def _write_work(job: _Job, work: Path, merged: dict[str, bytes | None]) -> None:
    """The merged files (edit these) and, under .patchset/, the release's own and the state."""
    if work.exists() and any(work.iterdir()):
        raise UsageError(
            f"an unfinished refresh of {job.patch.id} is in {work}: finish it (--finish) or"
            " drop it (--abort)"
        )
    state_path = work / STATE
    created = not work.exists()
    try:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        for rel, data in merged.items():
            path = work / job.moves.get(rel, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data or b"")
        for rel, data in job.files.items():
            if data is not None:
                kept = state_path.parent / "release" / rel
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(data)
        state = {
            "schema": STATE_SCHEMA,
            "patch": job.patch.id,
            "revision": job.patch.revision,
            "from_variant": job.variant.name,
            "from_sha256": job.variant.sha256,
            "base": job.base,
            "vllm": job.target,
            "versions": list(job.versions),
            "moves": dict(job.moves),
            "files": {
                rel: None if data is None else hashlib.sha256(data).hexdigest()
                for rel, data in job.files.items()
            },
        }
        state_path.write_text(json.dumps(state, indent=2) + "\n", encoding="utf-8")  # last
    except OSError as exc:
        if created:
            shutil.rmtree(work, ignore_errors=True)
        raise UsageError(f"cannot write the work folder: {exc.strerror}", path=work) from None


_STATE_KEYS: dict[str, type] = {
    "revision": int,
    "from_variant": str,
    "from_sha256": str,
    "base": str,
    "vllm": str,
    "versions": list,
    "files": dict,
}


def _load_state(work: Path, patch_id: str) -> dict[str, Any]:
    path = work / STATE
    try:
        state = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no unfinished refresh of {patch_id} here", path=work) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable refresh state: {exc}", path=path) from None
    if not isinstance(state, dict) or state.get("schema") != STATE_SCHEMA:
        raise UsageError("not a patchset refresh state", path=path)
    for key, kind in _STATE_KEYS.items():
        if not isinstance(state.get(key), kind):
            raise UsageError(f"refresh state without a valid {key!r}", path=path)
    if state.get("patch") != patch_id:
        raise UsageError(f"this is a refresh of {state.get('patch')!r}, not {patch_id}", path=path)
    moves = state.setdefault("moves", {})  # absent in a state written before moves were followed
    if not isinstance(moves, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in moves.items()
    ):
        raise UsageError("refresh state without a valid 'moves'", path=path)
    return state


def _stored_release(work: Path, rel: str, sha: str | None) -> bytes | None:
    if sha is None:
        return None
    path = work / STATE
    kept = path.parent / "release" / rel
    data = kept.read_bytes() if kept.is_file() else b""
    if hashlib.sha256(data).hexdigest() != sha:
        raise UsageError("the release's copy was changed: start again (--abort)", path=kept)
    return data


# -- runtime patches: new anchors --------------------------------------------------------------


def _refresh_runtime(
    job: _Job, source: ReleaseSource, *, write: bool, picks: Mapping[str, int]
) -> RefreshResult:
    patch, variant, target = job.patch, job.variant, job.target
    names = [s.name for s in variant.sites]
    for name in picks:
        if name not in names:
            raise UsageError(
                f"--pick {name}: {variant.name} has no such site{did_you_mean(name, names)}"
            )
    texts = {rel: split_text(_decode(data or b""))[0] for rel, data in job.files.items()}
    base_texts: dict[str, list[str]] = {}
    if job.base is not None:
        base_texts = {
            rel: split_text(_decode(data))[0]
            for rel, data in _read(source, job.base, variant.files).items()
            if data is not None
        }
    sites = tuple(
        _site_refresh(site, texts[site.file], base_texts.get(site.file), picks.get(site.name))
        for site in variant.sites
    )
    if not all(s.resolved for s in sites):
        return job.result("unresolved", sites=sites)
    name = _payload_name(patch, target, ".sites.toml")
    old_text = (patch.folder / variant.name).read_text(encoding="utf-8")
    new_text = _new_sites_file(old_text, variant.sites, sites)
    failures = _check_sites(job, new_text, name)
    if failures:
        reason = "the proposed sites do not apply: " + "; ".join(failures)
        unresolved = tuple(s if s.anchor is None else _without_anchor(s, reason) for s in sites)
        return job.result("unresolved", sites=unresolved)
    shown = "".join(
        difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{variant.name}",
            tofile=f"b/{name}",
        )
    )
    if not write:
        return job.result("proposed", variant=name, payload=shown, sites=sites)
    written, ranges, revision = _record(job, name, new_text.encode("utf-8"))
    return job.result(
        "written",
        variant=name,
        revision=revision,
        payload=shown,
        ranges=ranges,
        sites=sites,
        written=written,
    )


def _without_anchor(site: SiteRefresh, reason: str) -> SiteRefresh:
    return dataclasses.replace(site, anchor=None, text_follows=False, reason=reason)


def _site_refresh(
    site: Site, lines: list[str], base_lines: list[str] | None, pick: int | None
) -> SiteRefresh:
    found = check_site(site, lines)
    if found.status == "applies":
        if pick is not None:
            raise UsageError(f"--pick {site.name}: its anchor still matches; nothing to pick")
        return SiteRefresh(site.name, site.file, "applies", line=found.line)
    if found.status != "anchor-not-found":
        return SiteRefresh(site.name, site.file, found.status, reason=found.describe())
    kept = _kept_lines(base_lines, site, lines) if base_lines is not None else set()
    candidates = tuple(
        AnchorCandidate(
            start + 1,
            ratio,
            window,
            unchanged=bool(window) and all(i in kept for i in range(start, start + len(window))),
        )
        for start, window, ratio in rank_windows(lines, site.anchor_lines, limit=4)
    )
    if pick is not None:
        if not 1 <= pick <= len(candidates):
            raise UsageError(f"--pick {site.name}={pick}: there are {len(candidates)} candidates")
        chosen: AnchorCandidate | None = candidates[pick - 1]
        reason = ""
    else:
        chosen, reason = _clear_best(candidates)
    if chosen is None:
        return SiteRefresh(site.name, site.file, found.status, candidates=candidates, reason=reason)
    anchor = _dedent(chosen.lines)
    matches = len(find_block(lines, anchor))
    if matches != 1:
        reason = f"candidate {candidates.index(chosen) + 1} occurs {matches} times in the file"
        return SiteRefresh(site.name, site.file, found.status, candidates=candidates, reason=reason)
    follows = (
        site.action == "replace" and len(find_block(_text_lines(site), site.anchor_lines)) == 1
    )
    return SiteRefresh(
        site.name,
        site.file,
        found.status,
        candidates=candidates,
        anchor="\n".join(anchor),
        picked=candidates.index(chosen) + 1,
        text_follows=follows,
    )


def _clear_best(candidates: tuple[AnchorCandidate, ...]) -> tuple[AnchorCandidate | None, str]:
    eligible = [c for c in candidates if not c.unchanged]
    if not eligible:
        return None, "no candidate: every near window is code the base release has too"
    best = eligible[0]
    if best.similarity < MIN_SIMILARITY:
        return None, f"the best candidate is only {best.similarity:.0%} alike; pick one"
    if len(eligible) > 1 and best.similarity - eligible[1].similarity < MARGIN:
        return None, (
            f"no clear best: {best.similarity:.0%} at line {best.line} and"
            f" {eligible[1].similarity:.0%} at line {eligible[1].line}; pick one"
        )
    return best, ""


def _kept_lines(base_lines: list[str], site: Site, lines: list[str]) -> set[int]:
    """0-based lines of the target that are base-release lines outside the anchor, unchanged."""
    anchor_at = find_block(base_lines, site.anchor_lines)
    if len(anchor_at) != 1:
        return set()
    start, size = anchor_at[0], len(site.anchor_lines)
    fold = [" ".join(line.split()) for line in base_lines]
    new = [" ".join(line.split()) for line in lines]
    kept: set[int] = set()
    matcher = difflib.SequenceMatcher(None, fold, new, autojunk=False)
    for tag, i1, i2, j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            kept.update(j1 + k for k in range(i2 - i1) if not start <= i1 + k < start + size)
    return kept


def _dedent(lines: tuple[str, ...]) -> list[str]:
    block = textwrap.dedent("\n".join(lines)).splitlines()
    while block and not block[-1].strip():
        block.pop()
    while block and not block[0].strip():
        block.pop(0)
    return [line.rstrip() for line in block]


def _text_lines(site: Site) -> list[str]:
    """A replace site's text as a block (edited_lines without the marker comment)."""
    return site.edited_lines()[1:]


def _new_text(site: Site, anchor: list[str]) -> str:
    """A replace site's text with its copy of the old anchor swapped for the new one."""
    text = _text_lines(site)
    at = find_block(text, site.anchor_lines)[0]
    first = text[at]
    indent = first[: len(first) - len(first.lstrip())]
    new = [f"{indent}{line}" if line.strip() else "" for line in anchor]
    return "\n".join([*text[:at], *new, *text[at + len(site.anchor_lines) :]])


def _new_sites_file(old_text: str, old: tuple[Site, ...], sites: tuple[SiteRefresh, ...]) -> str:
    """The old sites file with new anchors (and texts that follow them); comments kept."""
    by_name = {s.name: s for s in old}
    doc = tomlkit.parse(old_text)
    for table in doc["site"]:
        refreshed = next(s for s in sites if s.site == table["name"])
        if refreshed.anchor is None:
            continue
        anchor = refreshed.anchor.splitlines()
        table["anchor"] = _multiline(anchor)
        if refreshed.text_follows:
            table["text"] = _multiline(_new_text(by_name[refreshed.site], anchor).splitlines())
    return tomlkit.dumps(doc)


def _multiline(lines: list[str]) -> Any:
    """A multi-line TOML string written as the registry's files write them: the opening
    quotes alone on their line (tomlkit would put the first line right after them)."""
    body = tomlkit.string("\n".join(lines) + "\n", multiline=True).as_string()[3:-3]
    return tomlkit.parse(f'v = """\n{body}"""\n')["v"]


def _check_sites(job: _Job, text: str, name: str) -> list[str]:
    """Load the new sites file as the registry will, and dry-run it on the target release."""
    with tempfile.TemporaryDirectory(prefix="patchset-refresh-") as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        sites = load_sites(path)
    variant = Variant(name, SpecifierSet(f">={job.target}"), "", sites=sites)
    ev = evaluate(job.patch, variant, job.files.get)
    return [] if ev.state == "applies" else list(ev.failures) or [ev.state]


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


# -- writing the new variant -------------------------------------------------------------------


def _payload_name(patch: Patch, target: str, suffix: str) -> str:
    taken = {v.name for v in patch.variants} | {p.name for p in patch.folder.iterdir()}
    name = f"v{target}{suffix}"
    number = 2
    while name in taken:
        name = f"v{target}-{number}{suffix}"
        number += 1
    return name


def _record(
    job: _Job, name: str, data: bytes
) -> tuple[tuple[Path, ...], tuple[RangeChange, ...], int]:
    """Add the payload, a variant for it from the target on, cap the old variant below the
    target, widen the patch's range to hold it, bump the revision; all in one checked write."""
    patch, variant, target, versions = job.patch, job.variant, job.target, job.versions
    target_v = Version(target)
    later = next(
        (
            v
            for v in versions
            if Version(v) > target_v
            and any(
                other is not variant and other.vllm.contains(Version(v), prereleases=True)
                for other in patch.variants
            )
        ),
        None,
    )
    new_range = range_text([f">={target}", f"<{later}" if later else ""])
    after = next((v for v in versions if Version(v) > target_v), None)
    changes: list[RangeChange] = []
    revision = patch.revision + 1

    def edit(doc: TOMLDocument) -> None:
        doc["revision"] = revision
        _add_targets(doc, list(job.moves.values()))
        top = str(doc["vllm"])
        widened = _widen(top, target, after)
        if widened != top:
            doc["vllm"] = widened
            changes.append(RangeChange("vllm", top, widened))
        new_table = _variant_table(name, new_range, target)
        if "variants" in doc:
            tables = doc["variants"]
            for table in tables:
                if table["payload"] == variant.name:
                    old = str(table["vllm"])
                    capped = _cap(old, target)
                    if capped != old:
                        table["vllm"] = capped
                        changes.append(RangeChange(variant.name, old, capped))
            tables.append(new_table)
        else:
            capped = _cap(top, target)
            old_table = _variant_table(variant.name, capped, variant.base)
            for key in ("payload", "base"):
                if key in doc:
                    del doc[key]
            tables = tomlkit.aot()
            tables.append(old_table)
            tables.append(new_table)
            doc.append("variants", tables)
            changes.append(RangeChange(variant.name, top, capped))
        changes.append(RangeChange(name, None, new_range))

    change = RegistryChange(job.registry)
    payload_path = change.add_file(patch, name, data)
    change.edit_toml(patch, edit)
    after_write = change.commit()
    picked = after_write.get(patch.id).variant_for(target)
    if picked is None or picked.name != name:  # pragma: no cover -- the ranges above say so
        raise RegistryError(f"{name} is not the variant for {target}", path=patch.folder)
    return (payload_path, patch.folder / "patch.toml"), tuple(changes), revision


def _variant_table(payload: str, vllm: str, base: str | None) -> Any:
    table = tomlkit.table()
    table["payload"] = payload
    table["vllm"] = vllm
    if base is not None:
        table["base"] = base
    return table


def _add_targets(doc: TOMLDocument, paths: list[str]) -> None:
    """The moved files' new paths added to `targets` (the old paths stay: older variants
    patch them); a one-line list that grows too long is laid out one path a line."""
    targets = doc["targets"]
    new = [p for p in paths if p not in targets]
    if not new:
        return
    one_line = "\n" not in targets.as_string()
    for path in new:
        targets.append(path)
    if one_line and len(f"targets = {targets.as_string()}") > 100:
        targets.multiline(True)


def _parts(spec: str) -> list[str]:
    return [part.strip() for part in spec.split(",") if part.strip()]


def _operator_of(part: str) -> str:
    (one,) = list(SpecifierSet(part))
    return one.operator


def _cap(spec: str, target: str) -> str:
    """`spec` narrowed to releases before `target` (an upper bound at or below it is kept)."""
    limit = Version(target)
    parts = _parts(spec)
    kept = []
    bounded = False
    for part in parts:
        ops = SpecifierSet(part)
        (one,) = list(ops)
        if one.operator in ("<", "<="):
            bound = Version(one.version)
            if bound < limit or (bound == limit and one.operator == "<"):
                bounded = True
            else:
                continue
        kept.append(part)
    if not bounded:
        kept.append(f"<{target}")
    return spec if kept == parts else range_text(kept)


def _widen(spec: str, target: str, after: str | None) -> str:
    """`spec` made to hold `target`: a bound that shut it out moves to the next release."""
    version = Version(target)
    if SpecifierSet(spec).contains(version, prereleases=True):
        return spec
    parts = _parts(spec)
    kept = [p for p in parts if SpecifierSet(p).contains(version, prereleases=True)]
    shut = [p for p in parts if p not in kept]
    if after is not None and any(_operator_of(p) in ("<", "<=") for p in shut):
        kept.append(f"<{after}")
    widened = range_text(kept)
    if not SpecifierSet(widened).contains(version, prereleases=True):  # pragma: no cover
        raise UsageError(f"cannot widen the range {spec!r} to hold {target}; edit it by hand")
    return widened
