"""Moved files: where a target file the release no longer has went (shared by check and refresh).

`check` reports the new place as `moved_to`; `refresh` carries a patch onto it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import PurePosixPath

from patchset.registry import Variant
from patchset.sources.base import ReadsMany, ReleaseTree

# A file "carries most of" a vanished one when it holds at least this share of the distinctive
# lines (stripped, longer than 8 characters) the patch expects in the vanished file.
MOVED_SHARE = 0.5


def moved_files(
    tree: ReleaseTree,
    variant: Variant,
    missing: tuple[str, ...],
    *,
    existed: set[str] | None = None,
    python_files: Callable[[], list[str]] | None = None,
) -> dict[str, str]:
    """Where each missing file went: the release file (of the same name, else in a folder of
    the same name) holding most of the lines the variant expects (`MOVED_SHARE` of them).

    With `existed`, only those missing files are looked for: a file never seen in an earlier
    release has not moved, it has not been written yet. Missing files with no such home are
    left out. `check` reports these as `moved_to`; `refresh` carries a patch onto them.
    `python_files` gives the tree's .py files (a check lists them once per release).
    """
    found: dict[str, str] = {}
    missing = tuple(m for m in missing if existed is None or m in existed)
    if not missing:
        return found
    paths = python_files() if python_files else [p for p in tree.paths() if p.endswith(".py")]
    for rel in missing:
        expected = {
            line.strip()
            for d in variant.diffs
            if d.path == rel
            for h in d.hunks
            for line in h.old
            if len(line.strip()) > 8
        } | {
            line.strip()
            for s in variant.sites
            if s.file == rel
            for line in s.anchor_lines
            if line.strip()
        }
        if not expected:
            continue
        pure = PurePosixPath(rel)
        suffix = f"/{pure.name}"
        same_name = [p for p in paths if p.endswith(suffix)]
        best = _best_home(tree, same_name, expected)
        if best is None:  # renamed inside a folder that kept its name
            infix = f"/{pure.parent.name}/"
            folder = [p for p in paths if infix in p and p.rsplit("/", 1)[0].endswith(infix[:-1])]
            best = _best_home(tree, folder, expected)
        if best is not None:
            found[rel] = best
    return found


def _best_home(tree: ReleaseTree, candidates: list[str], expected: set[str]) -> str | None:
    best: tuple[float, str] | None = None
    needles = [line.encode() for line in expected]
    many = tree.read_many(candidates) if isinstance(tree, ReadsMany) else None
    for path in candidates:
        data = many[path] if many is not None else tree.read(path)
        if data is None:
            continue
        score = sum(needle in data for needle in needles) / len(needles)
        if score >= MOVED_SHARE and (best is None or score > best[0]):
            best = (score, path)
    return None if best is None else best[1]
