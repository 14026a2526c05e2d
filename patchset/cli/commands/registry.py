"""`patchset list`, `show ID`, `validate`: reading the registry."""

from __future__ import annotations

import argparse

from patchset.cli.output import FORMATS, console, print_json, table
from patchset.errors import ExitCode
from patchset.image.definition import load_definitions
from patchset.registry import load_registry
from patchset.schemas import check_project


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("list", help="list the patches in the registry")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_list)
    p = sub.add_parser("show", help="show one patch's metadata and payload")
    p.add_argument("id", metavar="ID")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_show)
    p = sub.add_parser(
        "validate",
        help="load and validate every patch (and build definition); print the registry digest",
        description="Load every patch and build definition as every command does, and check"
        " patch.toml, sites.toml, builds/*.toml and [tool.patchset] against the JSON Schemas"
        " in patchset/schemas/.",
    )
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_validate)


def run_list(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    if args.format == "json":
        print_json(
            {"registry": registry.digest, "patches": [p.to_dict() for p in registry.patches]}
        )
        return ExitCode.OK
    out = table(
        f"{registry.root}  ({registry.digest[:19]})",
        ["id", "kind", "when", "rev", "vLLM", "upstream", "title"],
    )
    for p in registry.patches:
        upstream = f"{p.upstream.pr or '-'} ({p.upstream.state})"
        out.add_row(p.id, p.kind, p.apply, str(p.revision), str(p.vllm), upstream, p.title)
    console().print(out)
    return ExitCode.OK


def run_show(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    patch = registry.get(args.id)
    data = patch.to_dict()
    if args.format == "json":
        print_json(data)
        return ExitCode.OK
    con = console()
    con.print(f"[bold]{patch.id}[/] rev {patch.revision}: {patch.title}")
    for key in ("kind", "apply", "vllm", "targets", "upstream", "hardware", "origin", "credit"):
        con.print(f"  {key}: {data[key]}", markup=False)
    con.print()
    con.print(patch.description.strip(), markup=False)
    for variant in patch.variants:
        base = f", base {variant.base}" if variant.base else ""
        con.print(
            f"\n[bold]payload {variant.name}[/] (vLLM {variant.vllm}{base},"
            f" sha256 {variant.sha256[:12]})"
        )
        con.print((patch.folder / variant.name).read_text(encoding="utf-8"), markup=False)
    return ExitCode.OK


def run_validate(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    definitions = load_definitions(args.builds) if args.builds.is_dir() else []
    checked = check_project(registry.root, builds=args.builds, pyproject=args.pyproject)
    if args.format == "json":
        print_json(
            {
                "registry": registry.digest,
                "valid": True,
                "patches": len(registry.patches),
                "builds": len(definitions),
                "schema_checked": checked,
            }
        )
    else:
        console().print(
            f"{registry.root}: {len(registry.patches)} patches valid; digest {registry.digest}"
            f" ({checked} file{'' if checked == 1 else 's'} checked against the JSON Schemas)",
            markup=False,
        )
    return ExitCode.OK
