"""An edit of one file as anchored runtime sites: `sites_from_edit(original, edited, file)`.

Each changed region becomes one site whose anchor is the smallest run of the original's lines
that holds the change and matches exactly once in the file (whitespace folded, as the kernel
matches it): the changed lines themselves where they are unique, else one line more at a
time, above or below. A line a neighbour edit changes is then no part of the anchor, as it is
of a diff's three lines of context, so a release that changed a comment above the edit still
takes the site. Regions whose anchors would overlap become one site. An insertion whose anchor
is all context is an `insert-after` (anchor above) or `insert-before` (anchor below); anything
else a `replace`. The sites are checked by applying them, with the kernel, to the original:
the result (marker comments aside) must be the edited file, else UsageError.

Used by `patchset add --from-tree ... --runtime` and by the collection importers.
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

import tomlkit

from patchset.errors import UsageError
from patchset.kernel.hunks import split_text
from patchset.kernel.sites import Site, SiteAction, apply_site

MAX_ANCHOR = 80  # lines: an edit no shorter run of lines pins down is no site (a diff then)
_PROBE_MARKER = "patchset-authoring: site"  # the marker of the trial application only


@dataclass(frozen=True)
class SiteEdit:
    """One anchored site of an edit, without a name or marker yet (the patch gives those)."""

    file: str  # vllm/...
    action: SiteAction
    anchor: str  # the original's lines, joined with "\n"
    text: str  # the lines that go in (replace: instead of the anchor), joined with "\n"
    line: int  # 1-based line of the anchor's first line in the original

    def site(self, name: str, marker: str) -> Site:
        return Site(
            name=name, file=self.file, anchor=self.anchor, action=self.action,
            text=self.text, marker=marker,
        )  # fmt: skip


@dataclass
class _Region:
    a: int  # original lines [a, e)
    e: int
    c: int  # edited lines [c, d)
    d: int


def sites_from_edit(original: str, edited: str, file: str) -> list[SiteEdit]:
    """The sites that turn `original` into `edited` (both whole files), top to bottom."""
    old, _, _ = split_text(original)
    new, _, _ = split_text(edited)
    if old == new:
        return []
    folded = [" ".join(line.split()) for line in old]
    where: dict[str, list[int]] = {}  # each folded line: where it stands
    for number, line in enumerate(folded):
        where.setdefault(line, []).append(number)
    lines = _Folded(folded, where)
    regions = _changes(old, new)
    while True:
        grown = [_grow(old, new, lines, r, file) for r in regions]
        merged = _merge(grown)
        if len(merged) == len(grown):
            break
        regions = merged  # grown into each other: one region, grown again from its union
    edits = [_edit(old, new, r, file) for r in merged]
    _verify(edits, old, new, file)
    return edits


def _changes(old: list[str], new: list[str]) -> list[_Region]:
    """The changed regions, by difflib on what lies between the common head and tail (an
    edit is mostly small: the matcher then never sees the rest of a long, repetitive file)."""
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    middle_old, middle_new = old[head : len(old) - tail], new[head : len(new) - tail]
    matcher = difflib.SequenceMatcher(None, middle_old, middle_new, autojunk=False)
    return [
        _Region(head + i1, head + i2, head + j1, head + j2)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes()
        if tag != "equal"
    ]


@dataclass(frozen=True)
class _Folded:
    lines: list[str]  # the original's lines, whitespace folded
    where: dict[str, list[int]]

    def count(self, a: int, e: int) -> int:
        """How often the run lines[a:e] occurs in the file: 0, 1 or 2 (more than once)."""
        want = self.lines[a:e]
        count = 0
        for i in self.where.get(want[0], ()):
            if self.lines[i : i + len(want)] == want:
                count += 1
                if count > 1:
                    break
        return count


def _grow(old: list[str], new: list[str], folded: _Folded, r: _Region, file: str) -> _Region:
    """The smallest widening of `r` by unchanged lines (k in all, `up` of them above) whose
    original lines match once in the file and whose both sides start and end with a non-blank
    line (the kernel drops blank lines at an anchor's or text's edges)."""
    for k in range(min(len(old), MAX_ANCHOR) + 1):
        for up in range(k + 1):
            down = k - up
            a, e, c, d = r.a - up, r.e + down, r.c - up, r.d + down
            if a < 0 or c < 0 or e > len(old) or d > len(new) or e == a or d == c:
                continue
            if not (old[a].strip() and old[e - 1].strip()):
                continue
            if not (new[c].strip() and new[d - 1].strip()):
                continue
            if folded.count(a, e) == 1:
                return _Region(a, e, c, d)
    raise UsageError(
        f"{file}: the edit at line {r.a + 1} has no run of up to {MAX_ANCHOR} lines unique in"
        " the file to anchor it (the file repeats itself there): make it a diff patch"
    )


def _merge(regions: list[_Region]) -> list[_Region]:
    out: list[_Region] = []
    for r in sorted(regions, key=lambda r: r.a):
        if out and r.a < out[-1].e:  # overlapping anchors: one site
            last = out[-1]
            out[-1] = _Region(last.a, max(last.e, r.e), min(last.c, r.c), max(last.d, r.d))
        else:
            out.append(r)
    return out


def _edit(old: list[str], new: list[str], r: _Region, file: str) -> SiteEdit:
    anchor, text = old[r.a : r.e], new[r.c : r.d]
    size = len(anchor)
    if len(text) > size and text[:size] == anchor and text[size].strip() and text[-1].strip():
        opener = anchor[-1].rstrip().endswith(":")  # the kernel would put the text in the block
        if not opener:
            return SiteEdit(
                file, "insert-after", "\n".join(anchor), "\n".join(text[size:]), r.a + 1
            )
    if len(text) > size and text[-size:] == anchor and text[0].strip() and text[-size - 1].strip():
        kept = text[:-size]
        return SiteEdit(file, "insert-before", "\n".join(anchor), "\n".join(kept), r.a + 1)
    return SiteEdit(file, "replace", "\n".join(anchor), "\n".join(text), r.a + 1)


def _verify(edits: Sequence[SiteEdit], old: list[str], new: list[str], file: str) -> None:
    """Apply the sites to the original with the kernel: without their markers, the result
    must be the edited file."""
    lines = list(old)
    for number, edit in enumerate(edits, start=1):
        site = edit.site(f"s{number}", f"{_PROBE_MARKER} {number}")
        result, lines = apply_site(site, lines)
        if result.status != "applies":
            raise UsageError(
                f"{file}: the site for the edit at line {edit.line} does not apply after the"
                f" ones above it ({result.status}): make it a diff patch"
            )
    kept = [line for line in lines if not line.strip().startswith(f"# {_PROBE_MARKER} ")]
    if kept != new:
        raise UsageError(
            f"{file}: the sites made from the edit do not give the edited file back"
            " (indentation the kernel would move): make it a diff patch"
        )


def site_names(edits: Sequence[SiteEdit]) -> list[str]:
    """A name per site: the file's stem and the site's number in it (`envs-1`, `envs-2`)."""
    seen: dict[str, int] = {}
    names = []
    for edit in edits:
        stem = PurePosixPath(edit.file).stem.strip("_").replace("_", "-").lower() or "site"
        seen[stem] = seen.get(stem, 0) + 1
        names.append(f"{stem}-{seen[stem]}")
    return names


def sites_toml(patch_id: str, edits: Sequence[SiteEdit], *, header: str = "") -> str:
    """A `sites.toml` holding `edits` in order, each named and marked for `patch_id`."""
    doc = tomlkit.document()
    for line in header.splitlines():
        doc.add(tomlkit.comment(line))
    tables = tomlkit.aot()
    for name, edit in zip(site_names(edits), edits, strict=True):
        table = tomlkit.table()
        table["name"] = name
        table["file"] = edit.file
        table["action"] = edit.action
        table["marker"] = f"patchset: {patch_id} {name}"
        table["anchor"] = tomlkit.string(edit.anchor + "\n", multiline=True)
        table["text"] = tomlkit.string(edit.text + "\n", multiline=True)
        tables.append(table)
    doc["site"] = tables
    return tomlkit.dumps(doc)
