"""`patchset build`, `inspect` and `verify`: patched images through the Docker engine.

The Docker SDK is imported inside the handlers: it costs a tenth of a second, and every other
command (and the in-image use of the engine) would pay it for nothing.
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path
from typing import TYPE_CHECKING

from patchset.cli.loading import load
from patchset.cli.options import add_command, repeatable, switch
from patchset.cli.output import FORMATS, console, emit, err_lines, print_json, table
from patchset.errors import ExitCode, UsageError

if TYPE_CHECKING:
    from patchset.image.build import BuildReport

BUILD_DESCRIPTION = """\
Build the thin patched image of a build definition on its official base; nothing is tagged
unless the build and its verification pass."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "build", run_build, BUILD_DESCRIPTION)
    p.add_argument("definition", type=Path, metavar="BUILD_TOML")
    switch(p, "--push", "push every tag to its registry")
    repeatable(p, "--tag", "REF", "an extra tag")
    switch(p, "--no-cache", "build without the layer cache")
    switch(
        p,
        "--strict",
        "refuse a patch whose upstream fix the base holds (default: left out, a line)",
    )
    p.add_argument(
        "--output",
        type=Path,
        default=None,
        metavar="DIR",
        help="where build.log and report.json go (default: .patchset-builds/<name>)",
    )
    p.add_argument("--format", choices=FORMATS, default="table")
    for name, handler in (("inspect", run_inspect), ("verify", run_verify)):
        p = add_command(sub, name, handler)
        p.add_argument("image", metavar="IMAGE")
        p.add_argument("--format", choices=FORMATS, default="table")
    switch(  # verify's own
        p,
        "--start",
        "run the start itself in a throwaway container (startup patches written, every"
        " [[verify]] run), all but the exec of vllm serve",
    )
    p.add_argument(
        "--bundle",
        type=Path,
        default=None,
        metavar="DIR",
        help="a `runtime export` folder, copied to /opt/patchset of a stock IMAGE"
        " (implies --start)",
    )
    repeatable(
        p,
        "--env",
        "KEY=VALUE",
        "a variable of that start (switches, policies, PATCHSET_COMPUTE_CAPABILITY)",
    )
    switch(
        p,
        "--imports",
        "with --start/--bundle: after the files are written, import every vLLM module the"
        " start changed and each one a python patch touches (a child process each, bounded)",
    )
    p.add_argument(
        "--timeout",
        type=float,
        default=600.0,
        metavar="SECONDS",
        help="kill the throwaway container after this long (default: 600)",
    )


def run_build(args: argparse.Namespace) -> int:
    from patchset.image.build import build  # see the module docstring
    from patchset.registry.builds import load_definition

    definition = load_definition(args.definition)
    registry = load(args.registry)
    output = args.output or Path(".patchset-builds") / definition.name
    report = build(
        definition,
        registry,
        extra_tags=tuple(args.tag),
        nocache=args.no_cache,
        output=output,
        on_log=err_lines(),
        push=args.push,
        strict=args.strict,
    )
    emit(report, args.format, functools.partial(_built, output=output))
    return ExitCode.OK


def _built(report: BuildReport, *, output: Path) -> None:
    con = console()
    out = table(f"built {report.image_id[:19]} on {report.base}", ["patch", "rev", "apply"])
    for p in report.patches:
        out.add_row(p.id, str(p.revision), p.apply)
    con.print(out)
    for tag in report.tags:
        con.print(
            f"tag {tag}" + (f" pushed {report.pushed[tag]}" if tag in report.pushed else ""),
            markup=False,
        )
    con.print(
        f"added {report.added_bytes} bytes over the base; report {output}/report.json",
        markup=False,
    )


def run_inspect(args: argparse.Namespace) -> int:
    from patchset.image.inspect import inspect_image  # see the module docstring
    from patchset.image.manifest import MANIFEST_PATH

    found = inspect_image(args.image)
    if args.format == "json":
        print_json(found.to_dict())
        return ExitCode.OK
    con = console()
    for key, value in found.described_by.items():
        con.print(f"{key}: {value}", markup=False)
    out = table(f"patches in {args.image}", ["patch", "rev", "apply", "upstream", "payload sha256"])
    for p in found.patches:
        out.add_row(p.id, str(p.revision), p.apply, p.upstream or "-", p.payload_sha256[:16])
    con.print(out)
    if found.manifest is None:
        con.print(f"no {MANIFEST_PATH} in this image", markup=False)
        return ExitCode.ATTENTION
    return ExitCode.OK


def run_verify(args: argparse.Namespace) -> int:
    from patchset.adapters import dockerengine  # see the module docstring
    from patchset.image import verify

    start = args.start or args.bundle is not None
    environment = verify.environment_of(args.env)
    if environment and not start:
        raise UsageError("--env goes with --start or --bundle (a start's variables)")
    if args.imports and not start:
        raise UsageError("--imports goes with --start or --bundle (it imports what a start wrote)")
    if not args.timeout > 0:
        raise UsageError("--timeout: a positive number of seconds")
    if args.bundle is not None:
        verify.bundle_files(args.bundle)  # a bundle that is none: one line, before the engine
    with dockerengine.connect() as engine:
        image = engine.inspect(args.image).id
        if start:
            result = verify.prove_start(
                engine,
                image,
                bundle=args.bundle,
                environment=environment,
                imports=args.imports,
                timeout=args.timeout,
            )
        else:
            result = verify.verify_image(engine, image, timeout=args.timeout)
    if args.format == "json":
        print_json(verify.report_json(result, mode="start" if start else "present"))
    elif start:
        con = console()
        for r in result.results:
            con.print(f"{r.patch} ({r.apply}): {r.state}", markup=False)
        if result.error:
            con.print(f"refused: {result.error}", markup=False)
        out = table(f"a start of {args.image}, without vllm serve", ["patch", "apply", "outcome"])
        for proof in verify.per_patch(result):
            out.add_row(proof.patch, proof.apply, proof.outcome)
        con.print(out)
        con.print(
            "the start would serve" if result.ok else "the start would be refused",
            markup=False,
        )
    else:
        con = console()
        for r in result.results:
            con.print(f"{r.patch} ({r.apply}): {r.state}", markup=False)
        if result.error:
            con.print(f"refused: {result.error}", markup=False)
        con.print(
            "verified: every patch is present" if result.ok else "verification FAILED",
            markup=False,
        )
    return ExitCode.OK if result.ok else ExitCode.ATTENTION
