"""Reading unified diffs (through unidiff) into the engine's hunks, with strict path rules."""

from __future__ import annotations

import functools
import hashlib
import re
import threading
from collections import OrderedDict
from dataclasses import dataclass
from pathlib import Path

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile, PatchSet

from patchset.errors import PayloadError
from patchset.kernel.hunks import Hunk
from patchset.registry.paths import check_relpath

_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")
_MODE = re.compile(r"^(?:new|deleted) file mode ([0-7]{6})$", re.MULTILINE)
REGULAR, EXECUTABLE = 0o100644, 0o100755  # the file modes git records


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the folder that holds vllm/, e.g. "vllm/x/y.py"
    hunks: tuple[Hunk, ...]
    added: bool = False  # the diff creates the file
    removed: bool = False  # the diff deletes the file (`+++ /dev/null`): its one hunk is it all
    mode: int = REGULAR  # a created or deleted file's git mode (`new/deleted file mode`)

    def reversed(self) -> FileDiff:
        return self._reversed

    @functools.cached_property
    def _reversed(self) -> FileDiff:  # a check reverses each diff once per release
        return FileDiff(self.path, tuple(h.reversed() for h in self.hunks), added=False)

    @property
    def executable(self) -> bool:
        return self.mode == EXECUTABLE

    def whole_text(self) -> str:
        """The whole file a deletion removes (or a creation creates), with LF line ends."""
        hunk = next(iter(self.hunks), None)
        if hunk is None:
            return ""
        side = hunk.old if self.removed else hunk.new
        last_newline = hunk.old_eof_newline if self.removed else hunk.new_eof_newline
        return "\n".join(side) + ("\n" if side and last_newline else "")


def _strip_prefixes(source: str, target: str) -> tuple[str, str]:
    """Drop git's a/ and b/ prefixes when the diff uses them; plain paths stay as they are."""
    if source.startswith("a/") and target.startswith("b/"):
        return source[2:], target[2:]
    if source == "/dev/null" and target.startswith("b/"):
        return source, target[2:]
    if target == "/dev/null" and source.startswith("a/"):
        return source[2:], target
    return source, target


_PARSED: OrderedDict[bytes, tuple[FileDiff, ...]] = OrderedDict()  # by the text's digest
_PARSED_KEPT = 64
_PARSED_LOCK = threading.Lock()  # loads may run in threads (a check's prefetch pool)


def parse_diff(text: str, *, file: Path | str) -> tuple[FileDiff, ...]:
    """Parse a unified diff; anything the engine cannot apply faithfully is a PayloadError.

    A text parsed once is not parsed again (its result is immutable and names no file):
    `add` loads its new patch three times (staged, checked, moved into place), `update`
    and `check --write` reload what they write, and a 60 MB payload took seconds each time.
    Only successes are kept, so an error always names the file it was read from."""
    key = hashlib.sha256(text.encode("utf-8", "surrogatepass")).digest()
    with _PARSED_LOCK:
        known = _PARSED.get(key)
        if known is not None:
            _PARSED.move_to_end(key)
            return known
    parsed = _parse_diff(text, file=file)
    with _PARSED_LOCK:
        _PARSED[key] = parsed
        while len(_PARSED) > _PARSED_KEPT:
            _PARSED.popitem(last=False)
    return parsed


def parse_count() -> int:
    """How many diff texts were parsed (not taken from the cache) in this process: the
    tests of big payloads count parses instead of timing them."""
    return _parses[0]


_parses = [0]


def _parse_diff(text: str, *, file: Path | str) -> tuple[FileDiff, ...]:
    _parses[0] += 1
    text = text.replace("\r\n", "\n")  # a CRLF payload means what its LF twin means
    patch = read_patchset(text, file=file)
    files: list[FileDiff] = []
    seen: set[str] = set()
    for pf in patch:
        source, target = _strip_prefixes(pf.source_file, pf.target_file)
        removed = target == "/dev/null"
        if removed and source == "/dev/null":
            raise PayloadError("a file header with /dev/null on both sides", path=file)
        path = source if removed else target
        check_relpath(path, file=file)
        if source not in ("/dev/null", path):
            check_relpath(source, file=file)
        if pf.is_binary_file:
            raise PayloadError(f"{path}: binary diffs are not supported", path=file)
        if not removed and (pf.is_rename or (not pf.is_added_file and source != target)):
            raise PayloadError(f"{source} -> {target}: renames are not supported", path=file)
        hunks = _hunks(pf, file, removed=removed)  # first: an empty hunk is no deletion
        if removed:
            hunks = _deletion(path, hunks, file, empty=_mode(pf) is not None)
        if not hunks:
            raise PayloadError(
                f"{target}: a file header without hunks (mode changes are not supported)",
                path=file,
            )
        if path in seen:
            raise PayloadError(f"{path}: appears twice in one diff", path=file)
        seen.add(path)
        mode = _mode(pf) or REGULAR
        if mode not in (REGULAR, EXECUTABLE):
            raise PayloadError(f"{path}: file mode {mode:o} is not a regular file's", path=file)
        added = pf.is_added_file and not removed
        files.append(FileDiff(path, tuple(hunks), added=added, removed=removed, mode=mode))
    return tuple(files)


def _mode(pf: PatchedFile) -> int | None:
    """The `new file mode` / `deleted file mode` of a git diff's file header, if any."""
    found = _MODE.search(str(pf.patch_info or ""))
    return int(found.group(1), 8) if found else None


def _deletion(path: str, hunks: list[Hunk], file: Path | str, *, empty: bool) -> list[Hunk]:
    """A deletion's hunks: one, removing every line from line 1 on (git's own form); an
    empty file's deletion (a git header, no hunk) gets one empty hunk, so it has a state."""
    if not hunks and empty:
        return [Hunk(index=1, old_start=0, new_start=0, lines=())]
    if not hunks:
        raise PayloadError(f"{path}: a deletion (+++ /dev/null) without its hunk", path=file)
    first = hunks[0]
    if len(hunks) > 1 or first.old_start != 1 or any(tag != "-" for tag, _ in first.lines):
        raise PayloadError(
            f"{path}: a deletion (+++ /dev/null) must be one hunk removing every line from"
            " line 1 (@@ -1,N +0,0 @@), as git writes it",
            path=file,
        )
    return hunks


def read_patchset(text: str, *, file: Path | str, empty: str = "holds no file changes") -> PatchSet:
    """unidiff's reading of `text`, after the checks unidiff skips (see _check_hunk_lines);
    a diff with no file in it is a PayloadError saying `empty`."""
    _check_hunk_lines(text, file)
    try:
        patch = PatchSet(text)
    except UnidiffParseError as exc:
        raise PayloadError(f"not a valid unified diff: {exc}", path=file) from None
    if not len(patch):
        raise PayloadError(empty, path=file)
    return patch


def _check_hunk_lines(text: str, file: Path | str) -> None:
    """Every hunk header well formed, and no '+' or '-' line outside the hunks' counts.

    unidiff stops reading a hunk once its header's counts are used up and skips what follows
    up to the next header, so a hunk whose counts are too small would lose changes silently.
    """
    lines = text.split("\n")
    old = new = 0  # lines still to come in the current hunk
    for number, line in enumerate(lines, start=1):
        if old > 0 or new > 0:
            if line.startswith("\\"):
                continue
            tag = line[:1] or " "  # unidiff reads an empty line in a hunk as blank context
            old -= tag in " -"
            new -= tag in " +"
            continue
        if line.startswith("@@"):
            header = _HUNK_HEADER.match(line)
            if header is None:
                raise PayloadError(f"line {number}: malformed hunk header {line[:60]!r}", path=file)
            old, new = (int(n) if n else 1 for n in header.groups())
        elif line == "-- ":
            return  # git format-patch's signature follows
        elif line.startswith(("+", "-")) and not _file_header(lines, number - 1):
            raise PayloadError(
                f"line {number}: {line[:60]!r} lies outside every hunk"
                " (the @@ line counts before it are too small)",
                path=file,
            )


def _file_header(lines: list[str], index: int) -> bool:
    """Whether lines[index] is part of a '--- a/x' + '+++ b/x' pair."""
    line = lines[index]
    if line.startswith("--- "):
        return index + 1 < len(lines) and lines[index + 1].startswith("+++ ")
    return line.startswith("+++ ") and index > 0 and lines[index - 1].startswith("--- ")


def _hunks(pf: PatchedFile, file: Path | str, *, removed: bool = False) -> list[Hunk]:
    hunks = []
    for index, hunk in enumerate(pf, start=1):
        lines: list[tuple[str, str]] = []
        old_eof = new_eof = True
        for line in hunk:
            tag = line.line_type
            if tag == "\\":
                if lines and not lines[-1][1]:
                    raise PayloadError(
                        f"{pf.path}: hunk #{index}: an empty last line without a newline is no"
                        " line at all (\\ No newline at end of file after an empty line)",
                        path=file,
                    )
                prev = lines[-1][0] if lines else " "
                old_eof = old_eof and prev == "+"
                new_eof = new_eof and prev == "-"
                continue
            if tag not in (" ", "-", "+"):
                raise PayloadError(f"{pf.path}: hunk #{index}: unexpected line {tag!r}", path=file)
            lines.append((tag, line.value.rstrip("\r\n")))
        if not any(tag in "-+" for tag, _ in lines):
            raise PayloadError(f"{pf.path}: hunk #{index} changes nothing", path=file)
        sides = {tag for tag, _ in lines}
        if not pf.is_added_file and not removed and sides in ({"+"}, {"-"}):
            raise PayloadError(
                f"{pf.path}: hunk #{index} only {'adds' if sides == {'+'} else 'removes'}"
                " lines, with no context: where it goes (or, reverted, went) cannot be"
                " checked; write the diff with context (diff -U3)",
                path=file,
            )
        hunks.append(
            Hunk(
                index=index,
                old_start=hunk.source_start,
                new_start=hunk.target_start,
                lines=tuple(lines),
                section=hunk.section_header.strip(),
                old_eof_newline=old_eof,
                new_eof_newline=new_eof,
            )
        )
    return hunks
