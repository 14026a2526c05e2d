"""`patchset completion SHELL`: a shell completion script, generated from the parser by shtab."""

from __future__ import annotations

import argparse
import sys

from patchset.cli.options import add_command

SHELLS = ("bash", "zsh", "tcsh")

DESCRIPTION = """\
Print a completion script for SHELL on stdout. bash: save it as
~/.local/share/bash-completion/completions/patchset; zsh: as _patchset in a folder of your
$fpath."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "completion", run, DESCRIPTION)
    p.add_argument("shell", choices=SHELLS, metavar="SHELL", help="one of: " + ", ".join(SHELLS))


def run(args: argparse.Namespace) -> int:
    import shtab  # (only this command needs it)

    from patchset.cli.main import build_parser  # (main imports this module)

    sys.stdout.write(shtab.complete(build_parser(), shell=args.shell))
    return 0
