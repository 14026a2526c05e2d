"""Hunk placement on synthetic edge cases, each also given to real `git apply --check` (and
`--reverse --check`) so the placement rules are held against git's, not against a memory of it."""

from __future__ import annotations

import random
import re
import subprocess
from pathlib import Path

import pytest

from patchset.kernel.hunks import _search, _shared_words, apply_hunks, split_text
from patchset.registry.diffs import parse_diff

BODY = "".join(f"line {i}\n" for i in range(1, 21))
APPENDED = "def tail():\n    return 1\n"


def _diff(before: str, after: str, *, context: int = 3, name: str = "vllm/mod.py") -> str:
    """A real unified diff from git itself (no hand-written hunks)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        a, b = Path(tmp, "a"), Path(tmp, "b")
        a.write_text(before)
        b.write_text(after)
        out = subprocess.run(
            ["git", "diff", "--no-index", f"-U{context}", "a", "b"],
            cwd=tmp,
            capture_output=True,
            text=True,
            check=False,
        ).stdout
    body = out[out.index("\n@@") + 1 :]
    return f"--- a/{name}\n+++ b/{name}\n{body}"


def _ours(text: str, diff: str, *, reverse: bool = False) -> tuple[bool, list[str]]:
    (fd,) = parse_diff(diff, file="x.diff")
    hunks = fd.reversed().hunks if reverse else fd.hunks
    lines, _, eof = split_text(text)
    result = apply_hunks(lines, hunks, eof_newline=eof, nearest=False)
    return result.ok, [h.detail for h in result.hunks if h.detail]


def _git(text: str, diff: str, tmp: Path, *, reverse: bool = False) -> bool:
    (tmp / "vllm").mkdir(exist_ok=True)
    (tmp / "vllm" / "mod.py").write_text(text)
    (tmp / "p.diff").write_text(diff)
    extra = ["--reverse"] if reverse else []
    done = subprocess.run(
        ["git", "apply", "--check", *extra, "p.diff"], cwd=tmp, capture_output=True, check=False
    )
    return done.returncode == 0


def _both(text: str, diff: str, tmp: Path, *, reverse: bool = False) -> bool:
    ours, _ = _ours(text, diff, reverse=reverse)
    assert ours == _git(text, diff, tmp, reverse=reverse), (text, diff, reverse)
    return ours


def test_end_of_file_append_fits_only_at_the_end(tmp_path: Path) -> None:
    diff = _diff(BODY, BODY + APPENDED)
    assert _both(BODY, diff, tmp_path)
    # The release already holds the function, and more code was added after it: the append's
    # context (lines 18-20) is no longer at the end, so forward must not fit.
    later = BODY + APPENDED + "def more():\n    pass\n"
    assert not _both(later, diff, tmp_path)
    _, details = _ours(later, diff)
    assert details == [
        "its lines fit at line 18, not at the end of the file, as a hunk with no"
        " trailing context must"
    ]
    # Already applied, as is: the reverse fits, the forward does not.
    assert _both(BODY + APPENDED, diff, tmp_path, reverse=True)
    assert not _both(BODY + APPENDED, diff, tmp_path)


def test_hunk_at_line_one_is_pinned_to_the_top(tmp_path: Path) -> None:
    diff = _diff(BODY, "header\n" + BODY)
    assert _both(BODY, diff, tmp_path)
    # The same context further down (a copy of the first lines later in the file): no fit.
    shifted = "new first line\n" + BODY
    assert not _both(shifted, diff, tmp_path)


def test_empty_file(tmp_path: Path) -> None:
    diff = _diff("", "hello\n")
    assert _both("", diff, tmp_path)
    assert not _both("something\n", diff, tmp_path)
    assert _both("hello\n", diff, tmp_path, reverse=True)


def test_file_without_final_newline(tmp_path: Path) -> None:
    before = BODY.rstrip("\n")
    diff = _diff(before, before + "\nline 21")
    assert _both(before, diff, tmp_path)
    assert not _both(BODY, diff, tmp_path)  # the file ends with a newline: the old side differs
    assert _both(before + "\nline 21", diff, tmp_path, reverse=True)


def test_repeated_context_is_ambiguous_not_picked(tmp_path: Path) -> None:
    block = "a\nb\nc\nX\nd\ne\nf\n"
    before = block + "mid\n" * 3 + block
    after = block + "mid\n" * 3 + block.replace("X", "Y")
    diff = _diff(before, after)
    # Exact at its own line: fine, as git says.
    assert _both(before, diff, tmp_path)
    # Four lines added at the top and two between the blocks: the hunk's header (line 11) now
    # sits midway between two equal places (lines 5 and 17). git picks one silently; we refuse.
    moved = "t1\nt2\nt3\nt4\n" + block + "mid\n" * 5 + block
    ours, details = _ours(moved, diff)
    assert not ours
    assert details == ["it fits equally well at lines 5 and 17: ambiguous, none picked"]


def test_offset_is_kept(tmp_path: Path) -> None:
    after = BODY.replace("line 10\n", "line 10 changed\n")
    diff = _diff(BODY, after)
    shifted = "\n".join(f"extra {i}" for i in range(5)) + "\n" + BODY
    assert _both(shifted, diff, tmp_path)
    (fd,) = parse_diff(diff, file="x.diff")
    result = apply_hunks(split_text(shifted)[0], fd.hunks)
    assert [(h.status, h.offset) for h in result.hunks] == [("offset", 5)]


@pytest.mark.parametrize("fuzz", [0, 1])
def test_fuzz_only_when_asked(fuzz: int) -> None:
    after = BODY.replace("line 10\n", "line 10 changed\n")
    diff = _diff(BODY, after)
    drifted = BODY.replace("line 7\n", "line 7 drifted\n")  # the first context line changed
    (fd,) = parse_diff(diff, file="x.diff")
    result = apply_hunks(split_text(drifted)[0], fd.hunks, max_fuzz=fuzz, nearest=False)
    assert result.ok == bool(fuzz)
    assert result.hunks[0].status == ("fuzz" if fuzz else "failed")


def test_nearest_lines_only_when_asked() -> None:
    diff = _diff(BODY, BODY.replace("line 10\n", "line 10 changed\n"))
    drifted = BODY.replace("line 9\n", "line nine\n")
    (fd,) = parse_diff(diff, file="x.diff")
    lines = split_text(drifted)[0]
    lazy = apply_hunks(lines, fd.hunks, nearest=False).hunks[0]
    assert lazy.status == "failed" and lazy.nearest_line is None
    eager = apply_hunks(lines, fd.hunks, nearest=True).hunks[0]
    assert eager.nearest_line == 7 and eager.similarity > 0.8


def test_shared_identifiers_are_counted_as_one_scan_per_line_would() -> None:
    """The identifier vote of `rank_windows` (a file sharing no line with the text) counts,
    per line, the distinct identifiers of four or more characters it shares with the text:
    as a per-line `findall` would, whole identifiers only, across punctuation and unicode."""
    pieces = ["self", "config", "_dtype", "dtype", "naïve_x", "x1234", "ab", "(", ")", " ", "."]
    rng = random.Random(7)  # noqa: S311 - a fixed test sequence
    for _ in range(200):
        lines = ["".join(rng.choice(pieces) for _ in range(rng.randint(0, 9))) for _ in range(12)]
        words = set(re.findall(r"\w{4,}", " ".join(rng.choice(pieces) for _ in range(6))))
        slow = [
            (i, len(words.intersection(re.findall(r"\w{4,}", line))))
            for i, line in enumerate(lines)
        ]
        assert _shared_words(lines, words) == [(i, n) for i, n in slow if n]


def test_search_finds_what_a_scan_of_every_offset_finds() -> None:
    """`_search` looks only where the hunk's longest line stands: the same match (nearest to
    the expected line, at or after the floor) and the same tie as trying every offset, on
    files full of repeated short lines."""
    rng = random.Random(25)  # noqa: S311 - a fixed test sequence
    words = ["", ")", "x = 1", "    return value", "def long_function_name(argument):"]
    for _ in range(400):
        lines = [rng.choice(words) for _ in range(rng.randint(0, 30))]
        start = rng.randint(0, max(0, len(lines) - 1))
        want = lines[start : start + rng.randint(1, 4)] or ["x = 1"]
        expected, floor = rng.randint(-2, 32), rng.randint(0, 10)
        last = len(lines) - len(want)
        fits = [i for i in range(floor, last + 1) if lines[i : i + len(want)] == want]
        plain: tuple[int | None, int | None] = (None, None)
        if fits:
            near = min(max(expected, floor), max(last, floor))
            fits.sort(key=lambda i: (abs(i - near), i))
            tie = fits[1] if len(fits) > 1 and abs(fits[1] - near) == abs(fits[0] - near) else None
            plain = (fits[0], tie)
        assert _search(lines, want, expected, floor) == plain
