"""One error base with an exit code per kind; only the CLI turns them into a message."""

from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum
from pathlib import Path

MAX_MESSAGE = 2000  # characters; a hostile payload can put a megabyte into one quoted line


def one_line(text: str) -> str:
    """`text` made safe to print as one terminal line: control characters (newlines, escape
    sequences, NUL) are shown escaped, and a giant message is cut in the middle."""
    if text.isprintable():
        safe = text
    else:
        safe = "".join(
            ch if ch.isprintable() or ch == " " else ch.encode("unicode_escape").decode("ascii")
            for ch in text
        )
    if len(safe) > MAX_MESSAGE:
        cut = len(safe) - MAX_MESSAGE
        safe = f"{safe[: MAX_MESSAGE - 200]} ...[{cut} characters cut]... {safe[-200:]}"
    return safe


class ExitCode(IntEnum):
    """Documented exit codes shared by every command: `MEANING` says each one, and the help
    texts and docs/exit-codes.md are made from (and tested against) it."""

    OK = 0
    ATTENTION = 1  # a conflict, a partial patch, a failed build or verify
    BAD_INPUT = 2  # bad usage, bad registry data, bad target, unknown id
    UNAVAILABLE = 3  # a source, the index or the Docker engine could not be had
    MISSING_TARGET = 4  # apply/revert: a target file is absent (`missing-target`)
    OUT_OF_RANGE = 5
    ALREADY_APPLIED = 6  # --strict only
    APPLIED_WITH_WARNINGS = 7  # --strict only
    UPSTREAM = 8  # apply: a patch's upstream fix is in the tree (nothing written)
    START_REFUSED = 9  # the image or exported runtime's entrypoint refused to start vLLM
    INTERNAL = 70  # a bug: an exception patchset did not expect (EX_SOFTWARE of sysexits.h)
    INTERRUPTED = 130  # 128 + SIGINT
    BROKEN_PIPE = 141  # 128 + SIGPIPE, what a shell reports for a process killed by it
    TERMINATED = 143  # 128 + SIGTERM: stopped, after cleaning up


@dataclass(frozen=True)
class Meaning:
    """What an exit code is called (docs/exit-codes.md's name column) and says in a help text."""

    name: str
    short: str


MEANING: dict[ExitCode, Meaning] = {
    ExitCode.OK: Meaning("ok", "ok"),
    ExitCode.ATTENTION: Meaning(
        "attention", "a conflict or partial patch (nothing written), a failed build or verify"
    ),
    ExitCode.BAD_INPUT: Meaning("bad input", "bad usage or input"),
    ExitCode.UNAVAILABLE: Meaning(
        "unavailable", "a release, the index, a source or Docker could not be had"
    ),
    ExitCode.MISSING_TARGET: Meaning("missing target", "a target file missing (nothing written)"),
    ExitCode.OUT_OF_RANGE: Meaning(
        "out of range", "a patch asked for by id is out of its release range"
    ),
    ExitCode.ALREADY_APPLIED: Meaning(
        "already applied", "--strict only: nothing to do (already applied, nothing to take out)"
    ),
    ExitCode.APPLIED_WITH_WARNINGS: Meaning(
        "applied with warnings", "--strict only: written, but with offsets or fuzz"
    ),
    ExitCode.UPSTREAM: Meaning(
        "upstream", "a patch's upstream fix is in the tree (nothing written)"
    ),
    ExitCode.START_REFUSED: Meaning(
        "container start refused", "the image entrypoint refused to start vLLM"
    ),
    ExitCode.INTERNAL: Meaning(
        "internal error", "an internal error (a bug: rerun with --traceback)"
    ),
    ExitCode.INTERRUPTED: Meaning("interrupted", "interrupted (Ctrl-C)"),
    ExitCode.BROKEN_PIPE: Meaning("output closed", "output closed early (a broken pipe)"),
    ExitCode.TERMINATED: Meaning("terminated", "terminated (SIGTERM), after cleaning up"),
}

# What any command can end with besides its own codes.
COMMON: tuple[ExitCode, ...] = (
    ExitCode.INTERNAL,
    ExitCode.INTERRUPTED,
    ExitCode.BROKEN_PIPE,
    ExitCode.TERMINATED,
)


def describe_codes(codes: tuple[ExitCode, ...]) -> str:
    """`codes` as a help text lists them, one a line: "exit codes:\n    0  ok\n ..." (the
    words from `MEANING`)."""
    return "exit codes:\n" + "\n".join(f"  {int(code):>3}  {MEANING[code].short}" for code in codes)


class PatchsetError(Exception):
    """Base of every error patchset raises on purpose; `str()` is the one-line message."""

    exit_code: int = ExitCode.BAD_INPUT

    def __init__(self, message: str, *, path: Path | str | None = None) -> None:
        self.path = None if path is None else str(path)
        super().__init__(one_line(f"{self.path}: {message}" if self.path else message))


class UsageError(PatchsetError):
    """The command line asks for something that cannot be done."""


class RegistryError(PatchsetError):
    """A patch.toml, a payload or a build definition is malformed."""

    key: str | None = None  # the dotted key it is about (``upstream.state``), when one


class PayloadError(RegistryError):
    """A diff or runtime site file does not parse or breaks a rule."""


class UnknownPatchError(PatchsetError):
    """A patch id that the registry does not hold."""


class TargetError(PatchsetError):
    """The folder to patch is unusable: no vllm package, unsafe path, not writable."""


class LockedError(PatchsetError):
    """Another patchset process holds the lock on the same tree or cache."""

    exit_code = ExitCode.UNAVAILABLE


class SourceError(PatchsetError):
    """A vLLM release could not be had: unknown version, index unreachable, bad download."""

    exit_code = ExitCode.UNAVAILABLE


class IntegrityError(SourceError):
    """A download whose sha256 does not match what the index says."""


class DockerError(PatchsetError):
    """The Docker engine or a registry failed or refused."""

    exit_code = ExitCode.UNAVAILABLE


class BuildError(PatchsetError):
    """An image build stopped: a conflict with the base, a failed step, a refused push."""

    exit_code = ExitCode.ATTENTION
