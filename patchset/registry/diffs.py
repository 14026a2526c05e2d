"""Reading unified diffs (through unidiff) into the engine's hunks, with strict path rules."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from unidiff.errors import UnidiffParseError
from unidiff.patch import PatchedFile, PatchSet

from patchset.errors import PayloadError
from patchset.kernel.hunks import Hunk
from patchset.registry.paths import check_relpath

_HUNK_HEADER = re.compile(r"^@@ -\d+(?:,(\d+))? \+\d+(?:,(\d+))? @@")


@dataclass(frozen=True)
class FileDiff:
    path: str  # relative to the folder that holds vllm/, e.g. "vllm/x/y.py"
    hunks: tuple[Hunk, ...]
    added: bool = False  # the diff creates the file

    def reversed(self) -> FileDiff:
        return FileDiff(self.path, tuple(h.reversed() for h in self.hunks), added=False)


def _strip_prefixes(source: str, target: str) -> tuple[str, str]:
    """Drop git's a/ and b/ prefixes when the diff uses them; plain paths stay as they are."""
    if source.startswith("a/") and target.startswith("b/"):
        return source[2:], target[2:]
    if source == "/dev/null" and target.startswith("b/"):
        return source, target[2:]
    return source, target


def parse_diff(text: str, *, file: Path | str) -> tuple[FileDiff, ...]:
    """Parse a unified diff; anything the engine cannot apply faithfully is a PayloadError."""
    text = text.replace("\r\n", "\n")  # a CRLF payload means what its LF twin means
    patch = read_patchset(text, file=file)
    files: list[FileDiff] = []
    seen: set[str] = set()
    for pf in patch:
        source, target = _strip_prefixes(pf.source_file, pf.target_file)
        if target == "/dev/null":
            raise PayloadError(f"{source}: diffs that delete files are not supported", path=file)
        check_relpath(target, file=file)
        if source != "/dev/null":
            check_relpath(source, file=file)
        if pf.is_binary_file:
            raise PayloadError(f"{target}: binary diffs are not supported", path=file)
        if pf.is_rename or (not pf.is_added_file and source != target):
            raise PayloadError(f"{source} -> {target}: renames are not supported", path=file)
        hunks = _hunks(pf, file)  # first: an empty hunk must not read as a deletion
        if not hunks:
            raise PayloadError(
                f"{target}: a file header without hunks (mode changes are not supported)",
                path=file,
            )
        if pf.is_removed_file:
            raise PayloadError(f"{source}: diffs that delete files are not supported", path=file)
        if target in seen:
            raise PayloadError(f"{target}: appears twice in one diff", path=file)
        seen.add(target)
        files.append(FileDiff(target, tuple(hunks), added=pf.is_added_file))
    return tuple(files)


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


def _hunks(pf: PatchedFile, file: Path | str) -> list[Hunk]:
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
        if not pf.is_added_file and sides in ({"+"}, {"-"}):
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
