"""What an edit of a Python source changes, judged by the units it changes (standard library
only): the defs, classes and module-level statements an edit touches, each compiled alone
where that says what compiling the whole file would. `patchset.kernel.pycompile.edit_error`
is the caller; the facts a source's whole compile gives (`Known`) are made there.
"""

from __future__ import annotations

import bisect
import functools
import opcode
import re
import types
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .indents import any_outside, dedented

if TYPE_CHECKING:
    from .pycompile import CompileError

_SCOPE_STARTS = ("def ", "async ", "class ", "@")
# Near these, a unit compiled alone may compile where the whole file would not.
_RISKY = re.compile(r"\b(?:global|nonlocal|__future__)\b|\bimport\s*\*|:=")
# ... and for a unit at module level (column 0), which holds every scope its statements see,
# only these: a module-level declaration reaches the module's other statements.
_RISKY_TOP = re.compile(r"\b__future__\b|^(?:global|nonlocal)\b", re.MULTILINE)
_GLOBALS = re.compile(rb"^[ \t]*(?:global|nonlocal)\b", re.MULTILINE)
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=]")


# A source's def and class starts, its `ends` and its classes' starts.
Found = tuple[list[int], list[int], list[int]]


@dataclass(frozen=True)
class Known:
    """A source compiled once: its error (None: it compiles), the 0-based first lines of its
    defs and classes (decorators included: where the compiler says each starts), its
    `__future__` flags, the 0-based lines of its `global` and `nonlocal` statements and
    whether any of those stands at module level (column 0)."""

    error: CompileError | None
    starts: tuple[int, ...] = ()
    flags: int = 0
    declared: tuple[int, ...] = ()
    top_declares: bool = False
    futures: tuple[int, ...] = ()  # lines naming __future__
    # The line after each module-level def or class (0-based): the module's next statement,
    # or comments and blank lines before it, starts there.
    ends: tuple[int, ...] = ()
    classes: tuple[int, ...] = ()  # the starts that are classes

    @functools.cached_property
    def bounds(self) -> list[int]:
        """Every start and end, sorted once (`_place` looks for a unit's end among them)."""
        return sorted({*self.starts, *self.ends})


def facts(source: bytes, flags: int, found: Found) -> Known:
    """A compiling source's `Known`, its flags and its starts, ends and classes given."""
    starts, ends, classes = found
    declared: list[int] = []
    top = False
    line, at = 0, 0
    for start in _declarations(source):
        line += source.count(b"\n", at, start)
        at = start
        declared.append(line)
        top = top or source[at : at + 1] not in (b" ", b"\t")
    futures: list[int] = []
    line, at, found_at = 0, 0, source.find(b"__future__")
    while found_at >= 0:
        line += source.count(b"\n", at, found_at)
        at = found_at
        futures.append(line)
        found_at = source.find(b"__future__", source.find(b"\n", found_at) % (len(source) + 1))
    return Known(
        None,
        tuple(sorted(starts)),
        flags,
        tuple(declared),
        top,
        tuple(futures),
        tuple(sorted(set(ends))),
        tuple(sorted(classes)),
    )


_WORD_BYTES = frozenset(b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_")


def _declarations(source: bytes) -> list[int]:
    """Where each line matching `_GLOBALS` starts, in order: each `global` and `nonlocal`
    found by a search for the word (a regular expression anchored at line starts tries
    every position of the file), kept where only blanks stand before it on its line and
    no word character follows it."""
    found: list[int] = []
    for word in (b"global", b"nonlocal"):
        at = source.find(word)
        while at >= 0:
            start = source.rfind(b"\n", 0, at) + 1
            end = at + len(word)
            if (end == len(source) or source[end] not in _WORD_BYTES) and not source[
                start:at
            ].strip(b" \t"):
                found.append(start)
            at = source.find(word, end)
    found.sort()
    return found


# Sources compiled whole, by a digest of their content (oldest first out): `_known` compiles
# each once, and an edit of a source already here is judged by its units.
_LOAD_CONST, _EXTENDED_ARG = opcode.opmap["LOAD_CONST"], opcode.opmap["EXTENDED_ARG"]
_CO_OPTIMIZED = 0x1  # a code object's flag: a function's (a class body lacks it)


def module_ends(code: types.CodeType, offset: int = 0) -> list[int]:
    """For each def and class at column 0 of the module `code`, the 0-based line after its
    last (plus `offset`): where the compiler's location of the statement (from the parsed
    tree, trailing strings and all) ends."""
    ends: list[int] = []
    raw, consts, arg = code.co_code, code.co_consts, 0
    for k, where in zip(range(0, len(raw), 2), code.co_positions(), strict=False):
        op = raw[k]
        if op == _EXTENDED_ARG:
            arg = (arg | raw[k + 1]) << 8
            continue
        if op == _LOAD_CONST:
            const = consts[arg | raw[k + 1]]
            if (
                isinstance(const, types.CodeType)
                and not const.co_name.startswith("<")
                and where[2] == 0
                and where[1] is not None
            ):
                ends.append(where[1] + offset)
        arg = 0
    return ends


def code_starts(code: types.CodeType) -> tuple[list[int], list[int]]:
    """The 0-based first lines of the defs and classes compiled in `code`, and of the
    classes alone."""
    starts: list[int] = []
    classes: list[int] = []
    todo = [code]
    while todo:
        for const in todo.pop().co_consts:
            if isinstance(const, types.CodeType):
                if not const.co_name.startswith("<"):  # not a lambda nor a comprehension
                    starts.append(const.co_firstlineno - 1)
                    if not const.co_flags & _CO_OPTIMIZED:  # a class body
                        classes.append(const.co_firstlineno - 1)
                todo.append(const)
    return starts, classes


def units(
    known: Known,
    before: bytes,
    after: bytes,
    shared: tuple[int, int] | None = None,
    *,
    facts: bool = True,
) -> Found | None:
    """`after`'s def and class starts and its ends when `after` (an edit of `before`, which
    compiles) is known to compile from its changed units alone, else None. `after` is read
    as `before`'s lines with some stretches replaced, each stretch [s, e) starting at a def
    or class of `before` (its first decorator: the compiler's own first line, a clean
    statement start), at the top of the file or at the line after a module-level def or
    class (`ends`), and ending at a later one of those no deeper, or at the end of the
    file, every line between at least as indented as line s (so the stretch is whole
    statements of one block; comment lines aside). Each replacement, dedented, compiled
    alone with the file's `__future__` flags, is whole statements of that block too; the
    lines around are `before`'s, tokenized alike. The innermost units are tried first, then
    those around them, then the module-level one (which holds every scope its statements
    see). None (compile the whole file) near what a unit alone cannot judge: in a nested
    unit `global`, `nonlocal` (in the unit, or in the module-level unit around it: a
    scope's declarations reach its other statements), `import *` and `:=` (a class body
    around it); anywhere a module-level `global` or `nonlocal`, `__future__` (on either
    side), a coding declaration, tabs or form feeds in indentation, a byte-order mark, a
    NUL, CR line ends, nesting near the compiler's limits (20 blocks). `shared`: their
    `common_ends`, when the caller has it. `facts=False`: whether it compiles alone, `after`'s
    starts and ends not gathered (an empty `Found` when it does)."""
    a = _lines(before)
    if known.top_declares or a is None:
        return None
    b = _edited_lines(a, before, after, shared)
    if b is None:
        return None
    if facts:  # `after` is kept as a source (the next release's file): its lines are these
        _keep_edited(after, b)
    starts, ends = known.starts, known.ends
    n, m = len(a), len(b)
    tops = sorted({0, *(x for x in ends if x < n), *(x for x in starts if a[x][:1] not in " \t")})
    found: Found = ([], [], [])
    classes = known.classes
    kept = 0  # before's lines from here on are after's, shifted by j - i
    i = j = 0
    while True:
        run = i  # a[run:i] == b[j - (i - run):j]
        same = _same(a, b, i, j)
        i, j = i + same, j + same
        if i == n and j == m:
            if facts:
                found[0].extend(x + j - i for x in _between(starts, kept, n))
                found[1].extend(x + j - i for x in _between(ends, kept, n + 1))
                found[2].extend(x + j - i for x in _between(classes, kept, n))
            return found
        top = tops[bisect.bisect_right(tops, i) - 1]
        placed = None
        within = starts[: bisect.bisect_right(starts, i)]
        for s in _around(a, within, top, i=i, tops=tops, known=known):
            if s < run:  # it reaches into a unit placed before
                continue
            placed = _place(known, a, b, s=s, i=i, js=j - (i - s), tops=tops)
            if placed is not None:
                break
        if placed is None:
            return None
        e, k, inner = placed
        js = j - (i - s)
        if facts:
            found[0].extend(x + j - i for x in _between(starts, kept, s))
            found[1].extend(x + j - i for x in _between(ends, kept, s + 1))  # s stays one
            found[2].extend(x + j - i for x in _between(classes, kept, s))
            for mine, theirs in zip(found, inner, strict=True):
                mine.extend(x + js for x in theirs)
        kept = e
        i, j = e, k


def _between(lines: tuple[int, ...], lo: int, hi: int) -> tuple[int, ...]:
    """The sorted `lines` in [lo, hi)."""
    return lines[bisect.bisect_left(lines, lo) : bisect.bisect_left(lines, hi)]


def _same(a: list[str], b: list[str], i: int, j: int) -> int:
    """How many lines from a[i] and b[j] on are equal (compared 64 at a time, then fewer)."""
    n = min(len(a) - i, len(b) - j)
    k, step = 0, 64
    while step:
        while k + step <= n and a[i + k : i + k + step] == b[j + k : j + k + step]:
            k += step
        step //= 2
    return k


@functools.lru_cache(maxsize=64)
def _lines(source: bytes) -> list[str] | None:
    """`source`'s lines (shared: not to be changed), None where no unit can judge it: not
    UTF-8, a NUL, CR, byte-order mark or form feed in it, a coding declaration. Those an
    edit of another source gave, when it was read so (`_edited_lines`: the same lines),
    are taken as they are, not decoded and split again."""
    edited = _edited.pop(source, None)
    if edited is not None:
        return edited
    try:
        text = source.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(c in text for c in ("\0", "\r", "\ufeff", "\f")):
        return None
    lines = text.split("\n")
    return None if any(_COOKIE.match(line) for line in lines[:2]) else lines


def common_ends(before: bytes, after: bytes) -> tuple[int, int]:
    """How many bytes `before` and `after` share at their start and at their end (the two
    not overlapping in either): `after` is `before[:p] + after[p:len(after) - q] +
    before[len(before) - q:]`."""
    n = min(len(before), len(after))
    p = _shared(before, after, n, lambda x, k, m: x[k:m])
    return p, _shared(before, after, n - p, lambda x, k, m: x[len(x) - m : len(x) - k])


def _shared(x: bytes, y: bytes, n: int, cut: Callable[[bytes, int, int], bytes]) -> int:
    """The largest k <= n with cut(x, 0, k) == cut(y, 0, k): chunks of doubling size, then
    halving within the first that differs (slices are copied and compared in C)."""
    lo, step = 0, 4096
    while lo < n:
        hi = min(n, lo + step)
        if cut(x, lo, hi) != cut(y, lo, hi):
            break
        lo, step = hi, step * 2
    else:
        return n
    while hi - lo > 1:  # cut(.., 0, lo) equal, cut(.., 0, hi) not
        mid = (lo + hi) // 2
        if cut(x, lo, mid) == cut(y, lo, mid):
            lo = mid
        else:
            hi = mid
    return lo


# The lines of sources read as edits of another (`units` with facts: a release's file read as
# an edit of the last release's), by the source, for `_lines` to take when it is asked for
# them (it is next: the edits of that file are judged by its units).
_edited: dict[bytes, list[str]] = {}
_EDITED_KEPT = 16


def _keep_edited(source: bytes, lines: list[str]) -> None:
    if len(_edited) >= _EDITED_KEPT:
        del _edited[next(iter(_edited))]
    _edited[source] = lines


def _edited_lines(
    a: list[str], before: bytes, after: bytes, shared: tuple[int, int] | None = None
) -> list[str] | None:
    """`_lines(after)` for an `after` read as an edit of `before` (whose lines `a` are):
    the lines wholly in their shared start and end are `before`'s own (the same strings),
    only the rest of `after` is decoded and checked. `shared`: their `common_ends`, if
    known."""
    p, q = shared or common_ends(before, after)
    head = before.count(b"\n", 0, p)  # lines a[:head] end inside the shared start
    start = before.rfind(b"\n", 0, p) + 1  # where line `head` starts, in both
    tail = before.count(b"\n", len(before) - q) if q else 0  # a[-tail:] in the shared end
    # after's lines from `head` on, up to the newline before the shared end's lines
    stop = len(after) - len(before) + before.find(b"\n", len(before) - q) if tail else len(after)
    try:
        text = after[start:stop].decode("utf-8")
    except UnicodeDecodeError:
        return None
    if any(c in text for c in ("\0", "\r", "\ufeff", "\f")):
        return None
    lines = [*a[:head], *text.split("\n"), *(a[len(a) - tail :] if tail else ())]
    if head < 2 and any(_COOKIE.match(line) for line in lines[:2]):
        return None
    return lines


def _around(
    a: list[str], before: tuple[int, ...], top: int, *, i: int, tops: list[int], known: Known
) -> list[int]:
    """The units that may hold a change at line `i` after the starts `before` (sorted): the
    last one, the one before it at its own indentation where the change starts at its first
    line (lines put at the end of the one before), then each earlier one less indented (up
    to four), then `top` (module level). Where `top` is the line after a module-level class
    or def (not a statement's start) and only blank and comment lines stand from it to `i`
    (lines put at the end of that class), that statement's own units come before `top`,
    and the statement itself (from the top before) after it."""
    floor = top
    if top and top not in known.starts and not any(_code(line) for line in a[top:i]):
        floor = tops[bisect.bisect_left(tops, top) - 1]
    chain: list[int] = []
    width = None
    sibling = False
    for s in reversed(before):
        if s <= floor or len(chain) == 4:
            break
        here = len(a[s]) - len(a[s].lstrip())
        if width is None or here < width:
            chain.append(s)
            width = here
        elif here == width and chain == [i] and not sibling:
            chain.append(s)
            sibling = True
    chain.append(top)
    if floor != top:
        chain.append(floor)
    return chain


def _code(line: str) -> bool:
    """Whether `line` holds more than blanks and a comment."""
    text = line.lstrip()
    return bool(text) and not text.startswith("#")


def _place(
    known: Known, a: list[str], b: list[str], *, s: int, i: int, js: int, tops: list[int]
) -> tuple[int, int, Found] | None:
    """The stretch of `before` from line `s` (a unit's start, at or before the first changed
    line `i`) to the first later unit start no deeper (or the end) where `before`'s lines go
    on in `after`, if its replacement compiles alone: the lines to go on from and the
    replacement's own starts (from its first line), else None."""
    head = a[s]
    indent = "" if s in tops else head[: len(head) - len(head.lstrip())]
    if indent and (not head.lstrip().startswith(_SCOPE_STARTS) or "\t" in indent):
        return None
    in_class = False
    if indent:  # a nested unit: no declaration in the function or class body around it
        at = bisect.bisect_right(tops, s)
        top, end = tops[at - 1], tops[at] if at < len(tops) else len(a)
        in_class = top in known.classes and not _in_function(known, a, top, s)
        if in_class and _class_level_declared(known, a, top, end):
            return None
        if not in_class and _within(known.declared, top, end):
            return None
    n = len(a)
    bounds = known.bounds
    for e in [*bounds[bisect.bisect_right(bounds, i) : bisect.bisect_left(bounds, n)], n]:
        line = a[e] if e < n else ""
        if e < n and len(line) - len(line.lstrip()) > len(indent):
            continue  # deeper: inside the unit
        if indent and any_outside(a, s, e, indent):
            return None  # a line of `before` less indented: not one block
        if _within(known.futures, s, e):
            return None  # the file's `__future__` flags may change
        k = _resume(a, b, e, js + (i - s))
        if k is None or k < js:
            continue
        inner = _compiles_alone(known, b[js:k], indent, in_class=in_class)
        return None if inner is None else (e, k, inner)
    return None


def _in_function(known: Known, a: list[str], top: int, s: int) -> bool:
    """Whether the unit at `s`, inside the module-level statement from `top`, may lie in a
    function (whose other statements' declarations reach it): unless that statement is a
    class and no def between them is less indented than `s` (a class's own statements and
    methods see no function scope around them)."""
    if top not in known.classes:
        return True
    width = len(a[s]) - len(a[s].lstrip())
    return any(
        x not in known.classes and len(a[x]) - len(a[x].lstrip()) < width
        for x in _between(known.starts, top + 1, s)
    )


def _class_level_declared(known: Known, a: list[str], top: int, end: int) -> bool:
    """Whether a `global` or `nonlocal` of the class statement [top, end) may stand in its
    body itself, not in a def of it: one not known to lie in a def's block (a def less
    indented before it whose block no line between closes: only lines less or as indented
    as the def that start with a closing bracket, continuations, are let pass)."""
    for line in _between(known.declared, top, end):
        width = _width(a[line])
        for t in reversed(_between(known.starts, top + 1, line)):
            if t in known.classes or _width(a[t]) >= width:
                continue
            if not any(_closes(x, _width(a[t])) for x in a[t + 1 : line]):
                break  # in the block of the def at t
        else:
            return True
    return False


def _width(line: str) -> int:
    return len(line) - len(line.lstrip())


def _closes(line: str, width: int) -> bool:
    """Whether `line` may start a statement indented `width` or less (ending a block)."""
    text = line.lstrip()
    return bool(text) and not text.startswith(("#", ")", "]", "}")) and _width(line) <= width


def _within(lines: tuple[int, ...], lo: int, hi: int) -> bool:
    """Whether any of the sorted `lines` lies in [lo, hi)."""
    at = bisect.bisect_left(lines, lo)
    return at < len(lines) and lines[at] < hi


def _resume(a: list[str], b: list[str], e: int, lo: int) -> int | None:
    """Where `before`'s lines from `e` go on in `after` (the first place from `lo` holding
    the next eight of them; the last few only at the end), None if nowhere."""
    n, m = len(a), len(b)
    if n - e <= 8:  # the file's last lines: they go on at its end or nowhere
        k = m - (n - e)
        return k if k >= lo and b[k:] == a[e:] else None
    size = 8
    want = a[e : e + size]
    k = lo
    while k + size <= m:
        try:
            k = b.index(want[0], k, m - size + 1)
        except ValueError:
            return None
        if b[k : k + size] == want:
            return k
        k += 1
    return None


# Units judged so far, by their flags, indentation, context and text (oldest first out): a
# patch's unit meets the same lines in every release whose file differs elsewhere.
_UNITS: dict[tuple[int, str, bool, str], Found | None] = {}
_UNITS_KEPT = 4096


def _compiles_alone(
    known: Known, cut: list[str], indent: str, *, in_class: bool = False
) -> Found | None:
    """The 0-based starts of the defs and classes in the lines `cut` (whole statements of a
    block indented by `indent`), and at module level their ends, when they compile on their
    own (dedented, or `in_class` as they stand in a class of their own, the scope around
    them in place); None when not, or where alone they might compile but not in place."""
    text = "\n".join(cut) + "\n"
    key = (known.flags, indent, in_class, text)
    if key in _UNITS:
        return _UNITS[key]
    answer = _judge_alone(known.flags, text, indent, in_class=in_class)
    if len(_UNITS) >= _UNITS_KEPT:
        del _UNITS[next(iter(_UNITS))]
    _UNITS[key] = answer
    return answer


def _judge_alone(flags: int, text: str, indent: str, *, in_class: bool) -> Found | None:
    if in_class and "__future__" not in text and _opens_at_zero(dedented(text, indent)):
        # A class's own statements and methods (one block at `indent`, its first statement
        # at `indent` itself, no tab in it), in a class at module level as in place: the
        # same scopes around them, so `global`, `nonlocal`, `:=` and `import *` are judged
        # alike.
        code = _compiled("class _:\n" + text, flags)
        if code is None:
            return None
        starts, classes = code_starts(code)
        return [x - 1 for x in starts if x], [], [x - 1 for x in classes if x]
    if indent:
        text = dedented(text, indent)
        if not _opens_at_zero(text) or _risky(text):  # a statement of the block, at its start
            return None
    elif _risky_top(text):
        return None
    # At module level the unit is the file's own text, tokenized and nested as in place.
    code = _compiled(text, flags)
    if code is None:
        return None
    starts, classes = code_starts(code)
    return starts, [] if indent else module_ends(code), classes


def _compiled(text: str, flags: int) -> types.CodeType | None:
    """`text` compiled alone with the file's `__future__` flags (warnings ignored), None if
    it does not compile."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code: types.CodeType = compile(text, "<unit>", "exec", flags, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return code


def _opens_at_zero(text: str) -> bool:
    """Whether `text` holds a statement (not only comments: a block left with none does not
    compile) and its first stands at column 0."""
    for line in text.split("\n"):
        if line.strip() and not line.lstrip().startswith("#"):
            return not line[0].isspace()
    return False


def _risky(text: str) -> bool:
    if any(word in text for word in ("global", "nonlocal", "__future__", ":=")) or (
        "import" in text and "*" in text
    ):
        return _RISKY.search(text) is not None
    return False


def _risky_top(text: str) -> bool:
    if "__future__" in text or text.startswith(("global", "nonlocal")):
        return True
    return ("\nglobal" in text or "\nnonlocal" in text) and _RISKY_TOP.search(text) is not None


def clear() -> None:
    """Forget the units judged and the sources' lines kept."""
    _UNITS.clear()
    _lines.cache_clear()
    _edited.clear()


__all__ = ["Found", "Known", "clear", "code_starts", "common_ends", "facts", "module_ends", "units"]
