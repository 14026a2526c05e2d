"""The corpus of benchmarks/runtime_matrix.py: runtime patches cut from vLLM's own release
files (as the package index serves them, read through patchset's cache), in the shapes real
collections use, and written as a registry. See runtime_matrix.py for what is cut and why."""

from __future__ import annotations

import ast
import difflib
import hashlib
import itertools
import json
import shutil
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

from patchset.sources.package_index import IndexSource

PREFIXES = (
    "vllm/v1/",
    "vllm/model_executor/",
    "vllm/entrypoints/",
    "vllm/config/",
    "vllm/distributed/",
    "vllm/attention/",
    "vllm/lora/",
    "vllm/multimodal/",
)
SIMPLE = (ast.Assign, ast.AugAssign, ast.AnnAssign, ast.Expr, ast.Return, ast.Import)


# ---------------------------------------------------------------------------------------------
# The corpus: sites cut from the releases' own files


@dataclass
class SiteSpec:
    name: str
    file: str
    action: str
    anchor: str
    text: str
    optional: bool = False
    after: str | None = None
    alternatives: list[dict[str, str]] = field(default_factory=list)
    probe: list[str] | None = None  # contains


@dataclass
class PatchSpec:
    id: str
    shape: str
    base: str
    after: str | None  # the release after base (the range's end), None: open
    sites: list[SiteSpec]
    probe: tuple[str, list[str]] | None = None  # patch-level: file, contains


def _rank(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _fold(line: str) -> str:
    return " ".join(line.split())


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


class Releases:
    """The releases' files, read once through patchset's cache (the index's wheels)."""

    def __init__(self, versions: list[str]) -> None:
        self.versions = versions
        self.source = IndexSource()
        self.paths: dict[str, set[str]] = {}
        for v in versions:
            with self.source.open(v) as tree:
                self.paths[v] = {p for p in tree.paths() if p.endswith(".py")}
        self._data: dict[tuple[str, str], str | None] = {}

    def text(self, version: str, rel: str) -> str | None:
        key = (version, rel)
        if key not in self._data:
            data = None
            if rel in self.paths[version]:
                with self.source.open(version) as tree:
                    raw = tree.read(rel)
                data = None if raw is None else raw.decode("utf-8", "surrogateescape")
            self._data[key] = data
        return self._data[key]


@dataclass(frozen=True)
class Stmt:
    line: int  # 0-based
    text: str  # the line as in the file
    func: int | None  # 0-based line of the innermost enclosing def, if any


def _statements(source: str) -> tuple[list[str], list[Stmt], list[int]]:
    """The file's lines, its one-line simple statements (each alone on its line) and the
    0-based lines of its one-line `def ...:` signatures."""
    lines = source.split("\n")
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return lines, [], []
    out: list[Stmt] = []
    defs: list[int] = []

    def walk(node: ast.AST, func: int | None) -> None:
        for child in ast.iter_child_nodes(node):
            inner = func
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                inner = child.lineno - 1
                first = child.body[0].lineno - 1
                if lines[child.lineno - 1].rstrip().endswith(":") and first == child.lineno:
                    defs.append(child.lineno - 1)
            if (
                isinstance(child, SIMPLE)
                and child.end_lineno == child.lineno
                and not isinstance(getattr(child, "value", None), ast.Constant)
            ):
                line = lines[child.lineno - 1]
                alone = (
                    line.isascii()
                    and child.col_offset == len(_indent(line))
                    and (
                        child.end_col_offset is not None
                        and not line[child.end_col_offset :].strip()
                    )
                )
                if (
                    alone
                    and len(line.strip()) > 12
                    and "\t" not in line
                    and "\\" not in line
                    and "#" not in line
                    and '"""' not in line
                    and "'''" not in line
                ):
                    out.append(Stmt(child.lineno - 1, line, func))
            walk(child, inner)

    walk(tree, None)
    return lines, out, defs


def _counts(lines: list[str]) -> Counter[str]:
    return Counter(_fold(line) for line in lines)


def _toml_ok(text: str) -> bool:
    return not any((ord(c) < 32 and c != "\t") or c == "\x7f" for c in text.replace("\n", ""))


class Cutter:
    def __init__(self, releases: Releases, pool: int = 96) -> None:
        self.r = releases
        self.v = releases.versions
        every = set().union(*(releases.paths[v] for v in self.v))
        ranked = sorted(
            (p for p in every if p.startswith(PREFIXES) and not p.endswith("__init__.py")),
            key=lambda p: _rank("file", p),
        )
        held = {p: sum(p in releases.paths[v] for v in self.v) for p in ranked}
        # A collection's patches crowd on a few files: a pool of them, most in every release,
        # some that vanish (or appear) on the way.
        steady = [p for p in ranked if held[p] == len(self.v)][:pool]
        passing = [p for p in ranked if 6 <= held[p] < len(self.v) - 2][: pool // 8]
        self.files = sorted(steady + passing, key=lambda p: _rank("pool", p))
        self._parsed: dict[tuple[str, str], tuple[list[str], list[Stmt], list[int]]] = {}
        self._changes: dict[tuple[str, str], list[tuple[Stmt, str]]] = {}
        self._unique: dict[tuple[str, str], list[Stmt]] = {}

    def parsed(self, version: str, rel: str) -> tuple[list[str], list[Stmt], list[int]] | None:
        key = (version, rel)
        if key not in self._parsed:
            text = self.r.text(version, rel)
            if text is None or "\r" in text or not 2_000 <= len(text) <= 80_000:
                return None
            self._parsed[key] = _statements(text)
        return self._parsed[key]

    def files_in(self, version: str, salt: str) -> list[str]:
        have = self.r.paths[version]
        return sorted((f for f in self.files if f in have), key=lambda p: _rank(salt, p))

    def unique_stmts(self, version: str, rel: str) -> list[Stmt]:
        if (version, rel) not in self._unique:
            self._unique[(version, rel)] = self._unique_stmts(version, rel)
        return self._unique[(version, rel)]

    def _unique_stmts(self, version: str, rel: str) -> list[Stmt]:
        got = self.parsed(version, rel)
        if got is None:
            return []
        lines, stmts, _ = got
        counts = _counts(lines)
        return [s for s in stmts if counts[_fold(s.text)] == 1 and _toml_ok(s.text)]

    def changes(self, version: str, rel: str) -> list[tuple[Stmt, str]]:
        if (version, rel) not in self._changes:
            self._changes[(version, rel)] = self._changes_of(version, rel)
        return self._changes[(version, rel)]

    def _changes_of(self, version: str, rel: str) -> list[tuple[Stmt, str]]:
        """One-line replacements from `version` to the next release: (old stmt, new line),
        both unique in their file, the new one compiling where the old stood."""
        at = self.v.index(version)
        if at + 1 >= len(self.v):
            return []
        nxt = self.v[at + 1]
        if self.r.text(version, rel) == self.r.text(nxt, rel):
            return []
        old, new = self.parsed(version, rel), self.parsed(nxt, rel)
        if old is None or new is None:
            return []
        ol, ostmts, _ = old
        nl, nstmts, _ = new
        by_line = {s.line: s for s in ostmts}
        new_lines = {s.line for s in nstmts}
        oc, nc = _counts(ol), _counts(nl)
        out = []
        matcher = difflib.SequenceMatcher(None, ol, nl, autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag != "replace" or i2 - i1 != 1 or j2 - j1 != 1:
                continue
            s = by_line.get(i1)
            line = nl[j1]
            if s is None or j1 not in new_lines or _indent(line) != _indent(s.text):
                continue
            if oc[_fold(s.text)] != 1 or nc[_fold(line)] != 1 or _fold(line) in oc:
                continue
            if _toml_ok(line) and _toml_ok(s.text):
                out.append((s, line))
        return out

    def repeated_later(self, version: str, rel: str) -> list[Stmt]:
        """Lines unique in `version` that another release's file holds more than once."""
        uniq = self.unique_stmts(version, rel)
        if not uniq:
            return []
        want = {_fold(s.text): s for s in uniq}
        found: list[Stmt] = []
        for other in self.v:
            text = self.r.text(other, rel)
            if other == version or text is None:
                continue
            counts = _counts(text.split("\n"))
            found += [s for k, s in want.items() if counts[k] > 1 and s not in found]
        return found

    def scoped(self, version: str, rel: str) -> list[tuple[str, Stmt]]:
        """(a unique def line, a statement inside it whose line occurs elsewhere too, the
        first of its kind after the def line)."""
        got = self.parsed(version, rel)
        if got is None:
            return []
        lines, stmts, _ = got
        counts = _counts(lines)
        out = []
        for s in stmts:
            if s.func is None or counts[_fold(s.text)] < 2:
                continue
            head = lines[s.func]
            if counts[_fold(head)] != 1 or not head.rstrip().endswith(":"):
                continue
            later = [i for i in range(s.func + 1, len(lines)) if _fold(lines[i]) == _fold(s.text)]
            if later and later[0] == s.line and _toml_ok(head):
                out.append((head, s))
        return out


def _added(n: int, k: int) -> str:
    return f"_patchset_rt_{n}_{k} = {k}"


def _folded_anchor(line: str) -> str:
    """The line as a hand-written anchor whose spaces differ from the file's (runs of
    whitespace widened, or trailing spaces added): it matches only with whitespace folded."""
    stripped = line.strip()
    return stripped.replace(" ", "   ", 1) if " " in stripped else stripped + "   "


def _insert(  # noqa: PLR0917 - the cutter's one helper
    n: int, k: int, rel: str, s: Stmt, style: int, action: str = "insert-before"
) -> SiteSpec:
    """An insertion next to a one-line statement, its anchor written in one of three ways:
    with the file's own indentation (nested), at column 0, or whitespace-folded."""
    if style == 0:
        anchor, text = s.text, _indent(s.text) + _added(n, k)
    elif style == 1:
        anchor, text = s.text.strip(), _added(n, k)
    else:
        anchor, text = _folded_anchor(s.text), _added(n, k)
    return SiteSpec(f"s{k}", rel, action, anchor, text)


def _replace(n: int, k: int, rel: str, s: Stmt, style: int) -> SiteSpec:
    keep = s.text if style == 0 else s.text.strip()
    add = (_indent(s.text) if style == 0 else "") + _added(n, k)
    anchor = keep if style != 2 else _folded_anchor(s.text)
    return SiteSpec(f"s{k}", rel, "replace", anchor, f"{add}\n{keep}")


SHAPES = (
    "upstream-fix",
    "multi-site",
    "multi-file",
    "optional",
    "after-scoped",
    "alternatives",
    "into-block",
    "ambiguous-later",
    "patch-probe",
    "vanishing-file",
)


def cut(cutter: Cutter, want_patches: int, want_sites: int) -> list[PatchSpec]:
    """Patches of every shape, their base releases spread over the matrix, the same on every
    run (files and lines ranked by a hash)."""
    versions = cutter.v
    patches: list[PatchSpec] = []
    used: set[tuple[str, str, str]] = set()  # (file, base) pairs already cut
    sites = 0
    n = 0
    vanishing = [
        f
        for f in cutter.files
        if any(f in cutter.r.paths[a] and f not in cutter.r.paths[b] for a, b in _pairs(versions))
    ]
    spent: set[str] = set()  # shapes with nothing left to cut
    while (len(patches) < want_patches or sites < want_sites) and len(spent) < len(SHAPES):
        shape = SHAPES[n % len(SHAPES)]
        if shape in spent:
            n += 1
            continue
        spec = None
        for attempt in range(len(versions) - 1):
            base = versions[(n * 7 + attempt) % (len(versions) - 1)]
            nxt = versions[versions.index(base) + 1]
            spec = _one_patch(cutter, shape, n, base, nxt, used, vanishing)
            if spec is not None:
                break
        if spec is None:
            spent.add(shape)
            continue
        patches.append(spec)
        sites += len(spec.sites)
        n += 1
    return patches


def _pairs(versions: list[str]) -> list[tuple[str, str]]:
    return list(itertools.pairwise(versions))


def _one_patch(  # noqa: PLR0917 - the cutter's one helper
    c: Cutter,
    shape: str,
    n: int,
    base: str,
    nxt: str,
    used: set[tuple[str, str, str]],
    vanishing: list[str],
) -> PatchSpec | None:
    pid = f"rt-{shape}-{n}"
    pool = vanishing if shape == "vanishing-file" else c.files_in(base, f"{shape}{n}")
    pool = [f for f in pool if f in c.r.paths[base] and (f, base, shape) not in used]
    for rel in pool[:12]:
        got = _shape(c, shape, n, base, nxt, rel)
        if got is None:
            continue
        sites, probe, after = got
        for s in sites:
            used.add((s.file, base, shape))
        return PatchSpec(pid, shape, base, after, sites, probe)
    return None


def _shape(  # noqa: PLR0917, PLR0915 - one branch per shape
    c: Cutter, shape: str, n: int, base: str, nxt: str, rel: str
) -> tuple[list[SiteSpec], tuple[str, list[str]] | None, str | None] | None:
    uniq = c.unique_stmts(base, rel)
    if len(uniq) < 6:
        return None
    spread = sorted(uniq, key=lambda s: _rank(rel, base, str(s.line)))
    style = n % 3
    if shape == "upstream-fix":
        ch = c.changes(base, rel)
        if not ch:
            return None
        s, new = ch[0]
        fix = SiteSpec("fix", rel, "replace", s.text, new, probe=[new.strip()])
        other = next(x for x in spread if abs(x.line - s.line) > 3)
        return [fix, _insert(n, 1, rel, other, style)], None, nxt
    if shape == "multi-site":
        picked = _apart(spread, 4)
        ch = c.changes(base, rel)
        if ch:  # one site on a line the next release changes: partial there
            picked = [ch[0][0], *(p for p in picked if abs(p.line - ch[0][0].line) > 3)][:4]
        if len(picked) < 3:
            return None
        out = [
            (_insert if k % 2 else _replace)(n, k, rel, s, (style + k) % 3)
            for k, s in enumerate(picked)
        ]
        return out, None, nxt
    if shape == "multi-file":
        others = [
            f
            for f in c.files_in(base, f"second{n}")[:6]
            if f != rel and len(c.unique_stmts(base, f)) >= 6
        ][:2]
        if not others:
            return None
        out = []
        k = 0
        for f in [rel, *others]:
            stmts = _apart(sorted(c.unique_stmts(base, f), key=lambda s: _rank(f, str(s.line))), 2)
            for s in stmts:
                out.append(
                    _insert(n, k, f, s, (style + k) % 3, ("insert-after", "insert-before")[k % 2])
                )
                k += 1
        return out, None, nxt
    if shape == "optional":
        ch = c.changes(base, rel)
        if not ch:
            return None
        s = ch[0][0]
        gone = _insert(n, 0, rel, s, 0)
        gone.optional = True
        rest = [
            _insert(n, k, rel, x, (style + k) % 3)
            for k, x in enumerate(_apart([x for x in spread if abs(x.line - s.line) > 3], 2), 1)
        ]
        return [gone, *rest], None, None
    if shape == "after-scoped":
        scoped = c.scoped(base, rel)
        if not scoped:
            return None
        head, s = scoped[0]
        site = SiteSpec("scoped", rel, "insert-before", s.text.strip(), _added(n, 0))
        site.after = head.strip() if style else head
        other = next(x for x in spread if abs(x.line - s.line) > 3)
        return [site, _insert(n, 1, rel, other, style, "insert-after")], None, nxt
    if shape == "alternatives":
        ch = c.changes(base, rel)
        if not ch:
            return None
        s, new = ch[0]
        site = SiteSpec("alt", rel, "insert-after", new.strip(), _added(n, 0))
        site.alternatives = [{"anchor": s.text}]
        if style == 1:  # a third shape no release holds, tried last
            site.alternatives.append({"anchor": s.text.strip() + "  # never there"})
        other = next(x for x in spread if abs(x.line - s.line) > 3)
        return [site, _insert(n, 1, rel, other, style)], None, None
    if shape == "into-block":
        got = c.parsed(base, rel)
        assert got is not None
        lines, _, defs = got
        counts = _counts(lines)
        heads = [d for d in defs if counts[_fold(lines[d])] == 1 and _toml_ok(lines[d])]
        if not heads:
            return None
        d = sorted(heads, key=lambda i: _rank(rel, str(i)))[0]
        into = SiteSpec("into", rel, "insert-after", lines[d].strip(), _added(n, 0))
        other = next(x for x in spread if abs(x.line - d) > 3)
        return [into, _replace(n, 1, rel, other, style)], None, nxt
    if shape == "ambiguous-later":
        twice = c.repeated_later(base, rel)
        if not twice:
            return None
        s = twice[0]
        near = _apart([x for x in spread if abs(x.line - s.line) > 3], 2)
        out = [_insert(n, 0, rel, s, 1)] + [
            _insert(n, k, rel, x, (style + k) % 3) for k, x in enumerate(near, 1)
        ]
        return out, None, None
    if shape == "patch-probe":
        ch = c.changes(base, rel)
        if not ch:
            return None
        s, new = ch[0]
        site = SiteSpec("fix", rel, "replace", s.text, new)
        other = next(x for x in spread if abs(x.line - s.line) > 3)
        return [site, _insert(n, 1, rel, other, style)], (rel, [new.strip()]), None
    if shape == "vanishing-file":
        near = _apart(spread, 2)
        second = next(
            (
                f
                for f in c.files_in(base, f"v{n}")[:6]
                if f != rel and len(c.unique_stmts(base, f)) >= 6
            ),
            None,
        )
        out = [_insert(n, k, rel, s, (style + k) % 3) for k, s in enumerate(near)]
        if second is not None:
            s2 = sorted(c.unique_stmts(base, second), key=lambda s: _rank(second, str(s.line)))[0]
            out.append(_insert(n, len(out), second, s2, style, "insert-after"))
        return out, None, None
    raise AssertionError(shape)


def _apart(stmts: list[Stmt], count: int) -> list[Stmt]:
    out: list[Stmt] = []
    for s in stmts:
        if all(abs(s.line - o.line) > 3 for o in out):
            out.append(s)
        if len(out) == count:
            break
    return out


def _toml_str(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def write_registry(root: Path, patches: list[PatchSpec]) -> Path:
    registry = root / "patches"
    if registry.exists():
        shutil.rmtree(registry)
    registry.mkdir(parents=True)
    for p in patches:
        folder = registry / p.id
        folder.mkdir()
        targets = sorted({s.file for s in p.sites})
        rng = f">={p.base},<{p.after}" if p.after else f">={p.base}"
        toml = [
            f'id = "{p.id}"',
            f'title = "runtime matrix: {p.shape} cut from vLLM {p.base}"',
            f'description = "Sites cut from vLLM {p.base}\'s own files ({p.shape})."',
            'kind = "runtime"',
            "revision = 1",
            'origin = "benchmarks/runtime_matrix.py, from the release files on the index"',
            'credit = ["vLLM\'s authors (the lines the sites anchor on)"]',
            'apply = "startup"',
            f'vllm = "{rng}"',
            "targets = [" + ", ".join(_toml_str(t) for t in targets) + "]",
            "",
            "[upstream]",
            'state = "unsubmitted"',
        ]
        if p.probe is not None:
            toml += [
                "",
                "[upstream.probe]",
                f"file = {_toml_str(p.probe[0])}",
                "contains = [" + ", ".join(_toml_str(x) for x in p.probe[1]) + "]",
            ]
        (folder / "patch.toml").write_text("\n".join(toml) + "\n")
        out: list[str] = []
        for s in p.sites:
            out += [
                "[[site]]",
                f'name = "{s.name}"',
                f"file = {_toml_str(s.file)}",
                f'action = "{s.action}"',
                f'marker = "patchset: {p.id} {s.name}"',
                f"anchor = {_toml_str(s.anchor)}",
                f"text = {_toml_str(s.text)}",
            ]
            if s.optional:
                out.append("optional = true")
            if s.after is not None:
                out.append(f"after = {_toml_str(s.after)}")
            if s.probe:
                out += ["[site.probe]", "contains = [" + ", ".join(map(_toml_str, s.probe)) + "]"]
            for alt in s.alternatives:
                out += ["[[site.alternatives]]", f"anchor = {_toml_str(alt['anchor'])}"]
            out.append("")
        (folder / "sites.toml").write_text("\n".join(out))
    return registry


def _asdict(p: PatchSpec) -> dict[str, object]:
    return {
        "id": p.id,
        "shape": p.shape,
        "base": p.base,
        "after": p.after,
        "probe": p.probe,
        "sites": [s.__dict__ for s in p.sites],
    }
