"""`patchset` entry point: parse, dispatch to one command module, map errors to exit codes."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path

from patchset import __version__
from patchset.cli.commands import add as add_cmd
from patchset.cli.commands import apply as apply_cmd
from patchset.cli.commands import bake as bake_cmd
from patchset.cli.commands import check as check_cmd
from patchset.cli.commands import image as image_cmd
from patchset.cli.commands import project as project_cmd
from patchset.cli.commands import refresh as refresh_cmd
from patchset.cli.commands import registry as registry_cmd
from patchset.cli.commands import runtime as runtime_cmd
from patchset.cli.output import err_console
from patchset.errors import ExitCode, PatchsetError
from patchset.project import resolve

COMMANDS = (
    registry_cmd,
    apply_cmd,
    check_cmd,
    image_cmd,
    refresh_cmd,
    add_cmd,
    project_cmd,
    bake_cmd,
    runtime_cmd,
)

EPILOG = """\
exit codes: 0 ok; 1 a conflict or partial patch (nothing written); 2 bad usage or input;
3 a source, the index or Docker unavailable; 4 a target file missing; 5 out of the patch's
release range; 6 already applied (nothing to do); 7 applied, with offsets or fuzz.
See docs/exit-codes.md."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="patchset",
        description="Patch registry, apply engine, release check and image builds for vLLM.",
        epilog=EPILOG,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"patchset {__version__}")
    parser.add_argument(
        "--registry",
        type=Path,
        default=None,
        metavar="DIR",
        help="the patch registry folder (default: $PATCHSET_REGISTRY, else [tool.patchset]"
        " registry in the nearest pyproject.toml, else ./patches)",
    )
    parser.add_argument(
        "--builds",
        type=Path,
        default=None,
        metavar="DIR",
        help="the build definitions folder (default: $PATCHSET_BUILDS, else [tool.patchset]"
        " builds in the nearest pyproject.toml, else ./builds)",
    )
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for module in COMMANDS:
        module.add_parsers(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        project = resolve(registry=args.registry, builds=args.builds)
        args.registry, args.builds = project.registry, project.builds
        code: int = args.handler(args)
    except PatchsetError as exc:
        err_console().print(f"patchset: error: {exc}", markup=False, soft_wrap=True)
        return exc.exit_code
    except KeyboardInterrupt:
        err_console().print("patchset: interrupted", markup=False)
        return ExitCode.INTERRUPTED
    return code


def entry() -> None:
    raise SystemExit(main(sys.argv[1:]))
