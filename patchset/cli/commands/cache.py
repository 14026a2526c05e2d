"""`patchset cache info|prune|clear`: the release cache the check reads through."""

from __future__ import annotations

import argparse
import re

from patchset.cli.options import add_command
from patchset.cli.output import console, print_json
from patchset.errors import ExitCode

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, "": 86400}

DESCRIPTION = """\
The release cache: each release's file list, the files read from it and the index's answers.
Its folder is $PATCHSET_CACHE_DIR, else the user cache folder of the platform (platformdirs)."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "cache", run, DESCRIPTION)
    actions = p.add_subparsers(dest="cache_action", required=True, metavar="ACTION")
    info = actions.add_parser("info", help="where the cache is, its size and releases")
    info.add_argument("--format", choices=("table", "json"), default="table")
    prune = actions.add_parser("prune", help="drop what was not used lately")
    prune.add_argument(
        "--older-than",
        type=_duration,
        default=30 * 86400.0,
        metavar="AGE",
        help="unused for longer than AGE: a number with s, m, h, d or w (default 30d)",
    )
    actions.add_parser("clear", help="remove everything in the cache")


def _duration(text: str) -> float:
    match = _DURATION.match(text)
    if match is None:
        raise argparse.ArgumentTypeError(f"{text!r} is not an age such as 30d, 12h or 90m")
    return float(match[1]) * _UNITS[match[2]]


def run(args: argparse.Namespace) -> int:
    from patchset.cachedir import cache_location
    from patchset.sources.package_index.cache import Cache, summary

    con = console()
    if args.cache_action == "info":
        found = summary()
        if args.format == "json":
            print_json(
                {
                    "root": str(found.root),
                    "chosen_by": found.chosen_by,
                    "bytes": found.bytes,
                    "files": found.files,
                    "releases": list(found.releases),
                }
            )
            return ExitCode.OK
        con.print(f"where: {found.root} (chosen by {found.chosen_by})", markup=False)
        con.print(f"size: {_size(found.bytes)} in {found.files} files", markup=False)
        con.print(f"releases: {len(found.releases)}", markup=False)
        for line in found.releases:
            con.print(f"  {line}", markup=False, soft_wrap=True)
        return ExitCode.OK
    cache = Cache(cache_location()[0])
    if args.cache_action == "prune":
        removed, freed = cache.prune(args.older_than)
        con.print(f"pruned {removed} files ({_size(freed)}) from {cache.root}", markup=False)
    else:
        removed, freed = cache.clear()
        con.print(f"cleared {removed} files ({_size(freed)}) from {cache.root}", markup=False)
    return ExitCode.OK


def _size(n: int) -> str:
    value = float(n)
    for unit in ("B", "KB", "MB", "GB"):
        if value < 1024 or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1024
    return f"{n} B"  # pragma: no cover
