"""`patchset refresh`: carry a patch that no longer fits onto a newer vLLM release."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from patchset.cli.loading import load
from patchset.cli.options import add_command, repeatable, switch
from patchset.cli.output import FORMATS, console, emit
from patchset.cli.sourceopts import add_source_options, source_from
from patchset.errors import ExitCode, UsageError
from patchset.refresh import RefreshResult, SiteRefresh, abort, finish, refresh
from patchset.sources import select
from patchset.sources.select import LATEST

DESCRIPTION = """\
Carry a patch that no longer fits onto release X, as a new payload variant for X (the old
variant keeps the releases before X; the revision is bumped).

diff patches: a three-way merge (git) of the patch onto X, with the release the variant was
written against as the base (its `base` in patch.toml, else the newest release in its range).
A target file X moved (found as `patchset check` finds it) is followed: the new variant
patches its new path, which is added to `targets`.
A clean merge is written at once (--dry-run: only shown). A conflict leaves the merged files,
with conflict markers, in a work folder: edit them, then `patchset refresh ID --finish`.

--finish checks the work folder against the release again (its files are read anew from the
source, --source as for the refresh) and takes only regular files from it.

runtime patches: for each site whose anchor no longer matches, the nearest candidates in X;
where one is clearly best it is proposed as the new anchor. --write records the proposal;
--pick SITE=N takes candidate N instead."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "refresh", run, DESCRIPTION)
    p.add_argument("id", metavar="ID", nargs="?")
    switch(
        p,
        "--all",
        "with --vllm: every diff patch that fits it only at an offset or with fuzz, as an exact"
        " new variant, and every runtime patch whose anchors it moved, with the new anchors"
        " where they are clear (written with --write)",
    )
    what = p.add_mutually_exclusive_group(required=True)
    what.add_argument(
        "--vllm", metavar="VERSION", help="the release to carry it onto ('latest': the newest)"
    )
    switch(what, "--finish", "turn the edited work folder into the new variant")
    switch(what, "--abort", "drop an unfinished refresh")
    p.add_argument(
        "--workdir",
        type=Path,
        metavar="DIR",
        help="where a conflicted merge is left (default: .patchset-refresh/ID beside the registry)",
    )
    switch(p, "--write", "runtime patches: record the proposal")
    switch(p, "--dry-run", "diff patches: show the merge, write nothing")
    repeatable(
        p,
        "--pick",
        "SITE=N",
        "runtime patches: take candidate N (1-based) as SITE's new anchor (repeatable)",
    )
    add_source_options(p)
    p.add_argument("--format", choices=FORMATS, default="table")


def _picks(values: list[str]) -> dict[str, int]:
    picks: dict[str, int] = {}
    for value in values:
        name, sep, number = value.partition("=")
        if not sep or not name or not number.isdigit():
            raise UsageError(f"--pick {value!r}: expected SITE=N, e.g. a-forward-prefill-max-seq=1")
        picks[name] = int(number)
    return picks


def run(args: argparse.Namespace) -> int:
    if args.all or args.id is None:
        from patchset.cli.commands import refresh_all

        return refresh_all.run(args)
    registry = load(args.registry, [args.id])
    if args.finish or args.abort:
        extra = [flag for flag in ("write", "dry_run", "pick") if getattr(args, flag)]
        if args.abort and args.source:
            extra.append("source")
        if extra:
            flags = ", ".join("--" + f.replace("_", "-") for f in extra)
            raise UsageError(f"{flags} cannot go with --finish or --abort")
    if args.abort:
        work = abort(registry, args.id, workdir=args.workdir)
        console().print(f"dropped the unfinished refresh of {args.id} in {work}", markup=False)
        return ExitCode.OK
    if args.finish:
        result = finish(registry, args.id, workdir=args.workdir, source=source_from(args))
    else:
        patch = registry.get(args.id)
        if patch.kind == "diff" and (args.write or args.pick):
            raise UsageError("--write and --pick are for runtime patches; diff patches write")
        if patch.kind == "runtime" and args.dry_run:
            raise UsageError("--dry-run is for diff patches; runtime patches write with --write")
        source = source_from(args)
        target = select.one(source, args.vllm, pre=args.pre)[0] if args.vllm == LATEST else None
        write = args.write if patch.kind == "runtime" else not args.dry_run
        result = refresh(
            registry,
            args.id,
            target or args.vllm,
            source=source,
            write=write,
            workdir=args.workdir,
            picks=_picks(args.pick),
        )
    emit(result, args.format, show)
    return result.exit_code


def show(result: RefreshResult) -> None:
    con = console()

    def say(text: str = "") -> None:
        con.print(text, markup=False, soft_wrap=True)

    base = f", base {result.base}" if result.base else ""
    say(f"refresh {result.patch} onto vllm {result.vllm} (from {result.from_variant}{base})")
    for moved in result.moved:
        say(f"moved in vllm {result.vllm}: {moved.old} -> {moved.new} (the new variant patches it)")
    for site in result.sites:
        for line in _site_lines(site):
            say(line)
    if result.kind == "diff" and result.outcome in ("written", "proposed"):
        say("three-way merge: clean")
    if result.outcome == "conflict":
        say(f"three-way merge: conflicts in {len(result.conflicts)} file(s)")
        for conflict in result.conflicts:
            where = ", ".join(str(n) for n in conflict.lines)
            say(f"  {conflict.file}: conflict markers at lines {where}")
        if result.workdir is None:
            say("dry run: nothing was written")
            return
        say(f"the merged files, with conflict markers, are in {result.workdir}")
        say(f"resolve them there, then: patchset refresh {result.patch} --finish")
        return
    if result.outcome == "unresolved":
        say("no new variant: a site above has no clear new anchor (--pick SITE=N takes one);")
        say("nothing was written")
        return
    if result.outcome == "proposed":
        say(f"proposed variant {result.variant}:")
        sys.stdout.write(result.payload)
        say("nothing was written" + (" (--write records it)" if result.kind == "runtime" else ""))
        return
    say(f"new variant {result.variant}; revision {result.revision}; ranges:")
    for change in result.ranges:
        was = "new" if change.old is None else f"was {change.old}"
        say(f"  {change.what}: {change.new} ({'unchanged' if change.old == change.new else was})")
    say("written: " + ", ".join(str(p) for p in result.written))
    sys.stdout.write(result.payload)


def _site_lines(site: SiteRefresh) -> list[str]:
    if site.status == "applies":
        return [f"site {site.site}: still matches at {site.file}:{site.line}"]
    lines = [f"site {site.site}: {site.status} in {site.file}"]
    for number, c in enumerate(site.candidates, start=1):
        first = c.lines[0].strip() if c.lines else ""
        note = " (unchanged since the base: other code)" if c.unchanged else ""
        lines.append(f"  {number}. line {c.line}, {c.similarity:.0%} alike: {first}{note}")
    if site.anchor is not None:
        lines.append(f"  new anchor (candidate {site.picked}): {site.anchor}")
        if site.text_follows:
            lines.append("  its text held the old anchor: it now holds the new one")
    elif site.reason:
        lines.append(f"  no proposal: {site.reason}")
    return lines
