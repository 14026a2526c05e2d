"""`patchset upstream`: the pull-request audit (what the forge says of each patch's PR)."""

from __future__ import annotations

import argparse
import os
from pathlib import Path

from patchset.adapters.actions import workflow_command
from patchset.adapters.forge import API_ENV, TOKEN_ENV, ForgeAPI
from patchset.cachedir import cache_location
from patchset.cli.loading import load
from patchset.cli.options import add_command, switch
from patchset.cli.output import console, print_json, styled, table, text
from patchset.errors import UsageError
from patchset.registry import PATCH_FILE, Registry
from patchset.sources import parse_source
from patchset.sources.git import GitSource
from patchset.upstream import Finding, UpstreamReport, audit, record

FORMATS = ("table", "json", "markdown", "github")
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"

DESCRIPTION = f"""\
For each patch with [upstream] pr, the forge's answer (GitHub's REST API: the base from
${API_ENV}, default GitHub's; a token from ${TOKEN_ENV}, never printed) beside
the recorded state: newly merged (and its first release, with --source git:PATH), closed
without merging, still open, registry out of date. Answers are cached with their ETag (a
304 costs no rate limit)."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "upstream", run, DESCRIPTION)
    p.add_argument("--patch", action="append", default=[], metavar="ID", help="only this one")
    p.add_argument(
        "--source",
        metavar="git:PATH",
        help="a local vLLM clone: the first release tag holding each merged PR's commit",
    )
    p.add_argument("--format", choices=FORMATS, default="table")
    switch(p, "--write", "record the forge's state in each patch.toml")
    p.add_argument("--timeout", type=float, default=30.0, metavar="SECONDS")


def run(args: argparse.Namespace) -> int:
    if args.source is not None and not args.source.startswith("git:"):  # nothing else read
        raise UsageError(f"--source {args.source!r}: expected git:PATH (a local vLLM clone)")
    registry = load(args.registry, args.patch)
    git: GitSource | None = None
    if args.source is not None:
        clone = parse_source(args.source)
        assert isinstance(clone, GitSource)  # a git: spec is a clone, or it raised
        git = clone
    forge = ForgeAPI(cache_dir=cache_location()[0] / "forge", timeout=args.timeout)
    report = audit(registry, forge, patches=args.patch, git=git)
    if args.write:
        report = record(registry, report)
    if args.format == "json":
        print_json(report.to_dict())
    elif args.format == "markdown":
        console().print(markdown(report), markup=False, soft_wrap=True, highlight=False)
    elif args.format == "github":
        for line in workflow_lines(report, registry):
            print(line)
        if summary := os.environ.get(SUMMARY_ENV):
            with Path(summary).open("a", encoding="utf-8") as out:
                out.write(markdown(report) + "\n")
    else:
        _table(report)
    return report.exit_code


def _note(f: Finding) -> str:
    bits = [f.advice]
    if f.merged_at:
        bits.append(f"merged {f.merged_at}")
    if f.merge_commit:
        bits.append(f"commit {f.merge_commit[:12]}")
    if f.first_release:
        check = f.check_first_upstream or "none"
        bits.append(f"first release {f.first_release}; the check's first upstream {check}")
    if f.disagreement:
        bits.append(f"disagreement: {f.disagreement}")
    return "; ".join(bits)


def _table(report: UpstreamReport) -> None:
    out = table(None, ["patch", "pull request", "recorded", "forge", "status", "note"])
    for f in report.findings:
        out.add_row(
            text(f.patch),
            text(f.pr),
            text(f.recorded),
            text(f.forge),
            styled(f.status),
            text(_note(f)),
        )
    con = console()
    if report.findings:
        con.print(out)
    con.print(_summary_line(report), markup=False)


def _summary_line(report: UpstreamReport) -> str:
    counts = report.to_dict()["counts"]
    if not report.findings:
        return "no patch has an upstream pull request"
    said = ", ".join(f"{n} {status}" for status, n in sorted(counts.items()))
    tail = f"; recorded in {len(report.written)} patch.toml" if report.written else ""
    return f"{len(report.findings)} pull requests: {said}{tail}"


def markdown(report: UpstreamReport) -> str:
    """A markdown table of the findings (attention first), for an issue or a step summary."""
    lines = ["### Upstream pull requests", ""]
    if not report.findings:
        return "\n".join([*lines, "No patch has an upstream pull request."])
    lines += [
        "| patch | pull request | recorded | forge | status | note |",
        "|---|---|---|---|---|---|",
    ]
    ordered = sorted(report.findings, key=lambda f: (not f.attention, f.patch))
    for f in ordered:
        cells = [
            f.patch,
            f.pr,
            f.recorded,
            f.forge,
            f"**{f.status}**" if f.attention else f.status,
            _note(f),
        ]
        lines.append("| " + " | ".join(_cell(c) for c in cells) + " |")
    lines += ["", _summary_line(report)]
    return "\n".join(lines)


def _cell(value: str) -> str:
    return value.replace("|", "\\|").replace("\n", " ")


def workflow_lines(report: UpstreamReport, registry: Registry) -> list[str]:
    """One `::error` per finding that needs attention, on its patch.toml's `state` line; one
    `::notice` with the counts."""
    from patchset.cli.github import repo_root, shown  # --format github only (the check's)

    root = repo_root()
    lines = []
    for f in report.findings:
        if not f.attention:
            continue
        patch = registry.get(f.patch)
        lines.append(
            workflow_command(
                "error",
                f"{f.pr}: {f.status}: {_note(f)}",
                file=shown(patch.folder / PATCH_FILE, root),
                line=patch.upstream.state_line,
                title=f"patchset upstream: {f.patch}",
            )
        )
    lines.append(workflow_command("notice", _summary_line(report), title="patchset upstream"))
    return lines
