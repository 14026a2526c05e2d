"""`patchset add` and `patchset update`: a patch from a pull request, a local diff, an edited
vLLM tree or whole-file overlays (or a runtime skeleton); a new payload for an existing one."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from patchset._gc import collector_paused
from patchset.adapters.forge import DEFAULT_FORGE, FORGE_ENV, pr_ref
from patchset.cli.options import add_command, repeatable, switch
from patchset.cli.output import FORMATS, console, err_console, print_json, progress_console
from patchset.cli.sourceopts import add_source_options
from patchset.errors import ExitCode, UsageError
from patchset.registry import STATES, WHENS

if TYPE_CHECKING:
    from patchset.authoring.payload import Prepared

DESCRIPTION = """\
Add a patch to the registry: the diff of a pull request (--pr OWNER/REPO#N or its URL, fetched
from the forge), a local diff (--diff FILE, '-' for stdin; a `git format-patch` mail too), the
edits in a vLLM tree (--from-tree DIR --vllm X), whole-file overlays (--overlay FILE...), or a
runtime patch skeleton (--runtime). Only files under vllm/ are kept. A diff made inside the
vllm/ package (`patch -p1` from site-packages/vllm) is found so when every file it changes is
under vllm/ in a known release, or said with --root vllm (and --strip N). The text above the
diff becomes the description (a mail's Subject the title, its From the credit). The range is
suggested by checking the new patch against releases: --vllm/--since, else every release
already in the cache (the files the check needs that the cache lacks are fetched, unless
--offline).

An edited tree deletes no file it lacks unless --allow-deletions (then only files of folders
it holds: a checkout or sdist has no built or vendored folders of the wheel), or --file
names it. Inputs
(--diff, --overlay) are regular files (or '-', stdin) of at most 256 MiB; --from-tree reads
no symlink leading out of the tree.

Refused, with nothing written (exit 2): an id that exists, a diff that does not parse, a
diff that touches no file under vllm/, a --from-tree folder with no vllm/, an overlay that
matches no release or is identical to it."""

UPDATE_DESCRIPTION = """\
Give an existing diff patch a new payload: its pull request's diff again (the recorded
upstream.pr, or --pr), a new --diff, or the edits in a tree (--from-tree DIR --vllm X). Its
revision is bumped; every other key and comment in patch.toml is kept. The range is then
checked again (--vllm/--since, else the cached releases) and releases inside it where the new
payload is not `needed` are named. An id that does not exist is refused (exit 2)."""


def _sources(p: argparse.ArgumentParser, *, update: bool) -> None:
    what = p.add_mutually_exclusive_group()
    what.add_argument("--diff", metavar="FILE", help="a local .diff/.patch ('-': stdin)")
    what.add_argument(
        "--from-tree",
        metavar="DIR",
        type=Path,
        help="an edited vLLM (site-packages, checkout, or vllm/ itself): its difference from"
        " the release given by --vllm",
    )
    if not update:
        what.add_argument(
            "--overlay",
            nargs="+",
            metavar="FILE[=vllm/PATH]",
            help="whole-file copies of vLLM files with a fix; the release (and file) they were"
            " copied from is found by content unless --vllm (and =vllm/PATH) say it",
        )
        switch(what, "--python", "lay out a python patch skeleton to fill in")
        switch(
            p,
            "--runtime",
            "with --from-tree or --overlay: anchored runtime sites instead of a diff (each"
            " anchor the fewest of the release's lines that occur once in the file); alone: lay"
            " out a runtime patch skeleton to fill in",
        )
    repeatable(
        p,
        "--file",
        "vllm/PATH",
        "with --from-tree: only this file (repeatable; one not in the release is created, one"
        " not in the edited tree deleted)",
    )
    switch(
        p,
        "--allow-deletions",
        "with --from-tree: let the patch delete the files of the release that the edited tree"
        " lacks (without it none is deleted but those --file names)",
    )
    p.add_argument(
        "--pr",
        metavar="OWNER/REPO#N|URL",
        help="the upstream pull request; its diff is fetched unless another source is given",
    )
    p.add_argument(
        "--forge-url",
        metavar="URL",
        help=f"the forge serving <owner>/<repo>/pull/<n>.diff (default: the PR URL's, else"
        f" ${FORGE_ENV} or {DEFAULT_FORGE})",
    )
    p.add_argument("--strip", type=int, metavar="N", help="drop N leading path parts, as -pN")
    p.add_argument(
        "--root",
        metavar="DIR",
        help="the folder the diff's paths are relative to, e.g. 'vllm' for a diff made inside"
        " the vllm/ package (default: found)",
    )
    repeatable(p, "--vllm", "VERSION")
    p.add_argument(
        "--since", metavar="VERSION", help="check every release from VERSION on (VERSION included)"
    )
    add_source_options(p)
    switch(p, "--no-check", "check no release")
    p.add_argument("--format", choices=FORMATS, default="table")


REMOVE_DESCRIPTION = """\
Remove a patch folder from the registry, whole. Refused (exit 2, nothing removed) while
another patch requires it, conflicts with it or is superseded by it, or a build definition
lists it: each is named."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "add", run, DESCRIPTION)
    p.add_argument("id", metavar="ID", help="the new patch's id (3-64 of a-z 0-9 -)")
    _sources(p, update=False)
    p.add_argument("--state", choices=STATES, help="upstream state (default: open with --pr)")
    p.add_argument("--title", metavar="TEXT")
    repeatable(p, "--credit", "TEXT")
    p.add_argument("--apply", choices=WHENS, default=None, help="build (default) or startup")
    p.add_argument(
        "--range", metavar="SPEC", help="the declared vLLM range (default: from the check)"
    )
    repeatable(
        p,
        "--requires",
        "ID",
        "a patch this one goes on top of (repeatable; a stacked series, as quilt's)",
    )
    u = add_command(sub, "update", run_update, UPDATE_DESCRIPTION)
    u.add_argument("id", metavar="ID", help="the patch to update")
    _sources(u, update=True)
    r = add_command(sub, "remove", run_remove, REMOVE_DESCRIPTION)
    r.add_argument("id", metavar="ID", help="the patch to remove")
    r.add_argument("--format", choices=FORMATS, default="table")


def _progress(fmt: str) -> Callable[[int], Callable[[str], None]]:
    """A callback per checked release, on stderr (stdout stays the report)."""

    def start(total: int) -> Callable[[str], None]:
        done = 0

        def tick(version: str) -> None:
            nonlocal done
            done += 1
            if shown_on is not None:
                shown_on.print(f"checked vLLM {version} ({done}/{total})", markup=False)

        shown_on = progress_console()
        if total and fmt != "json" and shown_on is not None:
            shown_on.print(f"checking {total} release(s)...", markup=False)
        return tick

    return start


def _prepared(args: argparse.Namespace, *, pr: str | None, forge_url: str | None) -> Prepared:
    """The releases to check, the new payload, where it came from and the notes on it, the
    notes shown on stderr (`add` and `update`)."""
    from patchset.authoring.layout import Layout
    from patchset.authoring.payload import PayloadRequest, prepare

    wanted = PayloadRequest(
        from_tree=args.from_tree,
        files=tuple(args.file),
        overlay=tuple(getattr(args, "overlay", None) or ()),  # add's only
        diff=args.diff,
        pr=pr,
        forge_url=forge_url,
        layout=Layout(strip=args.strip, root=args.root),
        vllm=tuple(args.vllm),
        since=args.since,
        pre=args.pre,
        source=args.source,
        source_version=args.source_version,
        index_url=args.index_url,
        offline=args.offline,
        no_check=args.no_check,
        allow_deletions=args.allow_deletions,
        runtime=getattr(args, "runtime", False),  # add's only
    )
    prepared = prepare(wanted)
    for note in prepared.notes:
        err_console().print(note, markup=False, soft_wrap=True)
    return prepared


# The collector paused for the run, as for check: a payload's lines are objects without cycles,
# and its full passes walked them all again and again (60 MB: 4x 20 MB's CPU; issue 23 item 19).
@collector_paused()
def run(args: argparse.Namespace) -> int:
    from patchset.authoring import add

    root: Path = args.registry
    pr, url_forge = pr_ref(args.pr) if args.pr else (None, None)
    forge_url = args.forge_url or url_forge
    given = args.diff is not None or args.from_tree is not None or bool(args.overlay)
    if args.python or (args.runtime and not given):
        kind, fill = (
            ("python", "touches and plugin.py") if args.python else ("runtime", "sites.toml")
        )
        folder = add.add_skeleton(
            root, args.id, kind=kind, pr=pr, state=args.state, title=args.title, vllm=args.range
        )
        if args.format == "json":
            print_json({"id": args.id, "folder": str(folder), "kind": kind})
        else:
            console().print(
                f"laid out {folder}: fill in vllm, targets and {fill}, then"
                " `patchset validate` (it refuses the skeleton until then)",
                markup=False,
                soft_wrap=True,
            )
        return ExitCode.OK
    if not given and pr is None:
        raise UsageError(
            "say where the patch comes from: --pr OWNER/REPO#N, --diff FILE, --from-tree DIR,"
            " --overlay FILE, --runtime or --python"
        )
    add.check_new_id(root, args.id)  # before any download
    prepared = _prepared(args, pr=pr, forge_url=forge_url)
    payload, versions = prepared.payload, prepared.versions
    result = add.add_diff(
        root,
        args.id,
        payload,
        pr=pr,
        vllm=args.range,
        on_release=_progress(args.format)(len(versions)),
        state=args.state,
        title=args.title,
        credit=args.credit,
        apply=args.apply,
        requires=args.requires,
        origin=prepared.origin,
        source=prepared.source,
        versions=prepared.versions,
        base=prepared.base,
        sites=prepared.sites,
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
                "detected_root": "vllm" if payload.detected else None,
                "notes": list(prepared.notes),
                "upstream": {"pr": patch.upstream.pr, "state": patch.upstream.state},
                "vllm": result.range,
                "base": patch.variants[0].base,
                "sites": len(prepared.sites),
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
    if payload.preamble.description:
        con.print("description: from the text above the diff", markup=False)
    con.print(f'vllm = "{result.range}": {result.range_note}', markup=False, soft_wrap=True)
    con.print(
        f"next: review title, description and credit in {patch.folder}/patch.toml,"
        " then `patchset validate`",
        markup=False,
        soft_wrap=True,
    )
    return ExitCode.OK


@collector_paused()
def run_update(args: argparse.Namespace) -> int:
    from patchset.authoring import update as updates
    from patchset.registry import load_registry

    root: Path = args.registry
    patch = updates.find(load_registry(root, tolerant=True), args.id)  # before any download
    pr, url_forge = pr_ref(args.pr) if args.pr else (None, None)
    forge_url = args.forge_url or url_forge
    if args.diff is None and args.from_tree is None:
        pr = pr or patch.upstream.pr
        if pr is None:
            raise UsageError(
                f"{args.id} records no upstream.pr: give --pr, --diff FILE or --from-tree DIR",
                path=patch.folder,
            )
    prepared = _prepared(args, pr=pr, forge_url=forge_url)
    origin, versions = prepared.origin, prepared.versions
    result = updates.update(
        root,
        args.id,
        prepared.payload.text,
        prepared.payload.targets,
        pr=pr if args.pr else None,
        source=prepared.source,
        versions=versions,
        on_release=_progress(args.format)(len(versions)),
    )
    new = result.patch
    if args.format == "json":
        print_json(
            {
                "id": new.id,
                "changed": result.changed,
                "revision": new.revision,
                "old_revision": result.old_revision,
                "from": origin,
                "targets": list(new.targets),
                "vllm": str(new.vllm),
                "suggested_ranges": list(result.suggested),
                "not_needed_in_range": list(result.outside),
                "check": result.report.to_dict() if result.report else None,
            }
        )
        return ExitCode.OK
    con = console()
    if result.changed:
        con.print(
            f"updated {new.folder}: revision {result.old_revision} -> {new.revision},"
            f" from {origin}",
            markup=False,
            soft_wrap=True,
        )
    else:
        con.print(f"{new.id}: the payload is the same; nothing written", markup=False)
    if result.report is None:
        con.print("range not checked (no release given or cached)", markup=False)
    elif result.outside:
        con.print(
            f'vllm = "{new.vllm}" holds releases where it is not needed now:'
            f" {', '.join(result.outside)}; suggested: {', '.join(result.suggested) or 'none'}"
            " (`patchset check --suggest-ranges --write`)",
            markup=False,
            soft_wrap=True,
        )
    else:
        con.print(f'vllm = "{new.vllm}": needed in every checked release inside it', markup=False)
    return ExitCode.OK


def run_remove(args: argparse.Namespace) -> int:
    from patchset.authoring import remove as removal

    folder = removal.remove(args.registry, args.id, builds=args.builds)
    if args.format == "json":
        print_json({"id": args.id, "removed": str(folder)})
    else:
        console().print(f"removed {folder}", markup=False, soft_wrap=True)
    return ExitCode.OK
