"""Printing for people (rich tables) and machines (JSON); only the CLI prints."""

from __future__ import annotations

import json
import sys
from typing import Any

from rich.console import Console
from rich.table import Table

FORMATS = ("table", "json")


PIPE_WIDTH = 10_000  # no terminal: lines are never wrapped (copied TOML must still parse)


def console() -> Console:
    """stdout for people: wrapped to the terminal, and never wrapped when piped or redirected."""
    con = Console(soft_wrap=False, highlight=False)
    if con.is_terminal:
        return con
    return Console(soft_wrap=True, highlight=False, width=PIPE_WIDTH)


def err_console() -> Console:
    return Console(stderr=True, highlight=False)


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, indent=2, sort_keys=False, default=str)
    sys.stdout.write("\n")


def table(title: str | None, columns: list[str]) -> Table:
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
    "conflict": "bold red",
    "partial": "red",
    "missing-target": "magenta",
    "out-of-range": "dim",
    "skipped": "dim",
}


def styled(outcome: str) -> str:
    style = OUTCOME_STYLE.get(outcome)
    return f"[{style}]{outcome}[/]" if style else outcome
