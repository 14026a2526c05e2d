"""Diff patches: a three-way git merge of the variant (applied to its base) with the target
release, and the new diff variant it gives.
"""

from __future__ import annotations

import tempfile
from collections.abc import Mapping
from pathlib import Path

from packaging.specifiers import SpecifierSet

from patchset.adapters.gitrepo import MergeLabels, conflict_lines, scratch_repo
from patchset.engine.evaluate import evaluate
from patchset.errors import PatchsetError, UsageError
from patchset.refresh.job import Conflict, Job, RefreshResult, read_release
from patchset.refresh.landed import refuse_deletions
from patchset.refresh.record import payload_name, record
from patchset.refresh.workdir import write_work
from patchset.registry import Variant
from patchset.registry.diffs import parse_diff
from patchset.sources.base import ReleaseSource


def refresh_diff(
    job: Job, source: ReleaseSource, base: str, work: Path, *, write: bool
) -> RefreshResult:
    patch, variant, target = job.patch, job.variant, job.target
    files = variant.files
    base_files = read_release(source, base, files, job=job)  # on top of what it requires
    ev = evaluate(patch, variant, base_files.get)
    if ev.state != "applies":
        raise UsageError(
            f"{patch.id}: {variant.name} does not apply to vllm {base} ({ev.state}), the release"
            " taken as the one it was written against; give its base in patch.toml"
        )
    patched = {
        rel: None if rel in ev.removed else ev.changes.get(rel, base_files[rel]) for rel in files
    }
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
        payload = diff_of(job, merged)
    if conflicted:
        conflicts = tuple(
            Conflict(job.moves.get(rel, rel), tuple(conflict_lines(merged[rel] or b"")))
            for rel in files
            if rel in conflicted
        )
        if write:
            write_work(job, work, merged)
        return job.result("conflict", conflicts=conflicts, workdir=work if write else None)
    refuse_deletions(patch.id, variant, target, job.files, merged)
    if not payload.strip():
        raise UsageError(
            f"merging {patch.id} into vllm {target} changes nothing: the release holds an"
            " equivalent change; nothing to refresh"
        )
    if not write:
        return job.result(
            "proposed",
            variant=payload_name(patch, target, ".diff"),
            payload=payload.decode("utf-8", errors="replace"),
        )
    return write_diff_variant(job, payload)


def diff_of(job: Job, edited: Mapping[str, bytes | None]) -> bytes:
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


def write_diff_variant(job: Job, payload: bytes) -> RefreshResult:
    name = payload_name(job.patch, job.target, ".diff", payload)
    diffs = parse_diff(payload.decode("utf-8", errors="surrogateescape"), file=name)
    check = Variant(name, SpecifierSet(f">={job.target}"), "", diffs=diffs)
    ev = evaluate(job.patch, check, job.at_release_paths(job.files).get)
    if ev.state != "applies" or ev.warnings:
        raise PatchsetError(  # pragma: no cover -- git's own diff of the very files
            f"{name} does not apply cleanly to vllm {job.target}: {'; '.join(ev.failures)}"
        )
    written, changes, revision = record(job, name, payload)
    return job.result(
        "written",
        variant=name,
        revision=revision,
        payload=payload.decode("utf-8", errors="replace"),
        ranges=changes,
        written=written,
    )
