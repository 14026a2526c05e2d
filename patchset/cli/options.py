"""Option builders shared by the commands, and the per-command help footer.

Global options (`--registry`, `--builds`, `-q`, `-v`, `--traceback`) are accepted before the
command and after it: `add_global_options` puts them on the top-level parser and, with
`default=SUPPRESS`, on every command's parser, so a value given after the command wins and
one given before is not overwritten by a default.
"""

from __future__ import annotations

import argparse
import difflib
import re
import sys
from pathlib import Path
from typing import NoReturn

from patchset.errors import ExitCode, one_line
from patchset.kernel.sites import parse_served

COMMON_CODES = "70 an internal error (a bug: rerun with --traceback); 130 interrupted"

# command -> (its exit codes, one example); shown at the foot of `patchset COMMAND --help`
COMMAND_HELP: dict[str, tuple[str, str]] = {
    "list": ("0 ok; 2 a malformed registry", "patchset list --format json"),
    "show": ("0 ok; 2 a malformed registry or an unknown id", "patchset show fla-tma-sm12x"),
    "validate": ("0 every patch valid; 2 a malformed patch", "patchset validate"),
    "apply": (
        "0 applied; 1 a conflict (nothing written); 2 bad input; 4 a target file missing;"
        " 5 out of range; 6 already applied; 7 applied with offsets or fuzz",
        "patchset apply --target /usr/local/lib/python3.12/dist-packages --dry-run",
    ),
    "revert": (
        "0 reverted; 1 a conflict (nothing written); 2 bad input; 6 nothing to take out;"
        " 7 reverted, check by hand",
        "patchset revert --target /usr/local/lib/python3.12/dist-packages",
    ),
    "check": (
        "0 nothing in range needs attention (or no release to check); 1 an in-range"
        " conflict, partial or missing-target; 2 bad usage or input; 3 a release unavailable",
        "patchset check --since 0.19.0 --format github",
    ),
    "build": (
        "0 built and verified; 1 the build or its verification failed; 2 bad input;"
        " 3 Docker or the base image unavailable",
        "patchset build builds/0.19.1.toml --push",
    ),
    "inspect": (
        "0 ok; 2 not a patchset image; 3 Docker unavailable",
        "patchset inspect localhost:5000/vllm-openai:0.19.1-cu130",
    ),
    "verify": (
        "0 every patch present; 1 a patch missing; 2 not a patchset image; 3 Docker unavailable",
        "patchset verify localhost:5000/vllm-openai:0.19.1-cu130",
    ),
    "refresh": (
        "0 written (or proposed); 1 a conflict to resolve; 2 bad input; 3 a release unavailable",
        "patchset refresh fla-tma-sm12x --vllm 0.20.0 --write",
    ),
    "add": (
        "0 added; 2 bad input (id taken, bad diff); 3 the forge or a release unavailable",
        "patchset add fla-tma-sm12x --pr vllm-project/vllm#36325",
    ),
    "init": ("0 laid out (or already there); 2 a malformed pyproject.toml", "patchset init ."),
    "bake": ("0 written; 2 a malformed build definition", "patchset bake -o docker-bake.json"),
    "runtime": (
        "0 ok; 2 bad usage",
        "patchset runtime export out/ --build builds/0.19.1.toml",
    ),
    "runtime export": (
        "0 written; 2 a malformed build definition or registry; 3 a release unavailable",
        "patchset runtime export out/ --build builds/0.19.1.toml",
    ),
    "upstream": (
        "0 nothing needs attention; 1 a pull request merged, closed, gone or recorded out of"
        " date; 2 bad usage or input; 3 the forge unreachable, the token refused or the rate"
        " limit spent",
        "patchset upstream --format github",
    ),
    "completion": (
        "0 printed; 2 an unknown shell",
        "patchset completion bash > ~/.local/share/bash-completion/completions/patchset",
    ),
}


def footer(command: str) -> str:
    """The `--help` footer of `command`: its exit codes and one example."""
    codes, example = COMMAND_HELP.get(
        command, ("0 ok; 2 bad usage or input", f"patchset {command}")
    )
    return f"exit codes: {codes}; {COMMON_CODES}. See docs/exit-codes.md.\n\nexample:\n  {example}"


def add_global_options(parser: argparse.ArgumentParser, *, in_command: bool) -> None:
    """`--registry`, `--builds`, `-q`, `-v`, `--traceback` on `parser`; on a command's parser
    (`in_command`) their defaults are suppressed so the top level's value stands."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if in_command else value

    taken = parser._option_string_actions  # a command's own option of the same name wins

    class Group:
        def __init__(self) -> None:
            self.group = parser.add_argument_group("global options (before or after the command)")

        def add_argument(self, *names: str, **kwargs: object) -> None:
            if not any(name in taken for name in names):
                self.group.add_argument(*names, **kwargs)  # type: ignore[arg-type]

    group = Group()
    group.add_argument(
        "--registry",
        type=Path,
        default=default(None),
        metavar="DIR",
        help="the patch registry folder (default: $PATCHSET_REGISTRY, else [tool.patchset]"
        " registry in the nearest pyproject.toml, else ./patches)",
    )
    group.add_argument(
        "--builds",
        type=Path,
        default=default(None),
        metavar="DIR",
        help="the build definitions folder (default: $PATCHSET_BUILDS, else [tool.patchset]"
        " builds in the nearest pyproject.toml, else ./builds)",
    )
    group.add_argument(
        "-v",
        "--verbose",
        action="count",
        default=default(0),
        help="say more: -v shows downloads and retries, -vv debugging detail",
    )
    group.add_argument(
        "-q",
        "--quiet",
        action="count",
        default=default(0),
        help="say less: only errors on stderr",
    )
    group.add_argument(
        "--traceback",
        action="store_true",
        default=default(False),
        help="on an internal error, print the traceback (also: PATCHSET_DEBUG=1)",
    )


_INVALID_CHOICE = re.compile(r"invalid choice: '(?P<word>[^']*)' \(choose from (?P<choices>.*)\)")


class Parser(argparse.ArgumentParser):
    """argparse with a "did you mean" for a mistyped command or choice; the last usage error
    is kept in `last_error` (main() repeats it as a workflow command under --format github)."""

    last_error: str | None = None

    def error(self, message: str) -> NoReturn:
        match = _INVALID_CHOICE.search(message)
        if match:
            choices = [c.strip().strip("'") for c in match["choices"].split(",")]
            close = difflib.get_close_matches(match["word"], choices, n=1, cutoff=0.6)
            if close:
                message = f"{message}; did you mean {close[0]!r}?"
        Parser.last_error = f"{self.prog}: {message}"
        # One line, as every other error (not argparse's usage block before it).
        sys.stderr.write(f"patchset: error: {one_line(Parser.last_error)}\n")
        raise SystemExit(ExitCode.BAD_INPUT)


def wants_github(argv: list[str]) -> bool:
    """Whether the command line asks for `--format github` (read before it parses)."""
    return any(
        a == "--format=github" or (a == "--format" and b == "github")
        for a, b in zip(argv, [*argv[1:], ""], strict=True)
    )


def served_arg(text: str) -> dict[str, str]:
    """`--served KEY=VALUE,...` (apply, check) as argparse reads it."""
    try:
        return parse_served(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
