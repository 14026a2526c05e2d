"""`patchset add`: a new patch from a pull request, a local diff, or a runtime skeleton."""

from __future__ import annotations

import argparse
import sys
from datetime import UTC, datetime
from pathlib import Path

from patchset import add
from patchset.adapters import forge
from patchset.cli.output import FORMATS, console, print_json
from patchset.errors import ExitCode, UsageError
from patchset.registry import STATES, WHENS
from patchset.sources import parse_source, select

DESCRIPTION = """\
Add a patch to the registry: the diff of a pull request (--pr, fetched from the forge), a
local diff (--diff FILE, '-' for stdin), or a runtime patch skeleton (--runtime). Only files
under vllm/ are kept; the range is suggested by checking the new patch against releases:
--vllm/--since, else every release already in the cache (nothing is downloaded).

Refused, with nothing written (exit 2): an id that exists, a diff that does not parse, a
diff that touches no file under vllm/."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "add",
        help="add a patch from a pull request, a diff file, or a runtime skeleton",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", metavar="ID", help="the new patch's id (3-64 of a-z 0-9 -)")
    what = p.add_mutually_exclusive_group()
    what.add_argument("--diff", metavar="FILE", help="a local .diff/.patch ('-': stdin)")
    what.add_argument(
        "--runtime", action="store_true", help="lay out a runtime patch skeleton to fill in"
    )
    p.add_argument(
        "--pr",
        metavar="OWNER/REPO#N",
        help="the upstream pull request; its diff is fetched unless --diff is given",
    )
    p.add_argument(
        "--forge-url",
        metavar="URL",
        help=f"the forge serving <owner>/<repo>/pull/<n>.diff (default: ${forge.FORGE_ENV}"
        f" or {forge.DEFAULT_FORGE})",
    )
    p.add_argument("--state", choices=STATES, help="upstream state (default: open with --pr)")
    p.add_argument("--title", metavar="TEXT")
    p.add_argument("--credit", action="append", default=[], metavar="TEXT")
    p.add_argument("--apply", choices=WHENS, default=None, help="build (default) or startup")
    p.add_argument(
        "--range", metavar="SPEC", help="the declared vLLM range (default: from the check)"
    )
    p.add_argument("--vllm", action="append", default=[], metavar="VERSION")
    p.add_argument(
        "--since", metavar="VERSION", help="check every release from VERSION on (VERSION included)"
    )
    p.add_argument("--source", metavar="SPEC", help="where releases come from (see check)")
    p.add_argument("--index-url", metavar="URL")
    p.add_argument("--offline", action="store_true", help="use the release cache only")
    p.add_argument("--no-check", action="store_true", help="check no release")
    p.add_argument("--format", choices=FORMATS, default="table")
    p.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    root: Path = args.registry
    if args.runtime:
        folder = add.add_runtime(
            root, args.id, pr=args.pr, state=args.state, title=args.title, vllm=args.range
        )
        if args.format == "json":
            print_json({"id": args.id, "folder": str(folder), "kind": "runtime"})
        else:
            console().print(
                f"laid out {folder}: fill in vllm, targets and sites.toml, then"
                " `patchset validate` (it refuses the skeleton until then)",
                markup=False,
                soft_wrap=True,
            )
        return ExitCode.OK
    if args.diff is None and args.pr is None:
        raise UsageError(
            "say where the patch comes from: --pr OWNER/REPO#N, --diff FILE or --runtime"
        )
    add.check_new_id(root, args.id)  # before any download
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    if args.diff is not None:
        name = "<stdin>" if args.diff == "-" else args.diff
        text = sys.stdin.read() if args.diff == "-" else add.read_diff_file(Path(args.diff))
        origin = f"{args.pr + ', ' if args.pr else ''}diff {Path(name).name} (added {today})"
    else:
        url = forge.pr_diff_url(args.pr, args.forge_url)
        name = url
        text = forge.fetch_pr_diff(args.pr, args.forge_url)
        origin = f"{args.pr} (its diff, fetched {today})"
    payload = add.normalize_diff(text, file=name)
    source = None
    versions: list[str] = []
    if not args.no_check:
        cached_only = not (args.vllm or args.since or args.source)
        source = parse_source(
            args.source, index_url=args.index_url, offline=args.offline or cached_only
        )
        versions = select.for_add(source, versions=args.vllm, since=args.since)
    result = add.add_diff(
        root,
        args.id,
        payload,
        pr=args.pr,
        state=args.state,
        title=args.title,
        origin=origin,
        credit=args.credit,
        apply=args.apply or "build",
        vllm=args.range,
        source=source,
        versions=versions,
    )
    patch = result.patch
    if args.format == "json":
        print_json(
            {
                "id": patch.id,
                "folder": str(patch.folder),
                "kind": patch.kind,
                "targets": list(patch.targets),
                "dropped": list(result.dropped),
                "upstream": {"pr": patch.upstream.pr, "state": patch.upstream.state},
                "vllm": result.range,
                "range_note": result.range_note,
                "suggested_ranges": list(result.suggested),
                "check": result.report.to_dict() if result.report else None,
            }
        )
        return ExitCode.OK
    con = console()
    con.print(f"added {patch.folder}: {', '.join(patch.targets)}", markup=False, soft_wrap=True)
    if result.dropped:
        con.print(
            f"left out (not under vllm/): {', '.join(result.dropped)}", markup=False, soft_wrap=True
        )
    con.print(f'vllm = "{result.range}": {result.range_note}', markup=False, soft_wrap=True)
    con.print(
        f"next: review title, description and credit in {patch.folder}/patch.toml,"
        " then `patchset validate`",
        markup=False,
        soft_wrap=True,
    )
    return ExitCode.OK
