"""`patchset bake`: a docker-bake.json and build contexts for every build definition."""

from __future__ import annotations

import argparse
from pathlib import Path

from patchset.cli.loading import load
from patchset.cli.options import add_command, repeatable
from patchset.cli.output import FORMATS, console, err_lines, print_json, table
from patchset.errors import ExitCode, UsageError

DESCRIPTION = """\
Write a BuildKit bake file (JSON) with one target per build definition (build-0-19-1 for
builds/0.19.1.toml), each with the context, labels and tags `patchset build` uses; the
contexts go to <file stem>.contexts/ beside the file. Then, from that folder:
docker buildx bake [--push] [TARGET...]. Needs the base images on the local engine
(pulled when missing) to prepare the contexts."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "bake", run, DESCRIPTION)
    p.add_argument(
        "--builds",
        dest="bake_builds",
        type=Path,
        default=None,
        metavar="DIR",
        help="the build definitions (default: the global --builds)",
    )
    p.add_argument(
        "-o",
        "--output",
        type=Path,
        default=Path("docker-bake.json"),
        metavar="FILE",
        help="the bake file to write (default: docker-bake.json)",
    )
    repeatable(
        p, "--target", "NAME", "only this definition (0.19.1) or target (build-0-19-1); repeatable"
    )
    repeatable(p, "--tag", "REF", "an extra tag")
    p.add_argument("--format", choices=FORMATS, default="table")


def run(args: argparse.Namespace) -> int:
    folder: Path = args.bake_builds or args.builds
    if not folder.is_dir():
        raise UsageError("build definitions folder does not exist", path=folder)
    from patchset.image.bake import bake, target_name  # docker is slow to import
    from patchset.registry.builds import load_definitions

    definitions = load_definitions(folder)
    if not definitions:
        raise UsageError("holds no build definition (*.toml)", path=folder)
    if args.target:
        known = {d.name: d for d in definitions} | {target_name(d): d for d in definitions}
        unknown = [t for t in args.target if t not in known]
        if unknown:
            raise UsageError(
                f"no build target {unknown[0]!r} in {folder} (have: {', '.join(sorted(known))})"
            )
        definitions = list({id(known[t]): known[t] for t in args.target}.values())
    result = bake(
        definitions,
        load(args.registry),
        args.output,
        extra_tags=tuple(args.tag),
        log=err_lines(),
    )
    if args.format == "json":
        print_json(result.data)
        return ExitCode.OK
    out = table(f"{result.file}", ["target", "context", "FROM", "tags"])
    for t in result.targets:
        out.add_row(t.name, str(t.context), t.base, "\n".join(t.tags))
    con = console()
    con.print(out)
    con.print(
        f"next: cd {result.file.parent} && docker buildx bake -f {result.file.name} [--push]",
        markup=False,
    )
    return ExitCode.OK
