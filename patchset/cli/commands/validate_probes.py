"""`validate --probes`: every upstream probe string found in a release where its patch is
still needed (`release_check.probes`): one line each, naming the patch, the string and the
release; exit 1 when there is any."""

from __future__ import annotations

import argparse
from typing import Any

from patchset.cli.options import switch
from patchset.cli.output import console, err_console
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


def probe_findings(registry: Registry, args: argparse.Namespace) -> list[Any] | None:
    """With --probes, the findings (`release_check.probes.ProbeFinding`); else None. The
    releases that could not be read (offline and not cached) are said on stderr, one line."""
    if not args.probes:
        return None
    from patchset.release_check.probes import audit_probes  # on use: it reads releases

    unread: list[str] = []
    found = list(audit_probes(registry, source_from(args), unread=unread))
    if unread:
        err_console().print(
            f"patchset: warning: --probes passed over {len(unread)} release(s) it could not"
            f" read (first: {unread[0]})",
            markup=False,
            soft_wrap=True,
        )
    return found


def probes_json(found: list[Any] | None) -> dict[str, Any]:
    if found is None:
        return {}
    return {
        "probes_matching_unfixed_releases": len(found),
        "probes": [f.to_dict() for f in found],
    }


def show_probes(found: list[Any] | None) -> None:
    if found is None:
        return
    con = console()
    groups: dict[tuple[str, str, str], list[str]] = {}
    for f in found:  # one line per patch and string, its releases listed
        groups.setdefault((f.patch, f.string, f.file), []).append(f.release)
    for (patch, string, file), releases in groups.items():
        shown = ", ".join(releases[:6]) + (
            f" and {len(releases) - 6} more" if len(releases) > 6 else ""
        )
        con.print(
            f"probe: {patch}: its upstream probe string {string!r} is in {file} of vllm"
            f" {shown}, where the patch still applies and its change is absent: not evidence"
            " of the fix",
            markup=False,
            soft_wrap=True,
        )
    con.print(f"{len(found)} probe string(s) found where their patch is still needed", markup=False)


def probes_exit(found: list[Any] | None) -> int:
    return ExitCode.ATTENTION if found else ExitCode.OK
