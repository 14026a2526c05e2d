"""`validate --probes`: every upstream probe string found in a release where its patch is
still needed (`release_check.probes`): one line each, naming the patch, the string and the
release; exit 1 when there is any."""

from __future__ import annotations

import argparse

from patchset.cli.options import switch
from patchset.cli.output import console, print_json
from patchset.cli.sourceopts import add_source_options, source_from
from patchset.errors import ExitCode
from patchset.registry import Registry


def add_probe_options(parser: argparse.ArgumentParser) -> None:
    switch(
        parser,
        "--probes",
        "also look for probe strings found in releases where their patch is still needed"
        " (every hunk or site applies, none of their changes there): exit 1 when any",
    )
    if "--source" not in parser._option_string_actions:  # another option set may bring them
        add_source_options(parser, pre=False)


def run_probes(registry: Registry, args: argparse.Namespace) -> int:
    from patchset.release_check.probes import audit_probes

    found = audit_probes(registry, source_from(args))
    if args.format == "json":
        print_json(
            {
                "registry": registry.digest,
                "probes_matching_unfixed_releases": len(found),
                "findings": [f.to_dict() for f in found],
                "exit_code": int(ExitCode.ATTENTION if found else ExitCode.OK),
            }
        )
    else:
        con = console()
        for f in found:
            con.print(f"probe: {f.describe()}", markup=False, soft_wrap=True)
        con.print(
            f"{len(found)} probe string(s) found where their patch is still needed", markup=False
        )
    return ExitCode.ATTENTION if found else ExitCode.OK
