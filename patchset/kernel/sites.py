"""Runtime patch sites: anchored edits with markers (standard library only).

A site names a file, an anchor (one or more lines that must occur exactly once, compared with
runs of whitespace folded so re-indented code still matches), an action and the text to put in.
The edit carries a marker comment, so a second run finds the edit and does nothing.

One indentation rule: the anchor and the text are shifted together, by the file's indentation
of the anchor's first line minus that line's indentation as written. An anchor copied from the
file with its own indentation (shift zero) puts the text in exactly as written; a hand-written
site at column 0 is shifted to where its anchor stands.

Richer sites: `optional` (skipped alone when no anchor matches), alternative anchors (the
first that matches wins), a per-site upstream `probe` (that site alone is skipped as
upstream), an `after` block that scopes the anchor to the first match after it, and `when`
conditions on the served configuration.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import functools
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Literal, TypeVar, get_args

from .filelines import FileLines, Lines, as_view, find_block, fold
from .hunks import Ratio, rank_windows
from .served import WHEN_KEYS, parse_served, served_from_args

SiteAction = Literal["replace", "insert-after", "insert-before"]
ACTIONS: tuple[SiteAction, ...] = get_args(SiteAction)
INEXACT = (
    "the anchor matched only with whitespace folded: its original lines are kept in the marker,"
    " so a revert restores them byte for byte"
)
SiteStatus = Literal[
    "applies", "already-applied", "anchor-not-found", "ambiguous", "tampered", "upstream", "skipped"
]
# Statuses that let the patch go on: the site is (or can be) in place, or is rightly left out.
GOOD: tuple[SiteStatus, ...] = ("applies", "already-applied", "upstream", "skipped")
_L = TypeVar("_L", list[str], FileLines)  # what `apply_site` is given, it gives back
_ORIGINAL = " [patchset-original:"  # after the marker: the anchor's own lines, when not exact


@dataclass(frozen=True)
class SiteProbe:
    """A site's own upstream probe, over the site's file."""

    contains: tuple[str, ...] = ()  # every string must occur
    any: tuple[str, ...] = ()  # at least one must occur (when given)
    regex: str | None = None

    def matches(self, text: str) -> bool:
        if not all(needle in text for needle in self.contains):
            return False
        if self.any and not any(needle in text for needle in self.any):
            return False
        return self.regex is None or re.search(self.regex, text, re.MULTILINE) is not None

    def matches_lines(self, view: FileLines) -> bool:
        """`matches` of the lines' text, answered without joining it where a needle (one
        line's worth) is surely absent: an edited file's text is the whole file again, for
        every site with a probe after the first edit of it."""
        if any("\n" not in needle and not view.holds(needle) for needle in self.contains):
            return False
        if self.any and all("\n" not in needle and not view.holds(needle) for needle in self.any):
            return False
        return self.matches(view.text)

    def describe(self) -> str:
        what = [repr(c) for c in self.contains]
        if self.any:
            what.append("any of " + ", ".join(repr(a) for a in self.any))
        if self.regex:
            what.append(f"/{self.regex}/")
        return " and ".join(what)


@dataclass(frozen=True)
class Alternative:
    """Another upstream shape of the same code: its anchor, and its text (the site's if "")."""

    anchor: str
    text: str | None = None
    after: str | None = None

    def shape(self, site_text: str, index: int) -> _Shape:
        """This anchor with its text, the site's when it gives none, as alternative `index`."""
        return _Shape(self.anchor, site_text if self.text is None else self.text, self.after, index)


@dataclass(frozen=True)
class Site:
    name: str
    file: str
    anchor: str
    action: SiteAction
    text: str
    marker: str
    optional: bool = False
    after: str | None = None
    alternatives: tuple[Alternative, ...] = ()
    probe: SiteProbe | None = None
    when: tuple[tuple[str, tuple[str, ...]], ...] = ()
    requires_modules: tuple[str, ...] = ()  # modules its text imports (support packages)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Site:
        """A site from `dataclasses.asdict` output (an image manifest's JSON)."""
        probe = data.get("probe")
        return cls(
            name=data["name"],
            file=data["file"],
            anchor=data["anchor"],
            action=data["action"],
            text=data["text"],
            marker=data["marker"],
            optional=bool(data.get("optional", False)),
            after=data.get("after"),
            alternatives=tuple(Alternative(**alt) for alt in data.get("alternatives", ())),
            probe=None
            if probe is None
            else SiteProbe(tuple(probe["contains"]), tuple(probe["any"]), probe.get("regex")),
            when=tuple((key, tuple(values)) for key, values in data.get("when", ())),
            requires_modules=tuple(data.get("requires_modules", ())),
        )

    @property
    def anchor_lines(self) -> list[str]:
        return _block(self.anchor)

    @property
    def marker_line(self) -> str:
        return f"# {self.marker}"

    def edited_lines(self) -> list[str]:
        """The block that stands in the file once the site is applied, as written."""
        return _Shape(self.anchor, self.text, self.after, 0).edited(self)

    def shapes(self) -> list[_Shape]:
        return list(self._shapes)

    @functools.cached_property
    def _shapes(self) -> tuple[_Shape, ...]:
        """The site's own anchor and its alternatives, made once (every release reads them)."""
        alternatives = [alt.shape(self.text, k) for k, alt in enumerate(self.alternatives, 1)]
        return (_Shape(self.anchor, self.text, self.after, 0), *alternatives)

    def when_holds(self, served: Mapping[str, str] | None) -> bool:
        """Whether the served configuration meets `when` (None: unknown, taken as met)."""
        if served is None:
            return True
        return all(served.get(key, "").lower() in values for key, values in self.when)

    def describe_when(self) -> str:
        return ", ".join(f"{key} in {list(values)}" for key, values in self.when)


@dataclass(frozen=True)
class _Shape:
    """One anchor of a site (its own, or an alternative) with the text that goes with it."""

    anchor: str
    text: str
    after: str | None
    index: int  # 0: the site's own anchor; k: alternative k

    @property
    def anchor_lines(self) -> list[str]:
        return list(self._anchor)

    @property
    def text_lines(self) -> list[str]:
        return list(self._text)

    @functools.cached_property
    def _anchor(self) -> tuple[str, ...]:
        return tuple(_block(self.anchor))

    @functools.cached_property
    def _text(self) -> tuple[str, ...]:
        return tuple(_block(self.text))

    @functools.cached_property
    def _after(self) -> tuple[str, ...]:
        return tuple(_block(self.after)) if self.after is not None else ()

    def edited(self, site: Site) -> list[str]:
        text = self._text
        first = next((line for line in text if line.strip()), "")
        marker = [_indent(first) + site.marker_line]
        if site.action == "replace":
            return [*marker, *text]
        if site.action == "insert-after":
            return [*self._anchor, *marker, *text]
        return [*marker, *text, *self._anchor]

    def label(self) -> str:
        return "its anchor" if self.index == 0 else f"alternative {self.index}"


@dataclass(frozen=True)
class Candidate:
    line: int  # 1-based
    similarity: float
    lines: tuple[str, ...]

    def nearest(self) -> tuple[int, str] | None:
        """The first non-blank line of the window and its 1-based number."""
        for offset, text in enumerate(self.lines):
            if text.strip():
                return self.line + offset, text.strip()
        return None


@dataclass(frozen=True)
class SiteResult:
    site: str
    file: str
    status: SiteStatus
    line: int | None = None  # 1-based line of the anchor (or of the edit, when applied)
    candidates: tuple[Candidate, ...] = ()
    detail: str = ""
    alternative: int = 0  # which anchor matched: 0 the site's own, k alternative k
    exact: bool = True  # revert: the original bytes were restored (known, not assumed)
    optional: bool = False

    def describe(self) -> str:
        if self.status in ("applies", "already-applied"):
            notes = [f"alternative {self.alternative}"] if self.alternative else []
            notes += [self.detail] if self.detail else []
            note = f" ({'; '.join(notes)})" if notes else ""
            return f"site {self.site}: {self.status} at {self.file}:{self.line}{note}"
        if self.status in ("upstream", "skipped"):
            return f"site {self.site}: {self.status} ({self.detail})"
        near = ""
        best = self.candidates[0].nearest() if self.candidates else None
        if best is not None:
            line, text = best
            similarity = self.candidates[0].similarity
            near = f"; nearest {self.file}:{line} ({similarity:.0%} alike): {text!r}"
        extra = f" ({self.detail})" if self.detail else ""
        return f"site {self.site}: {self.status} in {self.file}{extra}{near}"


def _block(text: str) -> list[str]:
    """The lines of a multi-line TOML string as written, without leading/trailing blank lines."""
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    while lines and not lines[0].strip():
        lines.pop(0)
    while lines and not lines[-1].strip():
        lines.pop()
    return lines


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def shift(lines: list[str], written: str, actual: str) -> list[str]:
    """`lines` moved from indentation `written` (the anchor's first line as written) to
    `actual` (that line's indentation in the file): every line by the same amount, so lines
    less indented than the anchor's first line keep their place relative to it."""
    if written == actual:
        return list(lines)
    out = []
    for line in lines:
        if not line.strip():
            out.append("")
        elif actual.startswith(written):  # deeper: every line gains the difference
            out.append(actual[len(written) :] + line)
        elif written.startswith(actual):  # shallower: every line loses it, as far as it can
            cut = written[len(actual) :]
            out.append(line[len(cut) :] if line.startswith(cut) else line.lstrip())
        elif line.startswith(written):  # tabs against spaces: swap the anchor's prefix
            out.append(actual + line[len(written) :])
        else:
            out.append(line)
    return out


def _find_shape(lines: FileLines, shape: _Shape) -> tuple[list[int], str]:
    """Where the shape's anchor matches (scoped by `after`), and why not when it does not."""
    anchor = list(shape._anchor)
    if shape.after is None:
        return find_block(lines, anchor), ""
    after = list(shape._after)
    scope = find_block(lines, after)
    if not scope:
        return [], f"{shape.label()}: its 'after' {after[0].strip()!r} is not found"
    found = find_block(lines, anchor, start=scope[0] + len(after))
    return found[:1], "" if found else f"{shape.label()}: no match after line {scope[0] + 1}"


def is_marker(line: str, site: Site) -> bool:
    text = line.strip()
    return text == site.marker_line or text.startswith(site.marker_line + _ORIGINAL)


def _markers(site: Site, view: FileLines) -> list[int]:
    """The 0-based lines holding the site's marker: none, in the common case, is known from
    one search of the whole text (a marker line holds the marker's text)."""
    if not view.holds(site.marker_line):
        return []
    return [i for i, line in enumerate(view.lines) if is_marker(line, site)]


def _original(line: str) -> list[str] | None:
    """The anchor's own lines kept in a marker line, if the marker carries them."""
    at = line.find(_ORIGINAL)
    if at < 0 or not line.rstrip().endswith("]"):
        return None
    raw = line[at + len(_ORIGINAL) : line.rstrip().rfind("]")]
    try:
        value = json.loads(base64.b64decode(raw, validate=True).decode("utf-8", "surrogateescape"))
    except (ValueError, binascii.Error, UnicodeError):
        return None
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        return None
    return value


def _with_original(marker: str, original: list[str]) -> str:
    data = json.dumps(original).encode("utf-8", "surrogateescape")
    return f"{marker}{_ORIGINAL}{base64.b64encode(data).decode('ascii')}]"


def _edit_at(site: Site, view: FileLines, at: int) -> tuple[_Shape, int] | None:
    """The shape whose edit stands around the marker at line `at`, and the edit's start."""
    for shape in site._shapes:
        edited = shape.edited(site)
        before = len(shape._anchor) if site.action == "insert-after" else 0
        start = at - before
        if start < 0:
            continue
        want = [fold(line) for line in edited]
        got = view.folds(start, start + len(edited))
        # Every line but the marker's (which may carry the anchor's original lines).
        if (
            len(got) == len(want)
            and got[:before] + got[before + 1 :] == want[:before] + want[before + 1 :]
        ):
            return shape, start
    return None


@dataclass(frozen=True)
class _Found:
    result: SiteResult
    shape: _Shape | None = None
    at: int = 0  # 0-based start of the anchor (applies) or of the edit (already-applied)


def _locate(
    site: Site,
    view: FileLines,
    served: Mapping[str, str] | None,
    *,
    reverting: bool = False,
    nearest: bool = True,
    ratio: Ratio | None = None,
) -> _Found:
    markers = _markers(site, view)
    for at in markers[:1] if len(markers) == 1 else ():
        edit = _edit_at(site, view, at)
        if edit is not None:
            shape, start = edit
            result = SiteResult(
                site.name, site.file, "already-applied", line=start + 1, alternative=shape.index
            )
            return _Found(result, shape, start)
    if markers:
        where = ", ".join(str(i + 1) for i in markers)
        detail = (
            f"marker found at line {where} but the edit around it differs"
            if len(markers) == 1
            else f"its marker is at lines {where}"
        )
        return _Found(
            SiteResult(site.name, site.file, "tampered", line=markers[0] + 1, detail=detail)
        )
    if reverting:
        return _Found(SiteResult(site.name, site.file, "anchor-not-found", detail="not applied"))
    if not site.when_holds(served):
        given = ", ".join(f"{k}={v}" for k, v in sorted((served or {}).items())) or "nothing"
        detail = f"when {site.describe_when()}; served: {given}"
        return _Found(SiteResult(site.name, site.file, "skipped", detail=detail))
    if site.probe is not None and site.probe.matches_lines(view):
        detail = f"its probe matches: {site.probe.describe()}"
        return _Found(SiteResult(site.name, site.file, "upstream", detail=detail))
    reasons: list[str] = []
    for shape in site._shapes:
        found, why = _find_shape(view, shape)
        if len(found) == 1:
            result = SiteResult(
                site.name, site.file, "applies", line=found[0] + 1, alternative=shape.index
            )
            return _Found(result, shape, found[0])
        if len(found) > 1:
            where = ", ".join(str(i + 1) for i in found)
            detail = f"{shape.label()} matches at lines {where}"
            return _Found(SiteResult(site.name, site.file, "ambiguous", detail=detail))
        if why:
            reasons.append(why)
    if site.optional:
        detail = "optional: no anchor matches" + (f"; {'; '.join(reasons)}" if reasons else "")
        return _Found(SiteResult(site.name, site.file, "skipped", detail=detail, optional=True))
    if site.alternatives:
        reasons.insert(0, f"none of {len(site.alternatives) + 1} anchors matches")
    # The nearest lines: the costly part of a miss, only when it will be shown.
    ranked = (
        rank_windows(view.lines, site.anchor_lines, limit=3, ratio=ratio, folded=view.folded)
        if nearest
        else []
    )
    return _Found(
        SiteResult(
            site.name,
            site.file,
            "anchor-not-found",
            candidates=tuple(Candidate(start + 1, ratio, win) for start, win, ratio in ranked),
            detail="; ".join(reasons),
        )
    )


def check_site(
    site: Site,
    lines: Lines,
    served: Mapping[str, str] | None = None,
    *,
    ratio: Ratio | None = None,
    nearest: bool = True,
) -> SiteResult:
    """Where the site stands in `lines`, without changing anything.

    `served` is the served configuration for `when` (None: unknown, every site is looked at).
    `nearest`: an anchor not found gets the nearest lines of the file (with `ratio` as the
    similarity; difflib's by default), the costly part of a miss: only when it is shown.
    """
    return _locate(site, as_view(lines), served, nearest=nearest, ratio=ratio).result


def apply_site(
    site: Site,
    lines: _L,
    served: Mapping[str, str] | None = None,
    *,
    nearest: bool = True,
    ratio: Ratio | None = None,
) -> tuple[SiteResult, _L]:
    """The site's result and the new lines (unchanged unless the result is 'applies'): a
    list for a list, a `FileLines` (sharing the folding of the lines kept) for one."""
    view = as_view(lines)
    found = _locate(site, view, served, nearest=nearest, ratio=ratio)
    result, shape, at = found.result, found.shape, found.at
    if result.status != "applies" or shape is None:
        return result, lines
    result, new, size = _edit(site, shape, view.lines, at, result)
    return result, _spliced(lines, at, size, new)


def _spliced(lines: Lines, at: int, size: int, new: list[str]) -> Any:
    """`lines` with lines[at:at+size] replaced by `new`, of the type given (Any: mypy does
    not narrow the constrained type variable of `apply_site`)."""
    if isinstance(lines, FileLines):
        return lines.edited(at, size, new)
    return [*lines[:at], *new, *lines[at + size :]]


def _edit(
    site: Site, shape: _Shape, lines: list[str], at: int, result: SiteResult
) -> tuple[SiteResult, list[str], int]:
    """The lines that replace the anchor's `size` lines at `at`."""
    anchor = list(shape._anchor)
    size = len(anchor)
    written, actual = _indent(anchor[0]), _indent(lines[at])
    text = shift(list(shape._text), written, actual)
    if site.action == "insert-after" and lines[at + size - 1].rstrip().endswith(":"):
        # The anchor opens a block (a def, an if): text not written inside it goes into it.
        opener = _indent(lines[at + size - 1])
        first = next((line for line in text if line.strip()), "")
        following = next((line for line in lines[at + size :] if line.strip()), None)
        if first and len(_indent(first)) <= len(opener) and following is not None:
            text = shift(text, _indent(first), _indent(following))
    first = next((line for line in text if line.strip()), "")
    marker = (_indent(first) if first else actual) + site.marker_line
    own = lines[at : at + size]
    if site.action == "replace":
        new = [marker, *text]
        if own != shift(anchor, written, actual):
            # Matched with whitespace folded: keep the file's own lines for a byte-exact revert.
            new[0] = _with_original(marker, own)
            result = dataclasses.replace(result, detail=INEXACT)
        elif _rebuilt(shape, new, 0) != own:
            # Exact, but the text does not tell where the anchor stood (tabs against spaces,
            # a text less indented than the anchor): keep its lines too, quietly.
            new[0] = _with_original(marker, own)
    elif site.action == "insert-after":
        new = [*own, marker, *text]
    else:
        new = [marker, *text, *own]
    return result, new, size


def revert_site(site: Site, lines: list[str]) -> tuple[SiteResult, list[str]]:
    """Undo an applied site: status 'already-applied' means it was found and removed.

    `exact` in the result says whether the lines put back are known to be the file's own:
    applying the site again to them gives back the very lines it found.
    """
    found = _locate(site, as_view(lines), None, reverting=True)
    result, shape, at = found.result, found.shape, found.at
    if result.status != "already-applied" or shape is None:
        return result, lines
    edited = shape.edited(site)
    anchor = shape.anchor_lines
    if site.action == "replace":
        kept = _original(lines[at])
        if kept is not None and len(kept) == len(anchor):
            original = kept
        else:
            original = _rebuilt(shape, lines, at)
    elif site.action == "insert-after":
        original = lines[at : at + len(anchor)]
    else:
        original = lines[at + len(edited) - len(anchor) : at + len(edited)]
    reverted = [*lines[:at], *original, *lines[at + len(edited) :]]
    plain = dataclasses.replace(site, probe=None, when=(), optional=False)
    again = apply_site(plain, reverted)[1]
    return dataclasses.replace(result, exact=again == lines), reverted


def _rebuilt(shape: _Shape, lines: list[str], at: int) -> list[str]:
    """A replace's anchor as it stood, rebuilt from its edit (marker at `at`)."""
    anchor = shape.anchor_lines
    return shift(anchor, _indent(anchor[0]), _anchor_indent(shape, lines, at))


def _anchor_indent(shape: _Shape, lines: list[str], at: int) -> str:
    """Where a replace's anchor stood (its first line's indentation in the file), from how
    far its text was shifted; the marker line stands at the text's first line."""
    text = shape.text_lines
    written_anchor = _indent(shape.anchor_lines[0])
    first = next((line for line in text if line.strip()), None)
    if first is None:
        return _indent(lines[at])
    written, actual = _indent(first), _indent(lines[at])
    if actual.endswith(written):  # shifted deeper (or not at all)
        return written_anchor + actual[: len(actual) - len(written)]
    if written.endswith(actual):  # shifted shallower
        cut = written[: len(written) - len(actual)]
        return written_anchor.removesuffix(cut) if written_anchor.endswith(cut) else ""
    return actual


__all__ = [
    "ACTIONS",
    "GOOD",
    "WHEN_KEYS",
    "Alternative",
    "Candidate",
    "FileLines",
    "Site",
    "SiteAction",
    "SiteProbe",
    "SiteResult",
    "SiteStatus",
    "apply_site",
    "check_site",
    "find_block",
    "parse_served",
    "revert_site",
    "served_from_args",
    "shift",
]
