"""Big files (issue 37, E22): `apply` of a big new module and `validate` of a big python
patch cost work linear in their size. Counted rather than timed (benchmarks/reliability_report.py
--big times them): a new file is compiled in pieces of whole top-level statements, whose
answer is always compiling it whole's; a python patch's plugin.py is parsed once by validate
(it was parsed three times and compiled once more)."""

from __future__ import annotations

import ast
import builtins
import random
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from patchset.cli.main import main
from patchset.engine.apply import apply
from patchset.kernel import pycompile
from patchset.registry import load_registry
from tests.helpers.synthetic import BIG_PLUGIN_TOML, BODY, add_patch, make_tree

# Module-level pieces, some of which only compile next to others (a cut inside them must never
# be taken for a file that compiles), some never compile, some change how the rest compiles.
FRAGMENTS = [
    "x = 1\n",
    "def f(a):\n    return a + 1\n",
    "class C:\n    y = 2\n\n    def m(self):\n        return self.y\n",
    's = """\nx = 1\ndef g():\n    pass\n"""\n',  # column-0 lines inside a string
    "t = [\n1,\n2,\n]\n",  # ... inside brackets
    "u = 1 + \\\n2\n",  # ... after a continuation
    "@staticmethod\ndef h():\n    pass\n",
    "if x:\n    pass\nelse:\n    pass\n",
    "try:\n    pass\nexcept Exception:\n    pass\nfinally:\n    pass\n",
    "for i in range(2):\n    pass\nelse:\n    pass\n",
    "match x:\n    case 1:\n        pass\n",
    "async def a():\n    await b()\n",
    "def k():\n    s = '''\nreturn 1\n'''\n    return s\n",
    "# a comment\n\n",
    "lambda: (yield)\n",  # fine in 3.11 (a generator lambda)
]
BROKEN = [
    "return 1\n",  # the compiler's, not the parser's
    "break\n",
    "nonlocal q\n",
    "await z()\n",
    "def d(a, a):\n    pass\n",
    "x = (\n",
    "  y = 1\n",
    "else:\n    pass\n",
    "\x00\n",
    "\ufeffz = 1\n",  # a byte order mark in the middle: not allowed
    "from __future__ import annotations\n",  # only first
    "def e():\n    x = 1\n    global x\n",
]
FILLER = "a = 1\ndef f(a):\n    return a + 1\n" * 8  # pieces that compile alone
MODULE_DEPENDENT = [
    # a module-level global after an assignment: an error only whole
    "q = 1\n" + FILLER + "global q\n",
    "global w\n" + FILLER + "w = 1\n",
    # the first piece's __future__ flags reach the last: under this one a named expression
    # in an annotation does not compile
    "from __future__ import annotations\n" + FILLER + "x: (y := 1)\n",
    FILLER + "x: (y := 1)\n",
]


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Pieces of 64 bytes, so that small sources are cut at every chance."""
    monkeypatch.setattr(pycompile, "_PIECE", 64)


def _whole(source: bytes) -> tuple[int, str] | None:
    error = pycompile.compile_error(source)
    return None if error is None else (error.line, error.message)


def _pieced(source: bytes) -> tuple[int, str] | None:
    pycompile._PIECED.clear()
    pycompile.clear_cache()
    error = pycompile.new_file_error(source)
    return None if error is None else (error.line, error.message)


@pytest.mark.usefixtures("small_pieces")
def test_a_new_file_in_pieces_compiles_as_it_would_whole() -> None:
    rng = random.Random(37)  # noqa: S311 - a fixed mix of fragments, no secret
    pool = FRAGMENTS * 4 + BROKEN + MODULE_DEPENDENT
    sources = [
        "from __future__ import annotations\n" + "".join(rng.choices(FRAGMENTS, k=30)),
        "# -*- coding: latin-1 -*-\n" + "".join(FRAGMENTS) + "n = '\xe9'\n",
    ]
    sources += ["".join(rng.choices(pool, k=rng.randint(5, 40))) for _ in range(400)]
    sources += ["".join(FRAGMENTS) * 3 + bad + "".join(FRAGMENTS) for bad in BROKEN]
    sources += MODULE_DEPENDENT
    compiled = 0
    for text in sources:
        source = text.encode("latin-1" if "latin-1" in text else "utf-8")
        assert _pieced(source) == _whole(source), text
        compiled += _whole(source) is None
    assert 10 < compiled < len(sources) - 10  # both answers well represented


def _spy(monkeypatch: pytest.MonkeyPatch, sizes: list[tuple[str, int]]) -> None:
    real: Callable[..., Any] = builtins.compile

    def compile_(source: Any, *args: Any, **kwargs: Any) -> Any:
        kind = "tree" if isinstance(source, ast.AST) else "text"
        sizes.append((kind, len(source) if kind == "text" else 0))
        return real(source, *args, **kwargs)

    monkeypatch.setattr(builtins, "compile", compile_)


LINE = "x = 'a short line of a generated module'\n"


def test_a_big_new_file_is_compiled_in_pieces(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E22: `apply` of a diff creating a 3 MB module compiles no piece of it over about 1 MB
    (compiling 60 MB whole took gigabytes of memory); a broken one is still refused."""
    count = 3_000_000 // len(LINE)
    for name, tail in (("good", ""), ("bad", "return 1\n")):
        lines = [LINE] * count + ([tail] if tail else [])
        diff = f"--- /dev/null\n+++ b/vllm/big.py\n@@ -0,0 +1,{len(lines)} @@\n"
        diff += "".join("+" + line for line in lines)
        registry = tmp_path / f"reg-{name}"
        add_patch(registry, f"big-{name}", diff=diff, targets=["vllm/big.py"])
        tree = make_tree(tmp_path / f"tree-{name}", {"vllm/mod.py": BODY})
        sizes: list[tuple[str, int]] = []
        with monkeypatch.context() as patched:
            _spy(patched, sizes)
            result = apply(load_registry(registry), tree)
        big = [size for _, size in sizes if size > 100_000]
        if tail:
            assert not result.written
            assert not (tree / "vllm" / "big.py").exists()
        else:
            assert result.written
            assert (tree / "vllm" / "big.py").stat().st_size == count * len(LINE)
            assert len(big) >= 3 and max(big) < 1_100_000, big


def test_validate_parses_a_plugin_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """E22: `validate` of a python patch parses its plugin.py once (the compile check, the
    `apply()` it must define and the modules it imports all read that parse): it was parsed
    three times and compiled a fourth."""
    folder = tmp_path / "reg" / "big-plugin"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(BIG_PLUGIN_TOML)
    body = "    x = 'a line of a big plugin'\n" * 20_000
    (folder / "plugin.py").write_text("import json\n\ndef apply():\n    import vllm.envs\n" + body)
    sizes: list[tuple[str, int]] = []
    with monkeypatch.context() as patched:
        _spy(patched, sizes)
        code = main(["--registry", str(tmp_path / "reg"), "validate"])
    assert code == 0, capsys.readouterr()
    big = [(kind, size) for kind, size in sizes if kind == "tree" or size > 100_000]
    assert big == [("text", len((folder / "plugin.py").read_text())), ("tree", 0)], big
