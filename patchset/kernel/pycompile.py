"""Compile Python source in memory (standard library only): no .pyc file is ever written.

Used before a patched file is committed (apply, revert, an image's build and its container
start): a file that compiled before an edit and does not after refuses the edit.
"""

from __future__ import annotations
import __future__

import ast
import functools
import itertools
import operator
import re
import warnings
from dataclasses import dataclass

from . import kept, pyunits
from .pyunits import Known, code_starts, common_ends, facts, module_ends, units


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

_KNOWN: dict[bytes, Known] = {}
_KNOWN_KEPT = 4096


def _known(source: bytes, key: bytes | None = None) -> Known:
    key = key or _digest(source)
    known = _KNOWN.get(key)
    if known is None:
        known = _compile_known(source)
        _keep(key, known)
    return known


def _keep(key: bytes, known: Known) -> None:
    if len(_KNOWN) >= _KNOWN_KEPT:
        del _KNOWN[next(iter(_KNOWN))]
    _KNOWN[key] = known


def _compile_known(source: bytes) -> Known:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(source, "<patched>", "exec", dont_inherit=True)
    except SyntaxError as exc:
        return Known(CompileError(exc.lineno or 0, exc.msg or type(exc).__name__))
    except (ValueError, UnicodeDecodeError) as exc:
        return Known(CompileError(0, str(exc)))
    starts, classes = code_starts(code)
    return facts(source, code.co_flags & _FUTURE, (starts, module_ends(code), classes))


@functools.lru_cache(maxsize=512)
def _edits_of(source: bytes) -> dict[tuple[int, int, bytes], CompileError | None]:
    """The edits of this source judged so far, by what they change (the lengths of the start
    and end the edited content shares with the source and a digest of the rest between:
    that decides the content, and is cheaper than a digest of it all), and their
    answers (one dict per content): the same edit met again (one patch on the same file in
    several releases, whose other files differ) is answered from here."""
    return {}


def _digest(data: bytes) -> bytes:
    return kept.digest(data)


# The digests of the sources last asked for by `_known_named`, by the object itself (kept
# alive here, so its id is not another's): a release's file is one object for every patch
# that edits it, and is hashed once.
_DIGESTS: dict[int, tuple[bytes, bytes]] = {}
_DIGESTS_KEPT = 64


def _digest_of(source: bytes) -> bytes:
    seen = _DIGESTS.get(id(source))
    if seen is not None and seen[0] is source:
        return seen[1]
    key = _digest(source)
    if len(_DIGESTS) >= _DIGESTS_KEPT:
        del _DIGESTS[next(iter(_DIGESTS))]
    _DIGESTS[id(source)] = (source, key)
    return key


def clear_cache() -> None:
    """Forget the sources compiled (a benchmark's "nothing known yet")."""
    _KNOWN.clear()
    _LAST.clear()
    _DIGESTS.clear()
    pyunits.clear()
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
    start, end = common_ends(before, after)
    done = (start, end, _digest(after[start : len(after) - end]))
    if done in edits:
        return edits[done]
    known = _known_named(before, name)
    if known.error is not None:
        answer = None  # already broken: not the edit's doing
    elif units(known, before, after, (start, end), facts=False) is not None:
        answer = None
    else:
        answer = _known(after).error
    edits[done] = answer
    return answer


# By a file's name, the last source of it known here: the next one (the file in another
# release) is judged as an edit of it.
_LAST: dict[str, tuple[bytes, Known]] = {}


def _known_named(source: bytes, name: str) -> Known:
    key = _digest_of(source)
    known = _KNOWN.get(key)
    store = kept.store()
    if known is None and store is not None:
        known = known_from_plain(store.fact("known", key))
        if known is not None:
            _keep(key, known)
    if known is None:
        last = _LAST.get(name) if name else None
        if last is not None and last[1].error is None:
            found = units(last[1], last[0], source)
            if found is not None:
                known = facts(source, last[1].flags, found)
                _keep(key, known)
        if known is None:
            known = _known(source, key)
        if store is not None:  # what compiling a release's file told, kept between runs
            store.keep_fact("known", key, known_plain(known))
    if name:
        _LAST[name] = (source, known)
    return known


def known_plain(known: Known) -> list[object]:
    """`known` as JSON's values: [error line, error message, flags, top_declares, starts,
    declared, futures, ends, classes] (the error's two null when it compiles)."""
    error = known.error
    return [
        None if error is None else error.line,
        None if error is None else error.message,
        known.flags,
        known.top_declares,
        list(known.starts),
        list(known.declared),
        list(known.futures),
        list(known.ends),
        list(known.classes),
    ]


def known_from_plain(value: object) -> Known | None:
    """The `Known` `known_plain` gave `value` for; None for anything else."""
    if not isinstance(value, list) or len(value) != 9:
        return None
    line, message, flags, top, *lines = value
    if type(flags) is not int or type(top) is not bool:
        return None
    if not all(isinstance(x, list) and all(type(n) is int for n in x) for x in lines):
        return None
    if line is None and message is None:
        error = None
    elif type(line) is int and isinstance(message, str):
        error = CompileError(line, message)
    else:
        return None
    starts, declared, futures, ends, classes = (tuple(x) for x in lines)
    return Known(error, starts, flags, declared, top, futures, ends, classes)


def tree_error(tree: ast.Module, name: str = "<patched>") -> CompileError | None:
    """`compile_error` of the source `tree` was parsed from (`ast.parse`, which raised nothing):
    what the compiler past the parser finds (a `return` outside a function, a misplaced
    `nonlocal`...), without parsing the source again."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            compile(tree, name, "exec", dont_inherit=True)
    except SyntaxError as exc:
        return CompileError(exc.lineno or 0, exc.msg or type(exc).__name__)
    except (ValueError, RecursionError) as exc:
        return CompileError(0, str(exc) or type(exc).__name__)
    return None


# A new file is compiled in pieces of about this many bytes (whole top-level statements).
_PIECE = 1 << 20
# Where a piece may start: a line at column 0 that begins a statement (not a clause of the one
# before it) ...
_PIECE_START = re.compile(rb"^(?!(?:else|elif|except|finally|case)\b)[A-Za-z_]", re.MULTILINE)
# ... and what makes a file's statements depend on each other beyond their own text (besides
# `__future__` imports): module-level `global`/`nonlocal`, a coding cookie.
_PIECES_UNSAFE = re.compile(rb"^(?:global|nonlocal)\b", re.MULTILINE)
_CODING = re.compile(rb"^[ \t\f]*#.*?coding[:=]", re.MULTILINE)


def new_file_error(source: bytes, name: str = "<patched>") -> CompileError | None:
    """`compile_error(source)` at a cost linear in its size and memory bounded by `_PIECE`
    (compiling a 60 MB module whole takes gigabytes): the file is cut at lines that start a
    top-level statement into pieces of about `_PIECE` bytes, each compiled alone with the
    first piece's `__future__` flags. When every piece compiles, so does the file: a cut
    inside a string, a bracket, a continuation or a block leaves a piece that does not
    compile, and at column 0 nothing else carries from one statement to the next but
    `__future__` imports (which must come first: one past the first piece, and the file is
    compiled whole), module-level `global`/`nonlocal` and a coding cookie (then whole too).
    Any piece that does not compile: the file is compiled whole, so the answer and the
    message are always those of compiling it."""
    cuts = _cuts(source)
    if len(cuts) < 3:
        return _known(source).error  # small: compiled whole, kept as any other source
    key = _digest(source)
    if key not in _PIECED:
        if len(_PIECED) >= _KNOWN_KEPT:
            del _PIECED[next(iter(_PIECED))]
        _PIECED[key] = _pieces_error(source, cuts, name)
    return _PIECED[key]


# The answers for big new files, by a digest of their content (the same file in the next
# release is not compiled again).
_PIECED: dict[bytes, CompileError | None] = {}


def _pieces_error(source: bytes, cuts: list[int], name: str) -> CompileError | None:
    if (
        _PIECES_UNSAFE.search(source) is not None
        or _CODING.search(source, 0, _second_line_end(source)) is not None
        or source.find(b"__future__", cuts[1]) >= 0
    ):
        return compile_error(source, name)
    flags = 0
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for start, end in itertools.pairwise(cuts):
                code = compile(source[start:end], name, "exec", flags, dont_inherit=True)
                if start == 0:
                    flags = code.co_flags & _FUTURE
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return compile_error(source, name)
    return None


def _second_line_end(source: bytes) -> int:
    end = source.find(b"\n", source.find(b"\n") + 1)
    return len(source) if end < 0 else end


def _cuts(source: bytes) -> list[int]:
    """The offsets the pieces of `source` start at, and its length."""
    cuts = [0]
    at = _PIECE
    while at < len(source):
        match = _PIECE_START.search(source, at)
        if match is None:
            break
        start = match.start()
        if source[source.rfind(b"\n", 0, start - 1) + 1 : start][:1] != b"@":  # no decorator
            cuts.append(start)
            at = start + _PIECE
        else:
            at = start + 1
    cuts.append(len(source))
    return cuts


__all__ = [
    "CompileError",
    "broken_by",
    "clear_cache",
    "compile_error",
    "compiles",
    "edit_error",
    "known_from_plain",
    "known_plain",
    "new_file_error",
    "tree_error",
]
