"""`validate --build FILE`: the one planner (`patchset.image.plan`) on a build definition, as
`check --build` runs it: every refusal `runtime export`, `build` and the start would make, at
once, each with its fix (one line each; JSON: the plan per definition); exit 1 when any."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from patchset.cli.output import console
from patchset.cli.sourceopts import source_from
from patchset.errors import ExitCode
from patchset.image.plan import Plan
from patchset.registry import Registry


def add_build_options(parser: argparse.ArgumentParser) -> None:
    """`--build FILE` (repeatable) and `--switches SET` (repeatable); the release is read
    through the source options `--probes` brings (`--source`, `--offline`...)."""
    parser.add_argument(
        "--build",
        action="append",
        type=Path,
        default=[],
        metavar="FILE",
        help="a build definition: plan it on the release it pins, as `check --build` and"
        " `runtime export` do, and list every refusal at once, each with its fix: exit 1 when any",
    )
    parser.add_argument(
        "--switches",
        action="append",
        default=[],
        metavar="SET",
        help="with --build: plan this switch set too (repeatable): `all` (every switch on) or"
        " ENV=1,ENV=0,... over the definition's defaults",
    )


def build_plans(registry: Registry, args: argparse.Namespace) -> list[Plan] | None:
    """With --build, the planner's plan of each definition (its defaults and `--switches`);
    else None."""
    if not args.build:
        return None
    from patchset.image.plan import plan, switch_sets
    from patchset.registry.builds import load_definition  # on use: it reads releases

    definitions = [load_definition(path) for path in args.build]
    source = source_from(args)
    plans = []
    for definition in list({d.file.resolve(): d for d in definitions}.values()):
        sets = switch_sets(definition, registry, args.switches)
        with source.open(definition.vllm) as tree:
            read = lambda wanted, tree=tree: {rel: tree.read(rel) for rel in wanted}  # noqa: E731
            plans.append(plan(definition, registry, read, sets=sets))
    return plans


def plans_json(plans: list[Plan] | None) -> dict[str, Any]:
    if plans is None:
        return {}
    return {
        "plans": [p.to_dict() for p in plans],
        "refusals": sum(len(p.refusals) for p in plans),
    }


def show_plans(plans: list[Plan] | None) -> None:
    """As `check --build` shows the planner's part: each refusal on its line, then the count."""
    if plans is None:
        return
    con = console()
    for planned in plans:
        for refusal in planned.refusals:
            con.print(
                f"{planned.definition}: refused: {refusal.line()}", markup=False, soft_wrap=True
            )
    count = sum(len(p.refusals) for p in plans)
    con.print(
        f"{count} refusals `runtime export` would make (switches:"
        f" {', '.join(dict.fromkeys(s for p in plans for s in p.sets))})",
        markup=False,
    )


def plans_exit(plans: list[Plan] | None) -> int:
    return ExitCode.ATTENTION if plans and any(p.refusals for p in plans) else ExitCode.OK
