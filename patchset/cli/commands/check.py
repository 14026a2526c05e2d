"""`patchset check`: which patches a vLLM release still needs, from the released code."""

from __future__ import annotations

import argparse
import sys
import threading

from rich.progress import BarColumn, DownloadColumn, Progress
from rich.text import Text

from patchset.adapters import net
from patchset.adapters.actions import workflow_command
from patchset.cli import github
from patchset.cli.loading import load
from patchset.cli.options import served_arg
from patchset.cli.output import (
    OUTCOME_STYLE,
    DescriptionColumn,
    console,
    err_console,
    print_json,
    progress_console,
    shown,
    styled,
    table,
    text,
)
from patchset.errors import ExitCode, UsageError
from patchset.registry import Registry
from patchset.registry.write import write_ranges
from patchset.release_check.verdicts import CheckReport, CheckResult, Explain, check
from patchset.sources import parse_source, select
from patchset.sources.base import DownloadProgress, ReleaseSource

DESCRIPTION = """\
Check every patch against one or more vLLM releases and give one verdict per pair:
needed (applies, release lacks the fix), upstream (reverse applies or the upstream probe
matches), conflict, partial (some runtime sites match), missing-target (file absent; a
moved file is named). Whether the release is in the patch's declared range is shown beside."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "check",
        help="which patches a vLLM release still needs",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--vllm",
        action="append",
        default=[],
        metavar="VERSION",
        help="a release to check (repeatable; 'latest' is the newest on the index)",
    )
    p.add_argument(
        "--since",
        metavar="VERSION",
        help="every release from VERSION on, VERSION included (none yet: one line, exit 0)",
    )
    p.add_argument(
        "--pre",
        action="store_true",
        help="let 'latest' and --since pick pre-releases too (as pip --pre); yanked files never",
    )
    p.add_argument(
        "--source",
        metavar="SPEC",
        help="where releases come from: the package index (default), PATH (a checkout,"
        " unpacked sdist or site-packages), git:PATH (a vLLM clone), git:PATH@REF (one"
        " branch tip, as the next release after its tag) or image:REF",
    )
    p.add_argument(
        "--source-version",
        metavar="X",
        help="the release a folder or git:PATH@REF tree holds, when it cannot be read",
    )
    p.add_argument("--index-url", metavar="URL", help="the package index (default: pip's)")
    p.add_argument("--offline", action="store_true", help="use the cache only")
    p.add_argument(
        "--artifact",
        choices=("wheel", "sdist"),
        default=None,
        help="read releases from their wheels (default, the sdist as fallback) or their sdists",
    )
    p.add_argument(
        "--verify-full",
        action="store_true",
        help="download each release's whole artifact and check the index's sha256 first"
        " (default: each file read is checked against the wheel's RECORD and CRC)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=net.DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait on the index without hearing from it, retries included"
        f" (default {net.DEFAULT_TIMEOUT:g}): a hung index ends the check after that long;"
        " a request that fails quickly is tried 3 more times",
    )
    p.add_argument("--patch", action="append", dest="patches", metavar="ID")
    p.add_argument("--fuzz", type=int, default=0, metavar="N")
    p.add_argument(
        "--served",
        type=served_arg,
        metavar="KEY=VALUE,...",
        help="what is served, for runtime sites with `when` (as apply --served); sites it"
        " leaves out read 'conditional' (default: unknown)",
    )
    p.add_argument(
        "--explain",
        action="store_true",
        help="give every failing hunk its nearest lines, out-of-range releases and JSON"
        " included (by default only failures in the patch's range, and none in JSON)",
    )
    p.add_argument(
        "--suggest-ranges",
        action="store_true",
        help="print, per patch, the releases where it is needed beside its declared range",
    )
    p.add_argument(
        "--write",
        action="store_true",
        help="with --suggest-ranges: record each range as the patch's vllm in patch.toml"
        " (comments and formatting kept; a patch needed in separate runs is left as is)",
    )
    p.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="FILE",
        help="a build definition: its patches on the release it pins (failing), and on the"
        " later releases --vllm/--since name as 'would carry forward' (never failing)",
    )
    p.add_argument(
        "--builds",
        dest="all_builds",
        action="store_true",
        help="as --build, for every definition in the builds folder",
    )
    p.add_argument(
        "--format",
        choices=("table", "json", "markdown", "github"),
        default="table",
        help="github: workflow annotations (errors where the exit code is 1), and the markdown"
        " table in $GITHUB_STEP_SUMMARY when set",
    )
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    if args.fuzz < 0:  # before any download
        raise UsageError(f"--fuzz {args.fuzz}: give 0 or more context lines to drop")
    if args.write and not args.suggest_ranges:
        raise UsageError("--write records the suggested ranges: give --suggest-ranges too")
    registry = load(args.registry, args.patches)
    source = _source(args)
    if args.build or args.all_builds:  # per-build pins: patchset/cli/pins.py
        from patchset.cli import pins  # noqa: PLC0415

        return pins.run(args, registry, source, render_markdown)
    versions = select.for_check(source, versions=args.vllm, since=args.since, pre=args.pre)
    if not versions:
        return _nothing_to_check(args, registry, source)
    _prefetch(source, versions, registry, args.patches)
    explain: Explain = "all" if args.explain else "none" if args.format == "json" else "in-range"
    report = check(
        registry,
        versions,
        source=source,
        patches=args.patches,
        max_fuzz=args.fuzz,
        explain=explain,
        served=args.served,
    )
    if args.format == "json":
        print_json(report.to_dict())
    elif args.format == "markdown":
        sys.stdout.write(shown(render_markdown(report, registry)) + "\n")
    elif args.format == "github":
        sys.stdout.write(shown(github.render(report, registry, render_markdown(report, registry))))
    else:
        show_table(report, registry, suggest=args.suggest_ranges, all_notes=args.explain)
    if args.write:
        written, _ = write_ranges(registry, report.suggested)
        out = console() if args.format == "table" else err_console()
        for line in written:
            out.print(f"range {line.status}: {line.describe()}", markup=False, soft_wrap=True)
    return report.exit_code


def _nothing_to_check(args: argparse.Namespace, registry: Registry, source: ReleaseSource) -> int:
    """`--since X` with no release at or after X yet: one line (JSON: an empty report)."""
    what = "release" if args.pre else "final release"
    line = (
        f"patchset check: no {what} at or after {args.since} on the {source.name} yet;"
        " nothing to check"
    )
    if args.format == "json":
        print_json(check(registry, [], source=source, patches=args.patches).to_dict())
    elif args.format == "github":
        sys.stdout.write(workflow_command("notice", line, title="patchset check") + "\n")
    else:
        sys.stdout.write(line + "\n")
    return ExitCode.OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: give between 0 and 3600 seconds")
    return value


def _source(args: argparse.Namespace) -> ReleaseSource:
    index_only = {
        "--artifact": args.artifact is not None,
        "--verify-full": args.verify_full,
        "--timeout": args.timeout != net.DEFAULT_TIMEOUT,
    }
    named = args.source is not None and args.source.strip() not in {"", "index"}
    if named and (flags := [flag for flag, given in index_only.items() if given]):
        raise UsageError(f"{', '.join(flags)}: only for the package index, not --source")
    if named or args.source_version is not None:
        return parse_source(
            args.source,
            index_url=args.index_url,
            offline=args.offline,
            prereleases=args.pre,
            version=args.source_version,
        )
    from patchset.sources.package_index import IndexSource  # noqa: PLC0415 -- light imports

    return IndexSource(
        args.index_url,
        offline=args.offline,
        artifact=args.artifact or "auto",
        verify_full=args.verify_full,
        timeout=args.timeout,
        prereleases=args.pre,
    )


def _prefetch(
    source: ReleaseSource, versions: list[str], registry: Registry, patches: list[str] | None
) -> None:
    """Fetch the releases (and, from the index, the patches' files) in parallel, with one
    progress bar on stderr when it is a terminal (none under -q)."""
    if source.offline:
        return
    selected = registry.select(patches)
    paths = {t for p in selected for t in p.targets} | {"vllm/_version.py"}
    paths |= {p.upstream.probe.file for p in selected if p.upstream.probe}

    from patchset.sources.package_index import IndexSource  # noqa: PLC0415 -- light imports

    def fetch(progress: DownloadProgress | None) -> None:
        if isinstance(source, IndexSource):
            source.prefetch(versions, paths=sorted(paths), progress=progress)
        else:
            source.prefetch(versions, progress=progress)

    shown_on = progress_console()
    if shown_on is None or not shown_on.is_terminal:
        fetch(None)
        return
    counts: dict[str, tuple[int, int]] = {}  # version -> (bytes received, bytes expected)
    lock = threading.Lock()
    columns = (DescriptionColumn(), BarColumn(), DownloadColumn())
    with Progress(*columns, console=shown_on, transient=True) as progress:
        task = progress.add_task(f"vllm releases 0/{len(versions)}", total=None)

        def report(version: str, done: int, total: int) -> None:
            """The bar counts bytes (its end grows as each release's plan is known); the
            description, releases ready."""
            with lock:
                counts[version] = (done, total)
                ready = sum(1 for d, t in counts.values() if t and d >= t)
                progress.update(
                    task,
                    completed=sum(d for d, _ in counts.values()),
                    total=sum(t for _, t in counts.values()) or None,
                    description=f"vllm releases {ready}/{len(versions)}",
                )

        fetch(report)


SYMBOLS = {"needed": "N", "upstream": "U", "conflict": "C", "partial": "P", "missing-target": "M"}
LEGEND = (
    "N needed  U upstream  C conflict  P partial  M missing-target;"
    "  lower case: out of the patch's range;  !: signals disagree"
)
WIDE = 6  # more releases than this: one short symbol per cell, and a legend
MAX_NOTES = 40  # note lines a table shows; --explain shows them all


def _cell(r: CheckResult, *, variant: bool = False, short: bool = False) -> Text:
    if short:
        mark = SYMBOLS.get(r.verdict, "?")
        style = OUTCOME_STYLE.get(r.verdict, "") if r.in_range else "dim"
        cell = text(mark if r.in_range else mark.lower(), style)
        if r.disagreement:
            cell.append_text(text("!", "yellow"))
        return cell
    cell = styled(r.verdict)
    if r.disagreement:
        cell.append(" ").append_text(text("!", "yellow"))
    if not r.in_range:
        cell.append(" ").append_text(text("(out of range)", "dim"))
    if variant:  # for patches with several variants
        cell.append(" ").append_text(text(r.variant, "dim"))
    return cell


def _heads(versions: list[str]) -> list[str]:
    """Column heads; with many releases a shared leading "0." is dropped to save width."""
    if len(versions) > WIDE and all(v.startswith("0.") for v in versions):
        return [v[2:] for v in versions]
    return versions


def show_table(
    report: CheckReport, registry: Registry, *, suggest: bool, all_notes: bool = False
) -> None:
    """One row per patch and a column per release; past six releases each cell is one symbol
    under a legend. Notes are folded per patch and cut at `MAX_NOTES` lines, with a count."""
    con = console()
    versions = [i.version for i in report.releases]
    patches = [p for p in registry.patches if any(r.patch == p.id for r in report.results)]
    title = f"patchset check  (registry {registry.short_digest})"
    several = {p.id for p in patches if len(p.variants) > 1}
    short = len(versions) > WIDE
    found = {(r.vllm, r.patch): r for r in report.results}
    out = table(title, ["patch", *_heads(versions)])
    for patch in patches:
        cells = [
            _cell(found[(v, patch.id)], variant=patch.id in several, short=short) for v in versions
        ]
        out.add_row(f"{patch.id} r{patch.revision}", *cells)
    con.print(out)
    for patch in patches:  # switch, lifecycle, predicate: judged anyway, said here
        if patch.gates_text():
            con.print(f"{patch.id}: {patch.gates_text()}", markup=False)
    if short:
        con.print(LEGEND, style="dim", markup=False)
    notes = _notes(report)
    shown = notes if all_notes else notes[:MAX_NOTES]
    for line in shown:
        con.print(line, markup=False)
    if len(shown) < len(notes):
        con.print(
            f"... {len(notes) - len(shown)} more note lines (--explain shows them all;"
            " --format json has every detail)",
            markup=False,
        )
    if suggest:
        con.print()
        rows = table("suggested ranges (where needed)", ["patch", "declared", "needed in"])
        for patch in patches:
            rows.add_row(
                patch.id, str(patch.vllm), " | ".join(report.suggested.get(patch.id, ())) or "none"
            )
        con.print(rows)


def _span(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}..{versions[-1]} ({len(versions)})"


def _notes(report: CheckReport) -> list[str]:
    """Per patch with anything to say: its verdicts folded into runs of releases on one line,
    then each distinct detail of what needs a look (in its range, or a disagreement) once."""
    by_patch: dict[str, list[CheckResult]] = {}
    for r in report.results:
        by_patch.setdefault(r.patch, []).append(r)
    lines: list[str] = []
    for patch, results in by_patch.items():
        if all(r.verdict == "needed" and not r.shifted and not r.disagreement for r in results):
            continue
        runs: list[tuple[str, list[str]]] = []
        for r in results:
            if runs and runs[-1][0] == r.verdict:
                runs[-1][1].append(r.vllm)
            else:
                runs.append((r.verdict, [r.vllm]))
        lines.append(f"{patch}: " + "; ".join(f"{v} {_span(vs)}" for v, vs in runs))
        details: dict[tuple[str, str, str | None], list[str]] = {}
        for r in results:
            clean = r.verdict == "needed" and not r.shifted
            if (r.in_range and not clean) or r.disagreement:
                details.setdefault((r.verdict, r.detail, r.disagreement), []).append(r.vllm)
        for (verdict, detail, disagreement), vs in details.items():
            lines.append(f"    {_span(vs)}: {verdict}: {detail}")
            if disagreement:
                lines.append(f"    signals disagree: {disagreement}")
    return lines


def render_markdown(report: CheckReport, registry: Registry) -> str:
    versions = [i.version for i in report.releases]
    lines = [
        f"**patchset check** (registry `{registry.short_digest}`)",
        "",
        "| patch | " + " | ".join(versions) + " |",
        "|---|" + "---|" * len(versions),
    ]
    for patch in registry.patches:
        cells = [
            r.verdict + ("" if r.in_range else " (out of range)")
            for v in versions
            for r in report.results
            if r.vllm == v and r.patch == patch.id
        ]
        if cells:
            lines.append(f"| `{patch.id}` r{patch.revision} | " + " | ".join(cells) + " |")
    notes = [r for r in report.results if r.verdict != "needed" or r.disagreement]
    if notes:
        lines.append("")
        lines += [f"- {r.vllm} `{r.patch}`: **{r.verdict}**: {r.detail}" for r in notes]
    return "\n".join(lines)
