"""Printing for people (rich tables) and machines (JSON); only the CLI prints."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

if TYPE_CHECKING:  # rich imported when first printed with: a JSON report needs none of it
    from rich.console import Console
    from rich.style import Style
    from rich.table import Table
    from rich.text import Text

FORMATS = ("table", "json")


def shown(value: object) -> str:
    """`value` as text safe for a terminal: control characters (escape sequences, carriage
    returns, NUL) shown escaped; line breaks and tabs kept, so multi-line cells and payloads
    stay as they are."""
    text = str(value)
    if text.isprintable():
        return text
    return "".join(
        ch if ch.isprintable() or ch in " \n\t" else ch.encode("unicode_escape").decode("ascii")
        for ch in text
    )


def text(value: object, style: str | Style = "") -> Text:
    """A string from a registry, a target file, a path or the network, as plain styled text:
    never read as markup, its control characters escaped."""
    from rich.text import Text

    return Text(shown(value), style=style)


@functools.cache
def _safe_console() -> type[Console]:
    """`SafeConsole`, made on first use (rich imported then)."""
    from rich.console import Console

    class SafeConsole(Console):
        """A console that prints every string as text: markup (`[/x]`, `[bold]`), emoji codes
        (`:x:`) and control characters have no effect, in `print`, table cells and titles
        alike. Styles come only from `Text` objects (`styled`, `text`)."""

        def render_str(self, text: str, **kwargs: Any) -> Text:
            kwargs.update(markup=False, emoji=False, highlight=False)
            return super().render_str(shown(text), **kwargs)

    return SafeConsole


PIPE_WIDTH = 10_000  # no terminal: lines are never wrapped (copied TOML must still parse)
_PLAIN: dict[str, Any] = {"highlight": False, "markup": False, "emoji": False}


def console() -> Console:
    """stdout for people: wrapped to the terminal, and never wrapped when piped or redirected."""
    safe = _safe_console()
    con = safe(soft_wrap=False, **_PLAIN)
    if con.is_terminal:
        return con
    return safe(soft_wrap=True, width=PIPE_WIDTH, **_PLAIN)


def err_console() -> Console:
    return _safe_console()(stderr=True, highlight=False, markup=False, emoji=False)


def err_lines() -> Callable[[str], None]:
    """A log sink for the library's progress lines: each one on stderr as it comes, as text."""
    err = err_console()
    return lambda line: err.print(line, markup=False, highlight=False)


_quiet = False  # -q: no progress on stderr (bars or lines), as logging shows errors only


@contextlib.contextmanager
def quiet(on: bool) -> Iterator[None]:
    """`main` says whether -q was given, for the command's run (reset when it ends)."""
    global _quiet  # noqa: PLW0603 - one process-wide CLI setting, like logging's level
    _quiet = on
    try:
        yield
    finally:
        _quiet = False


def progress_console() -> Console | None:
    """stderr for progress (bars, "checked ..." lines), or None under -q."""
    return None if _quiet else err_console()


# What makes rich take a stream that is not a terminal for one (its own variables).
_FORCED = ("FORCE_COLOR", "TTY_COMPATIBLE", "TTY_INTERACTIVE")


def bars_shown() -> bool:
    """Whether a progress bar may be drawn on stderr (not -q, and a terminal there or rich
    told to take it for one), known without importing rich (a CI log has no terminal)."""
    if _quiet:
        return False
    return sys.stderr.isatty() or any(os.environ.get(name) for name in _FORCED)


class Report(Protocol):
    """What a command's report has for `--format json`."""

    def to_dict(self) -> dict[str, Any]: ...


R = TypeVar("R", bound=Report)


def emit(report: R, fmt: str, render: Callable[[R], object]) -> None:
    """`report` as `--format json` asks (its `to_dict`), else as `render` shows it to people."""
    if fmt == "json":
        print_json(report.to_dict())
    else:
        render(report)


def print_json(data: Any) -> None:
    """`data` as indented JSON on stdout, in one write (json.dump writes each token on its
    own: 200,000 writes for `check --builds` of 2,750 results, a second of CPU)."""
    sys.stdout.write(dumps(data) + "\n")


def dumps(data: Any) -> str:
    """`json.dumps(data, indent=2, default=str)`, the same text, in half the time: with an
    indent, json encodes in generic Python (every value through a chain of generators); this
    is that encoder written out for these settings. A key that is not a string (json would
    convert or refuse it) is left to json itself."""
    out: list[str] = []
    try:
        _encode(data, out, "\n")
    except _NotPlainError:
        return json.dumps(data, indent=2, sort_keys=False, default=str)
    return "".join(out)


class Encoded(str):
    """Text `dumps` writes as it stands: a value `encoded` already, at the depth where it goes
    (a report put together from parts kept from an earlier run: cli/replay.py)."""


def encoded(value: Any, depth: int) -> Encoded:
    """`value` as `dumps` writes it `depth` levels in (its own lines indented to match)."""
    out: list[str] = []
    try:
        _encode(value, out, "\n" + "  " * depth)
    except _NotPlainError:  # as `dumps` does: json's own, each line indented to the depth
        text = json.dumps(value, indent=2, sort_keys=False, default=str)
        return Encoded(text.replace("\n", "\n" + "  " * depth))
    return Encoded("".join(out))


class _NotPlainError(Exception):
    """A value the fast encoder leaves to json (a key that is not a string)."""


_escaped = json.encoder.encode_basestring_ascii  # json's own (its C version when there is one)
_INFINITY = float("inf")


def _encode(o: Any, out: list[str], newline: str) -> None:
    """`o` appended to `out` as json's encoder writes it with indent=2; `newline` is the line
    break and the indent of the level `o` is at. The checks in json's order (a str subclass
    is a string, a bool is not an int, a tuple is a list; anything else is str())."""
    if isinstance(o, str):
        out.append(o if o.__class__ is Encoded else _escaped(o))
    elif o is None:
        out.append("null")
    elif o is True:
        out.append("true")
    elif o is False:
        out.append("false")
    elif isinstance(o, int):
        out.append(int.__repr__(o))
    elif isinstance(o, float):
        out.append(_float(o))
    elif isinstance(o, (list, tuple)):
        if not o:
            out.append("[]")
            return
        inner = newline + "  "
        out.append("[")
        for i, value in enumerate(o):
            out.append("," + inner if i else inner)
            _encode(value, out, inner)
        out.append(newline + "]")
    elif isinstance(o, dict):
        if not o:
            out.append("{}")
            return
        inner = newline + "  "
        out.append("{")
        first = True
        for key, value in o.items():
            if not isinstance(key, str):
                raise _NotPlainError
            out.append((inner if first else "," + inner) + _escaped(key) + ": ")
            first = False
            _encode(value, out, inner)
        out.append(newline + "}")
    else:
        _encode(str(o), out, newline)


def _float(o: float) -> str:
    if o != o:  # noqa: PLR0124 - NaN, as json writes it
        return "NaN"
    if o == _INFINITY:
        return "Infinity"
    if o == -_INFINITY:
        return "-Infinity"
    return float.__repr__(o)


def table(title: str | None, columns: list[str]) -> Table:
    from rich.table import Table

    result = Table(title=title, title_justify="left", show_lines=False)
    for column in columns:
        result.add_column(column, overflow="fold")
    return result


OUTCOME_STYLE = {
    "applied": "green",
    "reverted": "green",
    "needed": "yellow",
    "upstream": "cyan",
    "already-applied": "cyan",
    "not-applied": "cyan",
    "plugin": "cyan",
    "conflict": "bold red",
    "partial": "red",
    "missing-target": "magenta",
    "out-of-range": "dim",
    "skipped": "dim",
    "blocked": "yellow",
}


def styled(outcome: str) -> Text:
    return text(outcome, OUTCOME_STYLE.get(outcome, ""))
