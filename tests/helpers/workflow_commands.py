"""A parser of GitHub Actions' workflow-command syntax, written from the runner's documented
rules, so tests read annotations the way the runner does instead of matching strings.

`::NAME[ key=value[,key=value]...]::DATA`: the command ends at the first `::` after the
leading one; properties are split on ',' and each on the first '='; DATA and property values
are unescaped (`%25`, `%0D`, `%0A`; in properties also `%3A`, `%2C`).
"""

from __future__ import annotations

from dataclasses import dataclass

ANNOTATION_PROPERTIES = {"file", "line", "endLine", "col", "endColumn", "title"}
_DATA = {"%25": "%", "%0D": "\r", "%0A": "\n"}
_PROPERTY = {**_DATA, "%3A": ":", "%2C": ","}


@dataclass(frozen=True)
class Command:
    name: str
    properties: dict[str, str]
    data: str


def _unescape(text: str, table: dict[str, str]) -> str:
    out, i = [], 0
    while i < len(text):
        token = text[i : i + 3]
        if token in table:
            out.append(table[token])
            i += 3
        else:
            out.append(text[i])
            i += 1
    return "".join(out)


def parse(line: str) -> Command | None:
    """The command on `line`, or None when the runner would print it as plain text."""
    if not line.startswith("::"):
        return None
    end = line.find("::", 2)
    if end < 0:
        return None
    head, data = line[2:end], line[end + 2 :]
    name, _, props = head.partition(" ")
    if not name:
        return None
    properties: dict[str, str] = {}
    for pair in filter(None, props.split(",")):
        key, sep, value = pair.partition("=")
        assert sep, f"property without '=': {pair!r} in {line!r}"
        properties[key] = _unescape(value, _PROPERTY)
    return Command(name, properties, _unescape(data, _DATA))


def read_annotations(output: str) -> list[Command]:
    """Every error/warning/notice command in `output`, each checked for unknown properties."""
    found = []
    for line in output.splitlines():
        cmd = parse(line)
        if cmd is not None and cmd.name in ("error", "warning", "notice"):
            unknown = set(cmd.properties) - ANNOTATION_PROPERTIES
            assert not unknown, f"unknown annotation properties {unknown} in {line!r}"
            found.append(cmd)
    return found
