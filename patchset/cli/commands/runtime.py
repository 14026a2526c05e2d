"""`patchset runtime export`: a bundle that patches the stock vLLM image at container start."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING

from patchset.cli.loading import load
from patchset.cli.options import add_command, switch
from patchset.cli.output import FORMATS, console, emit, err_lines, table
from patchset.cli.sourceopts import add_source_options, source_from
from patchset.errors import ExitCode

if TYPE_CHECKING:
    from patchset.image.export import ExportReport

EXPORT_DESCRIPTION = """\
Write a standard-library bundle (entrypoint, kernel, manifest, payloads, plugins) that,
mounted read-only into the stock image, applies the definition's patches at start and execs
`vllm serve`; with a compose.yaml service and docker-run.sh. The release's files come from
--source (default: the package index)."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    description = "Patches applied at container start by the stock vLLM image."
    p = add_command(sub, "runtime", None, description)
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    e = add_command(actions, "runtime export", run_export, EXPORT_DESCRIPTION)
    e.add_argument("folder", type=Path, metavar="DIR")
    e.add_argument(
        "--build",
        type=Path,
        default=None,
        metavar="BUILD_TOML",
        help="the build definition (default: the only one in the builds folder)",
    )
    add_source_options(e, pre=False)
    switch(
        e,
        "--strict",
        "refuse a patch whose upstream fix the release holds (default: left out, a line)",
    )
    e.add_argument(
        "--compose",
        type=Path,
        default=None,
        metavar="FILE",
        help="your compose file: its vLLM service's environment, image pin and command carried"
        " over, each switch variable reported as mapped, alias or unknown",
    )
    e.add_argument(
        "--switches",
        action="append",
        default=[],
        metavar="SET",
        help="plan this switch set too before writing (repeatable): `all` (every switch on) or"
        " ENV=1,ENV=0,... over the defaults; every refusal of any set is listed at once",
    )
    e.add_argument("--format", choices=FORMATS, default="table")


def run_export(args: argparse.Namespace) -> int:
    from patchset.image.compose_in import read_compose
    from patchset.image.export import default_definition, export_runtime
    from patchset.registry.builds import load_definition

    definition = load_definition(args.build or default_definition(args.builds))
    compose = None if args.compose is None else read_compose(args.compose, definition.vllm)
    registry = load(args.registry)
    source = source_from(args)
    report = export_runtime(
        definition,
        registry,
        args.folder,
        source=source,
        log=err_lines(),
        strict=args.strict,
        compose=compose,
        switches=args.switches,
    )
    emit(report, args.format, _exported)
    return ExitCode.OK


def _exported(report: ExportReport) -> None:
    con = console()
    out = table(
        f"runtime for {report.base} (vLLM {report.vllm}) in {report.folder}",
        ["patch", "rev", "kind", "apply"],
    )
    for p in report.patches:
        out.add_row(p.id, str(p.revision), p.kind, p.apply)
    con.print(out)
    for line in report.compose_in:
        con.print(f"compose: {line}", markup=False)
    con.print(f"compose: {report.folder}/compose.yaml", markup=False)
    con.print(f"docker run: {report.docker_run}", markup=False, soft_wrap=True)
