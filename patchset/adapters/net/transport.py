"""How patchset reaches servers: TLS trust, credentials, resolved connections, kept-alive pools.

The transport half of `patchset.adapters.net` (its requests, retries and downloads are in
`__init__`): the system's trust store through `truststore` or a CA bundle, hosts trusted
without TLS verification, credentials from the URL, the index settings or ``~/.netrc``; each
host looked up once a process; one urllib3 pool manager per TLS trust and proxy.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import functools
import io
import netrc
import os
import socket
import ssl
import threading
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

import urllib3

from patchset.errors import SourceError


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
