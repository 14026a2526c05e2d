"""Typed reading of TOML tables with errors that name the file, the key and a likely fix.

Every loader in patchset (patch.toml, sites.toml, builds/*.toml) reads through `Table`, so an
unknown key or a bad value always reads the same way:
``patches/fla-tma-sm12x/patch.toml: upstream.state: 'opne' is not one of open, merged, ...``.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import hmac
import json
import re
import sys
import tomllib
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from patchset._fs import atomic_file, cache_secret, seal
from patchset.errors import RegistryError

TOO_DEEP = "not usable TOML: arrays or tables nested too deeply"


def load_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file; a syntax error or unreadable file becomes a RegistryError. Within
    `parsed_cache`, a file whose bytes were parsed before is not parsed again."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise RegistryError(f"cannot read: {exc.strerror}", path=path) from None
    cache = _CACHE.get()
    key = cache.key("table", raw) if cache is not None else ""
    if cache is not None and (known := cache.get(key)) is not None:
        return known  # type: ignore[no-any-return]
    try:
        data = tomllib.loads(raw.decode())
    except tomllib.TOMLDecodeError as exc:
        raise RegistryError(f"not valid TOML: {exc}", path=path) from None
    except RecursionError:
        raise RegistryError(TOO_DEEP, path=path) from None
    except UnicodeDecodeError as exc:
        line = exc.object.count(b"\n", 0, exc.start) + 1
        raise RegistryError(
            f"line {line}: not UTF-8 (byte {exc.object[exc.start]:#04x})", path=path
        ) from None
    if cache is not None:
        cache.put(key, data)
    return data


CACHE_FILE_VERSION = 1


class _Parsed:
    """What TOML parsing made of files (their tables, their key lines), as JSON texts keyed by
    a sha256 of the bytes parsed and of the parser (Python's version, this module's text; the
    caller names the file by patchset's version): parsing is skipped, never the checks made
    of the tables. Kept in one file, sealed by the cache's secret (`_fs.seal`): a file
    changed by anyone else, torn or of another version is not believed (the files are
    parsed). JSON, not pickle: reading the cache never runs code from it. A value JSON
    cannot hold (a TOML date) is not kept."""

    def __init__(self, file: Path) -> None:
        self.file = file
        self.salt = hashlib.sha256(
            f"{CACHE_FILE_VERSION}\0{sys.version}\0".encode() + Path(__file__).read_bytes()
        ).digest()
        self.secret: bytes | None = None
        self.known: dict[str, str] = {}
        self.used: dict[str, str] = {}
        with contextlib.suppress(OSError, ValueError, UnicodeDecodeError):
            self.secret = cache_secret(file.parent)
            self.known = self._read()
        self.stored = set(self.known)  # what the file holds

    def _read(self) -> dict[str, str]:
        text = self.file.read_bytes().decode()
        said, _, body = text.partition("\n")
        assert self.secret is not None
        if not hmac.compare_digest(said, seal(self.secret, body)):
            return {}
        data = json.loads(body)
        if not isinstance(data, dict) or data.get("salt") != self.salt.hex():
            return {}
        entries = data.get("entries")
        if not isinstance(entries, dict):
            return {}
        return {k: v for k, v in entries.items() if isinstance(v, str)}

    def key(self, what: str, data: bytes) -> str:
        return hashlib.sha256(self.salt + what.encode() + b"\0" + data).hexdigest()

    def get(self, key: str) -> Any:
        text = self.known.get(key)
        if text is None:
            return None
        self.used[key] = text
        return json.loads(text)  # a new object each time: a caller may change what it gets

    def put(self, key: str, value: object) -> None:
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=True)
        except (TypeError, ValueError):  # a date or time: parsed each time
            return
        self.used[key] = self.known[key] = text

    def save(self) -> None:
        """The file rewritten with what this load used (when it differs from what was read):
        entries of files no longer there are dropped."""
        if self.secret is None or self.used.keys() == self.stored:
            return
        body = json.dumps({"salt": self.salt.hex(), "entries": self.used}, ensure_ascii=False)
        with (
            contextlib.suppress(OSError),
            atomic_file(self.file, mode=0o600, durable=False) as out,
        ):
            out.write(f"{seal(self.secret, body)}\n{body}".encode())


_CACHE: contextvars.ContextVar[_Parsed | None] = contextvars.ContextVar("parsed", default=None)


@contextlib.contextmanager
def parsed_cache(file: Path | None) -> Iterator[None]:
    """Within the block, `load_toml` and `key_lines` reuse what was parsed of the same bytes
    before (kept in `file`, see `_Parsed`); None: nothing kept."""
    if file is None or _CACHE.get() is not None:
        yield
        return
    cache = _Parsed(file)
    token = _CACHE.set(cache)
    try:
        yield
    finally:
        _CACHE.reset(token)
    cache.save()


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    import difflib  # noqa: PLC0415 -- a misspelt key only

    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean {close[0]!r}?)" if close else ""


class Table:
    """One TOML table being read; `finish()` rejects keys nobody asked for."""

    def __init__(self, data: object, *, file: Path, where: str = "") -> None:
        self.file = file
        self.where = where
        if not isinstance(data, dict):
            raise self.error(f"expected a table, got {_kind(data)}")
        self._data: dict[str, Any] = data
        self._known: set[str] = set()

    def error(self, message: str, key: str | None = None) -> RegistryError:
        name = ".".join(part for part in (self.where, key) if part)
        error = RegistryError(f"{name}: {message}" if name else message, path=self.file)
        error.key = name or None
        return error

    def _get(self, key: str, required: bool) -> Any:
        self._known.add(key)
        if key not in self._data:
            if required:
                raise self.error("required key is missing", key)
            return None
        return self._data[key]

    def opt_str(self, key: str, *, required: bool = True, default: str | None = None) -> str | None:
        value = self._get(key, required)
        if value is None:
            return default
        if not isinstance(value, str):
            raise self.error(f"expected a string, got {_kind(value)}", key)
        if required and not value.strip():
            raise self.error("must not be empty", key)
        return value

    def req_str(self, key: str) -> str:
        value = self.opt_str(key, required=True)
        assert value is not None  # required=True raised otherwise
        return value

    def integer(self, key: str, *, minimum: int | None = None) -> int:
        value = self._get(key, True)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(f"expected an integer, got {_kind(value)}", key)
        if minimum is not None and value < minimum:
            raise self.error(f"must be >= {minimum}, got {value}", key)
        return value

    def number(self, key: str, *, default: float, minimum: float, maximum: float) -> float:
        """An integer or float within [minimum, maximum]; `default` when absent."""
        value = self._get(key, False)
        if value is None:
            return default
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise self.error(f"expected a number, got {_kind(value)}", key)
        if not minimum <= value <= maximum:
            raise self.error(f"must be between {minimum:g} and {maximum:g}, got {value}", key)
        return float(value)

    def raw(self, key: str) -> Any:
        """The value as TOML gives it (None when absent), for a reader of its own (the
        `[applies]` predicate); counted as read."""
        return self._get(key, False)

    def flag(self, key: str, *, default: bool) -> bool:
        value = self._get(key, False)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self.error(f"expected true or false, got {_kind(value)}", key)
        return value

    def choice(self, key: str, choices: tuple[str, ...], *, default: str | None = None) -> str:
        value = self.opt_str(key, required=default is None, default=default)
        assert value is not None
        if value not in choices:
            raise self.error(
                f"{value!r} is not one of {', '.join(choices)}{did_you_mean(value, choices)}", key
            )
        return value

    def specifier(self, key: str, *, required: bool = True) -> SpecifierSet | None:
        value = self.opt_str(key, required=required)
        if value is None:
            return None
        try:
            return SpecifierSet(value)
        except InvalidSpecifier:
            raise self.error(
                f"{value!r} is not a PEP 440 version specifier (e.g. '>=0.17.0,<0.20.0')", key
            ) from None

    def version(self, key: str, *, required: bool = False) -> str | None:
        value = self.opt_str(key, required=required)
        if value is None:
            return None
        try:
            Version(value)
        except InvalidVersion:
            raise self.error(f"{value!r} is not a PEP 440 version", key) from None
        return value

    def str_list(self, key: str, *, required: bool = True) -> tuple[str, ...]:
        value = self._get(key, required)
        if value is None:
            return ()
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.error(f"expected a list of strings, got {_kind(value)}", key)
        if required and not value:
            raise self.error("must not be empty", key)
        return tuple(value)

    def matching_list(self, key: str, pattern: re.Pattern[str], what: str) -> tuple[str, ...]:
        """An optional list of strings each matching `pattern` (else "'x' is not `what`"),
        each kept once, in order."""
        names = self.str_list(key, required=False)
        for name in names:
            if not pattern.match(name):
                raise self.error(f"{name!r} is not {what}", key)
        return tuple(dict.fromkeys(names))

    def str_map(self, key: str) -> dict[str, str]:
        value = self._get(key, False)
        if value is None:
            return {}
        if not isinstance(value, dict) or not all(isinstance(v, str) for v in value.values()):
            raise self.error(f"expected a table of strings, got {_kind(value)}", key)
        return dict(value)

    def free_table(self, key: str) -> dict[str, Any]:
        """A table whose keys nobody checks (a team's own metadata); {} when absent."""
        value = self._get(key, False)
        if value is None:
            return {}
        if not isinstance(value, dict):
            raise self.error(f"expected a table, got {_kind(value)}", key)
        return value

    def table(self, key: str, *, required: bool = True) -> Table | None:
        value = self._get(key, required)
        if value is None:
            return None
        return Table(value, file=self.file, where=self._sub(key))

    def tables(self, key: str, *, required: bool = False) -> list[Table]:
        value = self._get(key, required)
        if value is None:
            return []
        if not isinstance(value, list) or not value:
            raise self.error(f"expected a non-empty array of tables, got {_kind(value)}", key)
        return [
            Table(item, file=self.file, where=f"{self._sub(key)}[{i}]")
            for i, item in enumerate(value)
        ]

    def names(self) -> list[str]:
        """The keys the table holds (for tables whose keys are data, like a site's `when`)."""
        return list(self._data)

    def known(self, *keys: str) -> None:
        """Count `keys` as read (a loader that could not read them for another key's fault)."""
        self._known.update(keys)

    def unknown(self) -> list[RegistryError]:
        """One error per key nobody asked for."""
        return [
            self.error(f"unknown key{did_you_mean(key, self._known)}", key)
            for key in self._data
            if key not in self._known
        ]

    def finish(self) -> None:
        for problem in self.unknown():
            raise problem

    def _sub(self, key: str) -> str:
        return f"{self.where}.{key}" if self.where else key


def _kind(value: object) -> str:
    return {
        bool: "a boolean",
        int: "an integer",
        float: "a float",
        str: "a string",
        list: "an array",
        dict: "a table",
    }.get(type(value), type(value).__name__)


_HEADER = re.compile(r"^\s*(\[\[?)\s*([^\[\]]+?)\s*\]\]?\s*(#.*)?$")
_BARE = r"""(?:[A-Za-z0-9_-]+|"[^"]*"|'[^']*')"""
_KEY = re.compile(rf"^\s*({_BARE}(?:\s*\.\s*{_BARE})*)\s*=")


def _dotted(text: str) -> str:
    return ".".join(part.strip().strip("\"'") for part in text.split("."))


def key_lines(text: str) -> dict[str, int]:
    """The line (from 1) of TOML `text` where each dotted key is set (``upstream.state``,
    ``site[1].anchor``: an array of tables counts from 0) or each table opens, the first
    where one is given twice. A light scan, not a parser (the text is valid TOML when it
    loaded): lines inside multi-line strings are skipped. Within `parsed_cache`, a text
    scanned before is not scanned again."""
    cache = _CACHE.get()
    if cache is None:
        return _key_lines(text)
    key = cache.key("lines", text.encode("utf-8", "surrogatepass"))
    known = cache.get(key)
    if known is None:
        known = _key_lines(text)
        cache.put(key, known)
    return known  # type: ignore[no-any-return]


def _key_lines(text: str) -> dict[str, int]:
    found: dict[str, int] = {}
    counts: dict[str, int] = {}
    table, quote = "", ""
    for number, line in enumerate(text.split("\n"), start=1):  # lines as an editor counts
        if quote:
            if line.count(quote) % 2:
                quote = ""
            continue
        first = line.lstrip()[:1]
        if not first or first == "#":
            continue
        header = _HEADER.match(line) if first == "[" else None
        if header:
            name = _dotted(header.group(2))
            if header.group(1) == "[[":
                counts[name] = counts.get(name, 0) + 1
                name = f"{name}[{counts[name] - 1}]"
            table = name
            found.setdefault(table, number)
            continue
        match = _KEY.match(line)
        if match:
            full = ".".join(p for p in (table, _dotted(match.group(1))) if p)
            found.setdefault(full, number)
            rest = line[match.end() :]
            for mark in ('"""', "'''"):
                if rest.count(mark) % 2:
                    quote = mark
    return found


def key_line(text: str, key: str) -> int | None:
    """The line (from 1) of TOML `text` that sets the dotted `key` (``upstream.state``,
    ``variants[1].payload``), else that opens the nearest table holding it; None when neither
    is found (a top-level key that is missing). A reader's hint for messages (`key_lines`)."""
    found = key_lines(text)
    path = key
    while path:
        if path in found:
            return found[path]
        path = path.rpartition(".")[0] if "." in path else ""
    return None
