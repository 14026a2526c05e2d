"""A unit's lines as `pyunits` cuts them out of a Python source: whether they stay inside
one block (`any_outside`), and the unit dedented to compile alone (`dedented`). Standard
library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations

import functools
import re


@functools.lru_cache(maxsize=64)
def _outside_pattern(indent: str) -> re.Pattern[str]:
    """Lines that hold code (not only a comment) less indented than `indent`, searched for
    in lines each led by a line break (a pattern led by a character is searched for fast;
    one anchored at line starts is tried at every position)."""
    return re.compile(rf"\n(?!{re.escape(indent)}|[ \t]*(?:#|\n|\Z))")


def any_outside(a: list[str], s: int, e: int, indent: str) -> bool:
    """Whether a line of a[s:e] is `outside` a block indented by `indent`."""
    return _outside_pattern(indent).search("\n" + "\n".join(a[s:e])) is not None


def outside(line: str, indent: str) -> bool:
    """Whether `line` stands outside a block indented by `indent`: it holds code (not only
    a comment: comment lines do not open or close blocks) and less indentation."""
    return not line.startswith(indent) and not line.lstrip().startswith("#") and bool(line.strip())


# Whitespace other than a space, a tab and a line break (what `str.strip` and `str.split` take
# for whitespace besides them): a unit holding none is dedented by `dedented`'s patterns.
ODD_SPACES = "\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680" + "".join(
    map(chr, [*range(0x2000, 0x200B), 0x2028, 0x2029, 0x202F, 0x205F, 0x3000])
)
_BLANK_LINE = re.compile(r"\n[ \t]++(?=\n|\Z)")  # on "\n" + text: a line of blanks alone


@functools.lru_cache(maxsize=64)
def _dedent_patterns(indent: str) -> tuple[re.Pattern[str], re.Pattern[str]]:
    """On "\n" + text: a line holding more than blanks that does not start with `indent`,
    or holds a tab after it before its first other character; and each line's indentation
    past `indent`, up to its first character that is no blank."""
    lead = re.escape(indent)
    return (
        re.compile(rf"\n(?!{lead}(?! *\t)|[ \t]*(?:\n|\Z))"),
        re.compile(rf"\n{lead}( *)[^ \t\n]"),
    )


def dedented(text: str, indent: str) -> str:
    """`text` without `indent` on each line ("" when a line lacks it, holds a tab in its
    indentation, or blocks nest near the compiler's limit of 20 in one scope: the unit's own
    depth in the file is at most its indentation's width). The common unit (every line of
    code starting with `indent` and spaces, no whitespace but those, tabs and line breaks)
    is cut by patterns over its whole text, its depth bounded by how many indentations it
    has; any other line by line."""
    if not any(c in text for c in ODD_SPACES):
        odd, leads = _dedent_patterns(indent)
        lined = "\n" + text
        found = leads.findall(lined) if odd.search(lined) is None else None
        if found is not None and len({0, *map(len, found)}) + len(indent) < 20:
            if not found:
                return ""  # blank lines alone
            lined = _BLANK_LINE.sub("\n", lined)
            return (lined.replace("\n" + indent, "\n") if indent else lined)[1:]
    return dedented_lines(text, indent)


def dedented_lines(text: str, indent: str) -> str:
    """`dedented`, line by line."""
    body: list[str] = []
    widths = [0]
    deepest = 0
    for line in text.split("\n"):
        if not line.strip():
            body.append("")
            continue
        if not line.startswith(indent):
            if not outside(line, indent):  # a comment: the tokenizer passes it by
                body.append(line.lstrip())
                continue
            return ""
        rest = line[len(indent) :]
        lead = rest[: len(rest) - len(rest.lstrip())]
        if "\t" in lead:
            return ""
        while widths and widths[-1] > len(lead):
            widths.pop()
        if not widths or widths[-1] < len(lead):
            widths.append(len(lead))
        deepest = max(deepest, len(widths))
        body.append(rest)
    if deepest + len(indent) >= 20 or not any(body):
        return ""
    return "\n".join(body)


__all__ = ["ODD_SPACES", "any_outside", "dedented", "dedented_lines", "outside"]
