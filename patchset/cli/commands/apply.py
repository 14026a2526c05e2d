"""`patchset apply` and `patchset revert` on a folder that holds a vllm/ package."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from patchset.cli.loading import load
from patchset.cli.options import add_command, served_arg, switch
from patchset.cli.output import FORMATS, console, print_json, styled, table
from patchset.kernel.predicates import SERVED_LEAVES

if TYPE_CHECKING:
    from patchset.engine.apply import ApplyReport

TARGET_HELP = (
    "folder holding the vllm/ package: an sdist root, a git checkout, a site-packages folder"
    " (default: the vllm this Python would import)"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    for name, handler in (("apply", run_apply), ("revert", run_revert)):
        p = add_command(sub, name, handler)
        p.add_argument("--target", type=Path, default=None, metavar="DIR", help=TARGET_HELP)
        p.add_argument(
            "--patch",
            action="append",
            dest="patches",
            metavar="ID",
            help="exactly this patch (repeatable; default: every patch that fits the tree's"
            " release and this machine's GPU, the others shown as skipped)",
        )
        switch(
            p,
            "--strict",
            "exit 6 when nothing was to do and 7 on offsets or fuzz (default: 0 when every"
            " selected patch ends as asked)",
        )
        switch(p, "--dry-run", "check everything, write nothing")
        p.add_argument(
            "--vllm-version",
            metavar="VERSION",
            help="the release in the target when it cannot be read from vllm/_version.py",
        )
        p.add_argument("--format", choices=FORMATS, default="table")
        if name == "apply":
            p.add_argument(
                "--compute-capability",
                metavar="X.Y",
                help="the GPU to select patches for, e.g. 12.0, or 'none' (default: the first"
                " GPU nvidia-smi reports; none without it)",
            )
            switch(
                p,
                "--ignore-range",
                "apply even where the release is outside a patch's declared range",
            )
            p.add_argument(
                "--fuzz",
                type=int,
                default=0,
                metavar="N",
                help="allow dropping up to N context lines per hunk (reported; default 0)",
            )
            p.add_argument(
                "--served",
                type=served_arg,
                default={},
                metavar="KEY=VALUE,...",
                help="what will be served, for sites with `when` and [applies] predicates: "
                + ", ".join(SERVED_LEAVES)
                + " (e.g. quantization=gptq,speculative=mtp; default: nothing, so such sites"
                " are skipped, and patches whose predicate needs it are skipped naming it)",
            )
            switch(
                p, "--force", "apply a patch even where its upstream probe finds the fix (warned)"
            )


def _tree(args: argparse.Namespace) -> dict[str, Any]:
    """What `apply` and `revert` share: the registry, the tree, the patches, how to run."""
    return {
        "registry": load(args.registry, args.patches),
        "target": args.target,
        "patches": args.patches,
        "dry_run": args.dry_run,
        "version": args.vllm_version,
        "strict": args.strict,
    }


def run_apply(args: argparse.Namespace) -> int:
    from patchset.engine.apply import apply

    report = apply(
        **_tree(args),
        ignore_range=args.ignore_range,
        max_fuzz=args.fuzz,
        compute_capability=_capability(args.compute_capability),
        served=args.served,
        force=args.force,
    )
    return show(report, args.format)


def _capability(text: str | None) -> tuple[int, int] | Literal["detect"] | None:
    from patchset.adapters import gpu
    from patchset.engine.apply import DETECT

    if text is None:
        return DETECT
    if text.strip().lower() == "none":
        return None
    return gpu.parse_capability(text)


def run_revert(args: argparse.Namespace) -> int:
    from patchset.engine.apply import revert

    return show(revert(**_tree(args)), args.format)


def show(report: ApplyReport, fmt: str) -> int:
    if fmt == "json":
        print_json(report.to_dict())
        return report.exit_code
    con = console()
    gpu_text = report.compute_capability or "none"
    title = f"{report.operation} on {report.target} (vLLM {report.vllm or 'unknown'}"
    title += f", GPU {gpu_text})" if report.operation == "apply" else ")"
    out = table(title, ["patch", "rev", "payload", "outcome", "details"])
    for r in report.results:
        lines = list(r.details) + [f"warning: {w}" for w in r.warnings]
        out.add_row(r.patch, str(r.revision), r.variant or "-", styled(r.outcome), "\n".join(lines))
    con.print(out)
    for path in report.recovered:
        if report.dry_run:
            con.print(
                f"{path}: an interrupted earlier run left it half-written; the real run rolls"
                " it back first (shown above as it will be then)",
                markup=False,
            )
        else:
            con.print(f"rolled back {path} from an interrupted earlier run", markup=False)
    if report.dry_run:
        con.print("dry run: nothing was written", markup=False)
    elif report.written:
        con.print("written: every change above landed together", markup=False)
    else:
        con.print("nothing was written", markup=False)
    return report.exit_code
