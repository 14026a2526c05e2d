"""The one module that talks HTTP: JSON and small fetches, byte ranges, verified downloads.

Everything goes through urllib with one `Transport`: the TLS trust (the system's trust store
through `truststore`, or a CA bundle named in pip's configuration), hosts trusted without
TLS verification, and credentials from the URL or ``~/.netrc``. ``file:`` URLs are read from
disk, ranges included, so a local mirror works like a remote one.

Transient failures (no connection, a timeout, a cut-off body, a 5xx or a 429) are tried
again with exponential backoff; any other 4xx fails at once. A download is streamed into
a temporary file beside its destination, hashed on the way, and renamed into place only
when its sha256 is the expected one, so a bad file is never left where the caller looks.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import hashlib
import http.client
import json
import logging
import netrc
import os
import re
import socket
import ssl
import threading
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

DEFAULT_TIMEOUT = 30.0
"""Seconds any one request may wait on the server (to connect, or between two reads)."""

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


@dataclasses.dataclass(frozen=True)
class Transport:
    """How to reach servers: whose certificates to trust, and where credentials come from.

    `cafile` replaces the system trust store (pip's ``cert``); `trusted_hosts` are reached
    without certificate checks (pip's ``trusted-host``, ``host`` or ``host:port``);
    credentials in a URL win over those of the index URL (`credentials`, used for every
    URL on its host), which win over ``~/.netrc`` (or ``$NETRC``).
    """

    cafile: str | None = None
    trusted_hosts: tuple[str, ...] = ()
    use_netrc: bool = True
    credentials: tuple[tuple[str, str, str], ...] = ()  # (host, user, password): the index's

    def context(self, url: str) -> ssl.SSLContext:
        parts = urllib.parse.urlsplit(url)
        host = parts.hostname or ""
        hostport = f"{host}:{parts.port}" if parts.port else host
        if host in self.trusted_hosts or hostport in self.trusted_hosts:
            return _unverified_context()
        return _verified_context(self.cafile)

    def authorization(self, url: str) -> str | None:
        parts = urllib.parse.urlsplit(url)
        if "@" in parts.netloc:
            userinfo = parts.netloc.rpartition("@")[0]
            user, _, password = userinfo.partition(":")
            pair = f"{urllib.parse.unquote(user)}:{urllib.parse.unquote(password)}"
        elif found_pair := next(
            (f"{u}:{p}" for h, u, p in self.credentials if h == parts.hostname), None
        ):
            pair = found_pair
        elif self.use_netrc and parts.hostname and (found := _netrc_entry(parts.hostname)):
            pair = f"{found[0]}:{found[1]}"
        else:
            return None
        return "Basic " + base64.b64encode(pair.encode()).decode()


DEFAULT_TRANSPORT = Transport()


@functools.cache
def _verified_context(cafile: str | None) -> ssl.SSLContext:
    if cafile:
        try:
            return ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise SourceError(f"{cafile}: not a usable CA bundle ({_reason(exc)})") from None
    import truststore  # noqa: PLC0415 -- only when TLS is used

    return truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


@functools.cache
def _unverified_context() -> ssl.SSLContext:
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    return context


@functools.cache
def _netrc_entry(host: str) -> tuple[str, str] | None:
    path = os.environ.get("NETRC") or str(Path.home() / ".netrc")
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if found is None or not found[0]:
        return None
    return found[0], found[2] or ""


_RESOLVED: dict[tuple[str, int], list[Any]] = {}
_RESOLVING = threading.Lock()


def _create_connection(
    address: tuple[str, int],
    timeout: float | None = None,
    source_address: tuple[str, int] | None = None,
    **_: Any,
) -> socket.socket:
    """socket.create_connection with each host looked up once per process.

    Many parallel look-ups of one name lose queries on some resolvers (each lost one costs a
    5 s retry): a check fetching 25 releases at once would stall on them.
    """
    host, port = address
    with _RESOLVING:
        infos = _RESOLVED.get((host, port))
        if infos is None:
            infos = socket.getaddrinfo(host, port, 0, socket.SOCK_STREAM)
            _RESOLVED[(host, port)] = infos
    error: OSError | None = None
    for family, kind, proto, _name, sockaddr in infos:
        sock = socket.socket(family, kind, proto)
        try:
            sock.settimeout(timeout)
            if source_address:
                sock.bind(source_address)
            sock.connect(sockaddr)
        except OSError as exc:
            error = exc
            sock.close()
            continue
        return sock
    raise error or OSError(f"no address for {host}")


class _HTTPConnection(http.client.HTTPConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _create_connection


class _HTTPSConnection(http.client.HTTPSConnection):
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._create_connection = _create_connection


class _HTTPHandler(urllib.request.HTTPHandler):
    def http_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPConnection, req)


class _HTTPSHandler(urllib.request.HTTPSHandler):
    def __init__(self, context: ssl.SSLContext | None) -> None:
        super().__init__(context=context)
        self._ctx = context

    def https_open(self, req: urllib.request.Request) -> http.client.HTTPResponse:
        return self.do_open(_HTTPSConnection, req, context=self._ctx)


@functools.cache
def _opener(context: ssl.SSLContext | None) -> urllib.request.OpenerDirector:
    """urllib's opener with the look-up cache, one per TLS context."""
    return urllib.request.build_opener(_HTTPHandler(), _HTTPSHandler(context))


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


def fetch_json(
    url: str,
    *,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    transport: Transport = DEFAULT_TRANSPORT,
) -> Any:
    """GET `url` and decode its JSON body; `retries` further attempts after the first."""

    def attempt() -> bytes:
        with _open(url, timeout, transport=transport) as response:
            body = _read(response, -1)
            _check_length(response, len(body))
            return body

    body = _with_retries(url, attempt, retries=retries)
    try:
        return json.loads(body)
    except ValueError as exc:
        raise SourceError(f"{redact(url)}: the answer is not JSON ({exc})") from None


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

    def attempt() -> tuple[str, str, bytes]:
        with _open(url, timeout, transport=transport, headers={"Accept": accept}) as response:
            body = _read(response, max_bytes + 1)
            if len(body) > max_bytes:
                raise SourceError(f"{redact(url)}: the answer is larger than {max_bytes} bytes")
            _check_length(response, len(body))
            kind = response.headers.get("Content-Type") or ""
            return response.geturl(), kind, body

    return _with_retries(url, attempt, retries=retries)


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

    def attempt() -> bytes:
        with _open(url, timeout, transport=transport) as response:
            body = _read(response, max_bytes + 1)
            if len(body) > max_bytes:
                raise SourceError(f"{redact(url)}: the answer is larger than {max_bytes} bytes")
            _check_length(response, len(body))
            return body

    return _with_retries(url, attempt, retries=retries, what=what, hint="")


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

    def attempt() -> tuple[bytes, int]:
        with _open(url, timeout, transport=transport, headers={"Range": spec}) as response:
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
            body = _read(response, last - first + 2)
            if len(body) != last - first + 1:
                raise _TransientError(f"got {len(body)} of {last - first + 1} bytes of a range")
            return body, total

    return _with_retries(url, attempt, retries=retries)


def _file_range(url: str, start: int, end: int | None) -> tuple[bytes, int]:
    path = _file_path(url)
    try:
        with path.open("rb") as f:
            total = os.fstat(f.fileno()).st_size
            first = max(total - start, 0) if end is None else start
            last = total - 1 if end is None else min(end, total - 1)
            f.seek(first)
            return f.read(max(last - first + 1, 0)), total
    except OSError as exc:
        raise SourceError(f"{redact(url)}: {_reason(exc)}") from None


def _file_path(url: str) -> Path:
    return Path(urllib.request.url2pathname(urllib.parse.urlsplit(url).path))


def download(
    url: str,
    dest: Path,
    *,
    sha256: str,
    timeout: float = DEFAULT_TIMEOUT,
    retries: int = 3,
    progress: Progress | None = None,
    transport: Transport = DEFAULT_TRANSPORT,
) -> None:
    """Download `url` to `dest`, which appears only once its sha256 is verified.

    Raises IntegrityError (and leaves nothing behind) when the bytes do not match.
    """
    dest.parent.mkdir(parents=True, exist_ok=True)
    expected = sha256.lower()

    def attempt() -> str:
        # 0o644 as any cache file: readable by the other users of a shared cache
        with (
            atomic_file(dest, mode=0o644, suffix=".part") as tmp,
            _open(url, timeout, transport=transport) as response,
        ):
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
def _open(
    url: str,
    timeout: float,
    *,
    transport: Transport = DEFAULT_TRANSPORT,
    headers: dict[str, str] | None = None,
) -> Iterator[http.client.HTTPResponse]:
    """Open `url`, sorting failures into transient (retry) and final (raise)."""
    request = _request(url, transport, headers or {})
    context = transport.context(url) if request.type == "https" else None
    try:
        response = _opener(context).open(request, timeout=timeout)
    except urllib.error.HTTPError as exc:
        exc.close()
        if exc.code >= 500 or exc.code == 429:  # 429: the server asks us to come back later
            raise _TransientError(f"HTTP {exc.code} {exc.reason}") from None
        raise HTTPStatusError(url, exc.code, str(exc.reason)) from None
    except urllib.error.URLError as exc:
        if isinstance(exc.reason, ssl.SSLCertVerificationError):
            raise SourceError(
                f"{redact(url)}: the server's certificate is not trusted"
                f" ({exc.reason.verify_message}); set pip's cert or trusted-host"
            ) from None
        raise _TransientError(_reason(exc.reason)) from None
    except (OSError, http.client.HTTPException) as exc:
        raise _TransientError(_reason(exc)) from None
    except ValueError as exc:  # a URL urllib cannot use (e.g. a malformed IPv6 host)
        raise SourceError(f"{redact(url)}: malformed URL ({exc})") from None
    with response:
        yield response


def _read(response: http.client.HTTPResponse, size: int) -> bytes:
    """Read from the connection; a failure there may pass, unlike one writing to disk."""
    try:
        return response.read(size)
    except (OSError, http.client.HTTPException) as exc:
        raise _TransientError(_reason(exc)) from None


def _request(url: str, transport: Transport, extra: dict[str, str]) -> urllib.request.Request:
    """A request with credentials (from `user:password@`, else netrc) in a Basic auth header."""
    check_url(url)
    headers = {"User-Agent": USER_AGENT, **extra}
    if (auth := transport.authorization(url)) is not None:
        headers["Authorization"] = auth
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
