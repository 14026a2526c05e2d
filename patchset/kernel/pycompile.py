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
_GLOBALS = re.compile(rb"^[ \t]*(?:global|nonlocal)\b", re.MULTILINE)
_COOKIE = re.compile(r"^[ \t\f]*#.*?coding[:=]")


@dataclass(frozen=True)
class _Known:
    """A source compiled once: its error (None: it compiles), the 0-based first lines of its
    defs and classes (decorators included: where the compiler says each starts), its
    `__future__` flags and whether it declares any name global or nonlocal."""

    error: CompileError | None
    starts: tuple[int, ...] = ()
    flags: int = 0
    declares: bool = False


# Sources compiled whole, by content (oldest first out): `_known` compiles each once, and
# an edit of a source already here is judged by its units.
_KNOWN: dict[bytes, _Known] = {}
_KNOWN_KEPT = 256


def _known(source: bytes) -> _Known:
    known = _KNOWN.get(source)
    if known is None:
        known = _compile_known(source)
        if len(_KNOWN) >= _KNOWN_KEPT:
            del _KNOWN[next(iter(_KNOWN))]
        _KNOWN[source] = known
    return known


def _compile_known(source: bytes) -> _Known:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(source, "<patched>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return _Known(CompileError(exc.lineno or 0, exc.msg or type(exc).__name__))
    except (ValueError, UnicodeDecodeError) as exc:
        return _Known(CompileError(0, str(exc)))
    starts: set[int] = set()
    todo = [code]
    while todo:
        for const in todo.pop().co_consts:
            if isinstance(const, types.CodeType):
                if not const.co_name.startswith("<"):  # not a lambda nor a comprehension
                    starts.add(const.co_firstlineno - 1)
                todo.append(const)
    return _Known(
        None, tuple(sorted(starts)), code.co_flags & _FUTURE, bool(_GLOBALS.search(source))
    )


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
    _edits_of.cache_clear()


def edit_error(before: bytes | None, after: bytes) -> CompileError | None:
    """`broken_by(before, after)` for an edit of a file, each source compiled once (cached by
    content), each edit judged once. The first edit of a source compiles `after` whole (and
    `before` only if that fails), as `broken_by` does; from the second on (many patches on
    one file, or one patch's variants), or when `before` was itself compiled whole here (an
    apply, each patch editing the file the one before left), `before` is compiled once and,
    where it compiles and every changed line lies in a def or class of it, each such unit as
    it stands in `after` is cut out and compiled alone: when all compile, so does `after`
    (see `_units_compile`). Otherwise `after` is compiled whole, so the answer, and the
    message, are always those of compiling it."""
    if before is None:
        return _known(after).error
    edits = _edits_of(before)
    done = _digest(after)
    if done in edits:
        return edits[done]
    if not edits and before not in _KNOWN:
        error = _known(after).error
        answer = None if error is None or _known(before).error is not None else error
    elif _known(before).error is not None:
        answer = None  # already broken: not the edit's doing
    elif _units_compile(_known(before), before, after):
        answer = None
    else:
        answer = _known(after).error
    edits[done] = answer
    return answer


def _units_compile(known: _Known, before: bytes, after: bytes) -> bool:
    """Whether `after` (an edit of `before`, which compiles) is known to compile from its
    changed units alone. `after` is read as `before`'s lines with some stretches replaced,
    each stretch [s, e) starting at a def or class of `before` (its first decorator: the
    compiler's own first line, a clean statement start) and ending at a later one no deeper,
    or at the end of the file, every line between at least as indented as line s (so the
    stretch is whole statements of one block). Each replacement, dedented, compiled alone
    with the file's `__future__` flags, is whole statements of that block too; the lines
    around are `before`'s, tokenized alike. False (compile the whole file) near what a unit
    alone cannot judge: `global`, `nonlocal` (in the unit, or anywhere in the file: a
    scope's declarations reach its other statements), `__future__`, `import *`, `:=`, a coding
    declaration, tabs or form feeds in indentation, a byte-order mark, a NUL, CR line ends,
    nesting near the compiler's limits (20 blocks)."""
    try:
        old, new = before.decode("utf-8"), after.decode("utf-8")
    except UnicodeDecodeError:
        return False
    if any(c in new or c in old for c in ("\0", "\r", "\ufeff", "\f")):
        return False
    a, b = old.split("\n"), new.split("\n")
    if any(_COOKIE.match(line) for line in a[:2] + b[:2]):
        return False
    starts = known.starts
    n, m = len(a), len(b)
    i = j = 0
    while True:
        run = i  # a[run:i] == b[j - (i - run):j]
        while i < n and j < m and a[i] == b[j]:
            i += 1
            j += 1
        if i == n and j == m:
            return True
        placed = None
        for s in reversed(starts[: bisect.bisect_right(starts, i)][-2:]):
            if s < run:
                break
            placed = _place(known, a, b, s=s, i=i, js=j - (i - s))
            if placed is not None:
                break
        if placed is None:
            return False
        i, j = placed


def _place(
    known: _Known, a: list[str], b: list[str], *, s: int, i: int, js: int
) -> tuple[int, int] | None:
    """The stretch of `before` from line `s` (a unit's start, at or before the first changed
    line `i`) to the first later unit start no deeper (or the end) where `before`'s lines go
    on in `after`, if its replacement compiles alone: the lines to go on from, else None."""
    head = a[s]
    indent = head[: len(head) - len(head.lstrip())]
    if not head.lstrip().startswith(_SCOPE_STARTS) or "\t" in indent:
        return None
    n, m = len(a), len(b)
    for e in [*(x for x in known.starts if x > i), n]:
        line = a[e] if e < n else ""
        if e < n and len(line) - len(line.lstrip()) > len(indent):
            continue  # deeper: inside the unit
        if any(x.strip() and not x.startswith(indent) for x in a[s:e]):
            return None  # a line of `before` less indented: not one block
        k = _resume(a, b, e, js + (i - s))
        if k is None or k < js:
            continue
        cut = b[js:k]
        if 2 * len(cut) > m or not _compiles_alone(known, cut, indent):
            return None  # half the file or more: compiling it whole costs no more
        return e, k
    return None


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


def _compiles_alone(known: _Known, cut: list[str], indent: str) -> bool:
    body: list[str] = []
    widths = [0]
    deepest = 0
    for line in cut:
        if not line.strip():
            body.append("")
            continue
        if not line.startswith(indent):
            return False
        rest = line[len(indent) :]
        lead = rest[: len(rest) - len(rest.lstrip())]
        if "\t" in lead:
            return False
        while widths and widths[-1] > len(lead):
            widths.pop()
        if not widths or widths[-1] < len(lead):
            widths.append(len(lead))
        deepest = max(deepest, len(widths))
        body.append(rest)
    # Blocks nest at most 20 deep in one scope: the unit's own depth in the file is at most
    # its indentation's width.
    if deepest + len(indent) >= 20 or not body:
        return False
    text = "\n".join(body) + "\n"
    if _RISKY.search(text) or known.declares:
        return False
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(text, "<unit>", "exec", known.flags, dont_inherit=True)
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return False
    return True


__all__ = [
    "CompileError",
    "broken_by",
    "clear_cache",
    "compile_error",
    "compiles",
    "edit_error",
]
