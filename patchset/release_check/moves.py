"""Moved files: where a target file the release no longer has went (shared by check and refresh).

`check` reports the new place as `moved_to`; `refresh` carries a patch onto it.

The rule (docs/check.md, "Moved files"): the content a patch expects in the vanished file is
its *content lines* (`content_lines`: boilerplate left out). A release file carries the
vanished one when it holds at least `MOVED_SHARE` of them, and at least `MIN_LINES` lines
are there to judge by. Candidates, in this order: files of the same name anywhere; the
package the file became (`foo.py` -> `foo/__init__.py`, `foo/bar.py`: the fewest of its
modules that together carry the share, at most `MAX_MODULES`); with the file's own content at
hand, files in the same folder, then files whose name holds its name or is held by it.
"""

from __future__ import annotations

import functools
import math
import re
from collections.abc import Callable, Iterable, Set
from pathlib import PurePosixPath

from patchset.registry import Variant
from patchset.sources.base import KnowsDigests, ReadsMany, ReleaseTree

# A file "carries most of" a vanished one when it holds at least this share of the content
# lines the patch expects in the vanished file...
MOVED_SHARE = 0.5
# ...and the patch expects at least this many (fewer say too little to name a file).
MIN_LINES = 3
# A file that became a package is named by at most this many of its modules.
MAX_MODULES = 3
# Files of a kindred name (one stem holds the other) are looked at only when so few.
MAX_KIN = 40
# Content lines are longer than this (shorter ones, `else:`, `return x`, say little).
SHORT = 8

_PUNCTUATION = re.compile(r"[\s()\[\]{},:;.\\]*")
_LICENCE = re.compile(r"#.*(spdx|copyright|licen[cs]e|apache|mit license)", re.IGNORECASE)
_IMPORT = re.compile(r"(import\s|from\s+\S+\s+import\b)")
_NAME_ONLY = re.compile(r"[\w.]+,?")  # an import's or a call's lone name: `SamplingParams,`
# Lines nearly every vLLM module holds: they say nothing about which file this is.
_COMMON = frozenset(
    {
        "logger = init_logger(__name__)",
        "if TYPE_CHECKING:",
        "from __future__ import annotations",
    }
)


def content_lines(lines: Iterable[str]) -> set[str]:
    """The lines that say what a file (or a run of its lines) holds: stripped, longer than
    `SHORT` characters, without boilerplate: blank lines, lone brackets and punctuation,
    licence and SPDX comments, imports (a parenthesised import's continuation lines too),
    lone names (`SamplingParams,`) and a few lines every module has (`_COMMON`)."""
    out: set[str] = set()
    in_import = False
    for raw in lines:
        line = raw.strip()
        if in_import:
            in_import = ")" not in line
            continue
        if _IMPORT.match(line):
            in_import = "(" in line and ")" not in line
            continue
        if (
            len(line) <= SHORT
            or _PUNCTUATION.fullmatch(line)
            or _NAME_ONLY.fullmatch(line)
            or _LICENCE.match(line)
            or line in _COMMON
        ):
            continue
        out.add(line)
    return out


def expected_lines(variant: Variant, rel: str) -> set[str]:
    """The content lines the variant expects in `rel`: its hunks' old sides and its sites'
    anchors (each hunk read on its own, so an import block never spills into the next)."""
    found: set[str] = set()
    for d in variant.diffs:
        if d.path == rel:
            for h in d.hunks:
                found |= content_lines(h.old)
    for s in variant.sites:
        if s.file == rel:
            found |= content_lines(s.anchor_lines)
    return found


def moved_homes(
    tree: ReleaseTree,
    variant: Variant,
    missing: tuple[str, ...],
    *,
    existed: set[str] | None = None,
    before: Callable[[str], bytes | None] | None = None,
    python_files: Callable[[], PythonFiles] | None = None,
) -> dict[str, tuple[str, ...]]:
    """Where each missing file went: the release file(s) carrying its content (module doc).

    With `existed`, only those missing files are looked for: a file never seen in an earlier
    release has not moved, it has not been written yet. `before` gives a missing file's
    content in an earlier release: its content lines are then what must be carried (and a
    file renamed in its own folder is looked for too); without it, the lines the patch
    expects there. Missing files with no such home are left out. A file that became a
    package maps to the modules that carry it. `python_files` gives the tree's .py files (a
    check lists them once per release).
    """
    found: dict[str, tuple[str, ...]] = {}
    missing = tuple(m for m in missing if existed is None or m in existed)
    if not missing:
        return found
    paths = python_files() if python_files else PythonFiles(tree.paths())
    for rel in missing:
        old = before(rel) if before is not None else None
        whole = _whole_file_lines(old) if old else frozenset()
        expected = whole if len(whole) >= MIN_LINES else frozenset(expected_lines(variant, rel))
        if len(expected) < MIN_LINES:
            continue
        # Patches on the same vanished file look for it with the same lines: searched once
        # in a release (the cache is the release's file list's own).
        key = (rel, expected, expected is whole)
        if key not in paths.homes:
            paths.homes[key] = _home(tree, paths, rel, expected, whole=expected is whole)
        home = paths.homes[key]
        if home:
            found[rel] = home
    return found


class PythonFiles:
    """A release's .py files and the indexes a moved-file search looks them up by (by file
    name, by folder, by stem), each made the first time it is asked for: a release lists
    thousands of files, and a check looks for several vanished files in each release."""

    def __init__(self, paths: Iterable[str]) -> None:
        self.paths = [p for p in paths if p.endswith(".py")]
        # (vanished file, the lines looked for, whether they are its whole content) -> where
        # `moved_homes` found it in this release
        self.homes: dict[tuple[str, frozenset[str], bool], tuple[str, ...] | None] = {}

    @functools.cached_property
    def _by_name_and_folder(self) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
        """Both indexes in one pass (string splits, not pathlib: thousands of paths)."""
        by_name: dict[str, list[str]] = {}
        by_folder: dict[str, list[str]] = {}
        for path in self.paths:
            folder, _, name = path.rpartition("/")
            by_name.setdefault(name, []).append(path)
            by_folder.setdefault(folder, []).append(path)
        return by_name, by_folder

    @property
    def by_name(self) -> dict[str, list[str]]:
        return self._by_name_and_folder[0]

    @property
    def by_folder(self) -> dict[str, list[str]]:
        return self._by_name_and_folder[1]

    @functools.cached_property
    def by_stem(self) -> dict[str, list[str]]:
        """By stem, made from the names (fewer than the paths); the order within a stem is
        by name, which no search depends on (candidates are ranked by lines, then path)."""
        found: dict[str, list[str]] = {}
        for name, paths in self.by_name.items():
            found.setdefault(_stem(name), []).extend(paths)
        return found

    def akin(self, stem: str) -> list[str]:
        """The files whose stem is akin to `stem`: one stem holds the other
        (`deepep_ht_prepare_finalize` / `deepep_ht`), both at least 4 characters long, not
        the same and not `__init__`; in the order of `by_stem`."""
        if len(stem) < 4 or stem == "__init__":
            return []
        return [
            p
            for s, ps in self.by_stem.items()
            if len(s) >= 4 and s not in (stem, "__init__") and (stem in s or s in stem)
            for p in ps
        ]

    def under(self, folder: str) -> list[str]:
        """The files in `folder` and its subfolders."""
        inside = f"{folder}/"
        return [
            p for f, ps in self.by_folder.items() if f == folder or f.startswith(inside) for p in ps
        ]

    def in_folders_named(self, name: str) -> list[str]:
        """The files with a folder called `name` in their path."""
        part = f"/{name}/"
        return [p for f, ps in self.by_folder.items() if part in f"{f}/" for p in ps]


def _home(
    tree: ReleaseTree, paths: PythonFiles, rel: str, expected: frozenset[str], *, whole: bool
) -> tuple[str, ...] | None:
    pure = PurePosixPath(rel)
    name, stem, parent = pure.name, pure.stem, str(pure.parent)
    same_name = [p for p in paths.by_name.get(name, ()) if p != rel]
    best = _best_file(tree, same_name, expected)
    if best is not None:
        return (best,)
    if name != "__init__.py":  # foo.py -> foo/...: the package of that name, nearest first
        modules = paths.under(f"{parent}/{stem}") or paths.in_folders_named(stem)
        split = _fewest_modules(tree, modules, expected)
        if split:
            return split
    if not whole:  # a few hunks' lines are too little to tell siblings apart
        return None
    folder = [p for p in paths.by_folder.get(parent, ()) if p != rel]
    best = _best_file(tree, folder, expected)  # renamed in its folder: the same rule
    if best is None:  # renamed with a part of its name kept (`x_prepare_finalize.py` -> `x.py`)
        kin = [p for p in paths.akin(stem) if p != rel]
        best = _best_file(tree, kin, expected) if len(kin) <= MAX_KIN else None
    return None if best is None else (best,)


@functools.lru_cache(maxsize=256)
def _whole_file_lines(data: bytes) -> frozenset[str]:
    """A vanished file's content lines, once per content: a check looks for it in every
    later release."""
    return frozenset(content_lines(data.decode("utf-8", "replace").splitlines()))


def _stem(path: str) -> str:
    """PurePosixPath(path).stem for a path ending in .py, by string splits."""
    name = path.rpartition("/")[2]
    return name[:-3] if len(name) > 3 and name.endswith(".py") else PurePosixPath(name).stem


def _shares(
    tree: ReleaseTree, candidates: list[str], expected: frozenset[str]
) -> dict[str, frozenset[str]]:
    """The expected lines each candidate holds (those holding none left out); for a file
    whose listed sha256 was met before with the same expected lines, kept from then (a
    vanished file is looked for again in every later release, mostly among the same files)."""
    digests = _digests(tree, candidates)
    held: dict[str, frozenset[str]] = {}
    todo = []
    for path in candidates:
        known = _HITS.get((digests[path], expected)) if path in digests else None
        if known is None:
            todo.append(path)
        elif known:
            held[path] = known
    lines = _line_sets(tree, todo) if todo else {}
    for path in todo:
        hits = lines.get(path, frozenset()) & expected
        if path in digests:
            if len(_HITS) >= _LINES_KEPT:
                _HITS.pop(next(iter(_HITS)))
            _HITS[(digests[path], expected)] = hits
        if hits:
            held[path] = hits
    return {path: held[path] for path in candidates if path in held}


# (a file's sha256, the expected lines) -> the expected lines it holds.
_HITS: dict[tuple[str, frozenset[str]], frozenset[str]] = {}


def _digests(tree: ReleaseTree, candidates: list[str]) -> dict[str, str]:
    """The listed sha256 of each candidate the release holds (none when it lists none)."""
    if not isinstance(tree, KnowsDigests):
        return {}
    found = {}
    for path in candidates:
        digest = tree.listed_digest(path)
        if digest is not None and digest != "-":
            found[path] = digest
    return found


# A file's stripped lines by its sha256: most files are the same bytes in consecutive
# releases, so a check of many releases reads and splits each version of a file once.
_LINES_BY_DIGEST: dict[str, frozenset[str]] = {}
_LINES_KEPT = 8192


def _line_sets(tree: ReleaseTree, candidates: list[str]) -> dict[str, frozenset[str]]:
    """Each candidate's set of stripped lines (files the release lacks left out); a file
    whose listed sha256 was seen before is not read again."""
    found: dict[str, frozenset[str]] = {}
    digests: dict[str, str] = {}
    if isinstance(tree, KnowsDigests):
        for path in candidates:
            digest = tree.listed_digest(path)
            if digest is None or digest == "-":
                continue
            known = _LINES_BY_DIGEST.get(digest)
            if known is not None:
                found[path] = known
            else:
                digests[path] = digest
    unread = [p for p in candidates if p not in found]
    if not unread:
        return found
    many = tree.read_many(unread) if isinstance(tree, ReadsMany) else None
    for path in unread:
        data = many[path] if many is not None else tree.read(path)
        if data is None:
            continue
        lines = frozenset(map(str.strip, data.decode("utf-8", "replace").splitlines()))
        found[path] = lines
        if path in digests:
            if len(_LINES_BY_DIGEST) >= _LINES_KEPT:
                _LINES_BY_DIGEST.pop(next(iter(_LINES_BY_DIGEST)))
            _LINES_BY_DIGEST[digests[path]] = lines
    return found


def forget_lines() -> None:
    """Drop the line sets kept by digest and content (as a fresh process has none)."""
    _LINES_BY_DIGEST.clear()
    _HITS.clear()
    _whole_file_lines.cache_clear()
    _smallest.cache_clear()


def _best_file(tree: ReleaseTree, candidates: list[str], wanted: Set[str]) -> str | None:
    expected = frozenset(wanted)  # the same object when it is one already
    need = math.ceil(MOVED_SHARE * len(expected))
    if isinstance(tree, KnowsDigests):  # a file too small to hold `need` of the lines: unread
        floor = _smallest_holding(expected, need)
        candidates = [p for p in candidates if (tree.listed_size(p) or floor) >= floor]
    held = _shares(tree, candidates, expected)
    ranked = sorted(held, key=lambda p: (-len(held[p]), p))
    if ranked and len(held[ranked[0]]) >= need:
        return ranked[0]
    return None


def _smallest_holding(lines: Set[str], count: int) -> int:
    """The fewest bytes a file holding `count` of these (distinct, stripped) lines has: the
    `count` shortest, each on a line of its own (a newline between them). Characters are
    counted, not bytes: each stands for at least one byte (U+FFFD for an undecodable one)."""
    return _smallest(frozenset(lines), count)  # the same object for a frozenset


@functools.lru_cache(maxsize=256)
def _smallest(lines: frozenset[str], count: int) -> int:
    """`_smallest_holding`, once per (lines, count): every later release asks again."""
    if count <= 0:
        return 0
    sizes = sorted(len(line) for line in lines)
    return sum(sizes[:count]) + count - 1


def _fewest_modules(
    tree: ReleaseTree, candidates: list[str], wanted: Set[str]
) -> tuple[str, ...] | None:
    """The fewest modules (greedy, most lines first) that together carry the share."""
    expected = frozenset(wanted)
    held = _shares(tree, candidates, expected)
    chosen: list[str] = []
    covered: set[str] = set()
    while held and len(chosen) < MAX_MODULES:
        path = max(sorted(held), key=lambda p: len(held[p] - covered))
        gain = held.pop(path) - covered
        if not gain:
            break
        chosen.append(path)
        covered |= gain
        if len(covered) >= MOVED_SHARE * len(expected):
            return tuple(chosen)
    return None
