"""What a `python` patch touches: module and attribute names, found in a release's files.

A python patch rebinds or wraps names in vLLM at run time (through vLLM's plugin hook), so it
edits no file; it declares ``touches = ["vllm.envs:is_set", "vllm.x.y:Class.method"]``
instead. Whether those names still exist is read from the release's source with `ast`
(nothing is imported or run), so the host check and an image's own Python agree.
Standard library only: the image entrypoint uses it at container start.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import io
import itertools
import re
import symtable
import tokenize
from collections.abc import Callable, Iterable

from . import kept

# a release file's text by its relative path (None: absent)
Reader = Callable[[str], bytes | str | None]

_MODULE = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")
_ATTR = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def parse_touch(spec: str) -> tuple[str, str]:
    """``"vllm.envs:is_set"`` as ``("vllm.envs", "is_set")``; ValueError when malformed."""
    module, sep, attr = spec.partition(":")
    if not sep or not _MODULE.match(module) or not _ATTR.match(attr):
        raise ValueError(f"{spec!r}: expected module:attribute, e.g. 'vllm.envs:is_set'")
    return module, attr


def module_files(module: str) -> tuple[str, str]:
    """The two files a module can be: ``a/b.py`` and ``a/b/__init__.py``."""
    base = module.replace(".", "/")
    return f"{base}.py", f"{base}/__init__.py"


def touch_files(touch: str) -> tuple[str, ...]:
    """Every file `resolve` may read for `touch` (``module:attr``): the module's two, and for
    each leading part of the attribute path the two of that submodule (``a/b/c.py``,
    ``a/b/c/__init__.py`` for ``a.b:c.X``). ValueError when malformed."""
    module, attr = parse_touch(touch)
    parts = attr.split(".")
    files: list[str] = []
    for n in range(len(parts) + 1):
        files += module_files(".".join([module, *parts[:n]]))
    return tuple(files)


def _module(module: str, read: Reader) -> tuple[str, bytes | str, bool] | None:
    """The file `module` is imported from (a package's ``__init__.py`` first, as Python's path
    finder looks), its source and whether it is a package; None when neither is there."""
    plain, package = module_files(module)
    for rel, is_package in ((package, True), (plain, False)):
        data = read(rel)
        if data is not None:
            return rel, data, is_package
    return None


def resolve(touch: str, read: Reader) -> tuple[str | None, str | None]:
    """Where `touch` (``module:attr``) is found as Python's import system resolves it: the
    module (``a/b.py`` or the package ``a/b/__init__.py``), then each part of the attribute
    path bound in it (a class's body for the next part), or else, in a package, a submodule
    of that name (``...schemes:compressed_tensors_w8a8_fp8``, and ``pkg:sub.Class`` inside
    it). Returns (the file the name was found in, None), or (None, what is missing: the
    module's file, or ``file: name`` for a name it does not bind). ValueError when
    malformed."""
    module, attr = parse_touch(touch)
    found = _module(module, read)
    if found is None:
        return None, module_files(module)[0]
    rel, source, package = found
    parts = attr.split(".")
    for i, part in enumerate(parts):
        rest = ".".join(parts[i:])
        if defines(source, rest):
            return rel, None
        sub = _module(f"{module}.{part}", read) if package else None
        if sub is None:
            return None, f"{rel}: {rest}"
        module, (rel, source, package) = f"{module}.{part}", sub
    return rel, None  # the whole path is submodules: the last one is there


# A step of `_bound_names` over a block, in order: a name, whether it replaces an earlier
# binding (a def or class does; an assignment or import keeps the first), what binds it.
_Step = tuple[str, bool, ast.AST]


def _steps(body: list[ast.stmt]) -> list[_Step]:
    """The bindings of a block at its own level, in order, looking into if/try/with blocks
    (where vLLM puts optional imports): each of those blocks' own names (`_bound_names`) is
    bound where not bound yet."""
    steps: list[_Step] = []
    for node in body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            steps.append((node.name, True, node))
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            for target in targets:
                steps += ((s.id, False, node) for s in ast.walk(target) if isinstance(s, ast.Name))
        elif isinstance(node, ast.Import | ast.ImportFrom):
            steps += (((a.asname or a.name).split(".")[0], False, node) for a in node.names)
        elif isinstance(node, ast.If | ast.Try | ast.With):
            blocks = [node.body, getattr(node, "orelse", []), getattr(node, "finalbody", [])]
            blocks += [h.body for h in getattr(node, "handlers", [])]
            for block in blocks:
                steps += ((name, False, bound) for name, bound in _bound_names(block).items())
    return steps


def _bound_names(body: list[ast.stmt]) -> dict[str, ast.AST]:
    """Names a block binds at its own level, looking into if/try/with blocks (where vLLM puts
    optional imports), with the node that binds each (a class, to look inside)."""
    names: dict[str, ast.AST] = {}
    for name, replaces, node in _steps(body):
        if replaces:
            names[name] = node
        else:
            names.setdefault(name, node)
    return names


@functools.lru_cache(maxsize=4)
def parsed(source: bytes | str) -> ast.Module | None:
    """A module's tree, parsed once for every name asked of it (a check asks many)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None


def defines(source: bytes | str, attr: str) -> bool:
    """Whether the module source binds `attr` (``"Class.method"`` looks inside the class)."""
    scope = _module_scope(source)
    if scope is None:
        return False
    parts = attr.split(".")
    for depth, part in enumerate(parts):
        if part not in scope:
            return False
        inner = scope[part]
        if depth < len(parts) - 1:
            if inner is None:  # not a class
                return False
            scope = inner
    return True


def defines_parsed(source: bytes | str, attr: str) -> bool:
    """`defines` read from the whole module's tree (what `defines` must always answer)."""
    tree = parsed(source)
    if tree is None:
        return False
    body: list[ast.stmt] = tree.body
    parts = attr.split(".")
    for depth, part in enumerate(parts):
        node = _bound_names(body).get(part)
        if node is None:
            return False
        if depth < len(parts) - 1:
            if not isinstance(node, ast.ClassDef):
                return False
            body = node.body
    return True


# What `defines` needs of a block: each name it binds, with the class's own scope when a
# class binds it (None: something else does).
Scope = dict[str, "Scope | None"]
# `_steps` with the binding node replaced by its scope (a class's) or None.
_ScopeStep = tuple[str, bool, "Scope | None"]


def _scope_steps(body: list[ast.stmt]) -> list[_ScopeStep]:
    return [
        (name, replaces, _scope(node.body) if isinstance(node, ast.ClassDef) else None)
        for name, replaces, node in _steps(body)
    ]


def _replayed(steps: Iterable[_ScopeStep]) -> Scope:
    names: Scope = {}
    for name, replaces, inner in steps:
        if replaces:
            names[name] = inner
        else:
            names.setdefault(name, inner)
    return names


def _scope(body: list[ast.stmt]) -> Scope:
    return _replayed(_scope_steps(body))


# A module is read in pieces: runs of whole top-level statements, each cut where a line at
# column 0 begins a statement (not a clause of the one before it, not after a decorator).
# Each piece is parsed alone and its steps kept by its bytes, so the next release's copy of a
# module parses only the pieces that changed. The pieces' statements are the module's: a cut
# inside a string, brackets or a continued line leaves a piece that does not parse (it ends
# inside them), and then the whole module is parsed as before; so is a module with a coding
# cookie or the grammar-changing `__future__` import.
_CUT = re.compile(rb"\n(?!(?:else|elif|except|finally)\b)(?:[A-Za-z_]|@)")  # on "\n" + text
_DECORATOR = ord("@")
_CODING = re.compile(rb"(?:[^\n]*\n)?[ \t\f]*#[^\n]*?coding[:=]")  # in the first two lines
_PIECES: dict[bytes, list[_ScopeStep] | None] = {}  # by a digest of the piece
_PIECES_KEPT = 65536
_SCOPES: dict[bytes | str, Scope | None] = {}
_SCOPES_KEPT = 64


def _pieces(data: bytes) -> list[bytes]:
    cuts = [0]
    after_decorator = False
    quotes = [0, 0]  # triple quotes met so far: an odd count, likely inside a string
    seen = 0
    for match in _CUT.finditer(b"\n" + data):  # each line start (a literal to search for)
        at = match.start()
        quotes[0] += data.count(b'"""', seen, at)
        quotes[1] += data.count(b"'''", seen, at)
        seen = at
        if quotes[0] % 2 or quotes[1] % 2:
            continue
        decorator = data[at] == _DECORATOR
        if at and not after_decorator:
            cuts.append(at)
        after_decorator = decorator
    cuts.append(len(data))
    return [data[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def _piece_steps(piece: bytes) -> list[_ScopeStep] | None:
    key = hashlib.blake2b(piece, digest_size=16).digest()
    if key in _PIECES:
        return _PIECES[key]
    steps: list[_ScopeStep] | None = None
    steps = _class_piece(piece) if len(piece) > _CLASS_SPLIT else None
    if steps is None:
        steps = _def_steps(piece, "")
    if steps is None:
        try:
            steps = _scope_steps(ast.parse(piece).body)
        except (SyntaxError, ValueError):
            steps = None
    _keep_piece(key, steps)
    return steps


# Most pieces (and most runs of a class body) are one def: its steps are its name alone,
# once the piece is known to parse. The parser's tree of its body is not needed for that:
# `symtable` parses it without building the tree's Python objects (a third cheaper).
_DEF = re.compile(r"(?:async[ \t]+)?def[ \t]+([A-Za-z_][A-Za-z0-9_]*)[ \t]*\(")


@functools.lru_cache(maxsize=16)
def _shallow_lines(indent: str) -> re.Pattern[str]:
    """On "\n" + text: each line holding more than blanks and no deeper than `indent`."""
    return re.compile(rf"\n(?!{re.escape(indent)}[ \t]|[ \t]*(?:\n|\Z))([^\n]*)")


def _lone_def(text: str, indent: str) -> str | None:
    """The name of the def that `text` (whole statements of a block at `indent`) is, when
    its lines show it is one def statement (decorated or not) and nothing more: at `indent`
    itself (no line less indented), decorators, then the one line starting ``def name(``
    (or ``async def``), and else only comments and lines starting with a closing bracket
    (a signature's or a decorator's end). Any other statement of the block would start a
    line at `indent` with none of those. None when that is not plain (the caller parses)."""
    name = None
    for match in _shallow_lines(indent).finditer("\n" + text):
        line = match.group(1)
        if not line.startswith(indent):
            return None
        first = line[len(indent)]
        if first in "#)]}":
            continue
        if first == "@" and name is None:
            continue
        found = _DEF.match(line, len(indent))
        if found is None or name is not None:
            return None
        name = found.group(1)
    return name


def _def_steps(source: bytes | str, indent: str, head: str = "") -> list[_ScopeStep] | None:
    """[(name, True, None)] when `source` (whole statements at `indent`, parsed after
    `head`) is one def statement (`_lone_def`) and parses; None when not known so."""
    try:
        text = source if isinstance(source, str) else source.decode("utf-8")
    except UnicodeDecodeError:
        return None
    name = _lone_def(text, indent)
    if name is None:
        return None
    try:
        symtable.symtable(head + text, "<piece>", "exec")  # as text: read as in its module
    except (SyntaxError, ValueError, RecursionError):
        return None  # parsed whole by the caller, which gives its answer
    return [(name, True, None)]


def _keep_piece(key: bytes, steps: list[_ScopeStep] | None) -> None:
    if len(_PIECES) >= _PIECES_KEPT:
        del _PIECES[next(iter(_PIECES))]
    _PIECES[key] = steps


# A class longer than this (bytes) is read as its header and its body in pieces too (a class of
# thousands of lines changes in every release; most of its methods do not).
_CLASS_SPLIT = 4096
_CLASS_START = re.compile(r"(?:@|class\b)")
_HEAD_END = frozenset({tokenize.NEWLINE})
_SKIPPED = frozenset({tokenize.NL, tokenize.COMMENT})
_COLUMN_0 = re.compile(r"\n[^ #\n]")  # these on "\n" + text: each line start
_CODE = re.compile(r"\n *[^ #\n]")


# A class header the tokenizer need not read: decorators and the class line, each whole on
# its line (their brackets closed there, strings on one line and with no backslash, no
# comment but the class line's last). A header it would read otherwise does not parse.
_ARG = r"""(?:[^()\n#'"\\]|"[^"\\\n]*"|'[^'\\\n]*')"""
_ARGS = rf"\((?:{_ARG}|\({_ARG}*\))*\)"
_PLAIN_HEAD = re.compile(
    rf"(?:@[A-Za-z_][\w.]*(?:{_ARGS})?[ ]*\n)*"
    rf"class[ ]+[A-Za-z_]\w*[ ]*(?:{_ARGS})?[ ]*:[ ]*(?:#[^\n]*)?\n"
)
# After it: blank and comment lines (no INDENT from the tokenizer), then the first line of
# code's indentation.
_BODY_LEAD = re.compile(r"(?:[ ]*(?:#[^\n]*)?\n)*( *)(?=[^ \n#])")


def _plain_head(text: str) -> tuple[int, str] | None:
    """Where the body of a class piece with a `_PLAIN_HEAD` starts, and its indentation (None
    when the header is not that plain: the tokenizer reads it)."""
    head = _PLAIN_HEAD.match(text)
    if head is None:
        return None
    lead = _BODY_LEAD.match(text, head.end())
    return None if lead is None or not lead.group(1) else (head.end(), lead.group(1))


def _tokenized_head(text: str) -> tuple[int, str] | None:
    """Where the body of a class piece starts (the line after the header's last) and its
    indentation, as the tokenizer reads the header; None when not sure (and, without
    tokenizing it, for a piece with no line starting ``class``: a decorated def)."""
    if not text.startswith("class") and "\nclass" not in text:
        return None
    tokens = tokenize.generate_tokens(io.StringIO(text).readline)
    head_row = indent = None
    seen_class = False
    try:
        for token in tokens:
            if token.type == tokenize.NAME and token.string == "class" and token.start[1] == 0:
                seen_class = True
            elif seen_class and head_row is None and token.type in _HEAD_END:
                head_row = token.start[0]
            elif head_row is not None and token.type not in _SKIPPED:
                if token.type == tokenize.INDENT:
                    indent = token.string
                break
    except (tokenize.TokenError, SyntaxError):
        return None
    if head_row is None or not indent or indent.strip(" "):
        return None
    start = 0
    for _ in range(head_row):  # the header's lines, through the one ending it
        start = text.index("\n", start) + 1
    return start, indent


def _class_piece(piece: bytes) -> list[_ScopeStep] | None:
    """The steps of a piece that is one decorated or plain class, from its header parsed with
    ``pass`` for a body and its body cut where a line at the body's indentation begins a
    statement, each run parsed alone inside ``if 1:`` (kept by its text). None when the piece
    is not that or is not sure to be read so: the caller parses it whole."""
    try:
        text = piece.decode("utf-8")
    except UnicodeDecodeError:
        return None
    if not _CLASS_START.match(text) or "\r" in text or "\t" in text or "\f" in text:
        return None
    header = _plain_head(text) or _tokenized_head(text)
    if header is None:
        return None
    start, indent = header
    head, body = text[:start], text[start:]
    if _COLUMN_0.search("\n" + body):
        return None  # a line at column 0 (in a string?): not sure where the class ends
    try:
        tree = ast.parse(head + indent + "pass\n")
    except (SyntaxError, ValueError):
        return None
    cls = tree.body[0] if len(tree.body) == 1 else None
    if not isinstance(cls, ast.ClassDef):
        return None
    first = _CODE.search("\n" + body)  # a piece of comments alone does not parse: none before it
    cuts = [0]
    after_decorator = False
    quotes = [0, 0]  # as in `_pieces`
    seen = 0
    cut = re.compile(rf"\n{indent}(?!(?:else|elif|except|finally)\b)(?:[A-Za-z_]|@)")
    for match in cut.finditer("\n" + body):
        at = match.start()
        quotes[0] += body.count('"""', seen, at)
        quotes[1] += body.count("'''", seen, at)
        seen = at
        if quotes[0] % 2 or quotes[1] % 2:
            continue
        if first is not None and at > first.start() and not after_decorator:
            cuts.append(at)
        after_decorator = body[at + len(indent)] == "@"
    cuts.append(len(body))
    steps: list[_ScopeStep] = []
    for a, b in itertools.pairwise(cuts):
        if b <= a:
            continue
        found = _body_steps(body[a:b], indent)
        if found is None:
            return None
        steps += found
    return [(cls.name, True, _replayed(steps))]


def _body_steps(chunk: str, indent: str) -> list[_ScopeStep] | None:
    key = hashlib.blake2b(b"class body\0" + chunk.encode("utf-8"), digest_size=16).digest()
    if key in _PIECES:
        return _PIECES[key]
    steps = _def_steps(chunk, indent, "if 1:\n")
    if steps is not None:
        _keep_piece(key, steps)
        return steps
    try:
        tree = ast.parse("if 1:\n" + chunk)
    except (SyntaxError, ValueError):
        steps = None
    else:
        block = tree.body[0] if len(tree.body) == 1 else None
        steps = _scope_steps(block.body) if isinstance(block, ast.If) else None
    _keep_piece(key, steps)
    return steps


def _module_scope(source: bytes | str) -> Scope | None:
    """The names the module binds (`_bound_names` of its tree, with each class's scope), or
    None when it does not parse. Kept by content: a check asks many names of one module."""
    if source in _SCOPES:
        return _SCOPES[source]
    store = kept.store()
    if store is not None and isinstance(source, bytes):  # an earlier run's finding, kept
        key = kept.digest(source)
        found = store.fact("scope", key)
        if found is None or (scope := _scope_from_plain(found)) is None:
            scope = _module_scope_made(source)
            store.keep_fact("scope", key, scope)
    else:
        scope = _module_scope_made(source)
    if len(_SCOPES) >= _SCOPES_KEPT:
        del _SCOPES[next(iter(_SCOPES))]
    _SCOPES[source] = scope
    return scope


def clear_caches() -> None:
    """Forget the modules read and their pieces (a benchmark's or a test's "nothing known")."""
    _SCOPES.clear()
    _PIECES.clear()
    parsed.cache_clear()


def _scope_from_plain(value: object, depth: int = 0) -> Scope | None:
    """The `Scope` kept as `value` (JSON's object of names, each null or such an object);
    None for anything else. A fact kept as null (a module that does not parse) is read as
    not kept: worked out again."""
    if not isinstance(value, dict) or depth > 64:
        return None
    scope: Scope = {}
    for name, inner in value.items():
        if not isinstance(name, str):
            return None
        if inner is None:
            scope[name] = None
        elif (nested := _scope_from_plain(inner, depth + 1)) is not None:
            scope[name] = nested
        else:
            return None
    return scope


def _module_scope_made(source: bytes | str) -> Scope | None:
    """`_module_scope` worked out: from its pieces (each kept by its text), else its tree."""
    scope: Scope | None = None
    if isinstance(source, bytes) and not (b"barry_as_FLUFL" in source or _CODING.match(source)):
        steps: list[_ScopeStep] = []
        for piece in _pieces(source):
            found = _piece_steps(piece)
            if found is None:
                break
            steps += found
        else:
            scope = _replayed(steps)
    if scope is None:
        tree = parsed(source)
        scope = None if tree is None else _scope(tree.body)
    return scope
