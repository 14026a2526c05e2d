"""The in-memory compile helper: errors with their line, nothing written to disk."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from patchset.kernel import pycompile, pyunits
from patchset.kernel.pycompile import broken_by, compile_error, compiles


def _whole_compiles(monkeypatch: pytest.MonkeyPatch) -> list[bytes]:
    """The sources compiled whole from here on (`pycompile._compile_known`), in order."""
    compiled: list[bytes] = []
    real = pycompile._compile_known

    def counting(source: bytes) -> object:
        compiled.append(source)
        return real(source)

    monkeypatch.setattr(pycompile, "_compile_known", counting)
    return compiled


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


SNIPPETS = (
    "x = 1", "return 1", "pass", "y = (", ")", '"""', "'''", "global zz", "nonlocal q",
    "def q():", "    return 2", "else:", "if a:", "class Z:", "@dec", "for i in r:", "yield 3",
    "await w", "break", "from m import *", "(v := 2)", "# comment", "", "z = f(a,", "    b)",
    "try:", "except E:", "\tt = 1", "x = '''a'''", "async def r():", "import os", "return",
    "x: int = 1", "f'{x'", "from __future__ import annotations",
)  # fmt: skip


@pytest.mark.parametrize("seed", range(4))
def test_an_edit_judged_by_its_units_is_judged_as_the_whole_file(seed: int) -> None:
    """`edit_error` (each changed def or class compiled alone where it can be) says what
    `broken_by` (the whole file compiled) says, error and line, for random edits of real
    files: lines put in, replaced or removed at any indentation, valid or not."""
    rng = random.Random(seed)  # noqa: S311 - a fixed test sequence
    sources = [p.read_bytes() for p in sorted(Path(pycompile.__file__).parent.parent.rglob("*.py"))]
    judged_alone = 0
    for _ in range(200):
        before = rng.choice(sources)
        lines = before.decode().split("\n")
        for _ in range(rng.choice([1, 1, 2, 3])):
            at = rng.randrange(len(lines))
            indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
            indent = rng.choice([indent, indent, indent + "    ", indent[:-4], ""])
            new = [indent + rng.choice(SNIPPETS) for _ in range(rng.choice([1, 1, 2]))]
            if rng.random() < 0.7:
                new = [indent + "_patchset_x = 1"]  # the common, valid edit
            lines[at : at + rng.choice([0, 0, 1, 2])] = new
        after = "\n".join(lines).encode()
        other = after + b"\n_patchset_y = 2\n"  # another edit of the same source
        pycompile.clear_cache()
        want = broken_by(before, after)
        assert pycompile.edit_error(before, after) == want  # a first edit: compiled whole
        assert pycompile.edit_error(before, after) == want  # the same edit: its answer kept
        pycompile.clear_cache()
        pycompile.edit_error(before, before + b"\n")  # an edit before: from now on, by units
        assert pycompile.edit_error(before, after) == want
        assert pycompile.edit_error(before, other) == broken_by(before, other)
        found = pyunits.units(pycompile._known(before), before, after)
        judged_alone += found is not None
        # only whether: the same answer, no facts of `after` gathered
        alone = pyunits.units(pycompile._known(before), before, after, facts=False)
        assert alone == (None if found is None else ([], [], []))
    assert judged_alone > 5  # the units alone decided a share of them


def test_the_same_edit_again_compiles_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    """One patch meeting the same file in several releases (its other files differ): the
    edit is judged once; a source is compiled whole once and its edits judged by units, and
    a unit already judged (the same lines edited in another release's file) is not compiled
    again."""
    before = Path(pycompile.__file__).read_bytes()
    after = before.replace(b"    return None\n", b"    x = 1\n    return None\n", 1)
    assert after != before
    pycompile.clear_cache()
    compiled: list[str] = []
    real = compile

    def counting(source: object, name: str, *args: object, **kwargs: object) -> object:
        compiled.append(name)
        return real(source, name, *args, **kwargs)  # type: ignore[call-overload]

    monkeypatch.setattr("builtins.compile", counting)
    assert pycompile.edit_error(before, after) is None
    assert compiled == ["<patched>", "<unit>"]  # `before` whole, then the edited unit
    assert pycompile.edit_error(before, after) is None
    assert compiled == ["<patched>", "<unit>"]  # again: nothing compiled
    elsewhere = before + b"\n_patchset_y = 2\n"  # the same file, another release's tail
    assert pycompile.edit_error(elsewhere, after + b"\n_patchset_y = 2\n") is None
    assert compiled == ["<patched>", "<unit>", "<patched>"]  # the unit's answer kept
    again = after.replace(b"    x = 1\n", b"    x = 2\n", 1)
    assert pycompile.edit_error(after, again) is None
    assert compiled == ["<patched>", "<unit>", "<patched>", "<patched>", "<unit>"]


@pytest.mark.parametrize("seed", range(3))
def test_a_release_known_from_the_one_before_is_known_as_compiled_whole(
    seed: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The same file in the next release (`name` given) is judged as an edit of the copy
    known before it: what it says of that copy (compiles or not, where its defs and classes
    start) is what compiling it whole says, and edits of it are judged as `broken_by` does."""
    real = pycompile._compile_known  # compiling whole, uncounted
    whole_compiles = _whole_compiles(monkeypatch)
    rng = random.Random(seed)  # noqa: S311 - a fixed test sequence
    sources = [p.read_bytes() for p in sorted(Path(pycompile.__file__).parent.parent.rglob("*.py"))]
    derived = 0
    for _ in range(40):
        release = rng.choice(sources)
        pycompile.clear_cache()
        for _ in range(4):  # four releases of one file, each an edit of the one before
            lines = release.decode().split("\n")
            defs = [
                k
                for k, line in enumerate(lines)
                if line.lstrip().startswith(("def ", "class ")) and k and "@" not in lines[k - 1]
            ]
            for _ in range(rng.choice([1, 2, 3])):  # lines put in before defs (valid edits)
                at = rng.choice(defs) if defs else len(lines)
                indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())] if defs else ""
                snippet = rng.choice(SNIPPETS) if rng.random() < 0.1 else "_y = 1"
                lines[at:at] = [indent + snippet]
                defs = [k + (k >= at) for k in defs]
            if rng.random() < 0.5:
                lines.append(f"def _new_{rng.randrange(99)}():\n    return 1\n")
            release = "\n".join(lines).encode()
            edit = release.replace(b"\n", b"\n_patchset_x = 1\n", 1)
            assert pycompile.edit_error(release, edit, "m.py") == broken_by(release, edit)
            known = pycompile._KNOWN[pycompile._digest(release)]
            whole = real(release)
            assert (known.error is None) == (whole.error is None)
            if known.error is None:
                same = ("starts", "classes", "flags", "declared", "top_declares", "futures")
                assert [getattr(known, f) for f in same] == [getattr(whole, f) for f in same]
                lines = release.decode().split("\n")
                for end in known.ends:  # each a statement boundary at module level
                    assert compiles("\n".join(lines[:end])), end
                    assert compiles("\n".join(lines[end:])), end
            derived += release not in whole_compiles
    assert derived > 40  # most releases were known from the one before


CLASS = '''import os


class Config:
    """A config."""

    name: str = "x"

    def first(self) -> int:
        values = [v for v in range(3)]
        return len(values)

    def second(self) -> None:
        global COUNT
        COUNT = 1


def helper() -> int:
    return 1
'''

# (what the edit does, the old text, the new text): edits inside a module-level class
# whose answer depends on the class around them.
IN_CLASS = (
    ("walrus in a method", "= [v for", "= [(w := v) for"),
    ("walrus in a class body comprehension", 'name: str = "x"', "n = [(w := v) for v in r]"),
    ("first statement indented deeper", "    def first(self) -> int:\n", "    "),
    ("a method's body at column 0", "        return len(values)", "return len(values)"),
    ("nonlocal in a method", "        return len(values)", "        nonlocal values"),
    ("global after use", "        COUNT = 1", "        COUNT = 1\n        global COUNT"),
    ("import * in a method", "        return len(values)", "        from os import *"),
    ("a class-level global", 'name: str = "x"', 'global name\n    name = "x"'),
    ("a new method", "    def second", "    def third(self):\n        pass\n\n    def second"),
    ("a module-level line between", "def helper", "x = (1,\n)\n\n\ndef helper"),
    ("a top-of-file import", "import os", "import os\nimport sys"),
)  # fmt: skip


@pytest.mark.parametrize(("what", "old", "new"), IN_CLASS, ids=[c[0] for c in IN_CLASS])
def test_an_edit_in_a_class_is_judged_as_the_whole_file(what: str, old: str, new: str) -> None:
    """Edits in a class's methods and body, judged by their unit (in a class of its own, or
    dedented), say what compiling the whole file says: the scopes around a unit decide
    `:=` in comprehensions, `nonlocal`, `global` and `import *`."""
    assert old in CLASS, what
    after = CLASS.replace(old, new, 1).encode()
    before = CLASS.encode()
    assert pycompile.compiles(before)
    pycompile.clear_cache()
    assert pycompile.edit_error(before, after) == broken_by(before, after), what
    pycompile.clear_cache()
    assert pycompile.edit_error(before, after, "m.py") == broken_by(before, after), what
    if broken_by(before, after) is None:
        assert pyunits.units(pycompile._known(before), before, after) is not None, what


def test_a_block_left_with_only_comments_does_not_compile() -> None:
    """A unit whose new lines are comments and blank lines only leaves its block with no
    statement: the whole file says so, and so must the edit's judgement."""
    before = b"class P:\n    def f(self) -> str: ...\n\n\nX = 1\n"
    for after in (
        b"class P:\n        # comment\n\n\nX = 1\n",
        b"class P:\n    # comment\n\n\nX = 1\n",
        b"def g():\n    return 1\n".replace(b"    return 1", b"    # gone"),
    ):
        pycompile.clear_cache()
        source = before if after.startswith(b"class") else b"def g():\n    return 1\n"
        assert broken_by(source, after) is not None
        assert pycompile.edit_error(source, after) == broken_by(source, after)


def test_lines_added_after_a_def_that_ends_the_file() -> None:
    """A def on the file's last line (no line break after it) ends where the file does: lines
    added after it are judged, not looked for past the end."""
    before = b"import os\n\n\ndef f():\n    return os.sep"
    for tail in (b"\n\n\ndef g():\n    pass\n", b"\nX = (\n", b"\n  y = 1\n"):
        after = before + tail
        for name in ("", "m.py"):
            pycompile.clear_cache()
            pycompile.edit_error(before, before + b"\n", name)  # `before` known, by units next
            assert pycompile.edit_error(before, after, name) == broken_by(before, after)


# (what the next release changes, the old text, the new text, whether its units tell):
# lines put at the end of a class or of a method, where the units around the first changed
# line are not the ones that change.
AT_ENDS = (
    ("a method put at the end of a class", "        COUNT = 1\n",
     "        COUNT = 1\n\n    def third(self) -> int:\n        return 3\n", True),
    ("lines put at the end of a method, after its blank line", "\n    def second",
     "\n        # a note\n        values.append(1)\n    def second", True),
    ("a function put after a class", "        COUNT = 1\n",
     "        COUNT = 1\n\n\ndef third() -> int:\n    return 3\n", True),
    ("a method after a module-level line (does not compile)", "        COUNT = 1\n",
     "        COUNT = 1\n\nx = 1\n    def third(self):\n        pass\n", False),
    ("a method's tail at column 0 (does not compile)", "\n    def second",
     "\n        values.append(1)\n  y = 2\n    def second", False),
)  # fmt: skip


@pytest.mark.parametrize(("what", "old", "new", "by_units"), AT_ENDS, ids=[c[0] for c in AT_ENDS])
def test_lines_put_at_the_end_of_a_class_or_method(
    what: str, old: str, new: str, by_units: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The next release's copy with lines put at the end of a class (after its last line) or
    of a method (after the blank line before the next one): known from the copy before by
    the units around them (the last method, the method before, not the class whole), as
    compiling it whole says (compiles or not, starts, classes; each end a boundary); where
    the lines make it not compile, the units refuse and it is compiled whole."""
    real = pycompile._compile_known  # compiling whole, uncounted
    whole_compiles = _whole_compiles(monkeypatch)
    units_compiled: list[str] = []
    real_unit = pyunits._compiled

    def recording(text: str, flags: int) -> object:
        units_compiled.append(text)
        return real_unit(text, flags)

    monkeypatch.setattr(pyunits, "_compiled", recording)
    before = CLASS.encode()
    release = CLASS.replace(old, new, 1).encode()
    assert release != before
    pycompile.clear_cache()
    pycompile._known_named(before, "m.py")
    known = pycompile._known_named(release, "m.py")
    whole = real(release)
    assert (release not in whole_compiles) == by_units
    if by_units:  # by the units around the lines put in, not the class whole
        assert units_compiled
        assert not any("class Config" in text for text in units_compiled), units_compiled
    assert (known.error is None) == (whole.error is None) == by_units
    if by_units:
        same = ("starts", "classes", "flags", "declared", "top_declares", "futures")
        assert [getattr(known, f) for f in same] == [getattr(whole, f) for f in same]
        lines = release.decode().split("\n")
        for end in known.ends:
            assert compiles("\n".join(lines[:end])), end
            assert compiles("\n".join(lines[end:])), end
    edit = release.replace(b"import os", b"import os\nimport sys", 1)
    pycompile.clear_cache()
    pycompile._known_named(before, "m.py")
    assert pycompile.edit_error(release, edit, "m.py") == broken_by(release, edit)
