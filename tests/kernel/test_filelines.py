"""The folded view sites share (kernel/filelines.py): an anchor's first line found by a word
of it, lines folded only when looked at, edits chained, against folding every line."""

from __future__ import annotations

import random

from patchset.kernel.filelines import FileLines, find_block, fold

WORDS = ["x", "y = 1", "return x", "  ", "\t", "x\u00a0=\u20031", "if x:", "é", "", "return"]


def _random_lines(rng: random.Random, n: int) -> list[str]:
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(0, 3))) for _ in range(n)]


def _where(lines: list[str], folded: str) -> list[int]:
    return [i for i, line in enumerate(lines) if fold(line) == folded]


def test_where_and_find_block_agree_with_folding_every_line() -> None:
    rng = random.Random(25)  # noqa: S311 - a fixed seed: the same cases every run
    for _ in range(300):
        plain = _random_lines(rng, rng.randint(0, 30))
        view = FileLines(list(plain))
        for _ in range(rng.randint(0, 20)):  # a chain of edits, deeper than the one kept
            at = rng.randint(0, len(plain))
            size = rng.randint(0, min(3, len(plain) - at))
            new = _random_lines(rng, rng.randint(0, 3))
            plain = [*plain[:at], *new, *plain[at + size :]]
            view = view.edited(at, size, new)
            assert view.splice == (at, size, len(new))
        assert view.lines == plain
        for probe in {fold(line) for line in plain} | {"return", "x =", "y = 1 x"}:
            assert view.where(probe) == _where(plain, probe), (plain, probe)
        block = plain[len(plain) // 2 : len(plain) // 2 + 2]
        want = [
            i
            for i in range(len(plain) - len(block) + 1)
            if [fold(x) for x in plain[i : i + len(block)]] == [fold(x) for x in block]
        ]
        assert find_block(view, block) == (want if block else [])
        assert view.folded == [fold(line) for line in plain]
        for needle in ("return", "é", "never"):  # may say True wrongly, never False wrongly
            held = any(needle in line for line in plain)
            assert view.holds(needle) or not held
            assert FileLines(plain).holds(needle) == held


def test_a_line_is_folded_only_when_looked_at() -> None:
    lines = [f"value_{i} = {i}" for i in range(1000)]
    view = FileLines(lines)
    assert view.where("value_500 = 500") == [500]
    assert len(view._folds) == 1  # what is made, not what is said
    assert FileLines(lines).splice is None


def test_lines_holding_a_line_break_are_still_found() -> None:
    """Lines not cut from a text (a caller's list) may hold a newline: found all the same."""
    lines = ["a = 1\nb = 2", "c = 3", "a = 1", "c = 3"]
    view = FileLines(lines)
    assert view.where("c = 3") == [1, 3]
    assert view.where("a = 1 b = 2") == [0]
    assert find_block(view, ["a = 1", "c = 3"]) == [2]


def test_each_line_is_searched_for_once_and_edits_read_the_answers_kept() -> None:
    """`where` keeps its answers: asked again, the same list, no search; an edit made after
    its parent answered reads that answer, and is right where the edit changed the lines."""
    rng = random.Random(38)  # noqa: S311 - a fixed seed: the same cases every run
    for _ in range(200):
        plain = _random_lines(rng, rng.randint(0, 30))
        view = FileLines(list(plain))
        for _ in range(rng.randint(1, 8)):
            for probe in {fold(line) for line in plain} | {"return"}:
                assert view.where(probe) == _where(plain, probe), (plain, probe)
            at = rng.randint(0, len(plain))
            size = rng.randint(0, min(3, len(plain) - at))
            new = _random_lines(rng, rng.randint(0, 3))
            plain = [*plain[:at], *new, *plain[at + size :]]
            view = view.edited(at, size, new)
        for probe in {fold(line) for line in plain} | {"return"}:
            assert view.where(probe) == _where(plain, probe), (plain, probe)
    lines = [f"value_{i % 10} = 1" for i in range(100)]
    view = FileLines(lines)
    first = view.where("value_3 = 1")
    view.lines = []  # a search now would find nothing: the answer comes from what was kept
    assert view.where("value_3 = 1") is first
    assert first == list(range(3, 100, 10))
