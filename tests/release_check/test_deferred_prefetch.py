"""The check's prefetch is done when a result is first worked out: a check the memo answers
fetches nothing (and decodes no release's file list), with the same report."""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import pytest

from patchset.registry import load_registry
from patchset.release_check import check, parallel
from patchset.release_check.memo import Memo
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index.cache import Cache
from tests.helpers.fake_index import FakeIndex
from tests.helpers.synthetic import add_patch
from tests.release_check.test_check_hardening import (
    DIFF,
    FILES,
    TARGET,
    publish,
    synthetic_wheel,
)

VERSIONS = ["0.1.0", "0.2.0", "0.3.0"]


class CountingSource(IndexSource):
    """An index source that counts its prefetches."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.prefetches = 0

    def prefetch(
        self, versions: Iterable[str], *, paths: Sequence[str] | None = None, **kwargs: Any
    ) -> dict[str, Path]:
        self.prefetches += 1
        return super().prefetch(versions, paths=paths, **kwargs)


@pytest.fixture
def published(fake_index: FakeIndex) -> FakeIndex:
    for version in VERSIONS:
        publish(fake_index, version, synthetic_wheel(version, FILES))
    return fake_index


def run(root: Path, index: FakeIndex, cache: Cache, memo: Path, jobs: int) -> tuple[str, int]:
    source = CountingSource(index.index_url, cache=cache)
    report = check(
        load_registry(root), VERSIONS, source=source, memo=Memo(memo), jobs=jobs, explain="all"
    )
    return json.dumps(report.to_dict(), default=str), source.prefetches


@pytest.mark.parametrize("jobs", [1, 2])
def test_a_check_the_memo_answers_fetches_nothing(
    published: FakeIndex,
    tmp_cache: Cache,
    tmp_path: Path,
    jobs: int,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parallel, "SMALLEST", 2)  # split among processes when 2 are asked
    root = tmp_path / "patches"
    for n in range(3):
        add_patch(root, f"edit-target-{n}", diff=DIFF, targets=[TARGET])
    memo = tmp_path / "memo"
    cold, fetched = run(root, published, tmp_cache, memo, jobs)
    assert fetched == 1
    warm, fetched = run(root, published, tmp_cache, memo, jobs)
    assert (warm, fetched) == (cold, 0)
    toml = root / "edit-target-1" / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    edited, fetched = run(root, published, tmp_cache, memo, jobs)
    assert fetched == 1  # a result to work out: the prefetch first
    unmemoised = check(
        load_registry(root),
        VERSIONS,
        source=IndexSource(published.index_url, cache=tmp_cache),
        use_memo=False,
        explain="all",
    )
    assert edited == json.dumps(unmemoised.to_dict(), default=str)


def test_a_warm_check_decodes_no_file_list(
    published: FakeIndex, tmp_cache: Cache, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = tmp_path / "patches"
    add_patch(root, "edit-target", diff=DIFF, targets=[TARGET])
    memo = tmp_path / "memo"
    cold, _ = run(root, published, tmp_cache, memo, 1)
    from patchset.sources.package_index import packing

    def refused(self: packing.Members) -> object:
        raise AssertionError("a release's file list decoded")

    monkeypatch.setattr(packing.Members, "_decoded", refused)
    warm, fetched = run(root, published, tmp_cache, memo, 1)
    assert (warm, fetched) == (cold, 0)
