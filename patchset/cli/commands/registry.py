"""`patchset list`, `show ID`, `validate`: reading the registry."""

from __future__ import annotations

import argparse

from patchset.cli.output import FORMATS, console, print_json, table
from patchset.errors import ExitCode
from patchset.registry import Patch, load_registry


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser("list", help="list the patches in the registry")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_list)
    p = sub.add_parser("show", help="show one patch's metadata and payload")
    p.add_argument("id", metavar="ID")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_show)
    p = sub.add_parser("validate", help="load and validate every patch; print the registry digest")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run_validate)


def patch_dict(patch: Patch) -> dict[str, object]:
    up = patch.upstream
    return {
        "id": patch.id,
        "title": patch.title,
        "description": patch.description.strip(),
        "kind": patch.kind,
        "revision": patch.revision,
        "vllm": str(patch.vllm),
        "apply": patch.apply,
        "targets": list(patch.targets),
        "touches": list(patch.touches),
        "upstream": {
            "pr": up.pr,
            "state": up.state,
            "superseded_by": up.superseded_by,
            "superseded_in": up.superseded_in,
            "probe": up.probe.describe() if up.probe else None,
            "note": up.note,
        },
        "hardware": {
            "compute_capability": (
                str(patch.hardware.compute_capability)
                if patch.hardware.compute_capability
                else None
            ),
            "note": patch.hardware.note,
        },
        "origin": patch.origin,
        "credit": list(patch.credit),
        "variants": [
            {
                "payload": v.name,
                "vllm": str(v.vllm),
                "base": v.base,
                "sha256": v.sha256,
                "files": list(v.files),
            }
            for v in patch.variants
        ],
        "digest": patch.digest,
    }


def run_list(args: argparse.Namespace) -> int:
    registry = load_registry(args.registry)
    if args.format == "json":
        print_json(
            {"registry": registry.digest, "patches": [patch_dict(p) for p in registry.patches]}
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
    data = patch_dict(patch)
    if args.format == "json":
        print_json(data)
        return ExitCode.OK
    con = console()
    con.print(f"[bold]{patch.id}[/] rev {patch.revision}: {patch.title}")
    for key in ("kind", "apply", "vllm", "targets", "upstream", "hardware", "origin", "credit"):
        con.print(f"  {key}: {data[key]}", markup=False)
        if key == "targets" and patch.touches:
            con.print(f"  touches: {data['touches']}", markup=False)
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
    if args.format == "json":
        print_json({"registry": registry.digest, "valid": True, "patches": len(registry.patches)})
    else:
        console().print(
            f"{registry.root}: {len(registry.patches)} patches valid; digest {registry.digest}",
            markup=False,
        )
    return ExitCode.OK
