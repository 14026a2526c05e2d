"""The release-source options `add`, `update`, `refresh` and `runtime export` share, one way.

`add_source_options(parser)` puts `--source`, `--source-version`, `--index-url`, `--offline`
(and `--pre` where a command picks releases by itself) on a parser, with the same names, help
and defaults everywhere; `source_from(args)` makes the source they name.
"""

from __future__ import annotations

import argparse

from patchset.sources import parse_source
from patchset.sources.base import ReleaseSource

SOURCE_HELP = "where releases come from: the package index (default), PATH, git:PATH or image:REF"
PRE_HELP = "let latest and --since pick pre-releases too (as pip --pre)"


def add_source_options(
    parser: argparse.ArgumentParser,
    *,
    pre: bool = True,
    source_help: str = SOURCE_HELP,
) -> None:
    """`--source SPEC`, `--index-url URL`, `--offline` and, with `pre`, `--pre`."""
    parser.add_argument("--source", metavar="SPEC", help=source_help)
    parser.add_argument(
        "--source-version",
        metavar="X",
        help="the release a folder or git:PATH@REF tree holds, when it cannot be read",
    )
    parser.add_argument("--index-url", metavar="URL", help="the package index (default: pip's)")
    parser.add_argument("--offline", action="store_true", help="use the release cache only")
    if pre:
        parser.add_argument("--pre", action="store_true", help=PRE_HELP)


def source_from(args: argparse.Namespace) -> ReleaseSource:
    """The source the options of `add_source_options` name."""
    return parse_source(
        args.source,
        index_url=args.index_url,
        offline=args.offline,
        prereleases=bool(getattr(args, "pre", False)),
        version=args.source_version,
    )
