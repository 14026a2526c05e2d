"""Locating and applying unified-diff hunks on a file's lines (standard library only).

Placement follows git's rules (apply.c), forward and in reverse alike:

- anchoring first: a hunk whose header starts at line 0 or 1 must match at the top of the file,
  and a hunk with no trailing context must match at its end (an end-of-file append fits only
  there, never in the middle of a file that already holds the appended lines);
- then the position the header says, else the nearest offset; two places at the same distance
  are ambiguous and the hunk fails, saying where (git would pick one silently);
- then, only when asked (`max_fuzz`), up to that many context lines dropped at either end, the
  anchoring dropped with them, as git's ``-C`` and GNU patch's fuzz do.

An offset or fuzz is reported with the result, never hidden: callers turn it into a warning.
The nearest-lines text of a failed hunk is only computed when asked (`nearest=True`), with the
similarity function given (difflib's ratio by default).
"""

from __future__ import annotations

import bisect
import difflib
import functools
import itertools
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Ratio = Callable[[str, str], float]  # similarity of two texts, 0.0 to 1.0

HunkStatus = Literal["exact", "offset", "fuzz", "failed"]


@dataclass(frozen=True)
class Hunk:
    """One hunk; `lines` holds (tag, text) with tag in ' ', '-', '+' and text without EOL."""

    index: int  # 1-based position in its file's diff
    old_start: int  # 1-based, as in the @@ header
    new_start: int
    lines: tuple[tuple[str, str], ...]
    section: str = ""  # the text after the second @@, often the enclosing def
    old_eof_newline: bool = True  # False when the old side ends with "\ No newline at end of file"
    new_eof_newline: bool = True

    def to_json(self) -> dict[str, Any]:
        """The hunk as an image manifest holds it (`from_json` reads it back in the image)."""
        return {
            "index": self.index,
            "old_start": self.old_start,
            "new_start": self.new_start,
            "lines": [list(pair) for pair in self.lines],
            "section": self.section,
            "old_eof_newline": self.old_eof_newline,
            "new_eof_newline": self.new_eof_newline,
        }

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Hunk:
        return cls(
            index=data["index"],
            old_start=data["old_start"],
            new_start=data["new_start"],
            lines=tuple((tag, text) for tag, text in data["lines"]),
            section=data.get("section", ""),
            old_eof_newline=data["old_eof_newline"],
            new_eof_newline=data["new_eof_newline"],
        )

    @property
    def old(self) -> list[str]:
        return list(self._sides[0])

    @property
    def new(self) -> list[str]:
        return list(self._sides[1])

    @functools.cached_property
    def _sides(self) -> tuple[list[str], list[str]]:
        """The old and new sides, made once: placing a hunk reads them many times (the
        placer never changes them; `old` and `new` hand out copies)."""
        old = [text for tag, text in self.lines if tag in " -"]
        new = [text for tag, text in self.lines if tag in " +"]
        return old, new

    @property
    def context(self) -> tuple[int, int]:
        """How many context lines lead and trail the changed lines."""
        changed = [i for i, (tag, _) in enumerate(self.lines) if tag != " "]
        if not changed:
            return 0, 0
        return changed[0], len(self.lines) - 1 - changed[-1]

    @functools.cached_property
    def pins(self) -> tuple[bool, bool]:
        """git's anchoring: (must match at the top, must match at the end of the file).

        A start at line 0 or 1 pins the hunk to the top; no trailing context pins it to the
        end (so a hunk with no context at all, from a ``-U0`` diff, fits only a whole file or
        the end of one, as with git without ``--unidiff-zero``).
        """
        return self.old_start <= 1, self.context[1] == 0

    @property
    def header(self) -> str:
        old, new = self.old, self.new
        return f"@@ -{self.old_start},{len(old)} +{self.new_start},{len(new)} @@"

    def reversed(self) -> Hunk:
        return self._reversed

    @functools.cached_property
    def _reversed(self) -> Hunk:
        swap = {" ": " ", "-": "+", "+": "-"}
        return Hunk(
            index=self.index,
            old_start=self.new_start,
            new_start=self.old_start,
            lines=tuple((swap[tag], text) for tag, text in self.lines),
            section=self.section,
            old_eof_newline=self.new_eof_newline,
            new_eof_newline=self.old_eof_newline,
        )


@dataclass(frozen=True)
class HunkResult:
    index: int
    status: HunkStatus
    line: int | None = None  # 1-based line in the file where the hunk's old side starts
    offset: int = 0
    fuzz: int = 0
    nearest_line: int | None = None  # for failed hunks: where the file looks most like it
    nearest: tuple[str, ...] = ()
    similarity: float = 0.0
    # for failed hunks: why, when it is not a plain mismatch; for a whole-file hunk (a file
    # deleted) what fitting means ("deletes the file", "the file is gone")
    detail: str = ""
    elsewhere: int | None = None  # an anchored hunk that failed: where its lines do fit

    def describe(self) -> str:
        if self.status == "exact" and self.detail:  # a whole-file hunk: a deletion
            return f"hunk #{self.index} {self.detail}"
        if self.status == "exact":
            return f"hunk #{self.index} exact at line {self.line}"
        if self.status == "offset":
            return f"hunk #{self.index} at line {self.line} (offset {self.offset:+d} lines)"
        if self.status == "fuzz":
            return (
                f"hunk #{self.index} at line {self.line} with fuzz {self.fuzz}"
                f" (offset {self.offset:+d} lines)"
            )
        if self.detail:
            return f"hunk #{self.index} does not match: {self.detail}"
        where = (
            f"; nearest lines {self.nearest_line}-{self.nearest_line + len(self.nearest) - 1}"
            f" ({self.similarity:.0%} alike)"
            if self.nearest_line is not None
            else ""
        )
        return f"hunk #{self.index} does not match{where}"


@dataclass(frozen=True)
class FileResult:
    hunks: tuple[HunkResult, ...]
    lines: tuple[str, ...] | None  # the new file's lines (no EOL) when every hunk applied
    eof_newline: bool = True

    @property
    def ok(self) -> bool:
        return self.lines is not None

    @property
    def clean(self) -> bool:
        return self.ok and all(h.status == "exact" for h in self.hunks)


def split_text(text: str) -> tuple[list[str], str, bool]:
    """Lines without EOL, the file's EOL ('\\n' or '\\r\\n') and whether it ends with one.

    Lines end at '\\n' only, as in a diff: a form feed, a lone '\\r' or U+2028 inside a line
    stays part of it (str.splitlines would cut the line there, and joining would add a newline).
    """
    if not text:
        return [], "\n", True
    lines = text.split("\n")
    ends = lines[-1] == ""
    if ends:
        lines.pop()
    if "\r" not in text:  # the common case: nothing to strip
        return lines, "\n", ends
    eol = "\r\n" if "\n" in text and lines[0].endswith("\r") else "\n"
    last = len(lines) - 1
    stripped = [
        line[:-1] if line.endswith("\r") and (i < last or ends) else line
        for i, line in enumerate(lines)
    ]
    return stripped, eol, ends


def join_text(lines: list[str] | tuple[str, ...], eol: str, eof_newline: bool) -> str:
    if not lines:
        return ""
    return eol.join(lines) + (eol if eof_newline else "")


def _matches(lines: list[str], at: int, want: list[str]) -> bool:
    # The first line first: a miss then costs one comparison, not a copy of the window.
    if want and (at >= len(lines) or lines[at] != want[0]):
        return False
    return lines[at : at + len(want)] == want


def _trim(hunk: Hunk, fuzz: int) -> tuple[list[str], list[str], int]:
    """The hunk's old/new sides with up to `fuzz` leading/trailing context lines dropped
    (not to be changed: without fuzz they are the hunk's own)."""
    if fuzz == 0:
        old, new = hunk._sides  # the placer's own view of the hunk, in this module
        return old, new, 0
    body = list(hunk.lines)
    top = 0
    while top < fuzz and top < len(body) and body[top][0] == " ":
        top += 1
    bottom = 0
    while bottom < fuzz and bottom < len(body) - top and body[len(body) - 1 - bottom][0] == " ":
        bottom += 1
    kept = body[top : len(body) - bottom]
    old = [t for tag, t in kept if tag in " -"]
    new = [t for tag, t in kept if tag in " +"]
    return old, new, top


def _search(
    lines: list[str], want: list[str], expected: int, floor: int
) -> tuple[int | None, int | None]:
    """The match position nearest `expected` at or after `floor`, or None; and a second match
    at the same distance on the other side, when there is one (the placement is ambiguous).

    Candidates are the places holding the hunk's longest line where it stands in the hunk
    (found by list.index, in C; a long line is rarely repeated, where a blank line or a lone
    bracket is all over a file), so a hunk that fits nowhere costs one scan of the file, not
    one comparison per offset."""
    last = len(lines) - len(want)
    expected = min(max(expected, floor), max(last, floor))
    if not want:
        return (expected, None) if floor <= expected <= last else (None, None)
    sizes = list(map(len, want))
    k = sizes.index(max(sizes))  # the first of the longest lines
    key, size = want[k], len(want)
    fits: list[int] = []
    at = floor + k  # a match starting at `start` holds `key` at start + k
    while at <= last + k:
        try:
            at = lines.index(key, at, last + k + 1)
        except ValueError:
            break
        start = at - k
        if lines[start : start + size] == want:
            fits.append(start)
        at += 1
    if not fits:
        return None, None
    fits.sort(key=lambda i: (abs(i - expected), i))
    best = fits[0]
    tie = next((i for i in fits[1:2] if abs(i - expected) == abs(best - expected)), None)
    return best, tie


def _votes(hits: list[tuple[int, int]], size: int, last: int) -> dict[int, int]:
    """Each hit at line i votes, with its weight, for every window start that would hold it:
    i - k for k < size, clamped to 0..last. Summed with a difference array, so a hunk of
    thousands of lines costs one pass, not one per line."""
    diff = [0] * (last + 2)
    for i, weight in hits:
        low, high = max(0, i - size + 1), min(last, i)
        if low <= high:
            diff[low] += weight
            diff[high + 1] -= weight
        diff[0] += weight * max(0, size - 1 - i)  # k > i: clamped up to 0
        diff[1] -= weight * max(0, size - 1 - i)
        clamped = max(0, min(size, i - last))  # i - k > last: clamped down to last
        diff[last] += weight * clamped
        diff[last + 1] -= weight * clamped
    votes: dict[int, int] = {}
    running = 0
    for start in range(last + 1):
        running += diff[start]
        if running:
            votes[start] = running
    return votes


def rank_windows(
    lines: list[str],
    want: list[str],
    limit: int = 3,
    *,
    ratio: Ratio | None = None,
    folded: list[str] | None = None,
) -> list[tuple[int, tuple[str, ...], float]]:
    """The windows of `lines` most like `want`, best first: (0-based start, window, similarity).

    Whitespace is ignored (`folded`: the lines whitespace-folded, when the caller has them).
    Only windows sharing a non-blank line with `want` are scored, which keeps this fast on
    large files; a file sharing none votes by the identifiers it shares with `want`.
    """
    if not want or not lines:
        return [(0, tuple(lines[:3]), 0.0)] if lines else []
    size = len(want)
    if folded is None:
        folded = [" ".join(line.split()) for line in lines]
    target = [" ".join(line.split()) for line in want]
    counts = Counter(folded)
    # Distinctive lines only (not blank, not ")" and not repeated all over the file).
    anchors = {line for line in target if len(line) > 3 and counts.get(line, 0) <= 5}
    last = max(0, len(lines) - size)
    hits = [(i, 1) for i, line in enumerate(folded) if line in anchors] if anchors else []
    joined = "\n".join(target)
    if not hits:  # no line survived: vote by shared identifiers instead
        hits = _shared_words(folded, set(_WORDS.findall(joined)))
    votes = _votes(hits, size, last)
    best_votes = sorted(votes, key=lambda st: (-votes[st], st))[: 4 * limit + 8] or [0]
    scored = []
    for start in best_votes:
        window = "\n".join(folded[start : start + size])
        scored.append(((ratio or _difflib_ratio)(joined, window), start))
    scored.sort(key=lambda item: (-item[0], item[1]))
    picked: list[tuple[int, tuple[str, ...], float]] = []
    for similarity, start in scored:
        if all(abs(start - other) >= size for other, _, _ in picked):
            picked.append((start, tuple(lines[start : start + size]), similarity))
        if len(picked) == limit:
            break
    return picked


_WORDS = re.compile(r"\w{4,}")


def _shared_words(folded: list[str], words: set[str]) -> list[tuple[int, int]]:
    """(line, how many of `words` it holds as whole identifiers of 4+ characters), for each
    line holding any: a plain search of the whole text per word, not one per line."""
    if not words:
        return []
    text = "\n".join(folded)
    # where each line starts in `text` (its length and a newline each; made in C)
    starts = list(itertools.accumulate(map((1).__add__, map(len, folded)), initial=0))
    found: dict[int, set[str]] = {}
    for word in words:  # each found by a plain search, kept where it is a whole identifier
        at = text.find(word)
        while at >= 0:
            end = at + len(word)
            if not (at and _word_char(text[at - 1])) and not (
                end < len(text) and _word_char(text[end])
            ):
                found.setdefault(bisect.bisect_right(starts, at) - 1, set()).add(word)
            at = text.find(word, at + 1)
    return [(line, len(held)) for line, held in sorted(found.items())]


def _word_char(c: str) -> bool:
    """Whether `c` is one of the characters `\\w` matches (str patterns)."""
    return c.isalnum() or c == "_"


def _difflib_ratio(a: str, b: str) -> float:
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    # ratio() is quadratic in the worst case: past a few pages, its cheap upper bound.
    return matcher.ratio() if len(a) + len(b) <= 40_000 else matcher.quick_ratio()


def nearest_window(
    lines: list[str], want: list[str], *, ratio: Ratio | None = None
) -> tuple[int, tuple[str, ...], float]:
    """Where `lines` looks most like `want`: 0-based start, the window, its similarity."""
    ranked = rank_windows(lines, want, limit=1, ratio=ratio)
    return ranked[0] if ranked else (0, (), 0.0)


def _places(work: list[str], old: list[str], floor: int) -> list[int]:
    return [i for i in range(floor, len(work) - len(old) + 1) if _matches(work, i, old)]


def _eof_pinned(hunk: Hunk, fuzz: int) -> bool:
    """Whether the hunk (with `fuzz` context lines dropped) ends at a missing final newline."""
    old, _, top = _trim(hunk, fuzz)
    untrimmed_end = len(old) + top == len(hunk.old)
    return untrimmed_end and not (hunk.old_eof_newline and hunk.new_eof_newline)


@dataclass(frozen=True)
class _Placement:
    at: int | None
    tie: int | None = None  # a second place as good as `at`: ambiguous
    pinned: str = ""  # "top" / "end" when anchoring decided, for the failure's reason


def _find(
    work: list[str], hunk: Hunk, fuzz: int, *, expected: int, floor: int, file_eof: bool
) -> _Placement:
    """Where the hunk's (trimmed) old side fits: anchored as git anchors it, else nearest to
    `expected`. A side marked "\\ No newline at end of file" fits only at the end of the file,
    and its old side only a file that lacks the newline too."""
    old, _, _ = _trim(hunk, fuzz)
    top, end = hunk.pins if fuzz == 0 else (False, False)  # fuzz drops the anchoring (git -C)
    if _eof_pinned(hunk, fuzz):
        end = True
        if not (hunk.old_eof_newline or not file_eof):
            return _Placement(None, pinned="end")
    if top and end:
        fits = floor == 0 and len(work) == len(old) and _matches(work, 0, old)
        return _Placement(0 if fits else None, pinned="whole")
    if top:
        return _Placement(0 if floor == 0 and _matches(work, 0, old) else None, pinned="top")
    if end:
        last = len(work) - len(old)
        fits = last >= floor and _matches(work, last, old)
        return _Placement(last if fits else None, pinned="end")
    at, tie = _search(work, old, expected, floor)
    return _Placement(at, tie)


def _unpinned(work: list[str], hunk: Hunk, floor: int, pinned: str) -> tuple[int | None, str]:
    """Why an anchored hunk failed when its lines do fit elsewhere: (0-based line, reason)."""
    at, _ = _search(work, hunk.old, hunk.old_start - 1, floor)
    if at is None or not hunk.old:
        return None, ""
    where = {
        "top": "at the top of the file, as a hunk starting at line 1 must",
        "end": "at the end of the file, as a hunk with no trailing context must",
        "whole": "as the whole file",
    }[pinned]
    return at, f"its lines fit at line {at + 1}, not {where}"


def _failure(
    work: list[str], hunk: Hunk, floor: int, pinned: str, *, nearest: bool, ratio: Ratio | None
) -> HunkResult:
    at, hint = _unpinned(work, hunk, floor, pinned) if pinned else (None, "")
    if hint or not nearest:
        # Only lines the hunk changes make a match elsewhere evidence of the change itself;
        # a side of context alone (a reversed deletion) proves nothing.
        changes = any(tag == "-" for tag, _ in hunk.lines)
        where = at + 1 if at is not None and changes else None
        return HunkResult(hunk.index, "failed", detail=hint, elsewhere=where)
    near_at, near, similarity = nearest_window(work, hunk.old, ratio=ratio)
    return HunkResult(
        hunk.index, "failed", nearest_line=near_at + 1, nearest=near, similarity=similarity
    )


def apply_hunks(
    lines: list[str],
    hunks: tuple[Hunk, ...],
    *,
    max_fuzz: int = 0,
    eof_newline: bool = True,
    nearest: bool = True,
    unique: bool = False,
    ratio: Ratio | None = None,
) -> FileResult:
    """Apply hunks in order to a copy of `lines`; never raises for a mismatch.

    A hunk fitting equally well in two places fails, saying where. With `unique`, a hunk that
    fits in more than one place at all fails: a revert must not guess which of two equal places
    it once changed. `nearest` computes, for failed hunks, where the file looks most like
    them (the costly part of a failure), with `ratio` as the similarity.
    """
    work = list(lines)
    results: list[HunkResult] = []
    shift = 0  # how far earlier hunks moved the text
    floor = 0
    failed = False
    new_eof = eof_newline
    for hunk in hunks:
        placed = None
        tie: int | None = None
        pinned = ""
        anchored = False  # the placement was decided by anchoring: there is no other place
        for fuzz in range(max_fuzz + 1):
            old, new, top = _trim(hunk, fuzz)
            if fuzz and len(old) == len(hunk.old):
                continue  # nothing left to drop: fuzz would only repeat the search
            start = hunk.old_start - 1 if hunk.old else hunk.old_start
            expected = start + shift + top
            found = _find(work, hunk, fuzz, expected=expected, floor=floor, file_eof=new_eof)
            pinned = pinned or found.pinned
            if found.at is not None:
                placed = (found.at, old, new, fuzz, found.at - expected)
                tie, anchored = found.tie, bool(found.pinned)
                break
        if placed is not None and tie is not None:
            where = f"{placed[0] + 1} and {tie + 1}"
            detail = f"it fits equally well at lines {where}: ambiguous, none picked"
            results.append(HunkResult(hunk.index, "failed", detail=detail))
            failed = True
            continue
        ambiguous = placed is not None and unique and not anchored
        if placed is not None and ambiguous and len(_places(work, placed[1], floor)) > 1:
            where = " and ".join(str(i + 1) for i in _places(work, placed[1], floor)[:3])
            results.append(HunkResult(hunk.index, "failed", detail=f"it fits at lines {where}"))
            failed = True
            continue
        if placed is None:
            failed = True
            results.append(_failure(work, hunk, floor, pinned, nearest=nearest, ratio=ratio))
            continue
        at, old, new, fuzz, offset = placed
        status: HunkStatus = "fuzz" if fuzz else ("offset" if offset else "exact")
        results.append(HunkResult(hunk.index, status, line=at + 1, offset=offset, fuzz=fuzz))
        work[at : at + len(old)] = new
        shift += len(new) - len(old) + offset
        floor = at + len(new)
        if at + len(new) == len(work) and not hunk.new_eof_newline:
            new_eof = False
        elif at + len(new) == len(work) and not hunk.old_eof_newline:
            new_eof = True
    return FileResult(tuple(results), None if failed else tuple(work), new_eof)
