"""Benchmark: runtime sites of real shapes, made from a real vLLM release's own files.

Each site is applied as a new user would (patchset's kernel, the code the engine and the
images run), compared with a plain string replacement of the same lines, compiled, and
reverted. The shapes are the ones that broke before the one indentation rule:

- `end-of-function`: an anchor copied from the end of a module-level function, a text that
  adds a module-level block after it (less indented than the anchor's first line);
- `call-args-to-def`: an anchor starting on a call's last argument line and ending at the
  next `def`/`class`, a text adding a statement before that `def`;
- `blank-lines`: an anchor holding the blank lines between two methods, a text adding a
  method between them;
- `column-zero`: a hand-written site (anchor and text at column 0) on an indented line;
- `folded`: a hand-written anchor whose spaces differ from the file's (a folded match);
- `into-block`: a hand-written `insert-after` on a one-line `def ...:`, text at column 0;
- the same shapes on a copy of each file indented with tabs (`tabs:` prefix).

Last line: sites=<n> identical=<n> compile_broken=<n> revert_exact=<n>/<n>

    python benchmarks/site_corpus.py [--vllm 0.20.0] [--limit 30] [-v]

The corpus lives here (tests/) so the network-marked test and the benchmark share it.
"""

from __future__ import annotations

import argparse
import ast
import itertools
import re
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass

from patchset.kernel.pycompile import compiles
from patchset.kernel.sites import Site, apply_site, find_block, revert_site
from patchset.sources.package_index import IndexSource

PREFIXES = ("vllm/v1/", "vllm/model_executor/layers/", "vllm/entrypoints/", "vllm/config/")
MARKER = "patchset: corpus"


@dataclass(frozen=True)
class Case:
    shape: str
    file: str
    site: Site
    before: list[str]
    expected: list[str]  # what a plain replacement of the same lines gives


@dataclass(frozen=True)
class Outcome:
    case: Case
    identical: bool
    broken: bool
    revert_exact: bool
    note: str = ""


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _unique(lines: list[str], block: list[str]) -> bool:
    return len(find_block(lines, block)) == 1


def _site(shape: str, file: str, k: int, anchor: list[str], text: list[str], **kw: str) -> Site:
    action = kw.get("action", "replace")
    return Site(
        name=f"{shape}-{k}",
        file=file,
        anchor="\n".join(anchor) + "\n",
        action=action,  # type: ignore[arg-type]
        text="\n".join(text) + "\n",
        marker=f"{MARKER} {shape} {k}",
    )


def _end_of_function(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    body = tree.body
    for node, following in itertools.pairwise(body):
        if not isinstance(node, ast.FunctionDef) or node.end_lineno is None:
            continue
        end = node.end_lineno  # 1-based, the function's last line
        anchor = lines[end - 2 : end]
        if len(anchor) < 2 or not all(line.strip() for line in anchor):
            continue
        if not anchor[0].startswith((" ", "\t")) or following.lineno <= end:
            continue
        if not _unique(lines, anchor):
            continue
        added = ["", "", f"_PATCHSET_CORPUS_{k} = {node.name!r}  # a module-level block"]
        text = [*anchor, *added]
        yield Case(
            "end-of-function",
            file,
            _site("end-of-function", file, k, anchor, text),
            lines,
            [*lines[: end - 2], *text, *lines[end:]],
        )
        k += 1


def _call_args_to_def(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    seen: set[int] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call) or node.end_lineno is None:
            continue
        last = node.end_lineno  # 1-based line of the call's ")"
        if last - node.lineno < 2 or last in seen:
            continue
        nxt = last
        while nxt < len(lines) and not lines[nxt].strip():
            nxt += 1
        if nxt >= len(lines) or nxt == last:
            continue
        head = lines[nxt].lstrip()
        if not head.startswith(("def ", "async def ", "class ")):
            continue
        start = last - 2  # 0-based: the argument line before the ")" line
        anchor = lines[start : nxt + 1]
        if len(_indent(anchor[0])) <= len(_indent(lines[nxt])):
            continue
        if not _unique(lines, anchor):
            continue
        seen.add(last)
        added = f"{_indent(lines[nxt])}_patchset_corpus_{k} = True"
        text = [*anchor[:-1], added, anchor[-1]]
        yield Case(
            "call-args-to-def",
            file,
            _site("call-args-to-def", file, k, anchor, text),
            lines,
            [*lines[:start], *text, *lines[nxt + 1 :]],
        )
        k += 1


def _blank_lines(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        methods = [n for n in cls.body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)]
        for first, second in itertools.pairwise(methods):
            if first.end_lineno is None:
                continue
            start = first.end_lineno - 1  # 0-based: the first method's last line
            top = min([second.lineno, *(d.lineno for d in second.decorator_list)]) - 1
            anchor = lines[start : top + 1]
            if len(anchor) < 3 or any(line.strip() for line in anchor[1:-1]):
                continue
            if not _unique(lines, anchor):
                continue
            indent = _indent(lines[top])
            inner = indent + ("\t" if indent.startswith("\t") else "    ")
            added = [f"{indent}def _patchset_corpus_{k}(self):", f"{inner}return {k}", ""]
            text = [*anchor[:-1], *added, anchor[-1]]
            yield Case(
                "blank-lines",
                file,
                _site("blank-lines", file, k, anchor, text),
                lines,
                [*lines[:start], *text, *lines[top + 1 :]],
            )
            k += 1


_SIMPLE = re.compile(r"^[A-Za-z_][\w.]* = [\w.]+\(.*\)$")


def _column_zero(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    del tree
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not line.startswith((" ", "\t")) or not _SIMPLE.match(stripped):
            continue
        if not _unique(lines, [stripped]):
            continue
        indent = _indent(line)
        text = [f"_patchset_corpus_{k} = {k}", stripped]
        yield Case(
            "column-zero",
            file,
            _site("column-zero", file, k, [stripped], text),
            lines,
            [*lines[:i], *(indent + t for t in text), *lines[i + 1 :]],
        )
        k += 1


def _folded(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    """A hand-written anchor whose spaces differ from the file's (matched with whitespace
    folded): the revert must give back the file's own line, kept in the marker."""
    del tree
    for i, line in enumerate(lines):
        stripped = line.strip()
        if not line.startswith((" ", "\t")) or not _SIMPLE.match(stripped):
            continue
        if not _unique(lines, [stripped]):
            continue
        anchor = stripped.replace(" = ", "  =  ", 1)
        text = [f"_patchset_corpus_{k} = {k}", stripped]
        yield Case(
            "folded",
            file,
            _site("folded", file, k, [anchor], text),
            lines,
            [*lines[:i], *(_indent(line) + t for t in text), *lines[i + 1 :]],
        )
        k += 1


def _into_block(file: str, lines: list[str], tree: ast.Module, k: int) -> Iterator[Case]:
    for node in ast.walk(tree):
        if not isinstance(node, ast.FunctionDef) or not node.body:
            continue
        i = node.lineno - 1
        line = lines[i]
        if not line.rstrip().endswith(":") or node.body[0].lineno != i + 2:
            continue  # a one-line signature, its body starting on the next line
        if not _unique(lines, [line.strip()]):
            continue
        inner = _indent(lines[i + 1])
        added = f"_patchset_corpus_{k} = {k}"
        yield Case(
            "into-block",
            file,
            _site("into-block", file, k, [line.strip()], [added], action="insert-after"),
            lines,
            [*lines[: i + 1], inner + added, *lines[i + 1 :]],
        )
        k += 1


SHAPES = (_end_of_function, _call_args_to_def, _blank_lines, _column_zero, _folded, _into_block)


def _tabbed(lines: list[str]) -> list[str]:
    """The file indented with tabs: each leading run of four spaces becomes a tab."""
    out = []
    for line in lines:
        indent = _indent(line)
        if indent and set(indent) == {" "}:
            tabs, rest = divmod(len(indent), 4)
            out.append("\t" * tabs + " " * rest + line[len(indent) :])
        else:
            out.append(line)
    return out


def corpus(version: str, limit: int) -> list[Case]:
    """Up to `limit` sites of each shape (and each again with tabs), from the release."""
    cases: list[Case] = []
    counts: Counter[str] = Counter()
    with IndexSource().open(version) as tree:
        names = sorted(p for p in tree.paths() if p.endswith(".py") and p.startswith(PREFIXES))
        for name in names:
            data = tree.read(name)
            if data is None:
                continue
            text = data.decode("utf-8", errors="surrogateescape")
            if "\r" in text or "\t" in text or not compiles(text):
                continue
            plain = text.split("\n")
            if plain and plain[-1] == "":
                plain.pop()
            for tabs in (False, True):
                lines = _tabbed(plain) if tabs else plain
                source = "\n".join(lines) + "\n"
                if tabs and not compiles(source):
                    continue
                parsed = ast.parse(source)
                for shape in SHAPES:
                    for n, case in enumerate(shape(name, lines, parsed, len(cases))):
                        label = ("tabs:" if tabs else "") + case.shape
                        if n >= 2 or counts[label] >= limit:
                            break
                        counts[label] += 1
                        cases.append(Case(label, case.file, case.site, case.before, case.expected))
    return cases


def run(case: Case) -> Outcome:
    result, after = apply_site(case.site, case.before)
    if result.status != "applies":
        return Outcome(case, False, False, False, result.describe())
    shown = [line for line in after if not line.strip().startswith(f"# {MARKER} ")]
    broken = compiles("\n".join(case.before) + "\n") and not compiles("\n".join(after) + "\n")
    back, reverted = revert_site(case.site, after)
    exact = back.status == "already-applied" and back.exact and reverted == case.before
    return Outcome(case, shown == case.expected, broken, exact)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="0.20.0", help="the release whose files are used")
    parser.add_argument("--limit", type=int, default=30, help="sites per shape (and per tabs)")
    parser.add_argument("-v", "--verbose", action="store_true", help="show every failing site")
    args = parser.parse_args()
    outcomes = [run(case) for case in corpus(args.vllm, args.limit)]
    by_shape: Counter[str] = Counter(o.case.shape for o in outcomes)
    for shape, n in sorted(by_shape.items()):
        ok = sum(1 for o in outcomes if o.case.shape == shape and o.identical)
        print(f"{shape:24} {ok}/{n} identical")
    for o in outcomes:
        if args.verbose and not (o.identical and o.revert_exact and not o.broken):
            print(f"FAIL {o.case.site.name} {o.case.file}: {o.note or o}")
    n = len(outcomes)
    identical = sum(o.identical for o in outcomes)
    broken = sum(o.broken for o in outcomes)
    exact = sum(o.revert_exact for o in outcomes)
    print(f"sites={n} identical={identical} compile_broken={broken} revert_exact={exact}/{n}")
