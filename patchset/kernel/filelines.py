"""A file's lines as anchored sites read them (standard library only): each line compared
with runs of whitespace folded, and anchors looked up by their first line.

What every site of every patch on a file shares is made once per file, and only as far as
it is asked for: a line is folded when a site looks at it, and an anchor's first line is
found by searching the file's text for its longest word (a line whose folded text is the
anchor's holds each of its words), not by folding every line. An edit makes a new
`FileLines` (`edited`) that folds only the lines it puts in and finds the others through
the one it came from.
"""

from __future__ import annotations

_DEPTH = 16  # edits kept as a chain; a longer one starts afresh (every look-up walks it)


def fold(line: str) -> str:
    """The line with every run of whitespace one space, none at either end."""
    return " ".join(line.split())


class FileLines:
    """A file's lines and what sites share of them (see the module). Never changed in place."""

    __slots__ = (
        "_all",
        "_broken",
        "_depth",
        "_folds",
        "_found",
        "_held",
        "_parent",
        "_splice",
        "_text",
        "lines",
    )

    def __init__(self, lines: list[str]) -> None:
        self.lines = lines  # not to be changed while this object is in use
        self._folds: dict[int, str] = {}  # line: its folded text, for the lines looked at
        self._found: dict[str, list[int]] = {}  # `where`'s answers so far (sites share them)
        self._held: dict[str, bool] = {}  # `holds`' answers so far, for a file's own lines
        self._text: str | None = None
        self._all: list[str] | None = None  # every line folded, once asked for
        self._broken: bool | None = None  # whether a line holds a "\n" (known once asked)
        self._parent: FileLines | None = None  # the lines this came from, while chained
        # The edit that made these: lines[at:at+size] of those replaced by `count` lines.
        self._splice: tuple[int, int, int] | None = None
        self._depth = 0

    def edited(self, at: int, size: int, new: list[str]) -> FileLines:
        """These lines with lines[at:at+size] replaced by `new`."""
        out = FileLines([*self.lines[:at], *new, *self.lines[at + size :]])
        out._splice = (at, size, len(new))
        if self._depth < _DEPTH:  # else the chain starts afresh: its lines folded anew
            out._parent, out._depth = self, self._depth + 1
        return out

    @property
    def splice(self) -> tuple[int, int, int] | None:
        """The edit that made these lines from the ones they came from (`edited`): its
        0-based start, the lines it replaced and the lines it put in; None for a file's own."""
        return self._splice

    def fold_at(self, i: int) -> str:
        """Line `i` (0-based) folded."""
        found = self._folds.get(i)
        if found is not None:
            return found
        parent, splice = self._parent, self._splice
        if parent is None or splice is None:
            found = fold(self.lines[i])
        else:
            at, size, count = splice
            if i < at:
                found = parent.fold_at(i)
            elif i < at + count:
                found = fold(self.lines[i])
            else:
                found = parent.fold_at(i - count + size)
        self._folds[i] = found
        return found

    def folds(self, start: int, stop: int) -> list[str]:
        """Lines start..stop (0-based, stop excluded, cut at the end) folded."""
        return [self.fold_at(i) for i in range(start, min(stop, len(self.lines)))]

    @property
    def folded(self) -> list[str]:
        """Every line folded (a whole-file look, e.g. for the nearest lines of a miss): made
        once, the same list each time (not to be changed)."""
        if self._all is None:
            parent, splice = self._parent, self._splice
            if parent is None or splice is None:
                self._all = [self._folds.get(i) or fold(x) for i, x in enumerate(self.lines)]
            else:  # the lines kept from the one these came from, folded there
                at, size, count = splice
                above = parent.folded
                self._all = [*above[:at], *self.folds(at, at + count), *above[at + size :]]
        return self._all

    @property
    def text(self) -> str:
        if self._text is None:
            self._text = "\n".join(self.lines)
        return self._text

    def holds(self, needle: str) -> bool:
        """Whether some line holds `needle` (no line break in it): False for certain when the
        text this came from and the lines the edits put in do not; it may say True else."""
        if self._parent is None or self._splice is None:  # a search of the whole text, once
            held = self._held.get(needle)
            if held is None:
                held = self._held[needle] = needle in self.text
            return held
        at, _, count = self._splice
        return self._parent.holds(needle) or any(needle in x for x in self.lines[at : at + count])

    def where(self, folded: str) -> list[int]:
        """The 0-based lines whose folded text is `folded`, in order (the same list for the
        same line asked again: not to be changed). Every patch on a file in a release reads
        the same `FileLines`, and anchors' first lines recur (patches that build on another
        anchor where it does), so each is searched for once."""
        found = self._found.get(folded)
        if found is None:
            found = self._found[folded] = self._where(folded)
        return found

    def _where(self, folded: str) -> list[int]:
        if self._parent is None or self._splice is None:
            return self._search(folded)
        at, size, count = self._splice
        moved = count - size
        kept = [
            i if i < at else i + moved
            for i in self._parent.where(folded)
            if i < at or i >= at + size
        ]
        new = [at + k for k in range(count) if self.fold_at(at + k) == folded]
        return sorted(kept + new)

    def _search(self, folded: str) -> list[int]:
        word = max(folded.split(" "), key=len)
        text = self.text
        if self._broken is None:  # a line holding a line break would throw the count off
            self._broken = text.count("\n") != len(self.lines) - 1
        if not word or self._broken:  # a blank line (or such lines): every line looked at
            return [i for i in range(len(self.lines)) if self.fold_at(i) == folded]
        out = []
        line = done = 0  # the line holding text[done], counted up to there
        at = text.find(word)
        while at >= 0:
            line += text.count("\n", done, at)
            if self.fold_at(line) == folded:
                out.append(line)
            done = text.find("\n", at) + 1  # the next line on
            if not done:
                break
            line += 1
            at = text.find(word, done)
        return out


Lines = list[str] | FileLines


def as_view(lines: Lines) -> FileLines:
    """The lines as a `FileLines` (made for a plain list)."""
    return lines if isinstance(lines, FileLines) else FileLines(lines)


def find_block(lines: Lines, block: list[str], start: int = 0) -> list[int]:
    """Every 0-based start (from `start` on) where `block` matches, lines whitespace-folded."""
    want = [fold(line) for line in block]
    if not want:
        return []
    found = as_view(lines)
    size = len(want)
    return [i for i in found.where(want[0]) if i >= start and found.folds(i, i + size) == want]


__all__ = ["FileLines", "Lines", "as_view", "find_block", "fold"]
