"""TOML text for what an importer writes: tables, arrays of tables, readable multi-line strings.

Plain data in (dicts, lists, str, int, bool); keys keep their order. A dict is a table, a list
of dicts an array of tables, each written after the table's own keys; inside an array, a dict
is an inline table. Multi-line strings are written as basic multi-line strings with every
backslash, quote and control character escaped, so any text (a payload's anchor, a marker)
reads back byte for byte.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence

_BARE = re.compile(r"^[A-Za-z0-9_-]+$")


def _key(key: str) -> str:
    return key if _BARE.match(key) else _string(key)


def _escape(text: str, *, multiline: bool) -> str:
    out = []
    for ch in text:
        if ch == "\\":
            out.append("\\\\")
        elif ch == '"':
            out.append('\\"')
        elif ch == "\n" and multiline:
            out.append("\n")
        elif ch == "\n":
            out.append("\\n")
        elif ch == "\t":
            out.append("\t" if multiline else "\\t")
        elif ch == "\r":
            out.append("\\r")
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\u{ord(ch):04x}")
        else:
            out.append(ch)
    return "".join(out)


def _string(text: str) -> str:
    if "\n" in text:
        return '"""\n' + _escape(text, multiline=True) + '"""'
    return '"' + _escape(text, multiline=False) + '"'


def _value(value: object) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        return _string(value)
    if isinstance(value, Mapping):
        inner = ", ".join(f"{_key(str(k))} = {_value(v)}" for k, v in value.items())
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, Sequence):
        items = [_value(v) for v in value]
        one = "[" + ", ".join(items) + "]"
        if len(one) <= 90 and "\n" not in one:
            return one
        return "[\n" + "".join(f"  {item},\n" for item in items) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


def _is_tables(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)


def dumps(data: Mapping[str, object], *, header: str = "") -> str:
    """`data` as TOML text; `header` lines become comments at the top."""
    lines = [f"# {line}".rstrip() for line in header.splitlines()]
    _table(lines, [], data)
    return "\n".join(lines).strip("\n") + "\n"


def _table(lines: list[str], path: list[str], data: Mapping[str, object]) -> None:
    later: list[tuple[str, object]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping) or (_is_tables(value) and not _inline_only(key)):
            later.append((key, value))
        else:
            lines.append(f"{_key(key)} = {_value(value)}")
    for key, value in later:
        sub = [*path, key]
        name = ".".join(_key(k) for k in sub)
        if isinstance(value, Mapping):
            lines.extend(["", f"[{name}]"])
            _table(lines, sub, value)
        else:
            assert isinstance(value, list)
            for item in value:
                lines.extend(["", f"[[{name}]]"])
                _table(lines, sub, item)


def _inline_only(key: str) -> bool:
    """Predicate lists (`all`, `any`) read better inline."""
    return key in ("all", "any")
