"""Whole collections into a project: `patchset import genesis DIR`, `patchset import club-3090 DIR`.

Each importer reads its collection (`collect`) into draft patches and a list of what it left
out and why; `land` writes them into the registry whole or not at all. The collection's own
code is never imported or run, except a club-3090 anchor script under `run_scripts`, each in a
scratch copy of the release it targets.
"""

from __future__ import annotations

import time
from pathlib import Path

from patchset.importers.land import land
from patchset.importers.model import CollectionError, ImportReport

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
    report = land(
        collected,
        Path(registry),
        dry_run=dry_run,
        only=wanted,
        builds=None if builds is None else Path(builds),
    )
    report.seconds = time.perf_counter() - start
    return report


__all__ = ["COLLECTIONS", "CollectionError", "ImportReport", "import_collection"]
