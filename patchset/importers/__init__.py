"""Whole collections into a project: `patchset import genesis DIR`, `patchset import club-3090 DIR`.

Each importer reads its collection (`collect`) into draft patches and a list of what it left
out and why; `land` writes them into the registry whole or not at all. The collection's own
code is never imported or run, except a club-3090 anchor script under `run_scripts`, each in a
scratch copy of the release it targets.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from patchset.importers.definitions import write_plans
from patchset.importers.land import land, read_state
from patchset.importers.model import Collected, CollectionError, Entry, ImportAction, ImportReport
from patchset.sources.base import ReleaseSource

COLLECTIONS = ("genesis", "club-3090")


def import_collection(
    collection: str,
    folder: Path | str,
    registry: Path | str,
    *,
    only: list[str] | tuple[str, ...] = (),
    dry_run: bool = False,
    run_scripts: bool = False,
    builds: Path | str | None = None,
    script_timeout: float = 60.0,
    sources: list[str] | tuple[str, ...] = (),
) -> ImportReport:
    """Import the collection checked out at `folder` into the registry at `registry`."""
    start = time.perf_counter()
    source = Path(folder)
    if not source.is_dir():
        raise CollectionError(f"{source}: no such folder")
    wanted = set(only) or None
    if collection == "genesis":
        from patchset.importers import genesis  # noqa: PLC0415 - one importer per call
        from patchset.sources import parse_source  # noqa: PLC0415

        given = [parse_source(spec) for spec in sources]
        collected = genesis.collect(source, only=wanted, sources=given)
    elif collection == "club-3090":
        from patchset.importers import club  # noqa: PLC0415 - one importer per call
        from patchset.sources import parse_source  # noqa: PLC0415

        releases = [parse_source(spec) for spec in sources] or [parse_source(None)]
        collected = club.collect(
            source,
            only=wanted,
            run_scripts=run_scripts,
            timeout=script_timeout,
            sources=releases,
        )
    else:
        raise CollectionError(
            f"unknown collection {collection!r} (one of {', '.join(COLLECTIONS)})"
        )
    target = Path(registry)
    written = None if builds is None else Path(builds)
    if collected.plans and written is not None:
        from patchset.sources import parse_source  # noqa: PLC0415

        releases = [parse_source(spec) for spec in sources] or [parse_source(None)]
    else:
        releases = []
    if dry_run:
        report = _rehearse(collected, target, wanted, written, releases)
    else:
        report = land(collected, target, only=wanted)
        _definitions(report, collected, target, written, releases, dry_run=False)
    no_longer_importable(report, collected, target)
    report.notes = [*collected.notes, *report.notes]
    report.seconds = time.perf_counter() - start
    return report


_WOULD: dict[str, ImportAction] = {"added": "would-add", "updated": "would-update"}


def _definitions(
    report: ImportReport,
    collected: Collected,
    registry: Path,
    builds: Path | None,
    releases: list[ReleaseSource],
    *,
    dry_run: bool,
) -> None:
    """The build definitions the importer proposes, planned on the landed registry: those
    that `runtime export` takes are written (named in the report), the rest said."""
    if not collected.plans:
        return
    planned = write_plans(collected.plans, registry, builds, releases, dry_run=dry_run)
    report.builds += [b for b in planned.written if b not in report.builds]
    report.notes += planned.notes


def _rehearse(
    collected: Collected,
    registry: Path,
    only: set[str] | None,
    builds: Path | None,
    releases: list[ReleaseSource],
) -> ImportReport:
    """A dry run: the real import, every check included (a patch that does not load, one
    validate refuses), landed in a throwaway copy of the registry; its actions said as what
    would be done. The registry and the build folder are not written."""
    with tempfile.TemporaryDirectory(prefix=".patchset-dry-run-") as scratch:
        copy = Path(scratch) / "patches"
        if registry.is_dir():
            shutil.copytree(registry, copy, symlinks=True)
        report = land(collected, copy, only=only, builds=None)
        _definitions(report, collected, copy, builds, releases, dry_run=True)
    report.dry_run = True
    for entry in report.entries:
        entry.action = _WOULD.get(entry.action, entry.action)
        entry.reasons = [r.replace(str(copy), str(registry)) for r in entry.reasons]
    return report


def no_longer_importable(report: ImportReport, collected: Collected, registry: Path) -> None:
    """A patch imported before that the collection still lists but that can no longer be
    imported is not "removed from the collection": its entry says why it is not importable
    now, and that its last good version stays in the project (one line)."""
    state = read_state(registry, collected.collection)
    by_source = {str(r.get("source", pid)): (pid, r) for pid, r in state.items()}
    still = {e.source_id: e for e in report.entries if e.action != "removed"}
    kept: list[Entry] = []
    for entry in report.entries:
        if entry.action == "removed" and entry.source_id in still:
            continue  # the collection still has it: said on its own entry below
        kept.append(entry)
    for entry in kept:
        if (
            entry.status != "not-imported"
            or entry.action == "removed"
            or entry.source_id not in by_source
        ):
            continue
        pid, record = by_source[entry.source_id]
        if not (registry / pid / "patch.toml").is_file():
            continue
        if entry.reasons and entry.reasons[0].startswith("id clash"):
            continue
        revision = record.get("revision", 1)
        why = "; ".join(entry.reasons) or "no reason given"
        entry.patch = pid
        entry.action = "kept"
        entry.reasons = [
            f"no longer importable ({why}); its last good version (revision {revision}) is"
            " kept in the project"
        ]
    report.entries = kept


__all__ = ["COLLECTIONS", "CollectionError", "ImportReport", "import_collection"]
