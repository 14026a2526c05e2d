"""The release check: which patches a vLLM release still needs, from the release's own code.

`run` is the check over releases (`check`, the package-level `patchset.check`, and
`check_tree` for one release; `files_needed` says what a check reads), `verdicts` the decision
ladder for one (release, patch), `report` the results and the ranges they suggest. `moves`
finds where a missing target file went (check and refresh); `memo` keeps results by content.
"""

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
