"""pip's settings that decide how the index is reached, read by public means only.

The index is ``--index-url`` from the caller, else ``PIP_INDEX_URL``, else ``index-url`` in
pip's configuration (``pip config list``), else pip's default (from ``pip install --help``,
so no index is named here). ``cert`` and ``trusted-host`` come from the environment
(``PIP_CERT``, ``PIP_TRUSTED_HOST``) or pip's configuration; credentials from the URL or
``~/.netrc``. Extra indexes are ignored on purpose: one release comes from one place.
"""

from __future__ import annotations

import ast
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
from dataclasses import dataclass
from pathlib import Path

from patchset.adapters import net
from patchset.errors import SourceError

_CONFIG_LINE = re.compile(r"^(?P<scope>[^.=\s]*)\.(?P<key>[a-z-]+)=(?P<value>.*)$")
_DEFAULT = re.compile(r"\(default\s+(\S+?)\)", re.DOTALL)
_SCOPES = ("global", "install", "download", ":env:")  # later ones win, as in pip


@dataclass(frozen=True)
class IndexSettings:
    """Where the index is and how to reach it, with the setting that chose the URL."""

    index_url: str
    chosen_by: str  # "--index-url", "PIP_INDEX_URL", "pip config (global.index-url)", ...
    transport: net.Transport = net.DEFAULT_TRANSPORT


def pip_config() -> dict[str, str]:
    """``pip config list`` as {key: value} (``cert``, ``index-url``...), later scopes winning;
    empty when pip is not installed."""
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
    """pip's own default index, as its help for ``--index-url`` states it."""
    try:
        done = subprocess.run(
            [sys.executable, "-m", "pip", "install", "--help"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        done = None
    text = done.stdout if done is not None else ""
    at = text.find("--index-url")
    match = _DEFAULT.search(" ".join(text[at : at + 400].split())) if at >= 0 else None
    if match is None:
        raise SourceError(
            "pip is not installed here, so its default index is unknown; pass --index-url"
        )
    return match[1]


def _pip_answers(memo: Path | None, want_default: bool) -> tuple[dict[str, str], str | None]:
    """pip's configuration and (when wanted) default index; remembered in `memo` under a key
    of everything they depend on (pip's version, PIP_* variables, its config files' stamps),
    since asking pip costs a second or two."""
    key = _memo_key() if memo is not None else None
    path = memo / f"pip-{key}.json" if memo is not None and key else None
    if path is not None:
        with contextlib.suppress(OSError, ValueError, KeyError, TypeError):
            record = json.loads(path.read_bytes())
            config = {str(k): str(v) for k, v in record["config"].items()}
            default = record["default"]
            if default is not None or not want_default:
                return config, default
    answers = _ask_pip(want_default)
    if path is not None and not isinstance(answers[1], SourceError):
        with contextlib.suppress(OSError):
            path.parent.mkdir(parents=True, exist_ok=True)
            tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
            tmp.write_text(json.dumps({"config": answers[0], "default": answers[1]}))
            tmp.replace(path)
    if isinstance(answers[1], SourceError):
        raise answers[1]
    return answers[0], answers[1]


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


def _ask_pip(want_default: bool) -> tuple[dict[str, str], str | SourceError | None]:
    default: list[str | SourceError] = []

    def ask_default() -> None:  # in parallel with `pip config list`: both start pip
        try:
            default.append(pip_default_index())
        except SourceError as exc:
            default.append(exc)

    asker = None
    if want_default:
        asker = threading.Thread(target=ask_default, daemon=True)
        asker.start()
    config = pip_config()
    if asker is not None:
        asker.join()
    return config, default[0] if default else None


def resolve(index_url: str | None = None, *, memo: Path | None = None) -> IndexSettings:
    """The index and its transport, from the caller, the environment and pip's config
    (remembered under `memo` when given)."""
    want_default = not index_url and not os.environ.get("PIP_INDEX_URL")
    config, default = _pip_answers(memo, want_default)
    if index_url:
        url, chosen = index_url, "--index-url"
    elif env := os.environ.get("PIP_INDEX_URL"):
        url, chosen = env, "PIP_INDEX_URL"
    elif config.get("index-url"):
        url, chosen = config["index-url"], "pip config (index-url)"
    elif default:
        url, chosen = default, "pip's default"
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
