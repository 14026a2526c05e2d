"""The in-memory compile helper: errors with their line, nothing written to disk."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.kernel.pycompile import broken_by, compile_error, compiles


def test_good_source_compiles() -> None:
    assert compile_error("def f():\n    return 1\n") is None
    assert compiles(b"x = '\\d'\n")  # a SyntaxWarning is not an error


def test_error_names_the_line() -> None:
    error = compile_error("def f():\n    return 1\n  x = 2\n")
    assert error is not None
    assert error.line == 3
    assert "indent" in error.message
    assert error.describe("a.py").startswith("a.py:3: ")


def test_tabs_and_nul_bytes() -> None:
    mixed = compile_error("if x:\n\tif y:\n        pass\n")
    assert mixed is not None and mixed.line == 3
    nul = compile_error(b"x = 1\x00\n")
    assert nul is not None


def test_broken_by_blames_only_the_edit() -> None:
    assert broken_by("x = 1\n", "x = (\n") is not None
    assert broken_by("x = (\n", "y = (\n") is None  # it was broken before
    assert broken_by(None, "def\n") is not None  # a new file
    assert broken_by("x = 1\n", "x = 2\n") is None


def test_nothing_is_written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    compile_error("import os\n", str(tmp_path / "m.py"))
    assert list(tmp_path.iterdir()) == []
