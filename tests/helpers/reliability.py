"""The ledger behind docs/reliability.md: every hostile input tried and fault injected.

Hardening tests call `record` once per case with `intact`: whether everything they check about
the files held (nothing outside the target touched, nothing written on failure, a revert or a
roll-back restoring every byte). A case that breaks an invariant is recorded before the test
fails, so the table counts it.

Records go to the JSON-lines file named by ``$PATCHSET_RELIABILITY_LOG`` when it is set (by
`benchmarks/reliability_report.py`) and nowhere otherwise. Loaded as a plugin
(``-p tests.helpers.reliability``), this module also records the outcome of the existing
download and index tests that inject faults, so they count without being written twice.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

LOG_ENV = "PATCHSET_RELIABILITY_LOG"

# Kinds of record, in the order the table lists them.
HOSTILE = "hostile input"
FAULT = "fault injected"

# Existing tests that inject a fault, counted by their outcome (see tests/adapters/test_net.py and
# tests/sources/test_index_source.py): the test passing means nothing corrupt was used or kept.
_HARD = "tests/release_check/test_check_hardening.py::"
REUSED: dict[str, str] = {
    "tests/adapters/test_net.py::test_a_500_is_retried": "index answers 5xx, then recovers",
    "tests/adapters/test_net.py::test_persistent_500_gives_one_clear_line": (
        "index answers 5xx, always"
    ),
    "tests/adapters/test_net.py::test_unreachable_port": "index unreachable",
    "tests/adapters/test_net.py::test_a_hung_server_is_given_up_on_after_the_timeout": (
        "index times out"
    ),
    "tests/adapters/test_net.py::test_not_json": "index answers garbage",
    "tests/adapters/test_net.py::test_download_retries_a_truncated_body": (
        "download cut short, then whole"
    ),
    "tests/adapters/test_net.py::test_download_always_truncated_leaves_nothing": (
        "download cut short"
    ),
    "tests/adapters/test_net.py::test_wrong_sha256_deletes_and_does_not_retry": (
        "download corrupted"
    ),
    "tests/sources/test_index_source.py::test_unreachable_index_says_offline": "index unreachable",
    "tests/sources/test_index_source.py::test_verify_full_refuses_a_wheel_the_index_disowns": (
        "download corrupted"
    ),
    "tests/sources/test_index_source.py::test_a_damaged_member_is_fetched_again": (
        "cached member corrupted"
    ),
    "tests/sources/test_index_source.py::test_a_damaged_manifest_is_rebuilt_not_believed": (
        "cached tree corrupted"
    ),
    "tests/sources/test_index_source.py::test_a_tampered_answer_keeps_the_cached_release": (
        "cached index answer tampered"
    ),
    "tests/sources/test_index_source.py::test_a_damaged_central_directory_is_one_clear_error": (
        "wheel directory lies"
    ),
    "tests/sources/test_index_source.py::test_a_member_that_lies_is_never_used_and_fetched_again": (
        "wheel member corrupted"
    ),
    "tests/sources/test_index_source.py::test_a_server_without_ranges_falls_back_to_the_sdist": (
        "server ignores ranges"
    ),
    "tests/sources/test_index_source.py::test_two_readers_read_the_directory_once": (
        "two readers, one cache"
    ),
    "tests/sources/test_index_source.py::test_a_held_lock_times_out": "cache lock held elsewhere",
    # issue 23, the check's classes (tests/release_check/test_check_hardening.py)
    _HARD + "TestWheelDirectoryAgainstRecord::test_a_damaged_wheel_is_exit_3_and_nothing"
    "_is_cached": "wheel directory and RECORD disagree",
    f"{_HARD}TestInflationBound::test_a_bomb_is_refused_without_inflating_it": "inflation bomb",
    f"{_HARD}TestCacheEntries::test_a_full_disk_under_the_cache_is_one_line_exit_3": (
        "full disk under the cache"
    ),
    f"{_HARD}TestCacheEntries::test_an_entry_that_is_not_a_file_is_fetched_again": (
        "cache entry a folder or FIFO"
    ),
    f"{_HARD}TestCacheEntries::test_a_rewritten_memo_row_is_not_believed": "memo row rewritten",
    f"{_HARD}TestIndexPages::test_another_projects_wheel_on_the_page_is_skipped": (
        "another project's file on the page"
    ),
    f"{_HARD}TestIndexPages::test_a_version_of_thousands_of_digits_is_refused_in_one_line": (
        "a version of 5,000 digits"
    ),
    f"{_HARD}TestIndexPages::test_since_is_bounded_and_says_so": "20,000-release --since",
}

# Issue 37's tests, each case (a parametrised one per parameter) counted by its outcome as it
# is: what it checks is that nothing outside its scratch tree changed, nothing was lost and
# nothing half-written.
BY_FILE: dict[str, tuple[str, str]] = {
    "tests/test_hostile_scripts.py": (HOSTILE, "sandbox: hostile anchor scripts (E1 E2 E9 E12)"),
    "tests/test_hostile_forge.py": (
        HOSTILE,
        "forge on 127.0.0.1: answers and caches (E13 E14 E20)",
    ),
    "tests/test_import_faults.py": (
        FAULT,
        "import: kill -9, other writers, full disk (E5-E7 E15 E19)",
    ),
    "tests/test_hostile_big.py": (HOSTILE, "big files: apply and validate (E22)"),
}


def record(kind: str, group: str, case: str, *, intact: bool) -> None:
    """Count one case; `intact` is False when anything was lost or half-written."""
    path = os.environ.get(LOG_ENV)
    if not path:
        return
    line = json.dumps({"kind": kind, "group": group, "case": case, "intact": intact})
    # One short write to a file opened for appending: lines of concurrent writers stay whole.
    with Path(path).open("a", encoding="utf-8") as log:
        log.write(line + "\n")


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Record the reused fault tests by outcome (only when loaded as a plugin)."""
    if report.when != "call" or report.skipped:
        return
    group = REUSED.get(report.nodeid.split("[")[0])
    if group is not None:
        record(FAULT, f"downloads and index: {group}", report.nodeid, intact=report.passed)
    counted = BY_FILE.get(report.nodeid.split("::")[0])
    if counted is not None:
        record(*counted, report.nodeid, intact=report.passed)
