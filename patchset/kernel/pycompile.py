"""Compile Python source in memory (standard library only): no .pyc file is ever written.

Used before a patched file is committed (apply, revert, an image's build and its container
start): a file that compiled before an edit and does not after refuses the edit.
"""

from __future__ import annotations
import __future__

import bisect
import functools
import hashlib
import operator
import re
import types
import warnings
from dataclasses import dataclass


@dataclass(frozen=True)
class CompileError:
    """Why a source did not compile: the 1-based line (0 when unknown) and the message."""

    line: int
    message: str

    def describe(self, name: str = "") -> str:
        where = f"{name}:{self.line}" if name else f"line {self.line}"
        return f"{where}: {self.message}"


def compile_error(source: str | bytes, name: str = "<patched>") -> CompileError | None:
    """None when `source` compiles as Python, else the first error and its line.

    Only `compile()` runs: nothing is imported, executed or written to disk. Warnings the
    compiler raises (invalid escape sequences, `is` with a literal) are not errors here.
    """
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(source, name, "exec", dont_inherit=True)
    except SyntaxError as exc:  # IndentationError and TabError are SyntaxErrors
        return CompileError(exc.lineno or 0, exc.msg or type(exc).__name__)
    except (ValueError, UnicodeDecodeError) as exc:  # NUL bytes, undecodable bytes
        return CompileError(0, str(exc))
    return None


def compiles(source: str | bytes) -> bool:
    """Whether `source` compiles as Python."""
    return compile_error(source) is None


def broken_by(before: str | bytes | None, after: str | bytes) -> CompileError | None:
    """The error an edit introduced: `after`'s compile error, but only when `before` (the
    file as it was; None for a new file) compiled. A file already broken is not blamed on
    the edit."""
    if before is not None and not compiles(before):
        return None
    return compile_error(after)


# Every `from __future__ import` flag the compiler takes.
_FUTURE = functools.reduce(
    operator.or_,
    (getattr(__future__, name).compiler_flag for name in __future__.all_feature_names),
    0,
)
_SCOPE_STARTS = ("def ", "async ", "class ", "@")
# Near these, a unit compiled alone may compile where the whole file would not.
_RISKY = re.compile(r"\b(?:global|nonlocal|__future__)\b|\bimport\s*\*|:=")
# ... and for a unit at module level (column 0), which holds every scope its statements see,
# only these: a module-level declaration reaches the module's other statements.
_RISKY_TOP = re.compile(r"\b__future__\b|^(?:global|nonlocal)\b", re.MULTILINE)
_DECLARES = re.compile(rb"^[ \t]*(?:global|nonlocal)\b|^.*?(__future__)", re.MULTILINE)
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=]")


@dataclass(frozen=True)
class _Known:
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


def _facts(source: bytes, starts: list[int], flags: int) -> _Known:
    """A compiling source's `_Known`, its starts and flags given."""
    declared: list[int] = []
    futures: list[int] = []
    top = False
    line, at = 0, 0
    for match in _DECLARES.finditer(source):
        line += source.count(b"\n", at, match.start())
        at = match.start()
        if match.group(1) is not None:
            futures.append(line)
        else:
            declared.append(line)
            top = top or source[at : at + 1] not in (b" ", b"\t")
    return _Known(None, tuple(sorted(starts)), flags, tuple(declared), top, tuple(futures))


# Sources compiled whole, by a digest of their content (oldest first out): `_known` compiles
# each once, and an edit of a source already here is judged by its units.
_KNOWN: dict[bytes, _Known] = {}
_KNOWN_KEPT = 4096


def _known(source: bytes, key: bytes | None = None) -> _Known:
    key = key or _digest(source)
    known = _KNOWN.get(key)
    if known is None:
        known = _compile_known(source)
        _keep(key, known)
    return known


def _keep(key: bytes, known: _Known) -> None:
    if len(_KNOWN) >= _KNOWN_KEPT:
        del _KNOWN[next(iter(_KNOWN))]
    _KNOWN[key] = known


def _compile_known(source: bytes) -> _Known:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(source, "<patched>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return _Known(CompileError(exc.lineno or 0, exc.msg or type(exc).__name__))
    except (ValueError, UnicodeDecodeError) as exc:
        return _Known(CompileError(0, str(exc)))
    return _facts(source, _code_starts(code), code.co_flags & _FUTURE)


def _code_starts(code: types.CodeType, offset: int = 0) -> list[int]:
    """The 0-based first lines (plus `offset`) of the defs and classes compiled in `code`."""
    starts: list[int] = []
    todo = [code]
    while todo:
        for const in todo.pop().co_consts:
            if isinstance(const, types.CodeType):
                if not const.co_name.startswith("<"):  # not a lambda nor a comprehension
                    starts.append(const.co_firstlineno - 1 + offset)
                todo.append(const)
    return starts


@functools.lru_cache(maxsize=512)
def _edits_of(source: bytes) -> dict[bytes, CompileError | None]:
    """The edits of this source judged so far, by a digest of the edited content, and their
    answers (one dict per content): the same edit met again (one patch on the same file in
    several releases, whose other files differ) is answered from here."""
    return {}


def _digest(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def clear_cache() -> None:
    """Forget the sources compiled (a benchmark's "nothing known yet")."""
    _KNOWN.clear()
    _LAST.clear()
    _UNITS.clear()
    _edits_of.cache_clear()


def edit_error(before: bytes | None, after: bytes, name: str = "") -> CompileError | None:
    """`broken_by(before, after)` for an edit of a file, each source compiled once (cached by
    content), each edit judged once. `before` is compiled whole once (or, when a source of
    the same `name` was known before it, as an edit of that one: another release's copy of
    the file is judged by the units it changed, see `_units`) and, where it compiles and
    every changed line lies in a def or class of it or in the module-level statements
    between them, each such unit as it stands in `after` is cut out and compiled alone:
    when all compile, so does `after`. Otherwise `after` is compiled whole, so the answer,
    and the message, are always those of compiling it."""
    if before is None:
        return _known(after).error
    edits = _edits_of(before)
    done = _digest(after)
    if done in edits:
        return edits[done]
    known = _known_named(before, name)
    if known.error is not None:
        answer = None  # already broken: not the edit's doing
    elif _units(known, before, after) is not None:
        answer = None
    else:
        answer = _known(after, done).error
    edits[done] = answer
    return answer


# By a file's name, the last source of it known here: the next one (the file in another
# release) is judged as an edit of it.
_LAST: dict[str, tuple[bytes, _Known]] = {}


def _known_named(source: bytes, name: str) -> _Known:
    key = _digest(source)
    known = _KNOWN.get(key)
    if known is None:
        last = _LAST.get(name) if name else None
        if last is not None and last[1].error is None:
            starts = _units(last[1], last[0], source)
            if starts is not None:
                known = _facts(source, starts, last[1].flags)
                _keep(key, known)
        if known is None:
            known = _known(source, key)
    if name:
        _LAST[name] = (source, known)
    return known


def _units(known: _Known, before: bytes, after: bytes) -> list[int] | None:
    """`after`'s def and class starts when `after` (an edit of `before`, which compiles) is
    known to compile from its changed units alone, else None. `after` is read as `before`'s
    lines with some stretches replaced, each stretch [s, e) starting at a def or class of
    `before` (its first decorator: the compiler's own first line, a clean statement start)
    or at the top of the file, and ending at a later one no deeper, or at the end of the
    file, every line between at least as indented as line s (so the stretch is whole
    statements of one block; comment lines aside). Each replacement, dedented, compiled alone
    with the file's `__future__` flags, is whole statements of that block too; the lines
    around are `before`'s, tokenized alike. The innermost units are tried first, then those
    around them, then the module-level one (which holds every scope its statements see).
    None (compile the whole file) near what a unit alone cannot judge: in a nested unit
    `global`, `nonlocal` (in the unit, or in the module-level unit around it: a scope's
    declarations reach its other statements), `import *` and `:=` (a class body around it);
    anywhere a module-level `global` or `nonlocal`, `__future__` (on either side), a coding
    declaration, tabs or form feeds in indentation, a byte-order mark, a NUL, CR line ends,
    nesting near the compiler's limits (20 blocks)."""
    try:
        old, new = before.decode("utf-8"), after.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if known.top_declares or any(c in new or c in old for c in ("\0", "\r", "\ufeff", "\f")):
        return None
    a, b = old.split("\n"), new.split("\n")
    if any(_COOKIE.match(line) for line in a[:2] + b[:2]):
        return None
    starts = known.starts
    tops = [0, *(x for x in starts if x and a[x][:1] not in (" ", "\t"))]
    n, m = len(a), len(b)
    found: list[int] = []
    kept = 0  # before's lines from here on are after's, shifted by j - i
    i = j = 0
    while True:
        run = i  # a[run:i] == b[j - (i - run):j]
        while i < n and j < m and a[i] == b[j]:
            i += 1
            j += 1
        if i == n and j == m:
            found += [x + j - i for x in starts[bisect.bisect_left(starts, kept) :]]
            return found
        top = tops[bisect.bisect_right(tops, i) - 1]
        placed = None
        for s in _around(a, starts[: bisect.bisect_right(starts, i)], top):
            if s < run:
                break
            placed = _place(known, a, b, s=s, i=i, js=j - (i - s), tops=tops)
            if placed is not None:
                break
        if placed is None:
            return None
        e, k, inner = placed
        found += [
            x + j - i
            for x in starts[bisect.bisect_left(starts, kept) : bisect.bisect_left(starts, s)]
        ]
        found += [x + (j - (i - s)) for x in inner]
        kept = e
        i, j = e, k


def _around(a: list[str], before: tuple[int, ...], top: int) -> list[int]:
    """The units that may hold a change after the starts `before` (sorted): the last one,
    then each earlier one less indented (up to four), then `top` (module level)."""
    chain: list[int] = []
    width = None
    for s in reversed(before):
        if s <= top or len(chain) == 4:
            break
        here = len(a[s]) - len(a[s].lstrip())
        if width is None or here < width:
            chain.append(s)
            width = here
    chain.append(top)
    return chain


def _place(
    known: _Known, a: list[str], b: list[str], *, s: int, i: int, js: int, tops: list[int]
) -> tuple[int, int, tuple[int, ...]] | None:
    """The stretch of `before` from line `s` (a unit's start, at or before the first changed
    line `i`) to the first later unit start no deeper (or the end) where `before`'s lines go
    on in `after`, if its replacement compiles alone: the lines to go on from and the
    replacement's own starts (from its first line), else None."""
    head = a[s]
    indent = head[: len(head) - len(head.lstrip())]
    if s not in tops and (not head.lstrip().startswith(_SCOPE_STARTS) or "\t" in indent):
        return None
    if indent:  # a nested unit: no declaration in the module-level unit around it
        at = bisect.bisect_right(tops, s)
        if _within(known.declared, tops[at - 1], tops[at] if at < len(tops) else len(a)):
            return None
    n = len(a)
    for e in [*(x for x in known.starts if x > i), n]:
        line = a[e] if e < n else ""
        if e < n and len(line) - len(line.lstrip()) > len(indent):
            continue  # deeper: inside the unit
        if indent and any(_outside(x, indent) for x in a[s:e]):
            return None  # a line of `before` less indented: not one block
        if _within(known.futures, s, e):
            return None  # the file's `__future__` flags may change
        k = _resume(a, b, e, js + (i - s))
        if k is None or k < js:
            continue
        inner = _compiles_alone(known, b[js:k], indent)
        return None if inner is None else (e, k, inner)
    return None


def _within(lines: tuple[int, ...], lo: int, hi: int) -> bool:
    """Whether any of the sorted `lines` lies in [lo, hi)."""
    at = bisect.bisect_left(lines, lo)
    return at < len(lines) and lines[at] < hi


def _resume(a: list[str], b: list[str], e: int, lo: int) -> int | None:
    """Where `before`'s lines from `e` go on in `after` (the first place from `lo` holding
    the next few of them), None if nowhere."""
    n, m = len(a), len(b)
    if e == n:
        return m
    size = min(8, n - e)
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


# Units judged so far, by a digest of their indentation, flags and text: a patch's unit meets
# the same lines in every release whose file differs elsewhere.
_UNITS: dict[bytes, tuple[int, ...] | None] = {}
_UNITS_KEPT = 16384


def _compiles_alone(known: _Known, cut: list[str], indent: str) -> tuple[int, ...] | None:
    """The 0-based starts of the defs and classes in the lines `cut` (whole statements of a
    block indented by `indent`) when they compile on their own, dedented; None when not, or
    where alone they might compile but not in place."""
    text = "\n".join(cut) + "\n"
    key = _digest(f"{known.flags}:{indent}:{text}".encode())
    if key in _UNITS:
        return _UNITS[key]
    answer = _judge_alone(known.flags, text, indent)
    if len(_UNITS) >= _UNITS_KEPT:
        del _UNITS[next(iter(_UNITS))]
    _UNITS[key] = answer
    return answer


def _judge_alone(flags: int, text: str, indent: str) -> tuple[int, ...] | None:
    if indent:
        text = _dedented(text, indent)
        if not text or _risky(text):
            return None
    elif _risky_top(text):
        return None
    # At module level the unit is the file's own text, tokenized and nested as in place.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(text, "<unit>", "exec", flags, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return None
    return tuple(_code_starts(code))


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


def _outside(line: str, indent: str) -> bool:
    """Whether `line` stands outside a block indented by `indent`: it holds code (not only
    a comment: comment lines do not open or close blocks) and less indentation."""
    return not line.startswith(indent) and not line.lstrip().startswith("#") and bool(line.strip())


def _dedented(text: str, indent: str) -> str:
    """`text` without `indent` on each line ("" when a line lacks it, holds a tab in its
    indentation, or blocks nest near the compiler's limit of 20 in one scope: the unit's own
    depth in the file is at most its indentation's width)."""
    body: list[str] = []
    widths = [0]
    deepest = 0
    for line in text.split("\n"):
        if not line.strip():
            body.append("")
            continue
        if not line.startswith(indent):
            if not _outside(line, indent):  # a comment: the tokenizer passes it by
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


__all__ = [
    "CompileError",
    "broken_by",
    "clear_cache",
    "compile_error",
    "compiles",
    "edit_error",
]
