"""Where one patch stands against a set of files, computed without writing anything.

Both `apply` (which then writes) and `check` (which only reports) start here, so the two can
never disagree about whether a patch fits.
"""

from __future__ import annotations

import collections
import difflib
import functools
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from patchset.engine.spans import Span, merged, of_site, other_breaks
from patchset.engine.spans import clear_caches as spans_clear
from patchset.kernel import pycompile, touches
from patchset.kernel.filelines import FileLines
from patchset.kernel.hunks import (
    FileResult,
    HunkResult,
    HunkStatus,
    Ratio,
    apply_hunks,
    join_text,
    split_text,
)
from patchset.kernel.pycompile import CompileError, edit_error, new_file_error
from patchset.kernel.sites import GOOD, SiteResult, apply_site, revert_site
from patchset.kernel.touches import resolve
from patchset.registry import Patch, Variant
from patchset.registry.diffs import FileDiff

State = Literal["applies", "already-applied", "conflict", "partial", "missing-target"]
Reader = Callable[[str], bytes | None]


@dataclass(frozen=True)
class Evaluation:
    """The engine's findings for one patch variant (forward, or reverse for a revert)."""

    state: State
    hunks: tuple[tuple[str, HunkResult], ...] = ()  # (file, result) for diff patches
    reverse_applies: bool = False  # diff: the reverse fits, i.e. the change is already there
    reverse: tuple[tuple[str, HunkResult], ...] = ()  # where the reversed hunks fit (diffs)
    sites: tuple[SiteResult, ...] = ()
    missing: tuple[str, ...] = ()
    changes: dict[str, bytes] = field(default_factory=dict)  # new contents, when it applies
    # files to delete: a diff's deletions, or a revert of a diff that created them
    removed: tuple[str, ...] = ()
    executable: tuple[str, ...] = ()  # files in `changes` to create executable (git mode 755)
    warnings: tuple[str, ...] = ()
    broken: str = ""  # the edit would leave a file that compiled before not compiling
    # Runtime patches that apply: per file of `changes`, the spans of the file's own lines
    # the sites change, as a line diff of the file before and after gives them, known from
    # where each site edits (no diff made). A file not here (a diff patch's) is not known.
    spans: dict[str, tuple[Span, ...]] = field(default_factory=dict)

    @property
    def failures(self) -> tuple[str, ...]:
        hunk_fails = tuple(f"{f}: {h.describe()}" for f, h in self.hunks if h.status == "failed")
        site_fails = tuple(s.describe() for s in self.sites if s.status not in GOOD)
        missing = tuple(f"{m}: file not found" for m in self.missing)
        return hunk_fails + site_fails + missing + ((self.broken,) if self.broken else ())

    @property
    def skipped_optional(self) -> int:
        """Optional sites left out because no anchor of theirs matches."""
        return sum(1 for s in self.sites if s.status == "skipped" and s.optional)


def _compile_break(
    read: Reader, changes: Mapping[str, bytes], blame: Callable[[str], str] | None = None
) -> str:
    """Why the changes would leave a Python file that compiled before not compiling ("" if
    none would): the file, the line and the compiler's message, and what is to blame. Each
    content is compiled once (a check meets the same file in many releases), and an edit
    inside defs and classes by those units alone (`edit_error`); a new file in pieces of its
    top-level statements (`new_file_error`: linear in its size, E22)."""
    for rel, data in changes.items():
        if not rel.endswith(".py"):
            continue
        before = read(rel)
        error = new_file_error(data) if before is None else edit_error(before, data, rel)
        if error is None:
            continue
        return _broken_message(rel, error, blame(rel) if blame else "")
    return ""


@functools.lru_cache(maxsize=128)
def _site_file(data: bytes) -> tuple[str, FileLines, str, bool]:
    """A target file as sites read it (text, lines and what sites share: the folded lines and
    where each stands), made once per content: every patch on the file, in every release
    whose file has these bytes, reads the same one (it is never changed in place)."""
    text = _decode(data)
    lines, eol, eof = split_text(text)
    made = _made.pop(id(data), None)
    if made is not None and made[0] is data and made[1].lines == lines:
        return text, made[1], eol, eof  # what an evaluation left: its folding kept
    return text, FileLines(lines), eol, eof


# The lines an evaluation's change was rendered from, by the bytes object rendered (held
# here, so its id is no other's): an apply reads each patch's result, that very object, as
# the next one's file, which then shares the folding of its lines. Kept by the object, not
# by its bytes: a check never reads a change again, and hashing each would cost it a pass
# over every changed file.
_made: collections.OrderedDict[int, tuple[bytes, FileLines]] = collections.OrderedDict()
_MADE_KEPT = 64


def _keep_made(data: bytes, view: FileLines) -> None:
    if len(_made) >= _MADE_KEPT:
        _made.popitem(last=False)  # the oldest (a dict's first key is found by a scan)
    _made[id(data)] = (data, view)


def clear_caches() -> None:
    """Forget what evaluations keep in memory (compile results, target files read for
    sites): a benchmark's "nothing known yet"."""
    pycompile.clear_cache()
    touches.clear_caches()
    _site_file.cache_clear()
    spans_clear()
    _made.clear()
    _resolved.clear()


def _known_first(known: Mapping[str, bytes | None], read: Reader) -> Reader:
    """A reader answering from what was already read."""
    return lambda rel: known[rel] if rel in known else read(rel)


def _broken_message(rel: str, error: CompileError, culprit: str) -> str:
    who = f"{culprit}: " if culprit else ""
    return f"{who}{rel}:{error.line} would not compile after the edit ({error.message})"


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")


def _encode(text: str) -> bytes:
    return text.encode("utf-8", errors="surrogateescape")


def _mixed(text: str) -> bool:
    """Whether the text mixes CRLF and LF line ends."""
    if "\r" not in text:  # the common case, found without counting
        return False
    crlf = text.count("\r\n")
    return 0 < crlf < text.count("\n")


def _line_ends(text: str) -> list[str]:
    """Each line's own end, as `split_text` cuts the lines: '\\n', '\\r\\n' or '' (the last)."""
    parts = text.split("\n")
    ends = ["\r\n" if part.endswith("\r") else "\n" for part in parts[:-1]]
    return ends if parts[-1] == "" else [*ends, ""]


def _render(
    before: str | None,
    old: list[str],
    new: list[str] | tuple[str, ...],
    eol: str,
    eof_newline: bool,
) -> bytes:
    """The new file's bytes. In a file that mixes line ends, each line kept (or replaced one
    for one) keeps its own, so a revert gives back the very bytes; new lines take the first's."""
    if before is None or not _mixed(before):
        return _encode(join_text(new, eol, eof_newline))
    ends = _line_ends(before)
    out: list[str] = []
    matcher = difflib.SequenceMatcher(None, old, list(new), autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        kept = ends[i1:i2] if tag == "equal" else ends[i1 : min(i2, i1 + j2 - j1)]
        out += kept + [eol] * (j2 - j1 - len(kept))
    out = [end or eol for end in out]
    if out:
        out[-1] = out[-1] if eof_newline else ""
    return _encode("".join(line + end for line, end in zip(new, out, strict=True)))


def _created(diff: FileDiff) -> bytes:
    """The bytes of the file a diff creates (`--- /dev/null`)."""
    result = apply_hunks([], diff.hunks)
    assert result.lines is not None  # hunks with an empty old side fit an empty file
    return _encode(join_text(result.lines, "\n", result.eof_newline))


def _deleting(diff: FileDiff, data: bytes | None) -> FileResult:
    """A diff that deletes a file (`+++ /dev/null`), forward: it fits only the very file it
    removes, byte for byte (so a revert gives those bytes back), as git's whole-file hunk."""
    index = diff.hunks[0].index
    if data is None:
        detail = "the diff deletes this file and it is already gone"
        return FileResult((HunkResult(index, "failed", detail=detail),), None)
    want = _encode(diff.whole_text())
    if data == want:
        return FileResult((HunkResult(index, "exact", line=1, detail="deletes the file"),), ())
    have, _, _ = split_text(_decode(data))
    lines = diff.hunks[0].old
    first = next((i for i, (a, b) in enumerate(zip(have, lines, strict=False)) if a != b), None)
    if first is not None:
        why = f"its line {first + 1} differs from the diff's"
    elif len(have) != len(lines):
        why = f"it has {len(have)} lines, the diff removes {len(lines)}"
    else:
        why = "its line ends (or final newline) differ from the diff's"
    detail = f"the diff deletes this file, but it is not the file the diff removes: {why}"
    return FileResult((HunkResult(index, "failed", detail=detail),), None)


def _exists_already(diff: FileDiff, data: bytes) -> FileResult:
    """A diff that creates a file meets a file already there: a conflict unless it is the very
    file the diff creates (then the reverse view reports it as already applied)."""
    detail = (
        "the diff creates this file and it is already there"
        if data == _created(diff)
        else "the diff creates this file, but a different one is already there"
    )
    return FileResult(tuple(HunkResult(h.index, "failed", detail=detail) for h in diff.hunks), None)


class _Target:
    """One target file as an evaluation reads it: its bytes, read once, and their text and
    lines, decoded and split once (forward, reverse and the no-op test share them; the
    engine's appliers copy the lines they are given)."""

    def __init__(self, data: bytes | None) -> None:
        self.data = data

    @functools.cached_property
    def text(self) -> str | None:
        return _decode(self.data) if self.data is not None else None

    @functools.cached_property
    def split(self) -> tuple[list[str], str, bool]:
        return split_text(self.text) if self.text is not None else ([], "\n", True)


def evaluate_diff(
    variant: Variant,
    read: Reader,
    *,
    max_fuzz: int = 0,
    compile_check: bool = True,
    nearest: bool = True,
    ratio: Ratio | None = None,
) -> Evaluation:
    """Forward and reverse, every hunk placed with git's rules; `nearest` adds, for each
    failing hunk, where the file looks most like it (costly: only when it will be shown)."""
    files = {d.path: _Target(read(d.path)) for d in variant.diffs}
    missing = tuple(
        d.path for d in variant.diffs if not (d.added or d.removed) and files[d.path].data is None
    )
    if missing:
        return Evaluation("missing-target", missing=missing)
    forward: list[tuple[str, HunkResult]] = []
    changes: dict[str, bytes] = {}
    removed: list[str] = []
    ok = True
    for diff in variant.diffs:
        target = files[diff.path]
        data = target.data
        if diff.removed:
            result = _deleting(diff, data)
            forward.extend((diff.path, h) for h in result.hunks)
            ok = ok and result.ok
            removed.append(diff.path)
            continue
        if diff.added and data is not None:
            result = _exists_already(diff, data)
        else:
            lines, eol, eof = target.split
            result = apply_hunks(
                lines, diff.hunks, max_fuzz=max_fuzz, eof_newline=eof, nearest=nearest, ratio=ratio
            )
        forward.extend((diff.path, h) for h in result.hunks)
        if result.lines is None:
            ok = False
        else:
            lines, eol, _ = target.split
            changes[diff.path] = _render(target.text, lines, result.lines, eol, result.eof_newline)
    backward = _reverse(variant, files)
    reverse = tuple((path, h) for path, result in backward for h in result.hunks)
    reverse_ok = all(h.status != "failed" for _, h in reverse) and _changes_something(
        variant, files, backward
    )
    if ok and all(changes.get(d.path) == files[d.path].data for d in variant.diffs):
        # It "fits" but changes no byte (a diff that only adds a final newline, on a file
        # that has it): the change is there already.
        ok = False
    if ok:
        known = {rel: target.data for rel, target in files.items()}  # read once, not again
        broken = _compile_break(_known_first(known, read), changes) if compile_check else ""
        if broken:
            return Evaluation("conflict", tuple(forward), reverse_ok, broken=broken)
        warnings = tuple(f"{f}: {h.describe()}" for f, h in forward if h.status != "exact")
        if reverse_ok:
            warnings += ("the reverse of this diff fits too: check the file by hand",)
        return Evaluation(
            "applies",
            tuple(forward),
            reverse_ok,
            reverse,
            changes=changes,
            removed=tuple(removed),
            executable=tuple(d.path for d in variant.diffs if d.added and d.executable),
            warnings=warnings,
        )
    if reverse_ok:
        return Evaluation("already-applied", tuple(forward), True, reverse=reverse)
    return Evaluation("conflict", tuple(forward), False, reverse)


def _reverse(variant: Variant, files: Mapping[str, _Target]) -> list[tuple[str, FileResult]]:
    """Where each reversed hunk fits (no fuzz), per file: all fitting means the change is
    present. A deletion fits when the file is gone, a creation when it is there byte for byte."""
    found: list[tuple[str, FileResult]] = []
    for diff in variant.diffs:
        data = files[diff.path].data
        if diff.removed:  # present means: the file is gone
            gone = HunkResult(diff.hunks[0].index, "exact", detail="the file is gone")
            hunk = gone if data is None else HunkResult(gone.index, "failed")
            found.append((diff.path, FileResult((hunk,), None)))
            continue
        if diff.added:  # present means: this very file, byte for byte
            status: HunkStatus = "exact" if data == _created(diff) else "failed"
            line = 1 if status == "exact" else None
            hunks = tuple(HunkResult(h.index, status, line=line) for h in diff.hunks)
            found.append((diff.path, FileResult(hunks, None)))
            continue
        lines, _, eof = files[diff.path].split
        result = apply_hunks(lines, diff.reversed().hunks, eof_newline=eof, nearest=False)
        found.append((diff.path, result))
    return found


def _changes_something(
    variant: Variant, files: Mapping[str, _Target], backward: list[tuple[str, FileResult]]
) -> bool:
    """Whether taking the diff out (`backward`, from `_reverse`) would change a byte: a diff
    that only adds a final newline fits backwards on a file without one too, and would
    "revert" it to itself."""
    for diff, (_, result) in zip(variant.diffs, backward, strict=True):
        target = files[diff.path]
        if diff.added or diff.removed or target.data is None or result.lines is None:
            return True
        lines, eol, _ = target.split
        if _render(target.text, lines, result.lines, eol, result.eof_newline) != target.data:
            return True
    return False


def evaluate_runtime(
    variant: Variant,
    read: Reader,
    served: Mapping[str, str] | None = None,
    *,
    compile_check: bool = True,
    nearest: bool = True,
    ratio: Ratio | None = None,
) -> Evaluation:
    """Every site in order on the files as they are (`served`: the served configuration
    for sites with `when`; None: unknown, every site is looked at). `nearest`: an anchor not
    found gets the nearest lines of its file (with `ratio`), only when it will be shown."""
    texts: dict[str, tuple[FileLines, str, bool]] = {}
    originals: dict[str, tuple[str, list[str]]] = {}
    datas: dict[str, bytes] = {}
    missing: list[str] = []
    for site in variant.sites:
        if site.file in texts or site.file in missing:
            continue
        data = read(site.file)
        if data is None:
            missing.append(site.file)
        else:
            datas[site.file] = data
            text, view, eol, eof = _site_file(data)
            texts[site.file] = (view, eol, eof)
            originals[site.file] = (text, view.lines)
    if missing:
        return Evaluation("missing-target", missing=tuple(missing))
    results: list[SiteResult] = []
    steps: dict[str, list[tuple[str, list[str]]]] = {}  # file: (site, lines after it)
    edits: dict[str, list[tuple[int, int, int]]] = {}  # file: each site's splice, in order
    spans: dict[str, list[Span | None]] = {}
    for site in variant.sites:
        view, eol, eof = texts[site.file]
        result, new = apply_site(site, view, served, nearest=nearest, ratio=ratio)
        texts[site.file] = (new, eol, eof)
        results.append(result)
        if new is not view:
            steps.setdefault(site.file, []).append((site.name, new.lines))
            splice = new.splice
            assert splice is not None  # an edit made it
            done = edits.setdefault(site.file, [])
            spans.setdefault(site.file, []).extend(of_site(view.lines, new.lines, splice, done))
            done.append(splice)
    statuses = {r.status for r in results}
    if not statuses <= set(GOOD):
        good = {"applies", "already-applied"}
        state: State = "partial" if statuses & good else "conflict"
        return Evaluation(state, sites=tuple(results))
    if "applies" not in statuses:
        if "already-applied" in statuses or "upstream" in statuses:
            return Evaluation("already-applied", sites=tuple(results))
        return Evaluation("conflict", sites=tuple(results), broken="no site applies")
    changes = {
        f: _render(*originals[f], view.lines, eol, eof)
        for f, (view, eol, eof) in texts.items()
        if f in steps
    }

    def blame(rel: str) -> str:
        _, eol, eof = texts[rel]
        for name, lines in steps.get(rel, []):
            if edit_error(datas[rel], _render(*originals[rel], lines, eol, eof), rel) is not None:
                return f"site {name}"
        return ""

    broken = _compile_break(_known_first(datas, read), changes, blame) if compile_check else ""
    if broken:
        return Evaluation("conflict", sites=tuple(results), broken=broken)
    warnings = tuple(r.describe() for r in results if r.status == "applies" and r.detail)
    for f, data in changes.items():
        _keep_made(data, texts[f][0])
    known = {
        f: merged([span for span in found if span is not None])
        for f, found in spans.items()
        if f in changes and None not in found and not other_breaks(originals[f][0])
    }
    return Evaluation(
        "applies", sites=tuple(results), changes=changes, warnings=warnings, spans=known
    )


def evaluate_python(patch: Patch, read: Reader) -> Evaluation:
    """A python patch edits no file: it applies when every name it touches is still there.
    A module gone, or a name no longer bound in it, is a missing target."""
    missing = [m for touch in patch.touches if (m := _resolve(touch, read)[1]) is not None]
    if missing:
        return Evaluation("missing-target", missing=tuple(missing))
    return Evaluation("applies")


# Each touch resolved so far: the files `resolve` read (in its order) with the bytes it got,
# and its answer. A touch met again where those files hold the same bytes (the next release,
# another patch) is answered without parsing them again: `resolve` reads the same files in
# the same order when they hold the same bytes, so its answer is the same.
_resolved: dict[
    str, list[tuple[tuple[tuple[str, bytes | None], ...], tuple[str | None, str | None]]]
] = {}
_RESOLVED_KEPT = 32  # answers kept a touch (the oldest out)


def _resolve(touch: str, read: Reader) -> tuple[str | None, str | None]:
    """`touches.resolve(touch, read)`, answered from `_resolved` when it can be."""
    known = _resolved.setdefault(touch, [])
    for reads, answer in reversed(known):  # the newest first: the last release's, mostly
        if all(read(rel) == data for rel, data in reads):
            return answer
    reads_now: list[tuple[str, bytes | None]] = []

    def recorded(rel: str) -> bytes | None:
        data = read(rel)
        reads_now.append((rel, data))
        return data

    answer = resolve(touch, recorded)
    if len(known) >= _RESOLVED_KEPT:
        del known[0]
    known.append((tuple(reads_now), answer))
    return answer


def evaluate(
    patch: Patch,
    variant: Variant,
    read: Reader,
    *,
    max_fuzz: int = 0,
    served: Mapping[str, str] | None = None,
    compile_check: bool = True,
    nearest: bool = True,
    ratio: Ratio | None = None,
) -> Evaluation:
    """`compile_check`: a changed .py file that compiled before must compile after (else the
    patch is a conflict); off only where another Python compiles it (an image's entrypoint).
    `nearest`: the nearest-lines text of failing hunks (only when it will be shown)."""
    if patch.kind == "python":
        return evaluate_python(patch, read)
    if patch.kind == "diff":
        return evaluate_diff(
            variant,
            read,
            max_fuzz=max_fuzz,
            compile_check=compile_check,
            nearest=nearest,
            ratio=ratio,
        )
    return evaluate_runtime(
        variant, read, served, compile_check=compile_check, nearest=nearest, ratio=ratio
    )


def evaluate_revert(patch: Patch, variant: Variant, read: Reader) -> Evaluation:
    """The reverse view: 'applies' means the patch is present and can be taken out."""
    if patch.kind == "diff":
        forward = evaluate_diff(variant, read)
        # Both ways fit (an insertion next to lines like it): the reverse fitting is what a
        # revert needs, and an apply in the same state applies. Say so, as apply does.
        both = forward.state == "applies" and forward.reverse_applies
        if forward.state != "already-applied" and not both:
            state: State = "already-applied" if forward.state == "applies" else forward.state
            return Evaluation(
                state, forward.hunks, forward.reverse_applies, missing=forward.missing
            )
        changes: dict[str, bytes] = {}
        removed: list[str] = []
        for diff in variant.diffs:
            if diff.added:  # the file is exactly what the diff created: take it away again
                removed.append(diff.path)
                continue
            if diff.removed:  # the file is gone: put back the very bytes the diff removed
                changes[diff.path] = _encode(diff.whole_text())
                continue
            data = read(diff.path)
            assert data is not None
            text = _decode(data)
            lines, eol, eof = split_text(text)
            result = apply_hunks(lines, diff.reversed().hunks, eof_newline=eof, unique=True)
            if result.lines is None:  # the change is there twice: which one to take out?
                hunks = tuple((diff.path, h) for h in result.hunks if h.status == "failed")
                return Evaluation("conflict", hunks, True)
            changes[diff.path] = _render(text, lines, result.lines, eol, result.eof_newline)
        warnings = ("the diff fits forward too: check the file by hand",) if both else ()
        return Evaluation(
            "applies",
            forward.hunks,
            True,
            changes=changes,
            removed=tuple(removed),
            executable=tuple(d.path for d in variant.diffs if d.removed and d.executable),
            warnings=warnings,
        )
    texts: dict[str, tuple[list[str], str, bool]] = {}
    originals: dict[str, tuple[str, list[str]]] = {}
    results: list[SiteResult] = []
    for site in reversed(variant.sites):  # last applied, first out: a site may sit in another
        if site.file not in texts:
            data = read(site.file)
            if data is None:
                return Evaluation("missing-target", missing=(site.file,))
            texts[site.file] = split_text(_decode(data))
            originals[site.file] = (_decode(data), texts[site.file][0])
        lines, eol, eof = texts[site.file]
        site_result, new = revert_site(site, lines)
        texts[site.file] = (new, eol, eof)
        results.insert(0, site_result)
    present = [r for r in results if r.status == "already-applied"]
    if not present:
        return Evaluation("already-applied", sites=tuple(results))  # nothing to take out
    # A site never applied (optional, conditional, upstream) has nothing to take out.
    may_lack = {s.name for s in variant.sites if s.optional or s.when or s.probe is not None}
    absent = [r for r in results if r.status == "anchor-not-found" and r.site in may_lack]
    if len(present) + len(absent) < len(results):
        return Evaluation("partial", sites=tuple(results))
    changes = {f: _render(*originals[f], lines, eol, eof) for f, (lines, eol, eof) in texts.items()}
    inexact = [r.site for r in present if not r.exact]
    # Lines known to be the file's own are put back as they were, compiling or not; lines
    # rebuilt from sites.toml must not break a file that compiles.
    broken = _compile_break(read, changes, lambda rel: f"revert of {rel}") if inexact else ""
    if broken:
        return Evaluation("conflict", sites=tuple(results), broken=broken)
    warnings = (
        (f"sites {', '.join(inexact)}: the lines put back may differ from the original",)
        if inexact
        else ()
    )
    return Evaluation("applies", sites=tuple(results), changes=changes, warnings=warnings)
