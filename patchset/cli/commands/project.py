"""`patchset init`: lay out a project of its own patches and builds."""

from __future__ import annotations

import argparse
from pathlib import Path

from patchset.cli.options import add_command
from patchset.cli.output import FORMATS, console, print_json
from patchset.errors import ExitCode

DESCRIPTION = """\
Lay out patches/, builds/ and [tool.patchset] in DIR/pyproject.toml; anything already there
is kept as it is."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "init", run, DESCRIPTION)
    p.add_argument("dir", nargs="?", type=Path, default=Path(), metavar="DIR")
    p.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace) -> int:
    from patchset.project import init_project

    result = init_project(args.dir)
    if args.format == "json":
        print_json(
            {
                "root": str(result.root),
                "created": [str(p) for p in result.created],
                "kept": [str(p) for p in result.kept],
            }
        )
        return ExitCode.OK
    con = console()
    for path in result.created:
        con.print(f"created {path}", markup=False, soft_wrap=True)
    for path in result.kept:
        con.print(f"kept {path} (already there)", markup=False, soft_wrap=True)
    con.print(
        "next: `patchset add ID --pr OWNER/REPO#N` or `--diff FILE`, then `patchset check`",
        markup=False,
        soft_wrap=True,
    )
    return ExitCode.OK
