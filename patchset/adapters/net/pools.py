"""How patchset's requests reach servers: resolved connections, answers by a deadline,
kept-alive pools.

The connection half of `patchset.adapters.net` (imported with its first request: urllib3,
`http.client` and `ssl` cost ~30 ms to import, which a command that asks no server does not
pay): each host looked up once a process; one urllib3 pool manager per TLS trust and proxy
(`transport.Transport`).
"""

from __future__ import annotations

import contextlib
import io
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import urllib3

from patchset.adapters.net.transport import Transport
from patchset.errors import SourceError

_RESOLVED: dict[tuple[str, int], list[Any]] = {}
_RESOLVING = threading.Lock()


def _create_connection(
    address: tuple[str, int],
    timeout: float | None = None,
    options: Iterable[tuple[int, int, int | bytes]] = (),
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
            for option in options:
                sock.setsockopt(*option)
            sock.settimeout(timeout)
            sock.connect(sockaddr)
        except OSError as exc:
            error = exc
            sock.close()
            continue
        return sock
    raise error or OSError(f"no address for {host}")


# The time (a `time.monotonic()`) by which the answer being asked for in this thread must have
# come whole, status line and headers included (`answer_by`); None: each read bounded alone.
_WHOLE = threading.local()


@contextlib.contextmanager
def answer_by(deadline: float | None) -> Iterator[None]:
    """Requests made in this thread inside the block read their answers' heads (status line
    and headers, which urllib3 reads before handing the answer over) by `deadline`, however
    steadily the server drips them: every read is given what is left, and none starts after
    it (a TimeoutError, as a per-read timeout gives)."""
    before = getattr(_WHOLE, "deadline", None)
    _WHOLE.deadline = deadline
    try:
        yield
    finally:
        _WHOLE.deadline = before


class _Deadlined:
    """A connection's socket as its answer is read while `answer_by` holds: each read gets at
    most the time left before the deadline. Everything else is the socket's."""

    def __init__(self, sock: socket.socket, deadline: float) -> None:
        self._sock = sock
        self._deadline = deadline

    def __getattr__(self, name: str) -> Any:
        return getattr(self._sock, name)

    def makefile(self, mode: str = "rb", *_: object, **__: object) -> io.BufferedReader:
        if mode != "rb":
            raise ValueError(f"a response reads its socket with 'rb', not {mode!r}")
        # as socket.makefile does: the socket's close waits for the reader's (the body is
        # read after the connection let go of a socket the server will close)
        self._sock._io_refs += 1  # type: ignore[attr-defined]
        return io.BufferedReader(socket.SocketIO(self, "rb"))  # type: ignore[arg-type]

    def _decref_socketios(self) -> None:  # the reader's close
        self._sock._decref_socketios()  # type: ignore[attr-defined]

    def recv_into(self, buffer: Any, *args: Any) -> int:
        left = self._deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("timed out")
        before = self._sock.gettimeout()
        if before is not None and before <= left:
            return self._sock.recv_into(buffer, *args)
        self._sock.settimeout(left)
        try:
            return self._sock.recv_into(buffer, *args)
        finally:
            self._sock.settimeout(before)


def _getresponse(conn: urllib3.connection.HTTPConnection, read: Callable[[], Any]) -> Any:
    """`read()` (the connection's getresponse) with its socket bounded by `answer_by`."""
    deadline = getattr(_WHOLE, "deadline", None)
    real = conn.sock
    if deadline is None or real is None:
        return read()
    bounded = _Deadlined(real, deadline)
    conn.sock = bounded
    try:
        return read()
    finally:
        if conn.sock is bounded:  # not closed (and set to None) by the reading
            conn.sock = real


class _ResolvedHTTPConnection(urllib3.connection.HTTPConnection):
    """urllib3's connection, with each host looked up once per process (see above) and its
    answer's head read by the deadline `answer_by` sets."""

    def _new_conn(self) -> socket.socket:  # urllib3's hook for opening the socket
        return _new_socket(self)

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        return _getresponse(self, super().getresponse)  # type: ignore[no-any-return]


class _ResolvedHTTPSConnection(urllib3.connection.HTTPSConnection):
    def _new_conn(self) -> socket.socket:
        return _new_socket(self)

    def getresponse(self) -> urllib3.response.HTTPResponse:  # type: ignore[override]
        return _getresponse(self, super().getresponse)  # type: ignore[no-any-return]


def _new_socket(conn: urllib3.connection.HTTPConnection) -> socket.socket:
    timeout = conn.timeout if isinstance(conn.timeout, int | float) else None
    try:
        return _create_connection((conn.host, conn.port or 80), timeout, conn.socket_options or ())
    except socket.gaierror as exc:
        raise urllib3.exceptions.NameResolutionError(conn.host, conn, exc) from exc
    except TimeoutError as exc:
        raise urllib3.exceptions.ConnectTimeoutError(conn, "timed out") from exc
    except OSError as exc:
        raise urllib3.exceptions.NewConnectionError(conn, _reason(exc)) from exc


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _ResolvedHTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _ResolvedHTTPSConnection


POOL_SIZE = 32  # kept-alive connections per host: a check has a few dozen requests in flight
_MANAGERS: dict[tuple[int, bool, str | None], urllib3.PoolManager] = {}
_MANAGERS_LOCK = threading.Lock()


def _forget_pools() -> None:
    """In a forked child (a check's other process): the parent's kept-alive connections are
    the parent's; the child opens its own (its copies of the sockets are dropped, not shut)."""
    global _MANAGERS_LOCK  # noqa: PLW0603 - a lock held at the fork stays held in the child
    _MANAGERS.clear()
    _MANAGERS_LOCK = threading.Lock()


os.register_at_fork(after_in_child=_forget_pools)


def _manager(url: str, transport: Transport) -> urllib3.PoolManager:
    """The connection pools for `url`: one manager per TLS trust and proxy, kept for the
    process (its connections stay open for the next request to the same host)."""
    parts = urllib.parse.urlsplit(url)
    context = transport.context(url) if parts.scheme == "https" else None
    verify = context is None or context.verify_mode != ssl.CERT_NONE
    proxy = urllib.request.getproxies().get(parts.scheme)
    if proxy and urllib.request.proxy_bypass(parts.hostname or ""):
        proxy = None
    key = (id(context), verify, proxy)
    with _MANAGERS_LOCK:
        manager = _MANAGERS.get(key)
        if manager is None:
            options: dict[str, Any] = {"num_pools": 16, "maxsize": POOL_SIZE, "block": False}
            options["ssl_context"] = context
            if not verify:  # a trusted host: urllib3 would otherwise turn checks back on
                options.update(cert_reqs="CERT_NONE", assert_hostname=False)
            if proxy:
                manager = urllib3.ProxyManager(proxy, **options)
            else:
                manager = urllib3.PoolManager(**options)
            manager.pool_classes_by_scheme = {"http": _HTTPPool, "https": _HTTPSPool}
            _MANAGERS[key] = manager
        return manager


def _reason(exc: object) -> str:
    """A short cause for a message: urllib3's own wrappers (naming its pool) left out."""
    if isinstance(exc, urllib3.exceptions.NameResolutionError):  # before its base classes
        return "the host name does not resolve"
    if isinstance(exc, urllib3.exceptions.NewConnectionError):  # a ConnectTimeoutError too
        return _reason(exc.__cause__) if exc.__cause__ is not None else "no connection"
    if isinstance(exc, socket.timeout | TimeoutError | urllib3.exceptions.TimeoutError):
        return "timed out"
    if isinstance(exc, urllib3.exceptions.IncompleteRead):
        return f"connection closed after {exc.partial} of {exc.partial + exc.expected} bytes"
    if isinstance(exc, urllib3.exceptions.ProtocolError | urllib3.exceptions.SSLError):
        inner = next((a for a in exc.args if isinstance(a, BaseException)), None)
        if isinstance(inner, urllib3.exceptions.IncompleteRead):
            return _reason(inner)
        return f"the connection broke ({_reason(inner)})" if inner else "the connection broke"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror
    return str(exc) or type(exc).__name__


def _failure(url: str, exc: BaseException) -> Exception:
    """The error for a request that got no answer: an untrusted certificate or a malformed
    URL is final; anything else (no connection, a timeout, a reset) may pass."""
    from patchset.adapters.net import _TransientError, redact  # noqa: PLC0415 -- its caller

    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, ssl.SSLCertVerificationError):
            return SourceError(
                f"{redact(url)}: the server's certificate is not trusted"
                f" ({cause.verify_message}); set pip's cert or trusted-host"
            )
        if isinstance(cause, urllib3.exceptions.LocationParseError):
            return SourceError(f"{redact(url)}: malformed URL ({cause})")
        cause = cause.__cause__ or cause.__context__
    return _TransientError(_reason(exc))
