"""The release-source options `check`, `add`, `update`, `refresh`, `bump` and `runtime export`
share, one way.

`add_source_options(parser)` puts `--pre` (where a command picks releases by itself),
`--source`, `--source-version`, `--index-url` and `--offline` on a parser, with the same
names, help and defaults everywhere; `source_from(args)` makes the source they name.
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from patchset.cli.options import switch

if TYPE_CHECKING:
    from patchset.sources.base import ReleaseSource

SOURCE_HELP = "where releases come from: the package index (default), PATH, git:PATH or image:REF"
PRE_HELP = "let 'latest' and --since pick pre-releases too (as pip --pre); yanked files never"


def add_source_options(
    parser: argparse.ArgumentParser,
    *,
    pre: bool = True,
    source_help: str = SOURCE_HELP,
) -> None:
    """With `pre`, `--pre`; `--source SPEC`, `--source-version X`, `--index-url URL`,
    `--offline`."""
    if pre:
        switch(parser, "--pre", PRE_HELP)
    parser.add_argument("--source", metavar="SPEC", help=source_help)
    parser.add_argument(
        "--source-version",
        metavar="X",
        help="the release a folder or git:PATH@REF tree holds, when it cannot be read",
    )
    parser.add_argument("--index-url", metavar="URL", help="the package index (default: pip's)")
    switch(parser, "--offline", "use the release cache only")


def source_from(args: argparse.Namespace, **more: Any) -> ReleaseSource:
    """The source the options of `add_source_options` name (`more`: the keywords of
    `parse_source` a command sets of its own, as `check --artifact`)."""
    from patchset.sources import parse_source  # when the command runs

    return parse_source(
        args.source,
        index_url=args.index_url,
        offline=args.offline,
        prereleases=bool(getattr(args, "pre", False)),
        version=args.source_version,
        **more,
    )
