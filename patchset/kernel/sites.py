"""Runtime patch sites: anchored edits with markers (standard library only).

A site names a file, an anchor (one or more lines that must occur exactly once, compared with
runs of whitespace folded so re-indented code still matches), an action and the text to put in.
The edit carries a marker comment, so a second run finds the edit and does nothing.
"""

from __future__ import annotations

import dataclasses
import textwrap
from dataclasses import dataclass
from typing import Literal, get_args

from .hunks import rank_windows

Action = Literal["replace", "insert-after", "insert-before"]
ACTIONS: tuple[Action, ...] = get_args(Action)
INEXACT = "the anchor matched with whitespace folded: a revert writes it as sites.toml has it"
SiteStatus = Literal["applies", "already-applied", "anchor-not-found", "ambiguous", "tampered"]


@dataclass(frozen=True)
class Site:
    name: str
    file: str
    anchor: str
    action: Action
    text: str
    marker: str

    @property
    def anchor_lines(self) -> list[str]:
        return _block(self.anchor)

    @property
    def marker_line(self) -> str:
        return f"# {self.marker}"

    def edited_lines(self) -> list[str]:
        """The block that stands in the file once the site is applied (relative indents)."""
        text = [self.marker_line, *_block(self.text)]
        if self.action == "replace":
            return text
        if self.action == "insert-after":
            return [*self.anchor_lines, *text]
        return [*text, *self.anchor_lines]


@dataclass(frozen=True)
class Candidate:
    line: int  # 1-based
    similarity: float
    lines: tuple[str, ...]


@dataclass(frozen=True)
class SiteResult:
    site: str
    file: str
    status: SiteStatus
    line: int | None = None  # 1-based line of the anchor (or of the edit, when applied)
    candidates: tuple[Candidate, ...] = ()
    detail: str = ""

    def describe(self) -> str:
        if self.status in ("applies", "already-applied"):
            note = f" ({self.detail})" if self.detail else ""
            return f"site {self.site}: {self.status} at {self.file}:{self.line}{note}"
        best = self.candidates[0] if self.candidates else None
        near = (
            f"; nearest {self.file}:{best.line} ({best.similarity:.0%} alike):"
            f" {best.lines[0].strip()!r}"
            if best and best.lines
            else ""
        )
        extra = f" ({self.detail})" if self.detail else ""
        return f"site {self.site}: {self.status}{extra}{near}"


def _block(text: str) -> list[str]:
    """Dedented lines of a multi-line TOML string, without leading/trailing blank lines."""
    lines = textwrap.dedent(text).splitlines()
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return [line.rstrip() for line in lines]


def _fold(line: str) -> str:
    return " ".join(line.split())


def find_block(lines: list[str], block: list[str]) -> list[int]:
    """Every 0-based start where `block` matches, comparing whitespace-folded lines."""
    want = [_fold(line) for line in block]
    if not want:
        return []
    folded = [_fold(line) for line in lines]
    first = want[0]
    return [
        i for i, line in enumerate(folded) if line == first and folded[i : i + len(want)] == want
    ]


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _reindent(block: list[str], base: str) -> list[str]:
    return [f"{base}{line}" if line.strip() else "" for line in block]


def check_site(site: Site, lines: list[str]) -> SiteResult:
    """Where the site stands in `lines`, without changing anything."""
    edited = find_block(lines, site.edited_lines())
    if len(edited) == 1:
        return SiteResult(site.name, site.file, "already-applied", line=edited[0] + 1)
    marker_at = [i for i, line in enumerate(lines) if line.strip() == site.marker_line]
    if marker_at:
        return SiteResult(
            site.name,
            site.file,
            "tampered",
            line=marker_at[0] + 1,
            detail=f"marker found at line {marker_at[0] + 1} but the edit around it differs",
        )
    found = find_block(lines, site.anchor_lines)
    if len(found) == 1:
        return SiteResult(site.name, site.file, "applies", line=found[0] + 1)
    if len(found) > 1:
        where = ", ".join(str(i + 1) for i in found)
        return SiteResult(
            site.name, site.file, "ambiguous", detail=f"anchor matches at lines {where}"
        )
    ranked = rank_windows(lines, site.anchor_lines, limit=3)
    return SiteResult(
        site.name,
        site.file,
        "anchor-not-found",
        candidates=tuple(Candidate(start + 1, ratio, win) for start, win, ratio in ranked),
    )


def apply_site(site: Site, lines: list[str]) -> tuple[SiteResult, list[str]]:
    """The site's result and the new lines (unchanged unless the result is 'applies')."""
    result = check_site(site, lines)
    if result.status != "applies":
        return result, lines
    assert result.line is not None
    at = result.line - 1
    size = len(site.anchor_lines)
    base = _indent(lines[at])
    new = _reindent(site.edited_lines(), base)
    if site.action == "insert-after":
        if lines[at + size - 1].rstrip().endswith(":"):
            # The anchor opens a block (a def, an if): the text goes into that block.
            following = [line for line in lines[at + size :] if line.strip()]
            if following:
                inner = _indent(following[0])
                new = _reindent(site.edited_lines(), inner)
        new[:size] = lines[at : at + size]  # keep the anchor's own bytes
    elif site.action == "insert-before":
        new[len(new) - size :] = lines[at : at + size]
    elif lines[at : at + size] != _reindent(site.anchor_lines, base):
        # Matched with whitespace folded: a revert can only put back the anchor as written.
        result = dataclasses.replace(result, detail=INEXACT)
    return result, [*lines[:at], *new, *lines[at + size :]]


def revert_site(site: Site, lines: list[str]) -> tuple[SiteResult, list[str]]:
    """Undo an applied site: status 'already-applied' means it was found and removed."""
    result = check_site(site, lines)
    if result.status != "already-applied":
        return result, lines
    assert result.line is not None
    at = result.line - 1
    edited = site.edited_lines()
    base = _indent(lines[at])
    if site.action == "replace":
        original = _reindent(site.anchor_lines, base)
    elif site.action == "insert-after":
        original = lines[at : at + len(site.anchor_lines)]
    else:
        original = lines[at + len(edited) - len(site.anchor_lines) : at + len(edited)]
    return result, [*lines[:at], *original, *lines[at + len(edited) :]]
