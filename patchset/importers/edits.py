"""An edit of one file (its text before and after) as runtime sites with minimal anchors.

Each changed region becomes one `replace` site whose anchor is the smallest run of the
original lines that is unique in the file (one line where one line is unique), widened over
neighbouring lines only as far as uniqueness needs, so a change in lines further away does
not break it as a diff's three lines of context do.

This is the importer's own small implementation of the interface the `author` teammate's
`add --from-tree --runtime` provides (issue 26, item 4); `sites_from_edit` is the one call
the importer makes, so the authoring library's function can stand in for it unchanged.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from patchset.kernel.sites import find_block


@dataclass(frozen=True)
class EditSite:
    """One site: the file, the original lines it replaces (the anchor) and the new lines."""

    file: str
    anchor: str
    text: str
    line: int  # 1-based line of the anchor in the original file


def _unique(lines: list[str], start: int, end: int) -> bool:
    block = lines[start:end]
    return len(find_block(lines, block)) == 1


def _widen(lines: list[str], start: int, end: int) -> tuple[int, int]:
    """The smallest region holding [start, end) that starts and ends on non-blank lines and
    occurs once in the file (growing one line at a time, after first, then before)."""
    n = len(lines)
    if start == end:  # a pure insertion: anchor on the line before (or after, at the top)
        if start > 0:
            start -= 1
        else:
            end = min(1, n)
    while start > 0 and not lines[start].strip():
        start -= 1
    while end < n and not lines[end - 1].strip():
        end += 1
    grow_after = True
    while not _unique(lines, start, end):
        if (grow_after and end < n) or start == 0:
            if end >= n:
                break
            end += 1
            while end < n and not lines[end - 1].strip():
                end += 1
        else:
            start -= 1
            while start > 0 and not lines[start].strip():
                start -= 1
        grow_after = not grow_after
    return start, end


def sites_from_edit(file: str, old: str, new: str) -> list[EditSite]:
    """The sites that turn `old` into `new` (both the file's whole text)."""
    before = old.split("\n")
    after = new.split("\n")
    matcher = difflib.SequenceMatcher(a=before, b=after, autojunk=False)
    regions: list[tuple[int, int, int, int]] = []  # old [i1, i2) -> new [j1, j2)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        start, end = _widen(before, i1, i2)
        if j1 == j2 and (start, end) == (i1, i2):  # a deletion: keep a line to stand on
            start, end = _widen(before, max(i1 - 1, 0), i2 if i1 else i2 + 1)
        # the same widening on the new side: the context lines added are equal lines
        nj1, nj2 = j1 - (i1 - start), j2 + (end - i2)
        if regions and start <= regions[-1][1]:
            pstart, _, pj1, _ = regions[-1]
            regions[-1] = (pstart, end, pj1, nj2)
        else:
            regions.append((start, end, nj1, nj2))
    return [
        EditSite(
            file=file,
            anchor="\n".join(before[s:e]) + "\n",
            text="\n".join(after[j1:j2]) + "\n",
            line=s + 1,
        )
        for s, e, j1, j2 in regions
    ]
