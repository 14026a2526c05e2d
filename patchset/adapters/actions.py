"""GitHub Actions workflow commands (`::error file=...,line=...::message`), escaped right.

Public API (re-exported as `patchset.workflow_command`, `patchset.escape_data` and
`patchset.escape_property`), so other projects' scripts need not re-do the escaping. The
runner reads a line `::NAME key=value,key=value::DATA`; it unescapes `%25`, `%0D`, `%0A` in
DATA and, in property values, also `%3A` and `%2C`. Anything else passes as it is, so a
message holding `%`, newlines or `::` arrives as written, and a property value cannot end the
property list early.
"""

from __future__ import annotations

import re

LEVELS = ("error", "warning", "notice")
_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_-]*$")


def escape_data(text: str) -> str:
    """`text` as the message part of a workflow command (after the second `::`)."""
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    """`text` as a property value (`file=`, `title=`, ...): ':' and ',' escaped too."""
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def workflow_command(name: str, message: str, **properties: str | int | None) -> str:
    """One workflow command line, e.g. ``workflow_command("error", "boom", file="a.py",
    line=3)``; properties that are None are left out."""
    if not _NAME.match(name):
        raise ValueError(f"not a workflow command name: {name!r}")
    props = ",".join(
        f"{key}={escape_property(str(value))}"
        for key, value in properties.items()
        if value is not None
    )
    head = f"::{name} {props}" if props else f"::{name}"
    return f"{head}::{escape_data(message)}"
