"""The one module that talks HTTP: pages and small fetches, byte ranges, verified downloads.

Everything goes through urllib3 with one `Transport` (in `transport`): the TLS trust (the
system's trust store through `truststore`, or a CA bundle named in pip's configuration), hosts
trusted without TLS verification, and credentials from the URL or ``~/.netrc``. Connections
are kept alive and reused (one pool per host; a proxy from ``https_proxy``/``http_proxy`` is
honoured, as ``no_proxy``), so the many small range requests of a check do not each pay a TLS
handshake.
``file:`` URLs are read from disk, ranges included, so a local mirror works like a remote one.

Transient failures (no connection, a timeout, a cut-off body, a 5xx or a 429) are tried
again with exponential backoff; any other 4xx fails at once. A download is streamed into
a temporary file beside its destination, hashed on the way, and renamed into place only
when its sha256 is the expected one, so a bad file is never left where the caller looks.

urllib3, `http.client` and `ssl` are imported with the first request (`pools`), not with
this module: a command that asks no server (a report kept from last time) does not pay ~30 ms.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import logging
import os
import re
import time
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import IO, Any, TypeVar

from patchset._fs import atomic_file
from patchset.adapters.net.transport import DEFAULT_TRANSPORT as DEFAULT_TRANSPORT
from patchset.adapters.net.transport import Transport as Transport
from patchset.adapters.net.transport import _netrc_entry as _netrc_entry  # tests clear it
from patchset.errors import IntegrityError, SourceError

LOG = logging.getLogger(__name__)

BACKOFF_BASE = 0.5
"""Seconds before the first retry; doubled for each further one. Tests set it small."""

DEFAULT_TIMEOUT = 30.0
"""Seconds one request may wait on its server without hearing anything (to connect, for the
answer, between two reads), its retries included: a hung server is given up on after that."""

CHUNK = 1 << 16
USER_AGENT = "patchset (+urllib)"
SCHEMES = ("https", "http", "file")  # file: for a local mirror laid out like an index

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


class RangeError(SourceError):
    """The server does not serve the byte range asked for (it sent the whole file, or
    another range); the caller falls back to reading the whole artifact."""


class _TransientError(Exception):
    """Internal: an attempt failed in a way that may go away when tried again."""


def redact(url: str) -> str:
    """The URL without any user:password part, for messages and logs."""
    try:
        parts = urllib.parse.urlsplit(url)
    except ValueError:
        return url.rpartition("@")[2] if "@" in url else url
    if "@" not in parts.netloc:
        return url
    host = parts.netloc.rpartition("@")[2]
    return urllib.parse.urlunsplit(parts._replace(netloc=host))


def check_url(url: str, what: str = "URL") -> str:
    """`url` if urllib can use it (scheme, host, port); SourceError naming it otherwise."""
    try:
        parts = urllib.parse.urlsplit(url)
        _ = parts.port  # raises ValueError for a port that is not a number
    except ValueError as exc:
        raise SourceError(f"{what} {redact(url)!r} is malformed ({exc})") from None
    if parts.scheme not in SCHEMES:
        raise SourceError(f"{what} {redact(url)!r}: only {', '.join(SCHEMES)} URLs are used")
    if parts.scheme != "file" and not parts.hostname:
        raise SourceError(f"{what} {redact(url)!r} names no host")
    return url


def fetch_page(
    url: str,
    *,
    accept: str,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    transport: Transport = DEFAULT_TRANSPORT,
    max_bytes: int = 64 << 20,
) -> tuple[str, str, bytes]:
    """GET `url` with an Accept header: (final URL, content type, body).

    A ``file:`` URL naming a folder reads its ``index.html``, as pip does.
    """
    if urllib.parse.urlsplit(url).scheme == "file":
        path = _file_path(url)
        if path.is_dir():
            path = path / "index.html"
        try:
            data = path.read_bytes()
        except OSError as exc:
            if isinstance(exc, FileNotFoundError):
                raise HTTPStatusError(url, 404, "Not Found") from None
            raise SourceError(f"{redact(url)}: {_reason(exc)}") from None
        kind = "application/json" if path.suffix == ".json" else "text/html"
        return path.as_uri(), kind, data

    def attempt(wait: _Patience) -> tuple[str, str, bytes]:
        with _open(url, wait, transport=transport, headers={"Accept": accept}) as response:
            body = _read_body(response, url, max_bytes)
            kind = response.headers.get("Content-Type") or ""
            return response.url, kind, body

    return _with_retries(url, attempt, retries=retries, timeout=timeout)


def fetch_bytes(
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    max_bytes: int = 32 << 20,
    what: str = "the server",
    transport: Transport = DEFAULT_TRANSPORT,
) -> bytes:
    """GET `url` and return its body (at most `max_bytes`); `what` names the server in
    messages (e.g. "the forge"), since this is not only for the package index."""

    def attempt(wait: _Patience) -> bytes:
        with _open(url, wait, transport=transport) as response:
            return _read_body(response, url, max_bytes)

    return _with_retries(url, attempt, retries=retries, timeout=timeout, what=what, hint="")


_CONTENT_RANGE = re.compile(r"^bytes (\d+)-(\d+)/(\d+|\*)$")


def fetch_range(
    url: str,
    start: int,
    end: int | None,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    transport: Transport = DEFAULT_TRANSPORT,
) -> tuple[bytes, int]:
    """Bytes ``start..end`` (inclusive) of the file at `url`, and the file's whole size.

    With ``end=None``, `start` counts from the end: the last `start` bytes (a suffix range).
    A server that sends the whole file (200) or another range raises RangeError at once:
    the body of a 400 MB file is never read by mistake.
    """
    if urllib.parse.urlsplit(url).scheme == "file":
        return _file_range(url, start, end)
    spec = f"bytes=-{start}" if end is None else f"bytes={start}-{end}"

    def attempt(wait: _Patience) -> tuple[bytes, int]:
        with _open(url, wait, transport=transport, headers={"Range": spec}) as response:
            if response.status != 206:
                raise RangeError(
                    f"{redact(url)}: the server ignores byte ranges (HTTP {response.status})"
                )
            found = _CONTENT_RANGE.match(response.headers.get("Content-Range") or "")
            if found is None or found[3] == "*":
                raise RangeError(f"{redact(url)}: a 206 answer without a usable Content-Range")
            first, last, total = int(found[1]), int(found[2]), int(found[3])
            want_first = max(total - start, 0) if end is None else start
            want_last = total - 1 if end is None else min(end, total - 1)
            if (first, last) != (want_first, want_last):
                raise RangeError(
                    f"{redact(url)}: asked for bytes {want_first}-{want_last},"
                    f" the server sent {first}-{last}"
                )
            body = response.read(last - first + 2)
            if len(body) != last - first + 1:
                raise _TransientError(f"got {len(body)} of {last - first + 1} bytes of a range")
            return body, total

    return _with_retries(url, attempt, retries=retries, timeout=timeout)


def _file_range(url: str, start: int, end: int | None) -> tuple[bytes, int]:
    path = _file_path(url)
    try:
        with path.open("rb") as f:
            return read_range(f, start, end)
    except OSError as exc:
        raise SourceError(f"{redact(url)}: {_reason(exc)}") from None


def read_range(f: IO[bytes], start: int, end: int | None) -> tuple[bytes, int]:
    """`fetch_range`'s answer (bytes ``start..end`` or the last `start`; the size) from `f`."""
    total = os.fstat(f.fileno()).st_size
    first = max(total - start, 0) if end is None else start
    last = total - 1 if end is None else min(end, total - 1)
    f.seek(first)
    return f.read(max(last - first + 1, 0)), total


def _file_path(url: str) -> Path:
    import urllib.request  # noqa: PLC0415 -- file: URLs only (it imports http.client, ssl)

    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def _reason(exc: object) -> str:
    """`pools._reason`: a short cause for a message."""
    from patchset.adapters.net.pools import _reason as reason  # noqa: PLC0415 -- see module

    return reason(exc)


def download(
    url: str,
    dest: Path | IO[bytes],
    *,
    sha256: str,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    progress: Progress | None = None,
    transport: Transport = DEFAULT_TRANSPORT,
) -> None:
    """Download `url` to `dest`, its sha256 checked (else IntegrityError): a path, which only
    then appears (0o644, as any cache file), or an open file, written from its start."""
    expected = sha256.lower()

    def attempt(wait: _Patience, out: IO[bytes]) -> str:
        out.seek(0)
        out.truncate()
        with _open(url, wait, transport=transport) as response:
            digest = _stream(response, out, progress)
        out.flush()  # all of it in the file: read back by its size (`read_range`)
        if digest != expected:
            raise IntegrityError(
                f"{redact(url)}: sha256 {digest} does not match the index's {expected};"
                " the download was deleted"
            )
        return digest

    if isinstance(dest, Path):
        dest.parent.mkdir(parents=True, exist_ok=True)
        with atomic_file(dest, mode=0o644, suffix=".part") as out:  # a shared cache's users read it
            _with_retries(url, lambda wait: attempt(wait, out), retries=retries, timeout=timeout)
    else:
        _with_retries(url, lambda wait: attempt(wait, dest), retries=retries, timeout=timeout)


class _Patience:
    """How much longer one request may wait on its server: `timeout` seconds without hearing
    anything (a connection, an answer, the next bytes), its retries included. A hung server
    is given up on after `timeout`, not after every retry's own; a slow one that keeps
    sending is never cut off."""

    def __init__(self, timeout: float) -> None:
        self.timeout = timeout
        self._last = time.monotonic()

    def heard(self) -> None:
        self._last = time.monotonic()

    def left(self) -> float:
        return self.timeout - (time.monotonic() - self._last)


# Servers that gave no answer for a whole timeout, by "scheme://host:port", and when: a run
# does not wait on them again request after request (a check's hundred requests would each
# wait the timeout in turn), for HUNG_FOR seconds.
_HUNG: dict[str, float] = {}
HUNG_FOR = 300.0


def _server(url: str) -> str:
    parts = urllib.parse.urlsplit(url)
    return f"{parts.scheme}://{parts.hostname}:{parts.port or ''}"


def _with_retries(
    url: str,
    attempt: Callable[[_Patience], T],
    *,
    retries: int,
    timeout: float,
    what: str = "the package index",
    hint: str = "; use --offline to work from the cache",
) -> T:
    server = _server(url)
    since = _HUNG.get(server)
    if since is not None and time.monotonic() - since < HUNG_FOR:
        raise UnreachableError(
            f"cannot reach {what} at {redact(url)}: it gave no answer for the whole timeout"
            f" earlier in this run (not asked again){hint}"
        )
    tries = retries + 1
    reason = ""
    wait = _Patience(timeout)
    number = 0
    for number in range(1, tries + 1):
        try:
            return attempt(wait)
        except _TransientError as exc:
            reason = str(exc)
        delay = BACKOFF_BASE * 2 ** (number - 1)
        if wait.left() <= delay:  # nothing heard for the whole timeout: the server hangs
            if wait.left() <= 0 and not url.startswith("file:"):
                _HUNG[server] = time.monotonic()
            break
        if number == tries:
            break
        LOG.info("%s: %s; trying again in %.1fs", redact(url), reason, delay)
        time.sleep(delay)
    times = "once" if number == 1 else f"{number} times"
    raise UnreachableError(f"cannot reach {what} at {redact(url)}: {reason} (tried {times}){hint}")


class _Response:
    """One answer being read: its status, headers and final URL, and its body in pieces."""

    def __init__(self, raw: Any, url: str, wait: _Patience | None = None) -> None:
        import http.client  # noqa: PLC0415 -- with the first request (see the module)

        import urllib3  # noqa: PLC0415

        self._raw = raw  # a urllib3 response, or urllib's for a file: URL
        self._web = isinstance(raw, urllib3.BaseHTTPResponse)
        self._some = isinstance(raw, urllib3.HTTPResponse)  # it reads what has come
        self._broken = (OSError, http.client.HTTPException, urllib3.exceptions.HTTPError)
        self._wait = wait
        self.status: int = getattr(raw, "status", None) or 200  # urllib's file: answers have none
        self.headers: Any = raw.headers
        self.url = url

    def read(self, size: int, *, some: bool = False) -> bytes:
        """Up to `size` bytes of the body (all of it with -1; with `some`, what has come, at
        least one byte unless the body ended); a failure of the connection is transient
        (tried again), unlike one writing to disk."""
        try:
            if self._some and some:
                data: bytes = self._raw.read1(size, decode_content=False)
            elif self._web:
                data = self._raw.read(None if size < 0 else size, decode_content=False)
            else:
                data = self._raw.read(size)
        except self._broken as exc:
            raise _TransientError(_reason(exc)) from None
        if data and self._wait is not None:
            self._wait.heard()
        return data

    def close(self) -> None:
        """Hand the connection back when the body was read to its end (kept alive for the next
        request); close it otherwise (a body not read, e.g. a whole wheel sent for a range)."""
        raw = self._raw
        if not self._web:
            raw.close()
            return
        if raw.length_remaining != 0:
            raw.close()
        raw.release_conn()


@contextlib.contextmanager
def _open(
    url: str,
    wait: _Patience,
    *,
    transport: Transport = DEFAULT_TRANSPORT,
    headers: dict[str, str] | None = None,
) -> Iterator[_Response]:
    """Open `url` (redirects followed), sorting failures into transient (retry) and final."""
    check_url(url)
    extra = {"User-Agent": USER_AGENT, **(headers or {})}
    if urllib.parse.urlsplit(url).scheme == "file":
        response = _open_file(url, extra, max(wait.left(), 0.001))
    else:
        response = _open_web(url, extra, wait, transport)
    try:
        if response.status >= 400:
            from http import HTTPStatus  # noqa: PLC0415 -- an error only

            try:
                reason = HTTPStatus(response.status).phrase
            except ValueError:
                reason = ""
            if response.status >= 500 or response.status == 429:  # 429: come back later
                raise _TransientError(f"HTTP {response.status} {reason}".rstrip())
            raise HTTPStatusError(response.url, response.status, reason)
        yield response
    finally:
        response.close()


MAX_REDIRECTS = 10
_REDIRECT_STATUS = frozenset({301, 302, 303, 307, 308})


def _open_web(
    url: str,
    headers: dict[str, str],
    wait: _Patience,
    transport: Transport,
    private: dict[str, str] | None = None,
    *,
    deadline: float | None = None,
) -> _Response:
    """GET `url` on a kept-alive connection, following redirects here (so the final URL is
    known, and each host gets only its own credentials: `private` headers, a token, go only
    to the first URL's host). With `deadline` (a `time.monotonic()`), the connection and the
    answer's head by then, however steadily the server drips it."""
    import http.client  # noqa: PLC0415 -- with the first request (see the module)

    import urllib3  # noqa: PLC0415

    from patchset.adapters.net.pools import _failure, _manager, answer_by  # noqa: PLC0415

    host = urllib.parse.urlsplit(url).netloc
    for _ in range(MAX_REDIRECTS + 1):
        sent = dict(headers)
        if private and urllib.parse.urlsplit(url).netloc == host:
            sent.update(private)
        timeout = wait.left()  # what is left of the time without an answer
        if deadline is not None:
            timeout = min(timeout, deadline - time.monotonic())
        timeout = max(timeout, 0.001)
        if (auth := transport.authorization(url)) is not None:
            sent["Authorization"] = auth
        try:
            with answer_by(deadline):
                raw = _manager(url, transport).urlopen(
                    "GET",
                    redact(url),
                    headers=sent,
                    timeout=urllib3.Timeout(connect=timeout, read=timeout),
                    retries=False,
                    redirect=False,
                    preload_content=False,
                    decode_content=False,
                )
        except (urllib3.exceptions.HTTPError, OSError, http.client.HTTPException) as exc:
            raise _failure(url, exc) from None
        except ValueError as exc:  # a URL urllib3 cannot use (e.g. a malformed IPv6 host)
            raise SourceError(f"{redact(url)}: malformed URL ({exc})") from None
        wait.heard()
        location = raw.headers.get("Location") if raw.status in _REDIRECT_STATUS else None
        if not location:
            return _Response(raw, url, wait)
        raw.drain_conn()  # a redirect's body is small: read, so the connection is kept
        raw.release_conn()
        url = check_url(urllib.parse.urljoin(url, location), "a redirect")
    raise SourceError(f"{redact(url)}: more than {MAX_REDIRECTS} redirects")


def _open_file(url: str, headers: dict[str, str], timeout: float) -> _Response:
    """A ``file:`` URL through urllib (a local mirror): the same answers as a server's."""
    import urllib.error  # noqa: PLC0415 -- file: URLs only
    import urllib.request  # noqa: PLC0415

    request = urllib.request.Request(redact(url), headers=headers)  # noqa: S310 -- file: only
    try:
        raw = urllib.request.urlopen(request, timeout=timeout)  # noqa: S310
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, FileNotFoundError):
            raise HTTPStatusError(url, 404, "Not Found") from None
        raise SourceError(f"{redact(url)}: {_reason(exc.reason)}") from None
    except OSError as exc:
        raise SourceError(f"{redact(url)}: {_reason(exc)}") from None
    return _Response(raw, url)


def _stream(response: _Response, out: IO[bytes], progress: Progress | None) -> str:
    total = int(response.headers.get("Content-Length") or 0)
    digest = hashlib.sha256()
    done = 0
    if progress:
        progress(0, total)
    while chunk := response.read(CHUNK):
        digest.update(chunk)
        out.write(chunk)
        done += len(chunk)
        if progress:
            progress(done, total)
    _check_length(response, done)
    return digest.hexdigest()


def _read_body(
    response: _Response, url: str, max_bytes: int, deadline: float | None = None
) -> bytes:
    """The whole body, at most `max_bytes` (a SourceError if larger; a body cut short is
    tried again); with `deadline` (a `time.monotonic()`), all of it by then: a server that
    drips its answer a byte at a time is given up on at the deadline, not kept alive by
    each byte."""
    if deadline is None:
        body = response.read(max_bytes + 1)
    else:
        parts: list[bytes] = []
        got = 0
        while got <= max_bytes:
            if time.monotonic() > deadline:
                raise SourceError(f"{redact(url)}: the answer did not come whole in time")
            chunk = response.read(min(CHUNK, max_bytes + 1 - got), some=True)
            if not chunk:
                break
            parts.append(chunk)
            got += len(chunk)
        body = b"".join(parts)
    if len(body) > max_bytes:
        raise SourceError(f"{redact(url)}: the answer is larger than {max_bytes} bytes")
    _check_length(response, len(body))
    return body


def _check_length(response: _Response, received: int) -> None:
    """urllib returns a short body without complaint when the connection drops early."""
    declared = response.headers.get("Content-Length")
    if declared is not None and declared.isdigit() and received < int(declared):
        raise _TransientError(f"connection closed after {received} of {declared} bytes")


@dataclasses.dataclass(frozen=True)
class Answer:
    """A server's answer whatever its status (an API's 304 or 404 is data, not a failure)."""

    status: int
    headers: dict[str, str]  # names in lower case
    body: bytes


def fetch_answer(
    url: str,
    *,
    headers: dict[str, str] | None = None,
    private: dict[str, str] | None = None,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    max_bytes: int = 8 << 20,
    what: str = "the server",
    transport: Transport = DEFAULT_TRANSPORT,
    whole: float | None = None,
) -> Answer:
    """GET `url` (http or https) and return its answer with any status below 500; a 5xx, no
    connection or a body cut short is tried again (`retries` more times), as elsewhere.
    `private` headers (a token) are sent only to `url`'s own host, never after a redirect
    to another. `whole`: seconds for the whole answer, retries included (a SourceError
    after), however steadily the server keeps sending."""
    deadline = None if whole is None else time.monotonic() + whole

    def attempt(wait: _Patience) -> Answer:
        check_url(url)
        late = SourceError(f"{redact(url)}: no whole answer in {whole:g} s")
        if deadline is not None and time.monotonic() > deadline:
            raise late
        try:
            response = _open_web(
                url,
                {"User-Agent": USER_AGENT, **(headers or {})},
                wait,
                transport,
                private,
                deadline=deadline,
            )
        except _TransientError:
            if deadline is not None and time.monotonic() >= deadline:
                raise late from None  # cut off at the deadline: not a server to retry
            raise
        try:
            if response.status >= 500:
                raise _TransientError(f"HTTP {response.status}")
            body = _read_body(response, url, max_bytes, deadline)
            found = {str(k).lower(): str(v) for k, v in response.headers.items()}
            return Answer(response.status, found, body)
        finally:
            response.close()

    return _with_retries(url, attempt, retries=retries, timeout=timeout, what=what, hint="")
