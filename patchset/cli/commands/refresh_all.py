"""`patchset refresh --all --vllm V [--write]`: every diff patch that fits V only at an
offset or with fuzz, carried onto V as an exact variant, and every runtime patch whose
anchors V moved, with its new anchors (patchset/refresh/carry.py)."""

from __future__ import annotations

import argparse

from patchset.cli.loading import load
from patchset.cli.output import console, print_json, table, text
from patchset.cli.sourceopts import source_from
from patchset.errors import UsageError
from patchset.refresh.carry import refresh_shifted


def run(args: argparse.Namespace) -> int:
    if not args.all:
        raise UsageError("refresh: give a patch ID, or --all with --vllm")
    if args.id is not None or not args.vllm or args.finish or args.abort or args.pick:
        raise UsageError("--all takes --vllm V (and --write), no patch ID, --finish or --pick")
    registry = load(args.registry)
    report = refresh_shifted(registry, args.vllm, source=source_from(args), write=args.write)
    if args.format == "json":
        print_json(report.to_dict())
        return report.exit_code
    out = table(
        f"patches fitting vllm {report.vllm} only at an offset, with fuzz or with moved anchors",
        ["patch", "outcome", "variant", "how"],
    )
    for c in report.carried:
        out.add_row(text(c.patch), text(c.outcome), text(c.variant or "-"), text(c.detail))
    con = console()
    if report.carried:
        con.print(out)
    wrote = sum(1 for c in report.carried if c.outcome == "written")
    tail = f"{wrote} written" if args.write else "nothing written (--write writes them)"
    con.print(
        f"{len(report.carried)} patches to carry onto vllm {report.vllm}; {tail}", markup=False
    )
    return report.exit_code
