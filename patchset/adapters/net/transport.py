"""How patchset reaches servers: TLS trust and credentials.

The transport half of `patchset.adapters.net` (its requests, retries and downloads are in
`__init__`, its connections in `pools`): the system's trust store through `truststore` or a
CA bundle, hosts trusted without TLS verification, credentials from the URL, the index
settings or ``~/.netrc``. `ssl` is imported when a context is first made: a command that
asks no server (a report kept from last time) does not pay for it.
"""

from __future__ import annotations

import base64
import dataclasses
import functools
import netrc
import os
import urllib.parse
from pathlib import Path
from typing import TYPE_CHECKING

from patchset.errors import SourceError

if TYPE_CHECKING:
    import ssl


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
    import ssl  # noqa: PLC0415 -- only when TLS is used

    from patchset.adapters.net.pools import _reason  # noqa: PLC0415 -- as ssl

    if cafile:
        try:
            return ssl.create_default_context(cafile=cafile)
        except (OSError, ssl.SSLError) as exc:
            raise SourceError(f"{cafile}: not a usable CA bundle ({_reason(exc)})") from None
    import truststore  # noqa: PLC0415 -- only when TLS is used

    return truststore.SSLContext(ssl.PROTOCOL_TLS_CLIENT)


@functools.cache
def _unverified_context() -> ssl.SSLContext:
    import ssl  # noqa: PLC0415 -- only when TLS is used

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
