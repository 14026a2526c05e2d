"""The lines a runtime patch's sites change, known from where each site edits (no diff of the
whole file made): the spans of the file's own lines, as a line diff of the file before and
after gives them. The pair refusal (`engine/pairs.py`) reads them."""

from __future__ import annotations

import difflib
import functools
import re

Span = tuple[int, int]  # [start, end) of a file's own lines; start == end: an insertion there
# Line breaks `str.splitlines` knows that `split_text` does not cut at (a lone CR, a form
# feed, ...): a file holding one has other line numbers there, and no spans are given for it.
_OTHER_BREAKS = re.compile("[\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029]|\r(?!\n)")
_BREAK_CHARS = "\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029\r"


@functools.lru_cache(maxsize=128)
def other_breaks(text: str) -> bool:
    """Whether `str.splitlines` cuts the text where `split_text` does not (once a content)."""
    if not any(c in text for c in _BREAK_CHARS):  # the common case: a scan per character
        return False
    return _OTHER_BREAKS.search(text) is not None


def clear_caches() -> None:
    other_breaks.cache_clear()


def of_site(
    old: list[str],
    new: list[str],
    splice: tuple[int, int, int],
    earlier: list[tuple[int, int, int]],
) -> list[Span | None]:
    """The spans of the file's own lines one site's edit changes: the lines it replaced
    (`splice`: at, size, count) against the lines it put in, diffed alone (a replace that
    keeps a line of its anchor changes the lines around it, as a diff of the file says),
    then carried back through the `earlier` edits of the same file to its own lines."""
    at, size, count = splice
    was, now = old[at : at + size], new[at : at + count]
    put = _put_beside(was, now)
    if put is not None:
        return [carried_back((at + put, at + put), earlier)]
    matcher = difflib.SequenceMatcher(None, was, now, False)
    return [
        carried_back((at + i1, at + i2), earlier)
        for tag, i1, i2, _, _ in matcher.get_opcodes()
        if tag != "equal"
    ]


def _put_beside(was: list[str], now: list[str]) -> int | None:
    """Where lines were only put in, right after `was` (`size`) or right before it (0), none
    of them one of `was`'s: the one way a line diff can match them. None: otherwise."""
    if len(now) <= len(was) or not was:
        return None
    size = len(was)
    if now[:size] == was:
        put, at = now[size:], size
    elif now[-size:] == was:
        put, at = now[:-size], 0
    else:
        return None
    return None if set(put) & set(was) else at


def carried_back(span: Span, earlier: list[tuple[int, int, int]]) -> Span | None:
    """`span` of lines after the `earlier` edits as a span of the lines before them; None
    when an end falls inside an earlier edit's new lines (a site editing another's text: a
    line diff of the file tells what it changed)."""
    start, end = span
    for at, size, count in reversed(earlier):
        if at < start < at + count or at < end < at + count:
            return None
        moved = count - size
        start -= moved if start >= at + count else 0
        end -= moved if end >= at + count else 0
    return start, end


def merged(spans: list[Span]) -> tuple[Span, ...]:
    """Spans in order, those that touch made one (a line diff has an equal line between two)."""
    out: list[Span] = []
    for start, end in sorted(spans):
        if out and start <= out[-1][1]:
            out[-1] = (out[-1][0], max(end, out[-1][1]))
        else:
            out.append((start, end))
    return tuple(out)


__all__ = ["Span", "carried_back", "clear_caches", "merged", "of_site", "other_breaks"]
