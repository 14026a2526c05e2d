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
# A pull request's page as a browser shows it: <forge>/<owner>/<repo>/pull/<n>[/files|.diff...]
PR_URL = re.compile(
    r"^(?P<forge>https?://[^/\s]+(?:/[^\s]*?)?)/(?P<owner>[\w.-]+)/(?P<repo>[\w.-]+)"
    r"/pulls?/(?P<number>\d+)(?:[/.#?][^\s]*)?$"
)


def parse_pr(pr: str) -> tuple[str, str, int]:
    """`owner/repo#N`, or a pull request's browser URL, as (owner, repo, number)."""
    match = PR_RULE.match(pr) or PR_URL.match(pr.strip())
    if match is None:
        raise UsageError(
            f"--pr {pr!r}: expected owner/repo#number (e.g. vllm-project/vllm#36325) or the"
            " pull request's URL"
        )
    return match["owner"], match["repo"], int(match["number"])


def pr_ref(pr: str) -> tuple[str, str | None]:
    """The canonical `owner/repo#N` of `pr`, and the forge its URL names (None for the
    short form)."""
    owner, repo, number = parse_pr(pr)
    url = PR_URL.match(pr.strip())
    return f"{owner}/{repo}#{number}", url["forge"] if url else None


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
