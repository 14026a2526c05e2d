"""`touches.defines` reads a module in pieces (runs of top-level statements, each parsed alone
and kept by its bytes, issue 38): its answers are those of the whole module's tree
(`defines_parsed`), for every name a module binds or does not, on tricky sources and on every
module of a real vLLM release."""

from __future__ import annotations

import ast
import symtable
from typing import Any

import pytest

from patchset.kernel import touches
from patchset.kernel.touches import defines, defines_parsed


def asked(source: bytes) -> set[str]:
    """Every name `source` mentions, each class's members, and names it does not bind."""
    names = {"absent", "Absent.x", "x.y", "x.y.z"}
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return names | {"x", "f", "C", "C.m", "os"}
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.add(node.name)
            if isinstance(node, ast.ClassDef):
                for sub in ast.walk(node):
                    if isinstance(sub, ast.FunctionDef | ast.ClassDef | ast.Name):
                        name = sub.id if isinstance(sub, ast.Name) else sub.name
                        names |= {f"{node.name}.{name}", f"{node.name}.{name}.m"}
        elif isinstance(node, ast.Name):
            names.add(node.id)
        elif isinstance(node, ast.alias):
            names.add((node.asname or node.name).split(".")[0])
    return names


def same_answers(source: bytes) -> None:
    touches._SCOPES.clear()
    for attr in sorted(asked(source)):
        assert defines(source, attr) == defines_parsed(source, attr), (source, attr)


TRICKY = [
    b"x = 1\nclass x:\n    def m(self): ...\n",  # a class rebinding a name: the class wins
    b"class C:\n    def m(self): ...\nC = 1\n",  # an assignment keeps the class
    b"@dec\ndef f(): ...\n@a\n@b(\n1,\n)\nclass C:\n    m = 1\n",  # decorators, a split one
    b'"""doc\nx = 1\nclass Y: pass\n"""\nz = 2\n',  # column-0 lines inside a string
    b"s = '''\ndef f():\n'''\nt = \"\"\"\nclass C: pass\n\"\"\"\nu = 1\n",
    b"f(\nx=1)\ny = [\nz\n]\n",  # column-0 lines inside brackets
    b"a = 1 + \\\nb\nc = 2\n",  # a continued line
    b"if A:\n    import os\nelse:\n    x = 1\ntry:\n    import y.z as w\nexcept E:\n"
    b"    pass\nfinally:\n    f = 1\nwith m:\n    class C:\n        m = 1\n",
    b"try:\n    pass\nexcept* E:\n    g = 1\n",  # TryStar is not looked into
    b"async def f(): ...\nx: int\ny += 1\na[i] = b.c = 1\n(p, [q, *r]) = s\n",
    b"class C:\n    class D:\n        def m(self): ...\n    if X:\n        e = 1\nC.x = 1\n",
    b"for i in x:\n    j = 1\nwhile 0:\n    k = 1\nmatch v:\n    case 1:\n        n = 1\n",
    b"\xef\xbb\xbfx = 1\r\ndef f():\r\n    pass\r\n",  # a BOM, CRLF
    b"x = 1\rdef f():\r    pass\r",  # lone CR line ends
    b"# -*- coding: latin-1 -*-\nx = '\xe9'\ndef f(): ...\n",  # a coding cookie
    b"from __future__ import barry_as_FLUFL\nx = 1 <> 2\n",
    b"x = 1\ndef f(:\n    pass\n",  # does not parse: nothing is bound
    b"  x = 1\ny = 2\n",  # an unexpected indent
    b"x = 1\n\x00\ny = 2\n",  # a NUL byte
    b"x = 1\ny = '\xff'\n",  # not UTF-8
    b"def f():\n    return '''\n'''\ndef g(): ...\n",
    b"x = 1\nfrom __future__ import annotations\n",  # parses (the compiler refuses it)
    b"",
    # one def, read without its tree (`_lone_def`), or not
    b"@dec(\n    1,\n)\ndef f(\n    a,\n) -> int:\n    return a\n",  # closing brackets
    b"@dec(\n    1,\n)\ndef f(): ...\n(g) = 1\n[h, i] = 1, 2\n",  # more statements after it
    b"def f():\n    s = '''\ndef g(): pass\n'''\n    return s\n",  # a def line in a string
    b"async  def  f(): ...\ndef g(): pass; x = 1\n",  # the `x` is the def's own
    b"def \\\nf(): ...\ndef f\xc3\xa9(): ...\n",  # continued, not ASCII
    b"def f():\n    nonlocal x\n",  # parses (symtable refuses it)
    b"def f(:\n    pass\n# a comment\n",
]


@pytest.mark.parametrize("source", TRICKY)
def test_pieces_answer_as_the_whole_tree(source: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    same_answers(source)
    monkeypatch.setattr(touches, "_CLASS_SPLIT", 0)  # and every class in pieces
    touches._PIECES.clear()
    same_answers(source)


CLASSES = [
    b"class C(\n    Base,\n    Other,\n):\n    x = 1\n\n    def m(self): ...\n\n    @property\n"
    b"    def p(self): ...\n    if T:\n        y = 2\n    else:\n        z = 3\n",
    b"@dataclass\n@other(\n    a=1,\n)\nclass D:\n    # a comment\n    a: int = 1\n"
    b"    class Inner:\n        def n(self): ...\n    def m(self):\n        s = '''\n"
    b"    def fake(self): ...\n    '''\n        return s\n",
    b'class E:\n    """doc\n    def fake(self): ...\n    """\n    def m(self): ...\n'
    b"    m = 2\n    def m(self): ...\n",  # rebinding inside the class
    b"class F:\n    def m(self):\n        return (\n    1)\n    def n(self): ...\n",
    b"class G:\n    def m(self):\n        s = '''\nx = 1\n'''\n    def n(self): ...\n",
    b"class H: pass\n",  # one line
    b"class I:\n    def m(self): ...\n  def bad(self): ...\n",  # does not parse
    b"class J:\n    def m(self: ...\n    def n(self): ...\n",  # does not parse
    b"class K:\n\tdef m(self): ...\n",  # tabs: read whole
    b"class L:\n    try:\n        import a\n    except E:\n        pass\n    n = 1\n",
    b"class M:\n    x = 1 + \\\n    2\n    y = 2\n",  # a continued line
    b"class N:\n    x = 1\nclass O:\n    def m(self): ...\n",
    b"class P:\n    def m(self): ...\n    [a, b] = 1, 2\n    def n(\n        self,\n    ): ...\n",
    b"class Q:\n    @property\n    def p(self): ...\n    @p.setter\n    def p(self, v): ...\n",
    b"class R:\n    async def m(self):\n        await x\n    # a comment\n    def n(self): ...\n",
    b"class S(B[):\n    x = 1\n",  # a plain header's line that does not end the header
]


@pytest.mark.parametrize("source", CLASSES)
def test_a_long_class_read_in_pieces(source: bytes, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(touches, "_CLASS_SPLIT", 0)  # every class read in pieces
    touches._PIECES.clear()
    same_answers(source)
    same_answers(source.replace(b"def m(self)", b"def mm(self)"))


def test_a_str_source_is_read_whole() -> None:
    assert defines("x = 1\nclass C:\n    m = 1\n", "C.m")
    assert not defines("x = 1\nclass C:\n    m = 1\n", "C.n")


def test_a_piece_seen_before_is_not_parsed_again(monkeypatch: pytest.MonkeyPatch) -> None:
    touches._SCOPES.clear()
    touches._PIECES.clear()
    old = b"import os\n\ndef f(): ...\n\nclass C:\n    def m(self): ...\n"
    assert defines(old, "C.m")
    parsed: list[bytes | str] = []
    real, real_table = ast.parse, symtable.symtable

    def counting(source: bytes, *args: Any, **kwargs: Any) -> Any:
        parsed.append(source)
        return real(source, *args, **kwargs)

    def counting_table(source: str, *args: Any) -> symtable.SymbolTable:
        parsed.append(source)
        return real_table(source, *args)

    monkeypatch.setattr(ast, "parse", counting)
    monkeypatch.setattr(symtable, "symtable", counting_table)
    new = old.replace(b"def f(): ...", b"def f(x): ...").replace(b"C:\n", b"C:\n    x = 1\n")
    assert defines(new, "f") and defines(new, "C.m")
    # only the pieces that changed: a def parsed without its tree, a class whole
    assert parsed == ["def f(x): ...\n\n", b"class C:\n    x = 1\n    def m(self): ...\n"]


@pytest.mark.network
@pytest.mark.slow
def test_every_module_of_a_real_release() -> None:
    from patchset.sources.package_index import IndexSource

    with IndexSource().open("0.20.0") as tree:
        modules = [p for p in tree.paths() if p.startswith("vllm/") and p.endswith(".py")]
        assert len(modules) > 500
        for rel in modules:
            data = tree.read(rel)
            assert data is not None
            same_answers(data)


@pytest.mark.parametrize("index", [0, 1, 2, 3, 9, 10])
def test_a_class_body_is_cut_where_sure(index: int) -> None:
    (piece,) = touches._pieces(CLASSES[index])
    assert touches._class_piece(piece) is not None  # read in pieces, not whole


@pytest.mark.parametrize(
    ("text", "indent", "name"),
    [
        ("def f(a): ...\n", "", "f"),
        ("@dec(\n    1,\n)\nasync def g(\n    a,\n) -> int:\n    return a\n\n# end\n", "", "g"),
        ("    @property\n    def p(self):\n        return 1\n", "    ", "p"),
        ("def f(): ...\n(g) = 1\n", "", None),  # another statement
        ("def f():\n    s = '''\ndef g(): pass\n'''\n", "", None),  # a def line in a string
        ("x = 1\n", "", None),
        ("def \\\nf(): ...\n", "", None),
        ("    def m(self): ...\n  y = 1\n", "    ", None),  # a line less indented
        ("@dec\n", "", None),
    ],
)
def test_a_lone_def_is_told_from_its_lines(text: str, indent: str, name: str | None) -> None:
    assert touches._lone_def(text, indent) == name


HEADS = [  # (a class piece, whether its header is plain: read without the tokenizer)
    ("class A:\n    # c\n\n  # d\n        x = 1\n", True),
    ("class A:  # c\n    x = 1\n", True),
    ("@d\n@e.f(1, 2)\nclass A(B, metaclass=M):\n    pass\n", True),
    ("class A:\n    '''doc'''\n", True),
    ("class A:\n    # only a comment", False),  # no body: the tokenizer gives no INDENT
    ("class A:\n\n    ", False),
    ("class A:\nx = 1\n", False),
    ("@d(\n)\nclass A:\n    x = 1\n", False),  # a decorator on two lines
    ("class A(f(x)):\n    x = 1\n", True),  # brackets one deep
    ("class A(B[f(g(x))]):\n    x = 1\n", False),  # two deep
    ("class A: x = 1\n", False),
    ("class A(\n    B):\n    x = 1\n", False),
    ("class A(B['x:y']):\n    x = 1\n", True),  # a string
    ("@c(c=D(a=True))\n@d('#(', \"'\")\nclass A:\n    x = 1\n", True),
    ("class A(B['x\\'y']):\n    x = 1\n", False),  # a backslash in a string
    ("class \u00c4(B):\n    x = 1\n", False),
]


@pytest.mark.parametrize(("text", "plain"), HEADS)
def test_a_plain_class_header_is_read_as_the_tokenizer_reads_it(text: str, plain: bool) -> None:
    found = touches._plain_head(text)
    assert (found is not None) == plain
    assert found is None or found == touches._tokenized_head(text)


def test_a_decorated_def_is_not_tokenized_for_a_class_header() -> None:
    text = "@jit\ndef f(\n    x,\n):\n    return '''\n  class A:\n'''\n"
    assert touches._tokenized_head(text) is None
    assert touches._tokenized_head("@d\nclass A(\n    B,\n):\n    x = 1\n") == (22, "    ")
