"""The forge (where pull requests live): a pull request's diff, by `owner/repo#N`, and its
state from the forge's REST API (GitHub's ``GET /repos/{owner}/{repo}/pulls/{n}``).

The base URL comes from the caller, else $PATCHSET_FORGE_URL, else the default; the API's from
the caller, else $PATCHSET_FORGE_API_URL, else its default. A token comes from $GITHUB_TOKEN
and is sent only to the API's host, never printed and never cached. Answers are kept in a
cache folder with their ETag and asked again with If-None-Match (a 304 costs nothing of the
forge's rate limit).
"""

from __future__ import annotations

import contextlib
import datetime
import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from patchset._fs import cache_secret, seal
from patchset.adapters import net
from patchset.errors import PayloadError, SourceError, UsageError, one_line

FORGE_ENV = "PATCHSET_FORGE_URL"
DEFAULT_FORGE = "https://github.com"
API_ENV = "PATCHSET_FORGE_API_URL"
DEFAULT_FORGE_API = "https://api.github.com"
MAX_ANSWER = 2 << 20  # bytes of one API answer (a pull request is tens of kB)
MAX_DEPTH = 64  # how deep its JSON may nest (the API's nests 4 deep)
TOKEN_ENV = "GITHUB_TOKEN"  # noqa: S105 -- the variable's name, not a token
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


def configured_url(explicit: str | None, env: str, default: str, what: str) -> str:
    """`explicit`, else $`env`, else `default`, without a trailing slash. A URL from the
    environment that cannot be used is bad configuration (UsageError, exit 2) naming the
    variable; one the caller gave is checked where it is used."""
    if explicit:
        return explicit.rstrip("/")
    value = os.environ.get(env)
    if not value:
        return default
    try:
        net.check_url(value, what)
    except SourceError as exc:
        raise UsageError(f"${env}: {exc}") from None
    return value.rstrip("/")


def forge_url(explicit: str | None = None) -> str:
    """The forge's base URL: `explicit`, else $PATCHSET_FORGE_URL, else the default."""
    return configured_url(explicit, FORGE_ENV, DEFAULT_FORGE, "the forge URL")


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


ForgeState = Literal["open", "merged", "closed", "gone"]


class ForgeError(SourceError):
    """The forge's API cannot answer: unreachable, a refused token, a spent rate limit, an
    answer that is not the API's (exit 3)."""


@dataclass(frozen=True)
class PullState:
    """What the forge says of one pull request."""

    pr: str  # owner/repo#N
    state: ForgeState  # "gone": the forge answered 404
    merged_at: str | None = None
    merge_commit: str | None = None
    cached: bool = False  # the forge answered 304: the cached answer stands


def api_url(explicit: str | None = None) -> str:
    """The forge API's base URL: `explicit`, else $PATCHSET_FORGE_API_URL, else the default."""
    return configured_url(explicit, API_ENV, DEFAULT_FORGE_API, "the forge API URL")


class ForgeAPI:
    """The forge's pull-request API with an ETag cache under `cache_dir` (None: no cache)."""

    def __init__(
        self,
        api: str | None = None,
        *,
        token: str | None = None,
        cache_dir: Path | None = None,
        timeout: float = net.DEFAULT_TIMEOUT,
    ) -> None:
        self.api = net.check_url(api_url(api), "the forge API URL")
        self._token = token if token is not None else os.environ.get(TOKEN_ENV) or None
        self.cache_dir = cache_dir
        self.timeout = timeout

    def pull(self, pr: str) -> PullState:
        """The state of `pr` (owner/repo#N); ForgeError when the forge cannot say."""
        owner, repo, number = parse_pr(pr)
        ref = f"{owner}/{repo}#{number}"
        url = f"{self.api}/repos/{owner}/{repo}/pulls/{number}"
        cached = self._cached(url)
        headers = {"Accept": "application/vnd.github+json", "X-GitHub-Api-Version": "2022-11-28"}
        if cached is not None:
            headers["If-None-Match"] = cached[0]
        private = {"Authorization": f"Bearer {self._token}"} if self._token else None
        try:
            answer = net.fetch_answer(
                url,
                headers=headers,
                private=private,
                timeout=self.timeout,
                what="the forge",
                max_bytes=MAX_ANSWER,
                whole=self.timeout,  # the whole answer, not each read: a drip is cut off
            )
        except ForgeError:
            raise
        except SourceError as exc:
            raise ForgeError(str(exc)) from None
        shown = net.redact(url)
        if answer.status == 304 and cached is not None:
            return _pull_state(ref, cached[1], shown, cached=True)
        if answer.status == 404:
            return PullState(ref, "gone")
        if answer.status in (403, 429) and _rate_limited(answer):
            raise ForgeError(_rate_message(answer, shown, bool(self._token)))
        if answer.status == 401:
            raise ForgeError(f"{shown}: HTTP 401: the forge refused the token in ${TOKEN_ENV}")
        if answer.status != 200:
            why = "access refused" if answer.status == 403 else "unexpected answer"
            raise ForgeError(f"{shown}: HTTP {answer.status}: {why}")
        data = _json(answer.body, shown)
        state = _pull_state(ref, data, shown, cached=False)
        if etag := answer.headers.get("etag"):
            self._keep(url, etag, data)
        return state

    def _path(self, url: str) -> Path | None:
        if self.cache_dir is None:
            return None
        return self.cache_dir / f"{hashlib.sha256(url.encode()).hexdigest()[:32]}.json"

    def _cached(self, url: str) -> tuple[str, dict[str, Any]] | None:
        path = self._path(url)
        if path is None:
            return None
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, RecursionError):
            record = json.loads(path.read_bytes())
            fields = (url, str(record["etag"]), json.dumps(record["body"], sort_keys=True))
            sealed = record.get("seal") == seal(cache_secret(path.parent), *fields)
            if sealed and record["url"] == url and isinstance(record["body"], dict):
                return str(record["etag"]), record["body"]
        return None  # none, or rewritten (its seal does not hold): asked for again

    def _keep(self, url: str, etag: str, data: dict[str, Any]) -> None:
        path = self._path(url)
        if path is None:
            return
        keep = {
            k: data.get(k) for k in ("number", "state", "merged", "merged_at", "merge_commit_sha")
        }
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        try:  # a cache: an answer not kept (a full disk) is asked for again next time
            path.parent.mkdir(parents=True, exist_ok=True)
            fields = (url, etag, json.dumps(keep, sort_keys=True))
            mark = seal(cache_secret(path.parent), *fields)
            tmp.write_text(json.dumps({"url": url, "etag": etag, "body": keep, "seal": mark}))
            tmp.replace(path)
        except OSError:
            with contextlib.suppress(OSError):
                tmp.unlink(missing_ok=True)


def _json(body: bytes, shown: str) -> dict[str, Any]:
    if _depth(body) > MAX_DEPTH:
        raise ForgeError(
            f"{shown}: the forge's answer is nested more than {MAX_DEPTH} deep, not the API's"
        )
    try:
        data = json.loads(body)
    except RecursionError:  # pragma: no cover - _depth stops these first
        raise ForgeError(f"{shown}: the forge's answer is nested too deeply") from None
    except (ValueError, UnicodeDecodeError):
        start = body.lstrip()[:1]
        kind = "an HTML page" if start == b"<" else "not JSON"
        raise ForgeError(f"{shown}: the forge's answer is {kind}, not the API's") from None
    if not isinstance(data, dict):
        raise ForgeError(f"{shown}: the forge's answer is not a pull request (a JSON object)")
    return data


_SHA = re.compile(r"[0-9a-f]{7,64}")


def _shown(value: object) -> str | None:
    """A text from the forge made safe for every format: control bytes (ESC, BEL, newlines)
    escaped, at most 64 characters; None for what is not a text."""
    if not isinstance(value, str) or not value:
        return None
    return one_line(value[:64])


def _depth(body: bytes) -> int:
    """How deep the JSON text's arrays and objects nest (brackets in strings not counted)."""
    depth = deepest = 0
    text = re.sub(rb'"(?:[^"\\]|\\.)*"', b'""', body)
    for byte in text.translate(None, _NOT_BRACKETS):
        depth += 1 if byte in b"[{" else -1
        deepest = max(deepest, depth)
    return deepest


_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def _pull_state(ref: str, data: dict[str, Any], shown: str, *, cached: bool) -> PullState:
    state, merged = data.get("state"), data.get("merged")
    if state not in ("open", "closed") or not isinstance(merged, bool | None):
        raise ForgeError(
            f"{shown}: the forge's answer is not a pull request"
            f" (state {state!r}, merged {merged!r})"
        )
    merged_at = _shown(data.get("merged_at"))
    sha = data.get("merge_commit_sha")
    sha = sha if isinstance(sha, str) and _SHA.fullmatch(sha) else None
    if merged or (merged is None and merged_at):
        return PullState(ref, "merged", merged_at, sha, cached)
    return PullState(ref, "closed" if state == "closed" else "open", None, None, cached)


def _rate_limited(answer: net.Answer) -> bool:
    return (
        answer.status == 429
        or answer.headers.get("x-ratelimit-remaining") == "0"
        or "retry-after" in answer.headers
    )


def _rate_message(answer: net.Answer, shown: str, token: bool) -> str:
    reset = answer.headers.get("x-ratelimit-reset", "")
    when = ""
    if reset.isdigit() and len(reset) <= 12:  # a time a clock can show (not 10**5000)
        with contextlib.suppress(OverflowError, OSError, ValueError):
            at = datetime.datetime.fromtimestamp(int(reset), tz=datetime.UTC)
            when = f" until {at:%H:%M} UTC"
    elif (after := answer.headers.get("retry-after", "")).isdigit():
        when = f" for {after} s"
    hint = "wait, or ask less often" if token else f"set ${TOKEN_ENV}, or wait"
    return f"{shown}: HTTP {answer.status}: the forge's rate limit is spent{when}; {hint}"
