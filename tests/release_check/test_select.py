"""Which releases a command checks (`patchset.sources.select`), on sources that hold no files."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from patchset.errors import UsageError
from patchset.sources import select
from patchset.sources.base import MemoryTree, ReleaseInfo, ReleaseSource


class Listed(ReleaseSource):
    """A source of a kind (`name`) offering `held`, `cached` of them already here; it answers
    the protocol's questions as that kind's source does."""

    def __init__(self, name: str, held: list[str], cached: list[str] | None = None) -> None:
        self.name, self.held, self.cached = name, held, cached
        self.named_on_trust = name == "index"

    def default_versions(self) -> list[str]:
        return {"index": [], "git": self.held[-1:]}.get(self.name, list(self.held))

    def versions(self) -> list[str]:
        return list(self.held)

    def cached_versions(self) -> list[str]:
        return list(self.held) if self.cached is None else list(self.cached)

    @contextmanager
    def open(self, version: str) -> Iterator[MemoryTree]:
        yield MemoryTree(ReleaseInfo(version, self.name), {})


HELD = ["0.17.0", "0.18.0", "0.19.1"]


@pytest.mark.parametrize(
    ("name", "versions", "since", "expected"),
    [
        ("index", ["0.19.1", "0.19.1"], None, ["0.19.1"]),
        ("index", ["latest"], None, ["0.19.1"]),
        ("index", ["0.17.0"], "0.17.0", ["0.17.0", "0.18.0", "0.19.1"]),
        ("index", ["9.9"], None, ["9.9"]),  # the index is asked when the release is opened
        ("git", [], None, ["0.19.1"]),
        ("folder", [], None, HELD),
    ],
)
def test_for_check(name: str, versions: list[str], since: str | None, expected: list[str]) -> None:
    assert select.for_check(Listed(name, HELD), versions=versions, since=since) == expected


@pytest.mark.parametrize(
    ("name", "versions", "since", "message"),
    [
        ("index", [], None, "say which releases"),
        ("index", ["0.19"], "nope", "--since 'nope' is not a PEP 440 version"),
        ("index", ["x.y"], None, "--vllm 'x.y' is not a PEP 440 version"),
        ("git", ["0.20.0"], None, "the source has no release 0.20.0"),
    ],
)
def test_for_check_refusals(
    name: str, versions: list[str], since: str | None, message: str
) -> None:
    with pytest.raises(UsageError, match=message):
        select.for_check(Listed(name, HELD), versions=versions, since=since)


def test_for_add_checks_what_is_here_when_nothing_is_named() -> None:
    source = Listed("index", HELD, cached=["0.18.0"])
    assert select.for_add(source) == ["0.18.0"]
    assert select.for_add(source, since="0.17.0") == ["0.17.0", "0.18.0", "0.19.1"]
    assert select.for_add(source, versions=["0.17.0", "0.17.0"]) == ["0.17.0"]
    with pytest.raises(UsageError, match="'bad' is not a PEP 440 version"):
        select.for_add(source, versions=["bad"])


def test_one_release() -> None:
    source = Listed("git", HELD)
    assert select.one(source, "latest") == ("0.19.1", HELD)
    assert select.one(source, "0.19.1") == ("0.19.1", HELD)
    with pytest.raises(UsageError, match=r"not a release the git source offers \(did you mean"):
        select.one(source, "0.19.2")
    with pytest.raises(UsageError, match="the git source offers no release"):
        select.one(Listed("git", []), "latest")
    with_pre = Listed("git", ["0.19.1", "0.20.0rc1"])
    assert select.one(with_pre, "latest")[0] == "0.19.1"  # refresh --vllm latest: final only
    assert select.one(with_pre, "latest", pre=True)[0] == "0.20.0rc1"  # ...unless --pre


WITH_PRE = ["0.19.1", "0.20.0rc1", "0.20.0", "0.21.0rc2"]


@pytest.mark.parametrize(
    ("versions", "since", "pre", "expected"),
    [
        ([], "0.19.1", False, ["0.19.1", "0.20.0"]),  # --since X includes X
        ([], "0.20.0", False, ["0.20.0"]),  # the newest: itself, not an empty selection
        ([], "0.20.1", False, []),  # nothing at or after it yet: empty, not an error
        ([], "0.20.0", True, ["0.20.0", "0.21.0rc2"]),
        (["latest"], None, False, ["0.20.0"]),  # latest skips a newer pre-release...
        (["latest"], None, True, ["0.21.0rc2"]),  # ...unless --pre
        (["0.21.0rc2"], None, False, ["0.21.0rc2"]),  # named: checked whatever it is
    ],
)
def test_since_includes_its_release_and_pre_releases_need_pre(
    versions: list[str], since: str | None, pre: bool, expected: list[str]
) -> None:
    source = Listed("folder", WITH_PRE)
    assert select.for_check(source, versions=versions, since=since, pre=pre) == expected


def test_for_add_since_is_inclusive_and_final_only() -> None:
    source = Listed("index", WITH_PRE)
    assert select.for_add(source, since="0.20.0") == ["0.20.0"]
    assert select.for_add(source, since="0.20.0", pre=True) == ["0.20.0", "0.21.0rc2"]
