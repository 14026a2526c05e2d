"""The one module that talks HTTP: JSON and small fetches, verified downloads, over urllib.

Transient failures (no connection, a timeout, a cut-off body, a 5xx or a 429) are tried
again with exponential backoff; any other 4xx fails at once. A download is streamed into
a temporary file beside its destination, hashed on the way, and renamed into place only
when its sha256 is the expected one, so a bad file is never left where the caller looks.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import http.client
import json
import logging
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from patchset._fs import atomic_file
from patchset.errors import IntegrityError, SourceError

LOG = logging.getLogger(__name__)

BACKOFF_BASE = 0.5
"""Seconds before the first retry; doubled for each further one. Tests set it small."""

CHUNK = 1 << 16
USER_AGENT = "patchset (+urllib)"
SCHEMES = ("https", "http", "file")  # file: for a local mirror laid out like the JSON API

T = TypeVar("T")

Progress = Callable[[int, int], None]
"""Called with (bytes received, bytes expected or 0 when unknown) while downloading."""


class HTTPStatusError(SourceError):
    """The server answered with an error status that retrying will not fix (a 4xx)."""

    def __init__(self, url: str, status: int, reason: str) -> None:
        self.url = url
        self.status = status
        super().__init__(f"{redact(url)}: HTTP {status} {reason}".rstrip())


class UnreachableError(SourceError):
    """Every attempt to reach the server failed with a transient error."""


class _TransientError(Exception):
    """Internal: an attempt failed in a way that may go away when tried again."""


def redact(url: str) -> str:
    """The URL without any user:password part, for messages and logs."""
    parts = urllib.parse.urlsplit(url)
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def fetch_json(url: str, *, timeout: float = 30.0, retries: int = 3) -> Any:
    """GET `url` and decode its JSON body; `retries` further attempts after the first."""

    def attempt() -> bytes:
        with _open(url, timeout) as response:
            body = _read(response, -1)
            _check_length(response, len(body))
            return body

    body = _with_retries(url, attempt, retries=retries)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise SourceError(f"{redact(url)}: the answer is not JSON ({exc})") from None


def fetch_bytes(
    url: str,
    *,
    timeout: float = 30.0,
    retries: int = 3,
    max_bytes: int = 32 << 20,
    what: str = "the server",
) -> bytes:
    """GET `url` and return its body (at most `max_bytes`); `what` names the server in
    messages (e.g. "the forge"), since this is not only for the package index."""

    def attempt() -> bytes:
        with _open(url, timeout) as response:
            body = _read(response, max_bytes + 1)
            if len(body) > max_bytes:
                raise SourceError(f"{redact(url)}: the answer is larger than {max_bytes} bytes")
            _check_length(response, len(body))
            return body

    return _with_retries(url, attempt, retries=retries, what=what, hint="")


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    timeout: float = 60.0,
    retries: int = 3,
    progress: Progress | None = None,
) -> None:
    """Download `url` to `dest`, which appears only once its sha256 is verified.

    Raises IntegrityError (and leaves nothing behind) when the bytes do not match.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected = sha256.lower()

    def attempt() -> str:
        # 0o644 as any cache file: readable by the other users of a shared cache
        with atomic_file(dest, mode=0o644, suffix=".part") as tmp, _open(url, timeout) as response:
            digest = _stream(response, tmp, progress)
            if digest != expected:
                raise IntegrityError(
                    f"{redact(url)}: sha256 {digest} does not match the index's {expected};"
                    " the download was deleted"
                )
        return digest

    _with_retries(url, attempt, retries=retries)


def _with_retries(
    url: str,
    attempt: Callable[[], T],
    *,
    retries: int,
    what: str = "the package index",
    hint: str = "; use --offline to work from the cache",
) -> T:
    tries = retries + 1
    reason = ""
    for number in range(1, tries + 1):
        try:
            return attempt()
        except _TransientError as exc:
            reason = str(exc)
        if number < tries:
            delay = BACKOFF_BASE * 2 ** (number - 1)
            LOG.info("%s: %s; trying again in %.1fs", redact(url), reason, delay)
            time.sleep(delay)
    raise UnreachableError(
        f"cannot reach {what} at {redact(url)}: {reason} (tried {tries} times){hint}"
    )


@contextlib.contextmanager
def _open(url: str, timeout: float) -> Iterator[http.client.HTTPResponse]:
    """Open `url`, sorting failures into transient (retry) and final (raise)."""
    try:
        response = urllib.request.urlopen(_request(url), timeout=timeout)  # noqa: S310 -- a Request whose scheme _request checked
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code >= 500 or exc.code == 429:  # 429: the server asks us to come back later
            raise _TransientError(f"HTTP {exc.code} {exc.reason}") from None
        raise HTTPStatusError(url, exc.code, str(exc.reason)) from None
    except urllib.error.URLError as exc:
        raise _TransientError(_reason(exc.reason)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _TransientError(_reason(exc)) from None
    with response:
        yield response


def _read(response: http.client.HTTPResponse, size: int) -> bytes:
    """Read from the connection; a failure there may pass, unlike one writing to disk."""
    try:
        return response.read(size)
    except (OSError, http.client.HTTPException) as exc:
        raise _TransientError(_reason(exc)) from None


def _request(url: str) -> urllib.request.Request:
    """A request with credentials from `user:password@` moved into a Basic auth header."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme not in SCHEMES:
        raise SourceError(f"{redact(url)}: only {', '.join(SCHEMES)} URLs are fetched")
    headers = {"User-Agent": USER_AGENT}
    if "@" in parts.netloc:
        userinfo = parts.netloc.rpartition("@")[0]
        user, _, password = userinfo.partition(":")
        pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        headers["Authorization"] = "Basic " + base64.b64encode(pair.encode()).decode()
    return urllib.request.Request(redact(url), headers=headers)  # noqa: S310 -- scheme checked above


def _stream(response: http.client.HTTPResponse, out: IO[bytes], progress: Progress | None) -> str:
    total = int(response.headers.get("Content-Length") or 0)
    digest = hashlib.sha256()
    done = 0
    if progress:
        progress(0, total)
    while chunk := _read(response, CHUNK):
        digest.update(chunk)
        out.write(chunk)
        done += len(chunk)
        if progress:
            progress(done, total)
    _check_length(response, done)
    return digest.hexdigest()


def _check_length(response: http.client.HTTPResponse, received: int) -> None:
    """urllib returns a short body without complaint when the connection drops early."""
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and received < int(declared):
        raise _TransientError(f"connection closed after {received} of {declared} bytes")


def _reason(exc: object) -> str:
    if isinstance(exc, socket.timeout | TimeoutError):
        return "timed out"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__
