"""The forge (where pull requests live): a pull request's diff, by `owner/repo#N`.

The base URL comes from the caller, else $PATCHSET_FORGE_URL, else the default.
"""

from __future__ import annotations

import os
import re

from patchset.adapters import net
from patchset.errors import PayloadError, UsageError

FORGE_ENV = "PATCHSET_FORGE_URL"
DEFAULT_FORGE = "https://github.com"
PR_RULE = re.compile(r"^(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+)#(?P<number>\d+)$")


def parse_pr(pr: str) -> tuple[str, str, int]:
    match = PR_RULE.match(pr)
    if match is None:
        raise UsageError(f"--pr {pr!r}: expected owner/repo#number, e.g. vllm-project/vllm#36325")
    return match["owner"], match["repo"], int(match["number"])


def forge_url(explicit: str | None = None) -> str:
    """The forge's base URL: `explicit`, else $PATCHSET_FORGE_URL, else the default."""
    return (explicit or os.environ.get(FORGE_ENV) or DEFAULT_FORGE).rstrip("/")


def pr_diff_url(pr: str, forge: str | None = None) -> str:
    owner, repo, number = parse_pr(pr)
    return f"{forge_url(forge)}/{owner}/{repo}/pull/{number}.diff"


def fetch_pr_diff(pr: str, forge: str | None = None) -> str:
    """The pull request's diff from the forge (through `net`: retries, no retry on 4xx)."""
    url = pr_diff_url(pr, forge)
    data = net.fetch_bytes(url, what="the forge")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise PayloadError("the forge's answer is not UTF-8 text", path=net.redact(url)) from None
