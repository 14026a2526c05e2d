"""Compile Python source in memory (standard library only): no .pyc file is ever written.

Used before a patched file is committed (apply, revert, an image's build and its container
start): a file that compiled before an edit and does not after refuses the edit.
"""

from __future__ import annotations

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


__all__ = ["CompileError", "broken_by", "compile_error", "compiles"]
