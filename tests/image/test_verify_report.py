"""`patchset verify`'s report of a proved start, per patch (no Docker): the entrypoint's lines
gathered per patch, each with its outcome and the policy a failure went by."""

from __future__ import annotations

import pytest

from patchset.errors import UsageError
from patchset.image.verify import environment_of, per_patch, report_json
from patchset.kernel.manifest import StartOutcome, StartReport

REPORT = StartReport(
    True,
    "0" * 64,
    None,
    (
        StartOutcome("gpu", "-", "12.0 (PATCHSET_COMPUTE_CAPABILITY)"),
        StartOutcome("off-default r1", "startup", "off (by default; PS_E2E_OFF=1 turns it on)"),
        StartOutcome("plain r2", "startup", "applied"),
        StartOutcome("proved r1", "startup", "applied"),
        StartOutcome(
            "broken r1", "startup", "FAILED (its [failure] policy = warn: left out, ...): x", True
        ),
        StartOutcome("may-fail r1", "startup", "applied"),
        StartOutcome("proved r1", "startup", "verified"),
        StartOutcome("may-fail r1", "startup", "verify FAILED (PATCHSET_ON_FAILURE=warn): y"),
    ),
)


def test_per_patch_outcomes() -> None:
    got = {p.patch: (p.outcome, p.states) for p in per_patch(REPORT)}
    assert list(got) == ["off-default r1", "plain r2", "proved r1", "broken r1", "may-fail r1"]
    assert got["off-default r1"][0] == "off"
    assert got["plain r2"][0] == "applied"  # no [[verify]]: what the start did
    assert got["proved r1"] == ("verified", ("applied", "verified"))
    assert got["broken r1"][0] == "failed (warn)"
    assert got["may-fail r1"][0] == "failed (warn)"
    refused = StartReport(
        False, None, None, (StartOutcome("p r1", "startup", "verify FAILED: z", ok=False),)
    )
    assert [p.outcome for p in per_patch(refused)] == ["failed (fail)"]


def test_report_json_modes() -> None:
    start = report_json(REPORT, mode="start")
    assert start["mode"] == "start" and start["ok"] is True
    assert start["patches"][2] == {
        "patch": "proved r1",
        "apply": "startup",
        "outcome": "verified",
        "states": ["applied", "verified"],
    }
    assert "patches" not in report_json(REPORT, mode="present")


def test_env_pairs() -> None:
    assert environment_of(["A=1", "B=x=y", "C="]) == {"A": "1", "B": "x=y", "C": ""}
    with pytest.raises(UsageError, match="give KEY=VALUE"):
        environment_of(["NOEQUALS"])
