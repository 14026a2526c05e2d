"""pip's settings that decide how the index is reached: its configuration read by public
means, its default index from pip's own constant.

pip's configuration is read, on Linux, from the files pip's documentation lists, in its order
(global, user, site, then ``PIP_CONFIG_FILE``; ``os.devnull`` there reads none) and from its
``PIP_*`` variables: no process is started, and the tests hold the answer equal to
``pip config list``'s. Elsewhere (other platforms put the files in other places) it is
``pip config list``, run once and remembered in the cache.

The index is the first of (docs/check.md, "Which index"): ``--index-url`` from the caller
(or ``[tool.patchset] index-url``); uv's ``[tool.uv.sources] vllm = { index = NAME }``;
``UV_DEFAULT_INDEX``, ``UV_INDEX_URL``; ``PIP_INDEX_URL``; the default index in uv's
configuration files (``[[index]]`` with ``default = true``, else ``index-url``: the project's
nearest ``uv.toml`` or ``pyproject.toml`` with ``[tool.uv]``, then the user's and the system's
``uv.toml``); ``index-url`` in pip's configuration; uv's first extra index (``UV_INDEX``,
``UV_EXTRA_INDEX_URL``, the first ``[[index]]`` that is not explicit, ``extra-index-url``);
else pip's default (its ``PyPI.simple_url``, so no index is named here). Variables beat files,
as in both tools; uv's come before pip's at each step; one index is read (a default before an
extra one): one release comes from one place. ``cert`` and ``trusted-host`` come from the
environment (``PIP_CERT``, ``PIP_TRUSTED_HOST``) or pip's configuration, with uv's
``UV_INSECURE_HOST`` / ``allow-insecure-host`` added to the trusted hosts; credentials from the
URL or ``~/.netrc``.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
import re
import sys
import threading
import urllib.parse
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from patchset.adapters import net
from patchset.errors import RegistryError, SourceError
from patchset.registry.toml import Table, load_toml

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
    return _pip_config_memo(memo)  # type: ignore[unreachable]  # mypy reads as on Linux


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
    import configparser  # noqa: PLC0415 -- when pip's files are read, not to look up the memo

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
    import subprocess  # noqa: PLC0415 -- asked of pip off Linux only

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
    import importlib.metadata  # noqa: PLC0415 -- off Linux only: 10 ms at every check otherwise

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


# -- uv's settings ----------------------------------------------------------------------------

UV_FILE = "uv.toml"
_INDEX_NAME = re.compile(r"^[A-Za-z0-9._-]+$")
_TRUE = {"1", "true", "yes", "on"}
Choice = tuple[str, str]  # (url, the setting that named it)


@dataclass(frozen=True)
class UvIndex:
    url: str
    chosen_by: str
    name: str | None = None
    default: bool = False
    explicit: bool = False


@dataclass(frozen=True)
class UvFile:
    """One configuration file uv reads, with what patchset takes from it."""

    path: Path
    indexes: tuple[UvIndex, ...] = ()  # ``[[index]]``, in order
    index_url: str | None = None
    extra_index_urls: tuple[str, ...] = ()
    insecure_hosts: tuple[str, ...] = ()
    vllm_index: str | None = None  # ``[tool.uv.sources] vllm = { index = NAME }``


@dataclass(frozen=True)
class UvSettings:
    """uv's index settings, each step of the order already decided (None: nothing set)."""

    pinned: Choice | None = None
    env_default: Choice | None = None
    file_default: Choice | None = None
    extra: Choice | None = None
    insecure_hosts: tuple[str, ...] = ()
    files: tuple[Path, ...] = ()


def uv_config_files(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> list[UvFile]:
    """The files uv reads, highest priority first: ``UV_CONFIG_FILE`` alone when set (none at
    all with ``UV_NO_CONFIG``); else the project's (the nearest folder, from `cwd` up, holding
    a ``uv.toml`` or a ``pyproject.toml`` with ``[tool.uv]``; ``uv.toml`` wins in one folder),
    the user's (``$XDG_CONFIG_HOME/uv/uv.toml``, else ``~/.config/uv/uv.toml``) and the
    system's (the first ``$XDG_CONFIG_DIRS/uv/uv.toml``, else ``/etc/uv/uv.toml``). A file
    that does not parse, or holds a setting of the wrong type, is a RegistryError naming it."""
    env = os.environ if environ is None else environ
    if (env.get("UV_NO_CONFIG") or "").strip().lower() in _TRUE:
        return []
    if named := (env.get("UV_CONFIG_FILE") or "").strip():
        path = Path(named).expanduser()
        return [_uv_file(path, load_toml(path), "")]
    found: list[UvFile] = []
    start = (cwd or Path.cwd()).absolute()
    for folder in (start, *start.parents):
        if (folder / UV_FILE).is_file():
            found.append(_uv_file(folder / UV_FILE, load_toml(folder / UV_FILE), ""))
            break
        pyproject = folder / "pyproject.toml"
        if pyproject.is_file():
            tool = load_toml(pyproject).get("tool")
            if isinstance(tool, dict) and "uv" in tool:
                found.append(_uv_file(pyproject, tool["uv"], "tool.uv"))
                break
    xdg = (env.get("XDG_CONFIG_HOME") or "").strip()
    user = (Path(xdg) if xdg else Path("~").expanduser() / ".config") / "uv" / UV_FILE
    if user.is_file():
        found.append(_uv_file(user, load_toml(user), ""))
    dirs = (env.get("XDG_CONFIG_DIRS") or "").strip() or "/etc/xdg"
    systems = [Path(d) / "uv" / UV_FILE for d in dirs.split(os.pathsep) if d]
    for system in (*systems, Path("/etc/uv") / UV_FILE):
        if system.is_file():
            found.append(_uv_file(system, load_toml(system), ""))
            break
    return found


def _uv_file(path: Path, data: object, where: str) -> UvFile:
    table = Table(data, file=path, where=where)
    indexes = [
        UvIndex(
            url=entry.req_str("url"),
            chosen_by=f"{path} ({entry.where})",
            name=entry.opt_str("name", required=False),
            default=entry.flag("default", default=False),
            explicit=entry.flag("explicit", default=False),
        )
        for entry in table.tables("index")
    ]
    pinned = None
    sources = table.table("sources", required=False)
    if sources is not None and "vllm" in sources.names():
        vllm = sources.table("vllm")
        assert vllm is not None  # required=True raised otherwise
        pinned = vllm.opt_str("index", required=False)
    return UvFile(
        path=path,
        indexes=tuple(indexes),
        index_url=table.opt_str("index-url", required=False),
        extra_index_urls=table.str_list("extra-index-url", required=False),
        insecure_hosts=table.str_list("allow-insecure-host", required=False),
        vllm_index=pinned,
    )


def _env_index(text: str, var: str) -> UvIndex:
    """``NAME=URL`` or ``URL`` (a URL's scheme holds a ``:``, so it never reads as a name)."""
    name, sep, url = text.partition("=")
    if sep and _INDEX_NAME.match(name):
        return UvIndex(url, var, name=name)
    return UvIndex(text, var)


def read_uv_settings(
    cwd: Path | None = None, environ: Mapping[str, str] | None = None
) -> UvSettings:
    """uv's settings for the index, read as uv reads them (see `uv_config_files`): variables
    before files, the project's file before the user's before the system's, an ``[[index]]``
    with ``default = true`` before ``index-url``, arrays in file order."""
    env = os.environ if environ is None else environ
    files = uv_config_files(cwd, env)
    env_extras = [_env_index(t, "UV_INDEX") for t in (env.get("UV_INDEX") or "").split()]
    env_extras += [UvIndex(t, "UV_EXTRA_INDEX_URL") for t in _words(env, "UV_EXTRA_INDEX_URL")]
    env_default: Choice | None = None
    for var in ("UV_DEFAULT_INDEX", "UV_INDEX_URL"):
        if text := (env.get(var) or "").strip():
            env_default = (_env_index(text, var).url, var)
            break
    file_indexes = [entry for f in files for entry in f.indexes]
    pinned: Choice | None = None
    for f in files:
        if f.vllm_index is not None:
            named = [i for i in (*env_extras, *file_indexes) if i.name == f.vllm_index]
            if not named:
                raise RegistryError(
                    f"[tool.uv.sources] vllm names the index {f.vllm_index!r}, "
                    "which no [[tool.uv.index]] or UV_INDEX defines",
                    path=f.path,
                )
            pinned = (named[0].url, f"{named[0].chosen_by}, named by [tool.uv.sources] vllm")
            break
    file_default = next(((i.url, i.chosen_by) for i in file_indexes if i.default), None) or next(
        ((f.index_url, f"{f.path} (index-url)") for f in files if f.index_url), None
    )
    extras = (i for i in (*env_extras, *file_indexes) if not (i.default or i.explicit))
    extra = next(((i.url, i.chosen_by) for i in extras), None) or next(
        (
            (f.extra_index_urls[0], f"{f.path} (extra-index-url)")
            for f in files
            if f.extra_index_urls
        ),
        None,
    )
    hosts = (*_words(env, "UV_INSECURE_HOST"), *(h for f in files for h in f.insecure_hosts))
    return UvSettings(pinned, env_default, file_default, extra, hosts, tuple(f.path for f in files))


def _words(env: Mapping[str, str], var: str) -> list[str]:
    return (env.get(var) or "").split()


def resolve(
    index_url: str | None = None, *, memo: Path | None = None, cwd: Path | None = None
) -> IndexSettings:
    """The index and its transport, from the caller, the environment, uv's and pip's settings
    in the module docstring's order (pip's remembered under `memo` when given; uv's project
    file searched from `cwd`, default the working folder)."""
    config = pip_config(memo)
    uv = read_uv_settings(cwd)
    pip_env = os.environ.get("PIP_INDEX_URL")
    steps: list[Choice | None] = [
        (index_url, "--index-url") if index_url else None,
        uv.pinned,
        uv.env_default,
        (pip_env, "PIP_INDEX_URL") if pip_env else None,
        uv.file_default,
        (config["index-url"], "pip config (index-url)") if config.get("index-url") else None,
        uv.extra,
    ]
    url, chosen = next((step for step in steps if step is not None), None) or (
        pip_default_index(),
        "pip's default",
    )
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
        cafile=cert,
        trusted_hosts=tuple(dict.fromkeys((*trusted.split(), *uv.insecure_hosts))),
        credentials=credentials,
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
