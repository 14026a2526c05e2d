"""`patchset import genesis|club-3090 DIR`: a whole collection into the current project."""

from __future__ import annotations

import argparse
from pathlib import Path

from patchset.cli.options import add_command, repeatable, switch
from patchset.cli.output import FORMATS, console, emit
from patchset.importers import COLLECTIONS, ImportReport, import_collection

DESCRIPTION = """\
Import a whole patch collection from a checkout DIR into this project's registry, landing
whole or not at all: genesis (Sandermage's Genesis: its registry and patch modules, read
statically) or club-3090 (its PR diffs, overlays, sitecustomize hooks and patches.yml; its
anchor scripts only with --run-scripts). Run again on a newer checkout: changed patches are
updated (revision bumped), new ones added, removed ones reported, and your own edits to
imported patches kept and named. Build definitions that export are written to the builds
folder (Genesis: per final release it pins; club-3090: per model and pin). Exit 1 when a
collection file did not parse (named and skipped); exit 2 when DIR is not the named
collection, or holds a link leading out of it, a link loop, a special file or a patches.yml
entry of the wrong type (nothing written)."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "import", run, DESCRIPTION)
    p.add_argument(
        "collection", choices=COLLECTIONS, metavar="COLLECTION", help="genesis | club-3090"
    )
    p.add_argument("dir", type=Path, metavar="DIR", help="a checkout of the collection")
    p.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="ID",
        help="only these patches (the collection's ids or patchset's)",
    )
    switch(p, "--dry-run", "say what would change; write nothing")
    switch(
        p,
        "--run-scripts",
        "club-3090: run its anchor scripts (the collection's own code) in scratch copies"
        " of each release, each in a bubblewrap sandbox (refused, exit 3, without bwrap)",
    )
    p.add_argument(
        "--script-timeout",
        type=float,
        default=60.0,
        metavar="S",
        help="seconds per script run (default 60)",
    )
    repeatable(
        p,
        "--source",
        "SPEC",
        "where releases come from: club-3090 compares overlays with them (default: the"
        " index); genesis, only when given, writes a variant per run of releases for a patcher"
        " that picks its file at run time; repeatable",
    )
    p.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace) -> int:
    report = import_collection(
        args.collection,
        args.dir,
        args.registry,
        sources=args.source,
        only=args.only,
        dry_run=args.dry_run,
        run_scripts=args.run_scripts,
        builds=args.builds,
        script_timeout=args.script_timeout,
    )
    emit(report, args.format, _render)
    return report.exit_code


def _render(report: ImportReport) -> None:
    con = console()

    def say(text: str) -> None:
        con.print(text, markup=False, soft_wrap=True, highlight=False)

    for entry in report.entries:
        what = entry.patch or "-"
        line = f"{entry.status:<19} {entry.action:<9} {entry.source_id} -> {what}"
        if entry.reasons:
            line += ": " + "; ".join(entry.reasons)
        if entry.kept:
            line += f" (kept your edits: {', '.join(entry.kept)})"
        say(line)
    for file, why in report.broken.items():
        say(f"skipped {file}: {why}")
    if report.ran:
        say(
            f"ran {len(report.ran)} of the collection's own anchor scripts (its code, not"
            " patchset's), each on scratch copies of releases: " + "; ".join(report.ran)
        )
    for name in report.builds:
        say(f"{'would write ' if report.dry_run else ''}build definition builds/{name}")
    for note in report.notes:
        say(note)
    prefix = "would import" if report.dry_run else "imported"
    say(
        f"{report.collection} @ {(report.commit or 'unknown')[:12]}: {prefix}"
        f" {report.count('imported')}, with loss {report.count('imported-with-loss')},"
        f" not imported {report.count('not-imported')}, out of scope {report.count('out-of-scope')}"
        f" ({report.seconds:.1f} s)"
    )
