"""Option builders shared by the commands, and the per-command help footer.

Global options (`--registry`, `--builds`, `-q`, `-v`, `--traceback`) are accepted before the
command and after it: `add_global_options` puts them on the top-level parser and, with
`default=SUPPRESS`, on every command's parser, so a value given after the command wins and
one given before is not overwritten by a default.
"""

from __future__ import annotations

import argparse
import itertools
import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn

from patchset.errors import COMMON, ExitCode, describe_codes, one_line

E = ExitCode
APPLY_CODES = (E.OK, E.ATTENTION, E.BAD_INPUT, E.MISSING_TARGET, E.OUT_OF_RANGE)
PLAIN = (E.OK, E.BAD_INPUT)  # reads and writes local files only
FETCHES = (E.OK, E.BAD_INPUT, E.UNAVAILABLE)  # reads a release, an image or a forge too
REPORTS = (E.OK, E.ATTENTION, E.BAD_INPUT, E.UNAVAILABLE)  # and may ask for attention
SITE_PACKAGES = "/usr/local/lib/python3.12/dist-packages"
IMAGE = "localhost:5000/vllm-openai:0.19.1-cu130"


@dataclass(frozen=True)
class Command:
    """A command as the top level knows it before its module is imported: the module of
    `patchset.cli.commands` that builds its parser and runs it, its line in `patchset --help`,
    its own exit codes and one example (shown at the foot of its `--help`, with the codes'
    words from `errors.MEANING` and the codes every command shares after them)."""

    module: str
    help: str
    codes: tuple[ExitCode, ...]
    example: str


# Every command, in the order `patchset --help` lists them (a nested one, "runtime export",
# under its parent's name). main() imports a command's module only when that command runs.
COMMAND_HELP: dict[str, Command] = {
    "list": Command(
        "registry", "list the patches in the registry", PLAIN, "patchset list --format json"
    ),
    "show": Command(
        "registry", "show one patch's metadata and payload", PLAIN, "patchset show fla-tma-sm12x"
    ),
    "validate": Command(
        "registry",
        "load and validate every patch (and build definition); print the registry digest",
        REPORTS,  # --probes and --build read releases (3) and exit 1 on what they find
        "patchset validate",
    ),
    "apply": Command(
        "apply",
        "apply patches to a vLLM tree, all or nothing",
        (*APPLY_CODES, E.ALREADY_APPLIED, E.APPLIED_WITH_WARNINGS, E.UPSTREAM),
        f"patchset apply --target {SITE_PACKAGES} --dry-run",
    ),
    "revert": Command(
        "apply",
        "take applied patches out of a vLLM tree, all or nothing",
        (*APPLY_CODES[:4], E.ALREADY_APPLIED, E.APPLIED_WITH_WARNINGS),
        f"patchset revert --target {SITE_PACKAGES}",
    ),
    "check": Command(
        "check",
        "which patches a vLLM release still needs",
        REPORTS,
        "patchset check --since 0.19.0 --format github",
    ),
    "build": Command(
        "image",
        "build, verify and tag a patched vLLM image from builds/<name>.toml",
        REPORTS,
        "patchset build builds/0.19.1.toml --push",
    ),
    "inspect": Command(
        "image",
        "print a patched image's provenance (labels and manifest)",
        FETCHES,
        f"patchset inspect {IMAGE}",
    ),
    "verify": Command(
        "image",
        "re-check, with no network, that every patch is present in an image",
        REPORTS,
        f"patchset verify {IMAGE}",
    ),
    "refresh": Command(
        "refresh",
        "carry a patch that no longer fits onto a newer vLLM release",
        REPORTS,
        "patchset refresh fla-tma-sm12x --vllm 0.20.0 --write",
    ),
    "add": Command(
        "add",
        "add a patch from a pull request, a diff, an edited tree, overlays, or a skeleton",
        FETCHES,
        "patchset add fla-tma-sm12x --pr vllm-project/vllm#36325",
    ),
    "update": Command(
        "add",
        "a new payload for a diff patch: from its pull request, a diff or an edited tree",
        FETCHES,
        "patchset update fla-tma-sm12x --from-tree site-packages --vllm 0.19.1",
    ),
    "remove": Command(
        "add",
        "take a patch out of the registry (refused while another patch or a build uses it)",
        PLAIN,
        "patchset remove fla-tma-sm12x",
    ),
    "init": Command(
        "project",
        "lay out patches/, builds/ and [tool.patchset] in DIR/pyproject.toml",
        PLAIN,
        "patchset init .",
    ),
    "bake": Command(
        "bake",
        "write a docker-bake.json and build contexts for the build definitions",
        PLAIN,
        "patchset bake -o docker-bake.json",
    ),
    "runtime": Command(
        "runtime",
        "patches for the stock vLLM image without a rebuild (runtime export)",
        PLAIN,
        "patchset runtime export out/ --build builds/0.19.1.toml",
    ),
    "runtime export": Command(
        "runtime",
        "write a read-only bundle, compose.yaml and docker run line for a build definition",
        FETCHES,
        "patchset runtime export out/ --build builds/0.19.1.toml",
    ),
    "completion": Command(
        "completion",
        "print a shell completion script (bash, zsh, tcsh)",
        PLAIN,
        "patchset completion bash > ~/.local/share/bash-completion/completions/patchset",
    ),
    "cache": Command("cache", "show, prune or clear the release cache", PLAIN, "patchset cache"),
    "upstream": Command(
        "upstream",
        "ask the forge about each patch's pull request; say what changed",
        REPORTS,
        "patchset upstream --format github",
    ),
    "bump": Command(
        "bump",
        "carry a build definition onto a newer vLLM release (keep, drop, refresh)",
        REPORTS,
        "patchset bump builds/0.19.1.toml --to 0.20.0 --format markdown",
    ),
    "import": Command(
        "import_",
        "import a whole collection (genesis, club-3090) into the registry",
        REPORTS,
        "patchset import genesis ../genesis-vllm-patches --dry-run",
    ),
}


def command_codes(command: str) -> tuple[ExitCode, ...]:
    """Every exit code `command` can end with: its own, then those every command shares."""
    known = COMMAND_HELP.get(command)
    return (*(known.codes if known else PLAIN), *COMMON)


def footer(command: str) -> str:
    """The `--help` footer of `command`: its exit codes and one example."""
    known = COMMAND_HELP.get(command)
    example = known.example if known else f"patchset {command}"
    codes = describe_codes(command_codes(command))
    return f"{codes}\nSee docs/exit-codes.md.\n\nexample:\n  {example}"


def epilog() -> str:
    """The top-level `--help` footer: every exit code, and one example."""
    codes = describe_codes(tuple(ExitCode))
    return (
        f"{codes}\nSee docs/exit-codes.md. `patchset COMMAND --help` names each command's"
        " own.\n\nexample:\n  patchset check --since 0.19.0"
    )


def add_command(
    sub: argparse._SubParsersAction[argparse.ArgumentParser],
    name: str,
    handler: Callable[[argparse.Namespace], int] | None,
    description: str | None = None,
) -> argparse.ArgumentParser:
    """The parser of command `name` ("runtime export" for a nested one), its line in the
    command list from `COMMAND_HELP`, `description` atop its `--help` (default: that line),
    `handler` run for it (main() adds the global options, the exit-code footer and the
    formatter that keeps a description's lines)."""
    helptext = COMMAND_HELP[name].help
    parser = sub.add_parser(
        name.rpartition(" ")[2], help=helptext, description=description or helptext
    )
    if handler is not None:
        parser.set_defaults(handler=handler)
    return parser


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
    for name, what, default_folder in (
        ("registry", "the patch registry folder", "./patches"),
        ("builds", "the build definitions folder", "./builds"),
    ):
        group.add_argument(
            f"--{name}",
            type=Path,
            default=default(None),
            metavar="DIR",
            help=f"{what} (default: $PATCHSET_{name.upper()}, else [tool.patchset] {name} in"
            f" the nearest pyproject.toml, else {default_folder})",
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
            import difflib

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
        for a, b in itertools.pairwise([*argv, ""])
    )


def served_arg(text: str) -> dict[str, str]:
    """`--served KEY=VALUE,...` (apply, check) as argparse reads it."""
    from patchset.kernel.predicates import SERVED_LEAVES  # only when --served is given
    from patchset.kernel.sites import parse_served

    try:
        return parse_served(text, SERVED_LEAVES)  # sites' `when` keys and [applies]' served
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def repeatable(
    parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    flag: str,
    metavar: str,
    helptext: str | None = None,
    **more: Any,
) -> None:
    """An option given once per value (`--credit A --credit B`): a list, empty when absent."""
    parser.add_argument(flag, action="append", default=[], metavar=metavar, help=helptext, **more)


def switch(
    parser: argparse.ArgumentParser | argparse._MutuallyExclusiveGroup,
    flag: str,
    helptext: str,
    **more: Any,
) -> None:
    """An option that is off unless given (`--dry-run`)."""
    parser.add_argument(flag, action="store_true", help=helptext, **more)
