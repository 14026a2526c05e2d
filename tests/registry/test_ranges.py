"""PEP 440 range text and arithmetic (`patchset.registry.ranges`), on plain strings."""

from __future__ import annotations

import pytest
from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from patchset.registry import ranges


def test_text_puts_lower_bounds_first_and_drops_repeats() -> None:
    assert ranges.range_text(["<0.20.0", ">=0.17.0", "", " >=0.17.0 "]) == ">=0.17.0,<0.20.0"
    assert ranges.range_text(["<1", "!=0.5", "==0.4.*", ">0.1"]) == ">0.1,==0.4.*,!=0.5,<1"
    assert ranges.operator("~=0.19") == "~=" and ranges.operator("0.19") == ""


def test_same_range_compares_meaning() -> None:
    assert ranges.same_range(">=0.17,<0.20", "<0.20, >=0.17")
    assert not ranges.same_range(">=0.17", ">0.17")
    assert ranges.same_range("not a range", "not a range")


@pytest.mark.parametrize(
    ("hits", "expected"),
    [
        (set(), ()),
        ({"0.17.0", "0.18.0"}, (">=0.17.0,<0.19.0",)),
        ({"0.18.0", "0.19.0"}, (">=0.18.0",)),
        ({"0.17.0", "0.19.0"}, (">=0.17.0,<0.18.0", ">=0.19.0")),
    ],
)
def test_runs_of_checked_releases(hits: set[str], expected: tuple[str, ...]) -> None:
    assert ranges.runs(hits, ["0.19.0", "0.17.0", "0.18.0", "0.18.0", "unknown"]) == expected


@pytest.mark.parametrize(
    ("hits", "closing", "expected"),
    [
        ({"0.17.0", "0.18.0"}, {"0.19.0"}, (">=0.17.0,<0.19.0",)),  # upstream in 0.19.0
        ({"0.17.0", "0.18.0"}, set(), (">=0.17.0",)),  # 0.19.0 conflicts: stays open
        ({"0.17.0", "0.19.0"}, set(), (">=0.17.0",)),  # a conflict between: one open run
        ({"0.17.0", "0.19.0"}, {"0.18.0"}, (">=0.17.0,<0.18.0", ">=0.19.0")),
        (set(), {"0.17.0"}, ()),
    ],
)
def test_runs_close_only_on_evidence(
    hits: set[str], closing: set[str], expected: tuple[str, ...]
) -> None:
    assert ranges.runs(hits, ["0.17.0", "0.18.0", "0.19.0"], closing=closing) == expected


@pytest.mark.parametrize(
    ("spec", "target", "expected"),
    [
        (">=0.17.0", "0.20.0", ">=0.17.0,<0.20.0"),
        (">=0.17.0,<0.22.0", "0.20.0", ">=0.17.0,<0.20.0"),
        (">=0.17.0,<0.19.0", "0.20.0", ">=0.17.0,<0.19.0"),  # already below: kept as written
        ("<=0.20.0,>=0.17.0", "0.20.0", ">=0.17.0,<0.20.0"),
    ],
)
def test_cap(spec: str, target: str, expected: str) -> None:
    assert ranges.cap(spec, target) == expected


@pytest.mark.parametrize(
    ("spec", "target", "after", "expected"),
    [
        (">=0.17.0,<0.20.0", "0.19.1", None, ">=0.17.0,<0.20.0"),  # holds it: unchanged
        (">=0.17.0,<0.20.0", "0.21.0", "0.22.0", ">=0.17.0,<0.22.0"),
        (">=0.17.0,<0.20.0", "0.21.0", None, ">=0.17.0"),
        (">=0.17.0,!=0.21.0", "0.21.0", None, ">=0.17.0"),
        ("==0.19.1", "0.21.0", None, ""),
    ],
)
def test_widen(spec: str, target: str, after: str | None, expected: str) -> None:
    assert ranges.widen(spec, target, after) == expected


def test_a_version_is_parsed_once_per_text() -> None:
    """`as_version` hands back one Version per distinct text (a check asks every patch about
    the same releases); it equals a fresh parse, and a text that is no version still fails."""
    first = ranges.as_version("0.20.0rc1")
    assert first is ranges.as_version("0.20.0rc1")
    assert first == Version("0.20.0rc1") and first < ranges.as_version("0.20.0")
    with pytest.raises(InvalidVersion):
        ranges.as_version("not a version")
    assert not ranges.is_version("not a version")
    assert ranges.holds(">=0.20.0rc1,<0.21", "0.20.0") and not ranges.holds(">=0.21", "0.20.0")


@pytest.mark.parametrize(
    ("texts", "version", "expected"),
    [
        ((">=0.17.0,<0.20.0", ">=0.17.0"), "0.19.1", (True, 0)),
        ((">=0.17.0,<0.20.0", ">=0.17.0"), "0.20.0", (False, 0)),  # a variant, out of range
        ((">=0.17.0", ">=0.19.0", ">=0.17.0"), "0.18.0", (True, 1)),  # the first that holds
        ((">=0.17.0", ">=0.19.0", "<0.18.0"), "0.18.5", (False, -1)),  # in a gap: no payload
        ((">=0.20.0", ">=0.20.0"), "0.20.0rc1", (False, -1)),
        ((">=0.20.0rc1", ">=0.20.0rc1"), "0.20.0rc2", (True, 0)),  # pre-releases are releases
        (("==0.19.*", "!=0.19.0"), "0.19.1.post1", (True, 0)),
    ],
)
def test_placed_answers_as_packaging_from_the_ranges_texts(
    texts: tuple[str, ...], version: str, expected: tuple[bool, int]
) -> None:
    """`placed` is SpecifierSet.contains with pre-releases over the declared range and each
    variant's, and the patch's `in_range` and `variant_for` are its answer."""
    assert ranges.placed(texts, version) == expected
    declared, *variants = (SpecifierSet(t) for t in texts)
    release = Version(version)
    holding = [i for i, v in enumerate(variants) if v.contains(release, prereleases=True)]
    first = holding[0] if holding else -1
    assert expected == (bool(holding) and declared.contains(release, prereleases=True), first)
