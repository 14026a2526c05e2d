"""`patchset bump builds/X.toml --to V`: a build definition carried onto a newer release."""

from __future__ import annotations

import argparse
from pathlib import Path

from packaging.version import Version

from patchset.cli.loading import load
from patchset.cli.options import add_command, switch
from patchset.cli.output import console, print_json, table, text
from patchset.cli.sourceopts import add_source_options, source_from
from patchset.registry.builds import load_definition
from patchset.upstream.bump import BumpReport, bump, newest_release

FORMATS = ("table", "json", "markdown")

DESCRIPTION = """\
Check the definition's patches on release V: a patch still needed is kept, one upstream is
dropped (with the check's evidence), one that conflicts is refreshed where the three-way
merge (or the new anchors) is clean and listed for hand work where it is not. The new
definition (builds/V.toml, after the old one's name) keeps the old one's text with vllm,
base and tags moved to V. --write writes the refreshed variants and the new definition;
--format markdown gives a pull request's body. A refresh that would delete the release's
own lines (or whose change already landed) is not made: the patch is dropped (landed) or
left for hand work, the lines named. Every patch upstream: nothing is written ("serve the
stock image"), exit 0. A pre-release needs --pre. Exit 0: the bump is complete (or, with
--to latest, no newer release yet: one line); 1: hand work is left."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "bump", run, DESCRIPTION)
    p.add_argument("definition", type=Path, metavar="DEFINITION", help="builds/X.toml")
    p.add_argument("--to", required=True, metavar="V", help="the release to bump to, or latest")
    switch(p, "--write", "write the variants and definition")
    p.add_argument("--format", choices=FORMATS, default="table")
    add_source_options(p)


def run(args: argparse.Namespace) -> int:
    registry = load(args.registry)
    source = source_from(args)
    if args.to == "latest":
        old = load_definition(args.definition)
        newest = newest_release(source)
        if Version(newest) <= Version(old.vllm):
            console().print(
                f"patchset bump: no release newer than {old.vllm} on the {source.name} yet;"
                " nothing to bump",
                markup=False,
            )
            return 0
        args.to = newest
    report = bump(registry, args.definition, args.to, source=source, write=args.write, pre=args.pre)
    if args.format == "json":
        print_json(report.to_dict())
    elif args.format == "markdown":
        console().print(markdown(report), markup=False, soft_wrap=True, highlight=False)
    else:
        _table(report)
    return report.exit_code


def _table(report: BumpReport) -> None:
    out = table(
        f"{report.definition} {report.old} -> {report.target} {report.new}",
        ["patch", f"on {report.new}", "action", "evidence"],
    )
    for s in report.steps:
        out.add_row(text(s.patch), text(s.verdict), text(s.action), text(s.evidence))
    con = console()
    con.print(out)
    for comment in report.comments:
        con.print(f"check the comment: {comment}", markup=False)
    if report.headline():
        con.print(f"bump complete: {report.headline()}", markup=False)
        return
    for note in report.notes:
        con.print(f"hand work: {note}", markup=False)
    state = "complete" if report.complete else "hand work left"
    wrote = f"; wrote {len(report.written)} files" if report.written else ""
    con.print(
        f"bump {state}: base {report.base}, {len(report.patches)} patches{wrote}", markup=False
    )


def markdown(report: BumpReport) -> str:
    """A pull request's body: what the bump did to each patch, and what is left."""
    counts = {
        a: [s for s in report.steps if s.action == a]
        for a in ("kept", "dropped", "refreshed", "hand-work")
    }
    lines = [
        f"## vLLM {report.new} for `{report.definition.name}`",
        "",
        f"`{report.target.name}`: vLLM {report.old} -> {report.new}, base `{report.base}`,"
        f" {len(report.patches)} patches ({len(counts['kept'])} kept, {len(counts['refreshed'])}"
        f" refreshed, {len(counts['dropped'])} dropped upstream, {len(counts['hand-work'])} for"
        " hand work).",
        "",
        "| patch | on " + report.new + " | action | evidence |",
        "|---|---|---|---|",
    ]
    order = {"hand-work": 0, "refreshed": 1, "dropped": 2, "kept": 3}
    for s in sorted(report.steps, key=lambda s: (order[s.action], s.patch)):
        action = f"**{s.action}**" if s.action == "hand-work" else s.action
        cells = [f"`{s.patch}`", s.verdict, action, s.evidence]
        lines.append(
            "| " + " | ".join(c.replace("|", "\\|").replace("\n", " ") for c in cells) + " |"
        )
    lines.append("")
    if report.comments:
        lines.append(f"Comments that name {report.old} (kept as they were; check them):")
        lines += [f"- [ ] {c}" for c in report.comments]
        lines.append("")
    if report.headline():
        lines.append(f"**{report.headline()}**")
    elif counts["hand-work"] or report.notes:
        lines.append("### Left for hand work")
        lines += [f"- [ ] `{s.patch}`: {s.evidence}" for s in counts["hand-work"]]
        lines += [f"- [ ] {note}" for note in report.notes]
    else:
        lines.append("Nothing left for hand work: the bump is complete.")
    return "\n".join(lines)
