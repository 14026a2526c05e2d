"""pip's settings that decide how the index is reached: its configuration read by public
means, its default index from pip's own constant.

pip's configuration is read, on Linux, from the files pip's documentation lists, in its order
(global, user, site, then ``PIP_CONFIG_FILE``; ``os.devnull`` there reads none) and from its
``PIP_*`` variables: no process is started, and the tests hold the answer equal to
``pip config list``'s. Elsewhere (other platforms put the files in other places) it is
``pip config list``, run once and remembered in the cache.

The index is ``--index-url`` from the caller, else ``PIP_INDEX_URL``, else ``index-url`` in
pip's configuration, else pip's default (its ``PyPI.simple_url``,
so no index is named here). ``cert`` and ``trusted-host`` come from the environment
(``PIP_CERT``, ``PIP_TRUSTED_HOST``) or pip's configuration; credentials from the URL or
``~/.netrc``. Extra indexes are ignored on purpose: one release comes from one place.
"""

from __future__ import annotations

import ast
import configparser
import contextlib
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import threading
import urllib.parse
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from patchset.adapters import net
from patchset.errors import SourceError

_CONFIG_LINE = re.compile(r"^(?P<scope>[^.=\s]*)\.(?P<key>[a-z-]+)=(?P<value>.*)$")
_SCOPES = ("global", "install", "download", ":env:")  # later ones win, as in pip


@dataclass(frozen=True)
class IndexSettings:
    """Where the index is and how to reach it, with the setting that chose the URL."""

    index_url: str
    chosen_by: str  # "--index-url", "PIP_INDEX_URL", "pip config (global.index-url)", ...
    transport: net.Transport = net.DEFAULT_TRANSPORT


def pip_config(memo: Path | None = None) -> dict[str, str]:
    """pip's configuration as {key: value} (``cert``, ``index-url``...), later scopes winning:
    read from its files on Linux, else asked of pip (remembered under `memo`)."""
    if sys.platform.startswith("linux"):
        return read_pip_config()
    return _pip_config_memo(memo)


def pip_config_files() -> list[str]:
    """The files pip reads on Linux, in its order (a later file wins): global
    (``$XDG_CONFIG_DIRS/pip/pip.conf``, ``/etc/pip.conf``), user (``~/.pip/pip.conf``,
    ``$XDG_CONFIG_HOME/pip/pip.conf``; skipped when ``PIP_CONFIG_FILE`` names a file that
    exists), site (``sys.prefix/pip.conf``), then ``PIP_CONFIG_FILE``; none at all when that is
    ``os.devnull``."""
    named = os.environ.get("PIP_CONFIG_FILE")
    if named == os.devnull:
        return []
    dirs = (os.environ.get("XDG_CONFIG_DIRS") or "").strip() or "/etc/xdg"
    files = [Path(d) / "pip" / "pip.conf" for d in dirs.split(os.pathsep) if d]
    files.append(Path("/etc/pip.conf"))
    if not (named and Path(named).exists()):
        home = Path("~").expanduser()
        user = (os.environ.get("XDG_CONFIG_HOME") or "").strip()
        files += [
            home / ".pip" / "pip.conf",
            (Path(user) if user else home / ".config") / "pip" / "pip.conf",
        ]
    files.append(Path(sys.prefix) / "pip.conf")
    if named:
        files.append(Path(named))
    return [str(f) for f in files]


def read_pip_config() -> dict[str, str]:
    """pip's configuration from its files and ``PIP_*`` variables, merged as ``pip config
    list`` shows it (a later file wins per section; then ``global`` < ``install`` <
    ``download`` < the environment); empty when a file cannot be parsed, as pip then fails."""
    merged: dict[tuple[str, str], str] = {}
    for name in pip_config_files():
        parser = configparser.RawConfigParser()
        try:
            parser.read(name, encoding="utf-8")
        except (configparser.Error, UnicodeDecodeError, OSError):
            return {}
        for section in parser.sections():
            for key, value in parser.items(section):
                merged[section, _pip_name(key)] = value
    for var, value in os.environ.items():
        if var.startswith("PIP_") and var != "PIP_VERSION":
            merged[":env:", _pip_name(var[4:])] = value
    found: dict[str, tuple[int, str]] = {}
    for (scope, key), value in merged.items():
        rank = _SCOPES.index(scope) if scope in _SCOPES else -1
        if rank >= 0 and rank >= found.get(key, (-1, ""))[0]:
            found[key] = (rank, value)
    return {key: value for key, (_, value) in found.items()}


def _pip_name(name: str) -> str:
    """A setting's name as pip spells it: lower case, dashes, no leading ``--``."""
    name = name.lower().replace("_", "-")
    return name[2:] if name.startswith("--") else name


def ask_pip_config() -> dict[str, str]:
    """``pip config list`` as {key: value}, later scopes winning; empty when pip is not
    installed or fails."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "config", "list"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return {}
    if done.returncode != 0:
        return {}
    found: dict[str, tuple[int, str]] = {}
    for line in done.stdout.splitlines():
        match = _CONFIG_LINE.match(line.strip())
        if match is None:
            continue
        scope, key = match["scope"], match["key"]
        rank = _SCOPES.index(scope) if scope in _SCOPES else -1
        try:
            value = ast.literal_eval(match["value"])
        except (ValueError, SyntaxError):
            continue
        if rank >= 0 and isinstance(value, str) and rank >= found.get(key, (-1, ""))[0]:
            found[key] = (rank, value)
    return {key: value for key, (_, value) in found.items()}


def pip_default_index() -> str:
    """pip's own default index: its ``PyPI.simple_url``, imported from pip only when no index
    is configured (a constant, so no subprocess; no registry host is named here)."""
    try:
        from pip._internal.models.index import PyPI  # noqa: PLC0415 -- only when needed

        url = PyPI.simple_url
    except Exception:  # pip absent, or moved its constant: the same answer for the user
        url = None
    if not isinstance(url, str) or not url:
        raise SourceError(
            "pip is not installed here, so its default index is unknown; pass --index-url"
        )
    return url


def _pip_config_memo(memo: Path | None) -> dict[str, str]:
    """pip's configuration, remembered in `memo` under a key of everything it depends on
    (pip's version, the PIP_* variables, its config files' stamps): asking pip starts a
    Python process (0.2 s or more)."""
    key = _memo_key() if memo is not None else None
    path = memo / f"pip-{key}.json" if memo is not None and key else None
    if path is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError, AttributeError):
            record = json.loads(path.read_bytes())
            return {str(k): str(v) for k, v in record["config"].items()}
    config = ask_pip_config()
    if path is not None:
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"config": config}))
            tmp.replace(path)
    return config


def _memo_key() -> str | None:
    try:
        pip_version = importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return None
    home = Path.home()
    xdg = os.environ.get("XDG_CONFIG_HOME") or str(home / ".config")
    files = [
        os.environ.get("PIP_CONFIG_FILE", ""),
        "/etc/pip.conf",
        *(f"{d}/pip/pip.conf" for d in os.environ.get("XDG_CONFIG_DIRS", "/etc/xdg").split(":")),
        f"{xdg}/pip/pip.conf",
        str(home / ".pip" / "pip.conf"),
        f"{sys.prefix}/pip.conf",
    ]
    stamps = []
    for name in files:
        try:
            stat = Path(name).stat() if name else None
        except OSError:
            stat = None
        stamps.append([name, stat.st_mtime_ns, stat.st_size] if stat else [name])
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_"))
    blob = json.dumps([sys.executable, pip_version, env, stamps])
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def resolve(index_url: str | None = None, *, memo: Path | None = None) -> IndexSettings:
    """The index and its transport, from the caller, the environment and pip's config
    (remembered under `memo` when given)."""
    config = pip_config(memo)
    if index_url:
        url, chosen = index_url, "--index-url"
    elif env := os.environ.get("PIP_INDEX_URL"):
        url, chosen = env, "PIP_INDEX_URL"
    elif config.get("index-url"):
        url, chosen = config["index-url"], "pip config (index-url)"
    else:
        url, chosen = pip_default_index(), "pip's default"
    url = net.check_url(url.strip(), "the index URL")
    cert = os.environ.get("PIP_CERT") or config.get("cert") or None
    trusted = os.environ.get("PIP_TRUSTED_HOST") or config.get("trusted-host") or ""
    parts = urllib.parse.urlsplit(url)
    credentials: tuple[tuple[str, str, str], ...] = ()
    if parts.username is not None and parts.hostname:
        user = urllib.parse.unquote(parts.username)
        password = urllib.parse.unquote(parts.password or "")
        credentials = ((parts.hostname, user, password),)
    transport = net.Transport(
        cafile=cert, trusted_hosts=tuple(trusted.split()), credentials=credentials
    )
    return IndexSettings(net.redact(url), chosen, transport)


def resolve_soon(
    index_url: str | None = None, *, memo: Path | None = None
) -> Callable[[], IndexSettings]:
    """Start `resolve` in a daemon thread (asking pip runs a process: the caller goes on
    meanwhile); the function returned waits for its answer, or raises its error."""
    done: list[IndexSettings | BaseException] = []

    def work() -> None:
        try:
            done.append(resolve(index_url, memo=memo))
        except BaseException as exc:  # handed to the caller's thread
            done.append(exc)

    worker = threading.Thread(target=work, daemon=True)
    worker.start()

    def result() -> IndexSettings:
        worker.join()
        if isinstance(done[0], BaseException):
            raise done[0]
        return done[0]

    return result
