"""`patchset add` and `patchset update`: a patch from a pull request, a local diff, an edited
vLLM tree or whole-file overlays (or a runtime skeleton); a new payload for an existing one."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path

from patchset import add
from patchset.adapters import forge
from patchset.authoring import tree as trees
from patchset.authoring import update as updates
from patchset.authoring.layout import Layout
from patchset.cli.output import FORMATS, console, err_console, print_json, progress_console
from patchset.errors import ExitCode, UsageError
from patchset.registry import STATES, WHENS, load_registry
from patchset.sources import parse_source, select
from patchset.sources.base import ReleaseSource

DESCRIPTION = """\
Add a patch to the registry: the diff of a pull request (--pr OWNER/REPO#N or its URL, fetched
from the forge), a local diff (--diff FILE, '-' for stdin; a `git format-patch` mail too), the
edits in a vLLM tree (--from-tree DIR --vllm X), whole-file overlays (--overlay FILE...), or a
runtime patch skeleton (--runtime). Only files under vllm/ are kept. A diff made inside the
vllm/ package (`patch -p1` from site-packages/vllm) is found so when every file it changes is
under vllm/ in a known release, or said with --root vllm (and --strip N). The text above the
diff becomes the description (a mail's Subject the title, its From the credit). The range is
suggested by checking the new patch against releases: --vllm/--since, else every release
already in the cache (nothing is downloaded).

Refused, with nothing written (exit 2): an id that exists, a diff that does not parse, a
diff that touches no file under vllm/, a --from-tree folder with no vllm/, an overlay that
matches no release."""

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
        what.add_argument(
            "--runtime", action="store_true", help="lay out a runtime patch skeleton to fill in"
        )
    p.add_argument(
        "--file",
        action="append",
        default=[],
        metavar="vllm/PATH",
        help="with --from-tree: only this file (repeatable; one not in the release is created,"
        " one not in the edited tree deleted)",
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
        f" ${forge.FORGE_ENV} or {forge.DEFAULT_FORGE})",
    )
    p.add_argument("--strip", type=int, metavar="N", help="drop N leading path parts, as -pN")
    p.add_argument(
        "--root",
        metavar="DIR",
        help="the folder the diff's paths are relative to, e.g. 'vllm' for a diff made inside"
        " the vllm/ package (default: found)",
    )
    p.add_argument("--vllm", action="append", default=[], metavar="VERSION")
    p.add_argument(
        "--since", metavar="VERSION", help="check every release from VERSION on (VERSION included)"
    )
    p.add_argument(
        "--pre", action="store_true", help="let --since pick pre-releases too (as pip --pre)"
    )
    p.add_argument("--source", metavar="SPEC", help="where releases come from (see check)")
    p.add_argument("--index-url", metavar="URL")
    p.add_argument("--offline", action="store_true", help="use the release cache only")
    p.add_argument("--no-check", action="store_true", help="check no release")
    p.add_argument("--format", choices=FORMATS, default="table")


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "add",
        help="add a patch from a pull request, a diff, an edited tree, overlays, or a skeleton",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("id", metavar="ID", help="the new patch's id (3-64 of a-z 0-9 -)")
    _sources(p, update=False)
    p.add_argument("--state", choices=STATES, help="upstream state (default: open with --pr)")
    p.add_argument("--title", metavar="TEXT")
    p.add_argument("--credit", action="append", default=[], metavar="TEXT")
    p.add_argument("--apply", choices=WHENS, default=None, help="build (default) or startup")
    p.add_argument(
        "--range", metavar="SPEC", help="the declared vLLM range (default: from the check)"
    )
    p.add_argument(
        "--requires",
        action="append",
        default=[],
        metavar="ID",
        help="a patch this one goes on top of (repeatable; a stacked series, as quilt's)",
    )
    p.set_defaults(handler=run)
    u = sub.add_parser(
        "update",
        help="a new payload for a diff patch: from its pull request, a diff or an edited tree",
        description=UPDATE_DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    u.add_argument("id", metavar="ID", help="the patch to update")
    _sources(u, update=True)
    u.set_defaults(handler=run_update)


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


def _releases(args: argparse.Namespace) -> tuple[ReleaseSource | None, list[str]]:
    if args.no_check and not (args.from_tree or getattr(args, "overlay", None)):
        return None, []
    cached_only = not (args.vllm or args.since or args.source)
    source = parse_source(
        args.source,
        index_url=args.index_url,
        offline=args.offline or cached_only,
        prereleases=args.pre,
    )
    if args.no_check:
        return source, []
    return source, select.for_add(source, versions=args.vllm, since=args.since, pre=args.pre)


def _prepared(
    args: argparse.Namespace, *, pr: str | None, forge_url: str | None
) -> tuple[ReleaseSource | None, list[str], add.DiffPayload, str, list[str]]:
    """The releases to check, the new payload, where it came from and the notes on it,
    shown on stderr (`add` and `update`)."""
    today = datetime.now(UTC).strftime("%Y-%m-%d")
    source, versions = _releases(args)
    payload, origin, notes = _payload(
        args, source, versions, pr=pr, forge_url=forge_url, today=today
    )
    for note in notes:
        err_console().print(note, markup=False, soft_wrap=True)
    return source, versions, payload, origin, notes


def _payload(
    args: argparse.Namespace,
    source: ReleaseSource | None,
    versions: list[str],
    *,
    pr: str | None,
    forge_url: str | None,
    today: str,
) -> tuple[add.DiffPayload, str, list[str]]:
    """The new payload, where it came from, and notes for the user."""
    notes: list[str] = []
    if args.from_tree is not None:
        if not args.vllm or source is None:
            raise UsageError("--from-tree needs --vllm X: the release the tree was installed from")
        with source.open(args.vllm[0]) as pristine:
            found = trees.diff_tree(args.from_tree, pristine, args.file)
        if not found.files:
            raise UsageError(
                f"no file differs from vLLM {args.vllm[0]}"
                + (
                    f" (not text, left out: {', '.join(found.unreadable)})"
                    if found.unreadable
                    else ""
                ),
                path=args.from_tree,
            )
        if found.unreadable:
            notes.append(f"left out (not UTF-8 text): {', '.join(found.unreadable)}")
        if found.deleted:
            notes.append(
                f"deletes (in vLLM {args.vllm[0]}, absent from the edited tree):"
                f" {', '.join(found.deleted)}"
                + ("" if args.file else "; --file vllm/PATH limits the patch to the files named")
            )
        payload = add.normalize_diff(found.text, file=args.from_tree)
        return (
            payload,
            f"the edits in {args.from_tree.name}/ against vLLM {args.vllm[0]} (added {today})",
            notes,
        )
    if getattr(args, "overlay", None):
        if source is None:
            raise UsageError("--overlay needs releases to compare with: drop --no-check")
        candidates = list(args.vllm) or versions
        if not candidates:
            raise UsageError(
                "--overlay: no release in the cache to compare with; give --vllm X or --since X"
            )
        parts = []
        for spec in args.overlay:
            name, _, target = spec.partition("=")
            path = Path(name)
            text = add.read_diff_file(path)
            match, old = trees.match_overlay(path, text, source, candidates, target or None)
            also = [v for v in match.same if v != match.version]
            chosen = ""
            if match.next_best is not None:
                chosen = (
                    f"; chosen by content among {match.compared} files named {path.name},"
                    f" next {match.next_best[0]} at {match.next_best[1]:.0%}"
                )
            notes.append(
                f"{path}: a copy of {match.target} from vLLM {match.version}"
                f" ({match.likeness:.0%} of lines alike"
                + (f"; as alike in {', '.join(also)}" if also else "")
                + chosen
                + ")"
            )
            parts.append(trees.unified(match.target, old, text))
        payload = add.normalize_diff("".join(parts), file=args.overlay[0])
        names = ", ".join(Path(s.partition("=")[0]).name for s in args.overlay)
        return payload, f"overlays {names} (added {today})", notes
    layout = Layout(strip=args.strip, root=args.root)
    if args.diff is not None:
        name = "<stdin>" if args.diff == "-" else args.diff
        text = sys.stdin.read() if args.diff == "-" else add.read_diff_file(Path(args.diff))
        origin = f"{pr + ', ' if pr else ''}diff {Path(name).name} (added {today})"
    else:
        assert pr is not None
        name = forge.pr_diff_url(pr, forge_url)
        text = forge.fetch_pr_diff(pr, forge_url)
        origin = f"{pr} (its diff, fetched {today})"
    detect = add.detector(source, versions) if source is not None and versions else None
    payload = add.normalize_diff(text, file=name, layout=layout, detect=detect)
    if payload.detected is not None:
        notes.append(
            "detected: the diff's paths are relative to the vllm/ package (every file it"
            f" changes is under vllm/ in {payload.detected.version}); --root/--strip say"
            " otherwise"
        )
    return payload, origin, notes


def run(args: argparse.Namespace) -> int:
    root: Path = args.registry
    pr, url_forge = forge.pr_ref(args.pr) if args.pr else (None, None)
    forge_url = args.forge_url or url_forge
    if args.runtime:
        folder = add.add_runtime(
            root, args.id, pr=pr, state=args.state, title=args.title, vllm=args.range
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
    if args.diff is None and pr is None and args.from_tree is None and not args.overlay:
        raise UsageError(
            "say where the patch comes from: --pr OWNER/REPO#N, --diff FILE, --from-tree DIR,"
            " --overlay FILE or --runtime"
        )
    add.check_new_id(root, args.id)  # before any download
    source, versions, payload, origin, notes = _prepared(args, pr=pr, forge_url=forge_url)
    result = add.add_diff(
        root,
        args.id,
        payload,
        pr=pr,
        state=args.state,
        title=args.title,
        origin=origin,
        credit=args.credit,
        apply=args.apply or "build",
        vllm=args.range,
        source=source,
        versions=versions,
        on_release=_progress(args.format)(len(versions)),
        requires=args.requires,
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
                "notes": notes,
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


def run_update(args: argparse.Namespace) -> int:
    root: Path = args.registry
    patch = updates.find(load_registry(root, tolerant=True), args.id)  # before any download
    pr, url_forge = forge.pr_ref(args.pr) if args.pr else (None, None)
    forge_url = args.forge_url or url_forge
    if args.diff is None and args.from_tree is None:
        pr = pr or patch.upstream.pr
        if pr is None:
            raise UsageError(
                f"{args.id} records no upstream.pr: give --pr, --diff FILE or --from-tree DIR",
                path=patch.folder,
            )
    source, versions, payload, origin, _ = _prepared(args, pr=pr, forge_url=forge_url)
    result = updates.update(
        root,
        args.id,
        payload.text,
        payload.targets,
        pr=pr if args.pr else None,
        source=source,
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
