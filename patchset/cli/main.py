"""`patchset` entry point: parse, dispatch to one command module, map errors to exit codes."""

from __future__ import annotations

import sys


def _interrupted_on_start(kind: type[BaseException], value: BaseException, tb: object) -> None:
    """Ctrl-C while the command line is still being imported: one line, no traceback (the
    process still ends by SIGINT, so a shell sees 130)."""
    if issubclass(kind, KeyboardInterrupt):
        sys.stderr.write("patchset: interrupted\n")
        return
    sys.__excepthook__(kind, value, tb)  # type: ignore[arg-type]


sys.excepthook = _interrupted_on_start  # before the imports below, which take a while

import argparse  # noqa: E402 - after the hook above, on purpose
import contextlib  # noqa: E402
import gc  # noqa: E402
import importlib  # noqa: E402
import logging  # noqa: E402
import os  # noqa: E402
import signal  # noqa: E402
import threading  # noqa: E402
import traceback  # noqa: E402
from collections.abc import Iterator, Sequence  # noqa: E402
from types import FrameType  # noqa: E402
from typing import TYPE_CHECKING, Any  # noqa: E402

from patchset import __version__  # noqa: E402
from patchset.cli import options  # noqa: E402
from patchset.errors import ExitCode, PatchsetError, one_line  # noqa: E402

if TYPE_CHECKING:
    from patchset.project import Project

DEBUG_ENV = "PATCHSET_DEBUG"
CACHE_ENV = "PATCHSET_CACHE_DIR"
COMMANDS_PACKAGE = "patchset.cli.commands"
_VALUED = ("--registry", "--builds")  # the global options that take a value


def build_parser(argv: Sequence[str] | None = None) -> argparse.ArgumentParser:
    """The whole command line; given `argv`, only the module of the command it names is
    imported (and builds that command's parser): the others are their line in the command
    list, so `patchset --version` or `patchset check` import nothing they do not use."""
    parser = options.Parser(
        prog="patchset",
        description="Patch registry, apply engine, release check and image builds for vLLM.",
        epilog=options.epilog(),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"patchset {__version__}")
    options.add_global_options(parser, in_command=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    wanted = None if argv is None else options.COMMAND_HELP.get(_command_word(argv))
    for name, command in options.COMMAND_HELP.items():
        if " " in name or name in sub.choices:  # nested, or built with its module
            continue
        if argv is None or (wanted is not None and wanted.module == command.module):
            importlib.import_module(f"{COMMANDS_PACKAGE}.{command.module}").add_parsers(sub)
        else:
            sub.add_parser(name, help=command.help)  # its line in the list, nothing more
    _finish_commands(sub, [])
    return parser


def _command_word(argv: Sequence[str]) -> str:
    """The word of `argv` that names the command: the first after the global options."""
    words = iter(argv)
    for word in words:
        if word in _VALUED:
            next(words, None)
        elif not word.startswith("-"):
            return word
    return ""


def _finish_commands(sub: argparse._SubParsersAction[Any], path: list[str]) -> None:
    """Every command parser, nested ones too (`runtime export`): the global options, and a
    help footer with its exit codes and one example."""
    seen: set[int] = set()
    for name, command in sub.choices.items():
        if id(command) in seen:
            continue
        seen.add(id(command))
        full = " ".join([*path, name])
        nested = [a for a in command._actions if isinstance(a, argparse._SubParsersAction)]
        for action in nested:
            _finish_commands(action, [*path, name])
        options.add_global_options(command, in_command=True)
        command.epilog = options.footer(full)
        command.formatter_class = argparse.RawDescriptionHelpFormatter


class _Handler(logging.Handler):
    """Library log lines on stderr as `patchset: [level: ]message`."""

    def emit(self, record: logging.LogRecord) -> None:
        level = "" if record.levelno == logging.INFO else f"{record.levelname.lower()}: "
        try:
            sys.stderr.write(f"patchset: {level}{one_line(record.getMessage())}\n")
        except Exception:  # logging must never raise: its own error path
            self.handleError(record)


def configure_logging(verbose: int, quiet: int) -> None:
    """Warnings by default, -v info (downloads, retries), -vv debug, -q errors only."""
    level = logging.WARNING - 10 * verbose + 10 * quiet
    logger = logging.getLogger("patchset")
    reset_logging()
    logger.addHandler(_Handler())
    logger.setLevel(max(logging.DEBUG, min(level, logging.CRITICAL)))
    logger.propagate = False


def reset_logging() -> None:
    """Undo configure_logging (main() does, so in-process callers keep their own set-up)."""
    logger = logging.getLogger("patchset")
    for handler in [h for h in logger.handlers if isinstance(h, _Handler)]:
        logger.removeHandler(handler)
    logger.setLevel(logging.NOTSET)
    logger.propagate = True


def _parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None) -> argparse.Namespace:
    """parse_args; a usage error under `--format github` is also an `::error::` on stdout."""
    words = list(sys.argv[1:] if argv is None else argv)
    try:
        args = parser.parse_args(words)
        if getattr(args, "handler", None) is None:  # a command _command_word did not see
            args = build_parser().parse_args(words)
    except SystemExit:
        if options.Parser.last_error and options.wants_github(words):
            from patchset.adapters.actions import workflow_command

            line = workflow_command("error", options.Parser.last_error, title="patchset")
            sys.stdout.write(line + "\n")
        raise
    return args


@contextlib.contextmanager
def project_defaults(args: argparse.Namespace, project: Project) -> Iterator[None]:
    """`[tool.patchset]` index-url, offline, cache-dir and since, where the command line and
    the environment said nothing (the cache folder through $PATCHSET_CACHE_DIR, restored)."""
    if getattr(args, "index_url", "") is None:
        args.index_url = project.index_url
    if getattr(args, "offline", None) is False:
        args.offline = project.offline
    if (
        args.command == "check"
        and getattr(args, "since", "") is None
        and not args.vllm
        and args.source is None
    ):
        args.since = project.since
    before = os.environ.get(CACHE_ENV)
    if project.cache_dir is not None and not before:
        os.environ[CACHE_ENV] = str(project.cache_dir)
    try:
        yield
    finally:
        if project.cache_dir is not None and not before:
            os.environ.pop(CACHE_ENV, None)


def _fatal(args: argparse.Namespace | None, message: str) -> None:
    """One line on stderr; under --format github also an `::error::` workflow command."""
    from patchset.adapters.actions import workflow_command
    from patchset.cli.output import err_console

    err_console().print(f"patchset: error: {message}", markup=False, soft_wrap=True)
    if args is not None and getattr(args, "format", None) == "github":
        line = workflow_command("error", message, title=f"patchset {args.command}")
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


def _quiet_stdout() -> None:
    """After a broken pipe: point stdout at /dev/null so the exit flush raises nothing."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError):  # a stdout with no file descriptor (tests): nothing to do
        pass


class Terminated(BaseException):
    """SIGTERM, raised where the process stands, so every clean-up on the way out runs (the
    transaction's roll-back, staging folders) as for Ctrl-C."""


def _terminate(signum: int, frame: FrameType | None) -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a second one must not cut the clean-up
    raise Terminated


@contextlib.contextmanager
def _signals() -> Iterator[None]:
    """SIGTERM handled for the run (main thread only: in-process callers elsewhere keep
    theirs), the caller's handler put back after it."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    before = signal.signal(signal.SIGTERM, _terminate)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, before)


def main(argv: Sequence[str] | None = None) -> int:
    options.Parser.last_error = None
    try:
        with _signals():
            return _main(argv)
    except KeyboardInterrupt:
        sys.stderr.write("patchset: interrupted\n")
        return ExitCode.INTERRUPTED
    except Terminated:
        sys.stderr.write("patchset: terminated (SIGTERM); cleaned up\n")
        return ExitCode.TERMINATED


def _main(argv: Sequence[str] | None) -> int:
    words = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser(words)
    args: argparse.Namespace | None = None
    try:
        args = _parse(parser, words)
        from patchset.cli.output import quiet  # the command's, not --version's
        from patchset.project import resolve

        configure_logging(args.verbose, args.quiet)
        project = resolve(registry=args.registry, builds=args.builds)
        args.registry, args.builds = project.registry, project.builds
        args.pyproject = project.pyproject
        with project_defaults(args, project), quiet(args.quiet > 0):
            code: int = args.handler(args)
        sys.stdout.flush()
    except PatchsetError as exc:
        _fatal(args, str(exc))
        return exc.exit_code
    except BrokenPipeError:
        _quiet_stdout()
        return ExitCode.BROKEN_PIPE
    except Exception as exc:  # the catch-all: one line, and a traceback only on request
        if os.environ.get(DEBUG_ENV) or (args is not None and args.traceback):
            traceback.print_exc()
        _fatal(
            args,
            f"internal error: {type(exc).__name__}: {one_line(str(exc))} (a bug in patchset;"
            f" rerun with --traceback or {DEBUG_ENV}=1 for the details)",
        )
        return ExitCode.INTERNAL
    finally:
        reset_logging()
    return code


def entry() -> None:
    """The `patchset` command (and `python -m patchset`): `main`, then the process ends."""
    code = main(sys.argv[1:])
    # What the command left is freed as the interpreter ends, each object once; frozen, the
    # collector does not walk it all once more before that (0.15 s after a collection's
    # check, a twentieth of an edited patch's). Not in `main`: an in-process caller's heap
    # is its own.
    gc.freeze()
    raise SystemExit(code)
