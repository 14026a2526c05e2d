"""The release check: which patches a vLLM release still needs, from the release's own code.

`run` is the check over releases (`check`, the package-level `patchset.check`, and
`check_tree` for one release; `files_needed` says what a check reads), `verdicts` the decision
ladder for one (release, patch), `report` the results and the ranges they suggest. `moves`
finds where a missing target file went (check and refresh); `memo` keeps results by content.
"""
# Each name is imported on first use: a module of this package is imported without the rest
# (`patchset check` answering from a kept report imports none of the loader).

from __future__ import annotations

from typing import TYPE_CHECKING

from patchset._lazy import exports

if TYPE_CHECKING:
    from patchset.release_check.report import (
        ATTENTION,
        SCHEMA,
        VERDICTS,
        CheckReport,
        CheckResult,
        Explain,
        Signals,
        Verdict,
        suggest_ranges,
    )
    from patchset.release_check.run import check, check_tree, files_needed

__all__ = [
    "ATTENTION",
    "SCHEMA",
    "VERDICTS",
    "CheckReport",
    "CheckResult",
    "Explain",
    "Signals",
    "Verdict",
    "check",
    "check_tree",
    "files_needed",
    "suggest_ranges",
]

_WHERE = {
    **dict.fromkeys(
        (
            "ATTENTION",
            "SCHEMA",
            "VERDICTS",
            "CheckReport",
            "CheckResult",
            "Explain",
            "Signals",
            "Verdict",
            "suggest_ranges",
        ),
        "patchset.release_check.report",
    ),
    **dict.fromkeys(("check", "check_tree", "files_needed"), "patchset.release_check.run"),
}

__getattr__, __dir__ = exports(__name__, _WHERE, __all__)
