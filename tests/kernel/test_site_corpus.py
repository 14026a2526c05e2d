"""Runtime sites of real shapes from a real vLLM release (tests/helpers/site_corpus.py, also run by
benchmarks/site_corpus.py): every one lands as a plain replacement would, compiles, and
reverts byte for byte."""

from __future__ import annotations

import pytest

from tests.helpers.site_corpus import corpus, run

pytestmark = pytest.mark.network  # the release comes from the package index (cached)


def test_real_shaped_sites_apply_as_written_and_revert_exactly(
    capsys: pytest.CaptureFixture[str],
) -> None:
    outcomes = [run(case) for case in corpus("0.20.0", limit=21)]
    n = len(outcomes)
    identical = sum(o.identical for o in outcomes)
    broken = sum(o.broken for o in outcomes)
    exact = sum(o.revert_exact for o in outcomes)
    with capsys.disabled():
        print(f"\nsites={n} identical={identical} compile_broken={broken} revert_exact={exact}/{n}")
    assert n >= 200
    assert len({o.case.shape for o in outcomes}) == 12  # every shape, with and without tabs
    failing = [o.case.site.name for o in outcomes if not o.identical or o.broken]
    assert not failing, failing[:5]
    assert exact == n
