"""`patchset check`: which patches a vLLM release still needs, from the released code."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from patchset.cli import registry_state, replay, report_parts
from patchset.cli.options import add_command, served_arg, switch
from patchset.cli.output import (
    bars_shown,
    console,
    dumps,
    err_console,
    print_json,
    progress_console,
    shown,
)
from patchset.cli.sourceopts import add_source_options, source_from
from patchset.errors import ExitCode, PatchsetError, UsageError

if TYPE_CHECKING:  # imported when the check runs: a report kept from last time needs none
    from patchset.registry import Patch, Registry
    from patchset.release_check import CheckReport
    from patchset.sources.base import DownloadProgress, ReleaseSource

# `patchset.adapters.net.DEFAULT_TIMEOUT` (tests/cli hold the two equal): the network module is
# imported when the check asks the index, not to build the command line
DEFAULT_TIMEOUT = 30.0

DESCRIPTION = """\
Check every patch against one or more vLLM releases and give one verdict per pair:
needed (applies, release lacks the fix), upstream (reverse applies or the upstream probe
matches), conflict, partial (some runtime sites match), missing-target (file absent; a
moved file is named). Whether the release is in the patch's declared range is shown beside."""
SOURCE_HELP = (
    "where releases come from: the package index (default), PATH (a checkout, unpacked sdist"
    " or site-packages), git:PATH (a vLLM clone), git:PATH@REF (one branch tip, as the next"
    " release after its tag) or image:REF"
)


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = add_command(sub, "check", run, DESCRIPTION)
    p.add_argument(
        "--vllm",
        action="append",
        default=[],
        metavar="VERSION",
        help="a release to check (repeatable; 'latest' is the newest on the index)",
    )
    p.add_argument(
        "--since",
        metavar="VERSION",
        help="every release from VERSION on, VERSION included (none yet: one line, exit 0)",
    )
    add_source_options(p, source_help=SOURCE_HELP)
    p.add_argument(
        "--artifact",
        choices=("wheel", "sdist"),
        default=None,
        help="read releases from their wheels (default, the sdist as fallback) or their sdists",
    )
    switch(
        p,
        "--verify-full",
        "download each release's whole artifact and check the index's sha256 first"
        " (default: each file read is checked against the wheel's RECORD and CRC)",
    )
    p.add_argument(
        "--timeout",
        type=_seconds,
        default=DEFAULT_TIMEOUT,
        metavar="SECONDS",
        help="how long to wait on the index without hearing from it, retries included"
        f" (default {DEFAULT_TIMEOUT:g}): a hung index ends the check after that long;"
        " a request that fails quickly is tried 3 more times",
    )
    p.add_argument("--patch", action="append", dest="patches", metavar="ID")
    p.add_argument("--fuzz", type=int, default=0, metavar="N")
    p.add_argument(
        "--jobs",
        type=int,
        default=None,
        metavar="N",
        help="processes the check uses: a check of many patches is split among them, with the"
        " same results (default: $PATCHSET_JOBS, else one per core; 1: this process only)",
    )
    p.add_argument(
        "--served",
        type=served_arg,
        metavar="KEY=VALUE,...",
        help="what is served, for runtime sites with `when` (as apply --served); sites it"
        " leaves out read 'conditional' (default: unknown)",
    )
    switch(
        p,
        "--explain",
        "give every failing hunk its nearest lines, out-of-range releases and JSON"
        " included (by default only failures in the patch's range, and none in JSON)",
    )
    switch(
        p,
        "--suggest-ranges",
        "print, per patch, the releases where it is needed beside its declared range",
    )
    switch(
        p,
        "--write",
        "with --suggest-ranges: record each range as the patch's vllm in patch.toml"
        " (comments and formatting kept; a patch needed in separate runs is left as is)",
    )
    p.add_argument(
        "--build",
        action="append",
        default=[],
        metavar="FILE",
        help="a build definition: its patches on the release it pins (failing), and on the"
        " later releases --vllm/--since name as 'would carry forward' (never failing)",
    )
    switch(
        p, "--builds", "as --build, for every definition in the builds folder", dest="all_builds"
    )
    switch(
        p,
        "--wide",
        "the full grid, a column per release (by default past six releases those with the"
        " same verdicts share a column, or each patch gets one strip, to fit 80 columns)",
    )
    p.add_argument(
        "--format",
        choices=("table", "json", "markdown", "github"),
        default="table",
        help="github: workflow annotations (errors where the exit code is 1), and the markdown"
        " table in $GITHUB_STEP_SUMMARY when set",
    )


def run(args: argparse.Namespace) -> int:
    if args.fuzz < 0:  # before any download
        raise UsageError(f"--fuzz {args.fuzz}: give 0 or more context lines to drop")
    from patchset._gc import collector_paused

    # The collector paused for the whole command, not only the check: the registry's loading,
    # the report's parts and the kept reports make many objects and no cycles (0.15 s of a
    # collection's check with no memo, 3% of an edited patch's)
    with collector_paused():
        return _run(args)


def _run(args: argparse.Namespace) -> int:
    from patchset.release_check import parallel

    jobs = parallel.wanted(args.jobs)  # a bad --jobs or PATCHSET_JOBS: exit 2 before any download
    if args.write and not args.suggest_ranges:
        raise UsageError("--write records the suggested ranges: give --suggest-ranges too")
    kept = _Kept.of(args)
    if kept is not None and (code := kept.replayed()) is not None:
        return code
    source = source_from(
        args,
        artifact=args.artifact,
        verify_full=args.verify_full,
        timeout=args.timeout if args.timeout != DEFAULT_TIMEOUT else None,
    )
    if kept is not None and (code := kept.edited(source, jobs)) is not None:
        return code
    from patchset.cli.loading import load, warnings

    registry = load(args.registry, args.patches)
    if args.build or args.all_builds:  # per-build pins: cli/commands/check_pins.py
        from patchset.cli.check_report import render_markdown
        from patchset.cli.commands import check_pins

        markdown = functools.partial(render_markdown, headline=False)
        return check_pins.run(args, registry, source, markdown, progress=_bar)
    report = _check(args, registry, source, jobs)
    if not report.releases:
        return _nothing_to_check(args, report, source)
    if args.format == "json":
        # in parts when it may be kept: the parts are encoded once, and printed joined
        parts = report_parts.parts_of(report, registry, kept.files) if kept is not None else None
        if parts is not None:
            sys.stdout.writelines(parts.pieces())
        else:
            sys.stdout.write(dumps(report.to_dict()) + "\n")
        code = _written(args, registry, report)
        if kept is not None and parts is not None:
            kept.keep(source, replay.Stored(parts, code, tuple(warnings(registry, args.patches))))
        return code
    # the reports for people (rich's tables among them) imported only for them: a CI's JSON
    # check starts faster
    from patchset.cli import github
    from patchset.cli.check_report import render_markdown, show_table

    if args.format == "markdown":
        sys.stdout.write(shown(render_markdown(report, registry)) + "\n")
    elif args.format == "github":
        table_md = render_markdown(report, registry, headline=False)
        sys.stdout.write(shown(github.render(report, registry, table_md)))
    else:
        show_table(
            report,
            registry,
            suggest=args.suggest_ranges,
            all_notes=args.explain,
            wide=args.wide,
        )
    return _written(args, registry, report)


def _check(
    args: argparse.Namespace,
    registry: Registry,
    source: ReleaseSource,
    jobs: int,
    *,
    prefetch: bool = True,
    patches: list[str] | None = None,
) -> CheckReport:
    """The check `args` ask for of `registry` (`prefetch`: fetch each release's files ahead,
    in parallel; else each is read when first wanted); of `patches` alone, when given."""
    from patchset.release_check import Explain, check

    explain: Explain = "all" if args.explain else "none" if args.format == "json" else "in-range"
    # The collector is paused (`run`; a library call leaves the caller's alone): each time it
    # came back on it walked all that the releases had left (directories, results).
    return check(
        registry,
        args.vllm,
        since=args.since,
        pre=args.pre,
        source=source,
        patches=patches if patches is not None else args.patches,
        max_fuzz=args.fuzz,
        explain=explain,
        served=args.served,
        progress=_bar,
        jobs=jobs,
        prefetch=prefetch,
    )


def _load_unchanged(root: Path, patch_id: str, loaded: dict[str, Patch]) -> Patch:
    """The patch `patch_id` from its folder (once: `loaded` keeps it); a PatchsetError when
    it does not load or its folder holds another patch (the whole check then says why)."""
    if patch_id not in loaded:
        from patchset.registry import load_patch

        patch = load_patch(root / patch_id)
        if patch.id != patch_id:
            raise PatchsetError(f"{patch_id}: the folder holds patch {patch.id}")
        loaded[patch_id] = patch
    return loaded[patch_id]


class _Kept:
    """This check's report as kept from last time (`cli/replay.py`): looked up before
    anything is loaded, and kept after the check when the registry did not change meanwhile."""

    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.started = time.time()
        self.files = registry_state.files_state(args.registry)
        self.base: str | None = None  # the key but the registry's files, once known

    @classmethod
    def of(cls, args: argparse.Namespace) -> _Kept | None:
        return cls(args) if replay.eligible(args) and args.registry.is_dir() else None

    def replayed(self) -> int | None:
        """The kept report printed (its warnings first) and its exit code; None: none kept."""
        listing = replay.listing_now(self.args)
        if listing is None:
            return None
        self.base = replay.base_key(self.args, listing)
        stored = replay.get(replay.key(self.base, self.files))
        if stored is None:
            return None
        if stored.warnings:
            for line in stored.warnings:
                err_console().print(line, markup=False, soft_wrap=True)
        sys.stdout.writelines(stored.parts.pieces())
        return stored.code

    def edited(self, source: ReleaseSource, jobs: int) -> int | None:
        """The newest kept report of this check brought up to date by checking only the
        patches edited since (`replay.edited`), printed; its exit code. None: the whole
        check is to run (no such report, or an edit reaching further)."""
        stored = replay.latest(self.base) if self.base is not None else None
        if stored is None or stored.warnings or self.args.patches:
            return None
        root = Path(self.args.registry)
        found = report_parts.edited(stored.parts, self.files, root)
        if found is None:
            return None
        names, contents = found
        if not names:  # touched, not changed (a checkout, a restore): the report as it was
            parts = dataclasses.replace(stored.parts, tops=self.files.tops, contents=contents)
            sys.stdout.writelines(parts.pieces())
            self.keep(source, replay.Stored(parts, parts.code))
            return parts.code
        from patchset.registry import Registry, load_patch
        from patchset.registry.load import registry_digest

        try:
            patches = [load_patch(root / name) for name in names]
        except PatchsetError:
            return None  # said as the whole registry's loading says it
        if any(report_parts.facts(p) != stored.parts.facts.get(p.id) for p in patches):
            return None  # its relations, files or names changed: the whole check
        # the patches stacked on an edited one are checked again with it (on top of it), each
        # checked patch on top of the patches it requires (loaded, not checked)
        again = report_parts.stacked_on(stored.parts, [p.id for p in patches])
        if len(patches) + len(again) > report_parts.CHECKED_MOST:
            return None
        loaded = {p.id: p for p in patches}
        try:
            checked = [*patches, *(_load_unchanged(root, i, loaded) for i in again)]
            todo = [r for p in checked for r in p.requires]
            while todo:
                todo.extend(_load_unchanged(root, todo.pop(), loaded).requires)
        except PatchsetError:
            return None
        alone = Registry(
            root=root,
            patches=tuple(loaded.values()),
            digest=registry_digest([(p.id, p.digest) for p in loaded.values()], []),
        )
        # a few patches' files: read as wanted (cached, mostly), not fetched ahead in threads
        ids = [p.id for p in checked]
        report = _check(self.args, alone, source, jobs, prefetch=False, patches=ids)
        made = report_parts.updated(stored.parts, checked, report, self.files, contents)
        if made is None:
            return None
        sys.stdout.writelines(made.pieces())
        self.keep(source, replay.Stored(made, made.code))
        return made.code

    def keep(self, source: ReleaseSource, stored: replay.Stored) -> None:
        """Keep the report just printed (unless `_keeping` says not to), with the content
        digest of each entry of the registry (those `stored` lacks read now)."""
        parts = stored.parts
        known = parts.contents.keys() == parts.tops.keys()  # read before the check (an edit)
        if (base := self._keeping(source, again=not known)) is None:
            return
        if not known:
            contents = registry_state.content_digests(Path(self.args.registry), parts.tops)
            stored = dataclasses.replace(
                stored, parts=dataclasses.replace(parts, contents=contents)
            )
        replay.put(replay.key(base, self.files), base, stored)

    def _keeping(self, source: ReleaseSource, *, again: bool) -> str | None:
        """The base key to keep this check's report under; None when it is not to be kept:
        the registry's files are too young to tell, or (`again`: looked at once more)
        changed while it ran (`registry_state.settled`). A report printed as it was kept (its
        files touched, none changed: a checkout, a restore) is kept again under the key it
        was found by, with the files' statuses now: the next run replays it without reading
        every file again."""
        if not registry_state.settled(self.files, self.args.registry, self.started, again=again):
            return None
        listing = replay.listing_used(source)
        if listing is None:  # no check ran (the report as it was): the key it was found by
            return self.base
        return replay.base_key(self.args, listing)


def _written(args: argparse.Namespace, registry: Registry, report: CheckReport) -> int:
    """`--write`: the suggested ranges recorded (each line said); the check's exit code."""
    if args.write:
        from patchset.registry.write import write_ranges  # --write only

        written, _ = write_ranges(registry, report.suggested)
        out = console() if args.format == "table" else err_console()
        for line in written:
            out.print(f"range {line.status}: {line.describe()}", markup=False, soft_wrap=True)
    return report.exit_code


def _nothing_to_check(args: argparse.Namespace, report: CheckReport, source: ReleaseSource) -> int:
    """`--since X` with no release at or after X yet: one line (JSON: the empty report)."""
    from patchset.adapters.actions import workflow_command

    what = "release" if args.pre else "final release"
    line = (
        f"patchset check: no {what} at or after {args.since} on the {source.name} yet;"
        " nothing to check"
    )
    if args.format == "json":
        print_json(report.to_dict())
    elif args.format == "github":
        sys.stdout.write(workflow_command("notice", line, title="patchset check") + "\n")
    else:
        sys.stdout.write(line + "\n")
    return ExitCode.OK


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not 0 < value <= 3600:
        raise argparse.ArgumentTypeError(f"{text!r}: give between 0 and 3600 seconds")
    return value


@contextlib.contextmanager
def _bar(versions: list[str]) -> Iterator[DownloadProgress | None]:
    """The prefetch's progress bar on stderr when it is a terminal (none under -q; rich's
    progress module imported only then: a CI log has no terminal)."""
    shown_on = progress_console() if bars_shown() else None
    if shown_on is None or not shown_on.is_terminal:
        yield None
        return
    from patchset.cli.progress import download_bar

    with download_bar(shown_on, versions) as report:
        yield report
