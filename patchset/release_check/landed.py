"""Whether a release holds a patch's change already, hunk by hunk, and what an edit deletes.

- `landed`: per hunk (a diff patch) or site (a runtime patch), whether the lines it adds
  are in the release's file already (whitespace folded, in order, close together). A change
  that landed is `upstream` for that hunk: refreshing it would merge the patch into code
  that holds its own change, and a merge of that kind deletes or doubles upstream's lines.
- `unexpected_deletions`: lines a refreshed variant removes from the release that the
  original patch never removed (from its base release), and Python files it leaves
  uncompilable. Either refuses the refresh (`patchset.refresh.landed`), the lines named.

The check reads `landed` too: a probe that matches where no hunk or site has landed is
weighed, not believed (`verdicts.probe_matches_unfixed`).
"""

from __future__ import annotations

import difflib
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass

from patchset.kernel.hunks import split_text
from patchset.kernel.pycompile import broken_by
from patchset.registry import Variant

MIN_CHARS = 4  # a folded line shorter than this (")", "else:") is no evidence on its own
MIN_TOTAL = 16  # nor are added lines this short in all ("x = 1"): too likely found by chance


@dataclass(frozen=True)
class Landed:
    """One hunk or site: whether the release holds the lines it adds, and where."""

    what: str  # "vllm/x.py#2" (a hunk) or "vllm/x.py site NAME"
    file: str
    present: bool
    line: int | None = None  # 1-based, where the added lines start in the release's file
    lines: int = 0  # how many telling lines it adds

    def describe(self) -> str:
        if not self.lines:
            return f"{self.what}: adds no telling line"
        if self.present:
            return f"{self.what}: its {self.lines} added line(s) are at line {self.line}"
        return f"{self.what}: its added lines are not there"


def fold(line: str) -> str:
    return " ".join(line.split())


def landed(variant: Variant, files: Mapping[str, bytes | None]) -> tuple[Landed, ...]:
    """Each hunk (site) of `variant` against the release's `files` (keyed by its paths)."""
    texts = {rel: _lines(data) for rel, data in files.items()}
    out: list[Landed] = []
    for diff in variant.diffs:
        lines = texts.get(diff.path)
        for hunk in diff.hunks:
            removed = {fold(t) for tag, t in hunk.lines if tag == "-"}
            added = [fold(t) for tag, t in hunk.lines if tag == "+" and _telling(t, removed)]
            out.append(_find(f"{diff.path}#{hunk.index}", diff.path, added, lines))
    for site in variant.sites:
        anchor = {fold(t) for t in site.anchor_lines}
        added = [
            fold(t) for t in site.text.splitlines() if _telling(t, anchor) and site.marker not in t
        ]
        out.append(_find(f"{site.file} site {site.name}", site.file, added, texts.get(site.file)))
    return tuple(out)


def removed_by(variant: Variant) -> set[str]:
    """The lines (folded) the variant itself removes: a diff's `-` lines, a replace site's
    anchor lines its text does not keep."""
    out = {fold(t) for d in variant.diffs for h in d.hunks for tag, t in h.lines if tag == "-"}
    for site in variant.sites:
        if site.action == "replace":
            kept = {fold(t) for t in site.text.splitlines()}
            out |= {fold(t) for t in site.anchor_lines} - kept
    return out


def unexpected_deletions(
    allowed: set[str],
    release: Mapping[str, bytes | None],
    edited: Mapping[str, bytes | None],
    *,
    limit: int = 5,
) -> list[str]:
    """What the refreshed variant (`release` -> `edited`) does that the original did not
    (`allowed`: the lines it removes, `removed_by`): lines removed, named with their line in
    the release's file, and Python files it leaves uncompilable."""
    found: list[str] = []
    for rel, old in release.items():
        new = edited.get(rel)
        if old is None or new is None:
            continue
        for number, line in _removed(_lines(old), _lines(new)).items():
            if line not in allowed and len(line) >= MIN_CHARS:
                found.append(f"{rel}:{number} {line[:80]!r}")
        if rel.endswith(".py"):
            error = broken_by(old, new)
            if error is not None:
                found.append(f"{rel} no longer compiles ({error.describe()})")
    if len(found) > limit:
        return [*found[:limit], f"and {len(found) - limit} more"]
    return found


def _telling(line: str, besides: set[str]) -> bool:
    folded = fold(line)
    return len(folded) >= MIN_CHARS and folded not in besides and not folded.startswith("#")


def _find(what: str, file: str, added: list[str], lines: list[str] | None) -> Landed:
    """`added` in `lines` in order, each within a few lines of the one before."""
    if sum(len(a) for a in added) < MIN_TOTAL or lines is None:
        return Landed(what, file, False, lines=0)
    folded = [fold(line) for line in lines]
    for start, line in enumerate(folded):
        if line != added[0]:
            continue
        at, ok = start, True
        for want in added[1:]:
            window = folded[at + 1 : at + 1 + 6]
            if want not in window:
                ok = False
                break
            at = at + 1 + window.index(want)
        if ok:
            return Landed(what, file, True, start + 1, len(added))
    return Landed(what, file, False, lines=len(added))


def _removed(old: list[str], new: list[str]) -> dict[int, str]:
    """Lines of `old` (1-based number -> folded text) that `new` no longer has."""
    a, b = [fold(x) for x in old], [fold(x) for x in new]
    left = Counter(a)
    left.subtract(Counter(b))  # how many copies of each line the edit took away
    out: dict[int, str] = {}
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    for tag, i1, i2, _j1, _j2 in matcher.get_opcodes():
        if tag in ("delete", "replace"):
            for i in range(i1, i2):
                if a[i] and left[a[i]] > 0:
                    left[a[i]] -= 1
                    out[i + 1] = a[i]
    return out


def _lines(data: bytes | None) -> list[str]:
    if data is None:
        return []
    return split_text(data.decode("utf-8", errors="surrogateescape"))[0]
