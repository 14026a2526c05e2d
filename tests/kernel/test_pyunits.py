"""What an edit shares with its source: `common_ends` and the edited lines read from it."""

from __future__ import annotations

import random
import re

import pytest

from patchset.kernel import indents, pycompile, pyunits

PIECES = (b"a", b"b", b"\n", b"\n", b"#", b" ", b"\xc3\xa9", b"\r", b"\xff", b"\x00", b"\f")


def _check(before: bytes, after: bytes) -> None:
    start, end = pyunits.common_ends(before, after)
    n = min(len(before), len(after))
    assert start + end <= n
    assert before[:start] == after[:start]
    assert start == n or before[start] != after[start]
    assert before[len(before) - end :] == after[len(after) - end :]
    assert end == n - start or before[len(before) - end - 1] != after[len(after) - end - 1]
    a = pyunits._lines(before)
    if a is None:
        return
    pyunits._lines.cache_clear()
    assert pyunits._edited_lines(a, before, after) == pyunits._lines(after), (before, after)


@pytest.mark.parametrize("seed", range(3))
def test_edited_lines_are_the_edited_source_s_lines(seed: int) -> None:
    """Random small sources edited at random places (line ends, non-ASCII, bytes that are not
    UTF-8, CR, NUL, form feed put in): the lines read from the shared start and end are
    those of reading the edited source whole, None where that is None."""
    rng = random.Random(seed)  # noqa: S311 - a fixed test sequence
    for _ in range(20000):
        before = b"".join(rng.choice(PIECES[:7]) for _ in range(rng.randint(0, 14)))
        after = bytearray(before)
        for _ in range(rng.randint(0, 3)):
            at = rng.randint(0, len(after))
            after[at : at + rng.randint(0, 3)] = b"".join(
                rng.choice(PIECES) for _ in range(rng.randint(0, 3))
            )
        _check(before, bytes(after))


def test_edited_lines_of_big_sources() -> None:
    """Past the first chunk compared (4 KB), and the ends shared whole or not at all."""
    rng = random.Random(7)  # noqa: S311 - a fixed test sequence
    big = bytes(rng.choice(b"abc\n ") for _ in range(60000))
    for _ in range(200):
        after = bytearray(big)
        at = rng.randint(0, len(big))
        after[at : at + rng.randint(0, 50)] = b"zz\n" * rng.randint(0, 3)
        _check(big, bytes(after))
    _check(big, big)
    _check(big, b"")
    _check(b"", big)
    _check(big, big + b"x\n")
    _check(big, b"x\n" + big)


def test_a_coding_declaration_edited_in_is_seen() -> None:
    _check(b"x = 1\ny = 2\n", b"# coding: latin-1\nx = 1\ny = 2\n")
    _check(b"x = 1\ny = 2\n", b"x = 1\n# -*- coding: latin-1 -*-\ny = 2\n")
    _check(b"# coding: latin-1\nx = 1\n", b"# coding: latin-1\nx = 2\n")


def test_edits_with_the_same_middle_are_told_apart() -> None:
    """An edit is known by the lengths of what it shares with its source and a digest of the
    rest: two edits putting the same text at different places get their own answers."""
    pycompile.clear_cache()
    before = b"def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    good = before.replace(b"    return 2\n", b"    return 2\n    x = (1)\n")
    bad = before.replace(b"def g():\n", b"def g():\n    x = (1)\n  y\n")
    assert pycompile.edit_error(before, good, "m.py") is None
    error = pycompile.edit_error(before, bad, "m.py")
    assert error is not None and error == pycompile.compile_error(bad)
    assert pycompile.edit_error(before, good, "m.py") is None


def test_declarations_are_the_lines_globals_matches() -> None:
    """`_declarations` (a search for the words) finds the lines `_GLOBALS` (anchored at each
    line start) matches: at the start, after blanks or not, as part of a longer word,
    followed by non-ASCII, at the end of the source."""
    words = (b"global", b"nonlocal", b" ", b"\t", b"\n", b"x", b"_", b"\xc3\xa9", b"#", b"1")
    rng = random.Random(5)  # noqa: S311 - a fixed test sequence
    for _ in range(20000):
        source = b"".join(rng.choice(words) for _ in range(rng.randint(0, 10)))
        want = [m.start() for m in pyunits._GLOBALS.finditer(source)]
        assert pyunits._declarations(source) == want, source


@pytest.mark.parametrize("indent", ["    ", "  ", "\t"])
def test_any_outside_is_a_search_from_each_line_start(indent: str) -> None:
    """`any_outside` (a search led by line breaks) finds what a search anchored at each line
    start finds: code less indented than `indent` (comments and blank lines let pass; odd
    whitespace is code to both), and agrees with `outside` where no odd whitespace is."""
    pieces = ("    ", "  ", " ", "\t", "#", "x", "", "\xa0", "\x0b")
    anchored = re.compile(rf"^(?!{re.escape(indent)}|[ \t]*(?:#|$))", re.MULTILINE)
    rng = random.Random(len(indent))  # noqa: S311 - a fixed test sequence
    for _ in range(20000):
        lines = [
            "".join(rng.choice(pieces) for _ in range(rng.randint(0, 3)))
            for _ in range(rng.randint(1, 5))
        ]
        found = indents.any_outside(lines, 0, len(lines), indent)
        assert found == (anchored.search("\n".join(lines)) is not None), lines
        if not any(c in line for line in lines for c in "\xa0\x0b"):
            assert found == any(indents.outside(line, indent) for line in lines), lines


def test_odd_spaces_are_all_whitespace_but_space_tab_and_line_break() -> None:
    spaces = {chr(c) for c in range(0x110000) if chr(c).isspace()}
    assert set(indents.ODD_SPACES) == spaces - {" ", "\t", "\n"}


DEDENT_PIECES = ["    ", "  ", "\t", "", "x", "# c", "\x0b", "\xa0", " ", "if x:", "\n", "\r"]


@pytest.mark.parametrize("seed", range(3))
def test_a_unit_is_dedented_by_its_patterns_as_line_by_line(seed: int) -> None:
    """`dedented` cuts the common unit by patterns over its text: the very text, or "",
    that reading it line by line gives (lines lacking the indentation, tabs in it, comment
    lines less indented, blank lines of blanks, odd whitespace, deep nesting)."""
    rng = random.Random(seed)  # noqa: S311 - a fixed seed: the same cases every run
    for _ in range(3000):
        text = "".join(rng.choice(DEDENT_PIECES) for _ in range(rng.randint(0, 14)))
        for indent in ("", " ", "    ", "        "):
            want = indents.dedented_lines(text, indent)
            assert indents.dedented(text, indent) == want, (text, indent)
    for depth in range(14, 22):  # blocks nested near the compiler's limit
        text = "".join("    " * (d + 1) + "if x:\n" for d in range(depth))
        text += "    " * (depth + 1) + "pass\n"
        assert indents.dedented(text, "    ") == indents.dedented_lines(text, "    ")


def test_a_source_read_as_an_edit_keeps_the_lines_it_was_read_with() -> None:
    """A release's file judged as an edit of the last release's (`units` with facts) is next
    a source whose edits are judged: its lines are the ones read then, equal to its own."""
    pycompile.clear_cache()
    before = b"def f():\n    return 1\n\n\ndef g():\n    return 2\n"
    after = before.replace(b"return 2", b"return 3")
    assert pyunits.units(pycompile._known(before), before, after) is not None
    kept = pyunits._edited[after]
    assert pyunits._lines(after) is kept
    assert kept == after.decode().split("\n")
    assert after not in pyunits._edited  # taken, not kept twice
