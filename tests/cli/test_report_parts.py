"""A report in parts (patchset/cli/report_parts.py) prints the bytes the whole report's JSON
is, whatever its results hold (text json escapes, empty lists, releases without details), and
round-trips through its stored form; an edit's parts put in place of the old are the bytes
of the report made with the edit."""

from __future__ import annotations

import json
import random
from pathlib import Path

from patchset.cli import report_parts
from patchset.cli.output import dumps
from patchset.cli.registry_state import Files
from patchset.registry import Registry, load_patch
from patchset.registry.load import registry_digest
from patchset.release_check import CheckReport, CheckResult, suggest_ranges
from patchset.release_check.report import Signals
from patchset.sources.base import ReleaseInfo
from tests.helpers.synthetic import add_patch

TEXTS = ["", "plain", 'quote " and \\ back', "line\nbreak\ttab", "ünïcode ✓", "\x00\x1f\x7f", "</>"]
VERDICTS = ["needed", "upstream", "conflict", "partial", "missing-target"]


def _registry(root: Path, count: int) -> Registry:
    patches = []
    for n in range(count):
        folder = add_patch(root, f"p{n:02d}-x", diff="", targets=["vllm/a.py"])
        (folder / "patch.diff").write_text(
            "--- a/vllm/a.py\n+++ b/vllm/a.py\n@@ -1 +1 @@\n-a\n+b\n"
        )
        patches.append(load_patch(folder))
    digest = registry_digest([(p.id, p.digest) for p in patches], [])
    return Registry(root=root, patches=tuple(patches), digest=digest)


def _report(rng: random.Random, registry: Registry, versions: list[str]) -> CheckReport:
    results = [
        CheckResult(
            vllm=version,
            patch=patch.id,
            revision=rng.randint(1, 3),
            variant=rng.choice(["default", "v2"]),
            verdict=rng.choice(VERDICTS),  # type: ignore[arg-type]
            in_range=rng.random() < 0.7,
            detail=rng.choice(TEXTS),
            signals=Signals(
                rng.choice(["applies", "conflict"]),
                rng.choice([None, True]),
                rng.choice([None, False]),
            ),
            disagreement=rng.choice([None, *TEXTS]),
            locations=tuple(rng.sample(TEXTS, rng.randint(0, 3))),
            moved_to=tuple(rng.sample(TEXTS, rng.randint(0, 2))),
        )
        for version in versions
        for patch in registry.patches
    ]
    releases = tuple(
        ReleaseInfo(
            v,
            rng.choice(TEXTS),
            rng.choice([None, "ab" * 32]),
            rng.choice([None, {}, {"checked": [{"path": "vllm/a.py", "sha256": "0"}], "x": TEXTS}]),
        )
        for v in versions
    )
    return CheckReport(
        registry=registry.digest,
        releases=releases,
        results=tuple(results),
        suggested=suggest_ranges(results, versions),
        patches={p.id: p.gates() for p in registry.patches},
    )


def test_parts_print_the_whole_reports_bytes_and_round_trip(tmp_path: Path) -> None:
    rng = random.Random(38)  # noqa: S311 - a fixed seed: the same reports every run
    registries = [_registry(tmp_path / f"patches-{n}", n) for n in (0, 1, 5)]
    files = Files("d", 0.0, {"p00-x/": "s"})
    for trial in range(40):
        registry = registries[trial % 3]
        versions = [f"0.{n}.0" for n in range(rng.randint(1, 4))]
        report = _report(rng, registry, versions)
        parts = report_parts.parts_of(report, registry, files)
        assert parts is not None
        assert parts.text() == dumps(report.to_dict()) + "\n"
        assert parts.code == report.exit_code
        again = report_parts.from_data(json.loads(json.dumps(report_parts.to_data(parts))))
        assert again == parts


def test_an_edits_parts_are_the_bytes_of_the_report_made_with_it(tmp_path: Path) -> None:
    rng = random.Random(7)  # noqa: S311 - a fixed seed
    registry = _registry(tmp_path / "patches", 4)
    versions = ["0.1.0", "0.2.0", "0.3.0"]
    files = Files("d", 0.0, {})
    whole = _report(rng, registry, versions)
    parts = report_parts.parts_of(whole, registry, files)
    assert parts is not None
    # patch p02-x's results made again (another outcome everywhere), the rest as they were
    edited = _report(rng, registry, versions)
    mine = [r for r in edited.results if r.patch == "p02-x"]
    alone = CheckReport(
        registry="-",
        releases=whole.releases,
        results=tuple(mine),
        suggested=suggest_ranges(mine, versions),
        patches={"p02-x": registry.patches[2].gates()},
    )
    made = report_parts.updated(parts, [registry.patches[2]], alone, files, {})
    assert made is not None
    results = tuple(
        next(m for m in mine if m.vllm == r.vllm) if r.patch == "p02-x" else r
        for r in whole.results
    )
    expected = CheckReport(
        registry=registry_digest([(p.id, p.digest) for p in registry.patches], []),
        releases=whole.releases,
        results=results,
        suggested=suggest_ranges(results, versions),
        patches=whole.patches,
    )
    assert made.text() == dumps(expected.to_dict()) + "\n"
