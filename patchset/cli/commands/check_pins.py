"""`check --build FILE` / `check --builds`: each definition's patches on its pinned release
and, as "would carry forward", on the later releases the command line names."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from patchset.cli import github
from patchset.cli.output import console, print_json, shown, styled, table, text
from patchset.errors import UsageError
from patchset.registry import Registry
from patchset.registry.builds import BuildDefinition, load_definition, load_definitions
from patchset.release_check import CheckReport, parallel
from patchset.release_check.pins import BuildsReport, check_builds
from patchset.release_check.prefetch import ProgressBar
from patchset.sources.base import ReleaseSource


def definitions(args: argparse.Namespace) -> list[BuildDefinition]:
    """The definitions `--build FILE`... and `--builds` (every one in the builds folder) name."""
    found = [load_definition(path) for path in args.build]
    if args.all_builds:
        found += load_definitions(args.builds)
        if not found:
            raise UsageError(f"--builds: no build definition in {args.builds}")
    return list({d.file.resolve(): d for d in found}.values())


def run(
    args: argparse.Namespace,
    registry: Registry,
    source: ReleaseSource,
    markdown: Callable[[CheckReport, Registry], str],
    *,
    progress: ProgressBar | None = None,
) -> int:
    """The check of the definitions as `patchset.check` runs one (the files they read
    prefetched, with `progress`), shown as the command line asks."""
    report = check_builds(
        registry,
        definitions(args),
        source=source,
        versions=args.vllm or (),
        since=args.since,
        pre=args.pre,
        max_fuzz=args.fuzz,
        served=args.served,
        progress=progress,
        jobs=parallel.wanted(args.jobs),
    )
    if args.format == "json":
        print_json(report.to_dict())
    elif args.format == "github":
        pinned = report.pinned_report()  # annotations only for what the definitions run
        sys.stdout.write(shown(github.render(pinned, registry, markdown(pinned, registry))))
    elif args.format == "markdown":
        sys.stdout.write(shown(_markdown(report)) + "\n")
        _refusals(report)
    else:
        _table(report)
    return report.exit_code


def _table(report: BuildsReport) -> None:
    out = table(None, ["definition", "vLLM", "patch", "verdict", "role"])
    for row in report.rows:
        role = "pinned" if row.role == "pinned" else "would carry forward"
        out.add_row(
            text(row.definition),
            text(row.result.vllm),
            text(row.result.patch),
            styled(row.result.verdict),
            text(role),
        )
    console().print(out)
    failing = sum(1 for r in report.rows if r.attention)
    console().print(
        f"{failing} pinned results need attention; carried-forward ones never fail", markup=False
    )
    _refusals(report)


def _refusals(report: BuildsReport) -> None:
    """The planner's refusals, all of them, one line each (what export would refuse)."""
    for planned in report.plans:
        for refusal in planned.refusals:
            console().print(f"{planned.definition}: refused: {refusal.line()}", markup=False)
    if report.plans:
        console().print(
            f"{report.refusals} refusals `runtime export` would make (switches:"
            f" {', '.join(dict.fromkeys(s for p in report.plans for s in p.sets))})",
            markup=False,
        )


def _markdown(report: BuildsReport) -> str:
    lines = ["| definition | vLLM | patch | verdict | role |", "|---|---|---|---|---|"]
    for row in report.rows:
        role = "pinned" if row.role == "pinned" else "would carry forward"
        verdict = f"**{row.result.verdict}**" if row.attention else row.result.verdict
        lines.append(
            f"| {row.definition} | {row.result.vllm} | {row.result.patch} | {verdict} | {role} |"
        )
    return "\n".join(lines)
