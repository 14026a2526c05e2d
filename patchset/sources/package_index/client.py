"""The package-index client: vLLM's files on any index that speaks the simple API.

The project page ``<index>/vllm/`` is asked for as PEP 691 JSON, then PEP 503 HTML (what
the server prefers decides), and parsed by `pypi_simple`. Per release it names a wheel
(one for this machine's architecture when there is one) and the sdist, each with the
index's sha256. The answer is cached with the time it was fetched and a digest of its
content, so ``offline=True`` can answer from the cache, look-ups within ``max_age`` cost no
request, and a damaged answer is never believed (it is asked for again, or refused offline).
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import importlib
import json
import logging
import os
import threading
import time
import urllib.parse
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any, Literal

from packaging.version import InvalidVersion, Version

from patchset.adapters import net
from patchset.errors import SourceError
from patchset.sources.package_index.cache import Cache
from patchset.sources.package_index.settings import IndexSettings, resolve_soon
from patchset.sources.select import MAX_VERSION

LOG = logging.getLogger(__name__)

PROJECT = "vllm"
MAX_AGE = 600.0  # seconds an online look-up reuses the cached project page
ACCEPT = (
    "application/vnd.pypi.simple.v1+json, application/vnd.pypi.simple.v1+html;q=0.2,"
    " text/html;q=0.01"
)


@dataclass(frozen=True)
class IndexFile:
    """One file of a release as the index describes it."""

    version: str
    filename: str
    url: str  # absolute
    sha256: str
    size: int  # 0 when the index does not say
    kind: Literal["wheel", "sdist"]
    yanked: bool = False


@dataclass(frozen=True)
class Release:
    """A release's artifacts: the wheel to read (if any) and the sdist (if any)."""

    version: str
    wheel: IndexFile | None
    sdist: IndexFile | None


class PackageIndex:
    """vLLM's entries on one package index, with the project page cached on disk."""

    def __init__(
        self,
        index_url: str | None = None,
        *,
        offline: bool = False,
        cache: Cache | None = None,
        max_age: float = MAX_AGE,
        timeout: float = net.DEFAULT_TIMEOUT,
        retries: int = 3,
        settings: IndexSettings | None = None,
    ) -> None:
        self._given = index_url
        self._settings = settings
        self.offline = offline
        self.cache = cache or Cache.default()
        self.max_age = max_age
        self.timeout = timeout
        self.retries = retries
        self._files: list[IndexFile] | None = None
        self._pending: Callable[[], IndexSettings] | None = None
        if settings is None:  # asking pip takes a process: started now, waited for when used
            self._pending = resolve_soon(index_url, memo=self.cache.root / "settings")
        self._importing: threading.Thread | None = None
        if not offline and not self.cache.has_fresh_answer(max_age):
            # the page will be asked for: pypi_simple (pydantic) imports in 0.2 s, meanwhile
            self._importing = threading.Thread(
                target=importlib.import_module, args=("pypi_simple",), daemon=True
            )
            self._importing.start()

    def settle(self) -> None:
        """Wait for the threads this index started (pip's settings asked for, an import):
        their answers are kept; a failure to get the settings is raised when they are used."""
        if self._importing is not None:
            self._importing.join()
        if self._settings is None and self._pending is not None:
            with contextlib.suppress(Exception):  # raised again where the settings are used
                self._settings = self._pending()

    @property
    def settings(self) -> IndexSettings:
        """pip's settings (asked for when the index was made; waited for here)."""
        if self._settings is None:
            assert self._pending is not None
            self._settings = self._pending()
        return self._settings

    @property
    def transport(self) -> net.Transport:
        return self.settings.transport

    @property
    def project_url(self) -> str:
        return urllib.parse.urljoin(self.settings.index_url.rstrip("/") + "/", f"{PROJECT}/")

    @property
    def cache_key(self) -> str:
        """One cached answer per index, named by a hash of its (credential-free) URL."""
        base = net.redact(self.settings.index_url.rstrip("/"))
        return f"{PROJECT}-{hashlib.sha256(base.encode()).hexdigest()[:16]}"

    def files(self) -> list[IndexFile]:
        """Every vLLM file the index lists: fetched, or from the cache when fresh or offline."""
        if self._files is None:
            self._files = self._load()
        return self._files

    def cached_files(self) -> list[IndexFile] | None:
        """The cached answer whatever its age, without touching the network."""
        cached = self.cache.load_json(self.cache_key)
        return _files_from_record(cached[1]) if cached else None

    def forget(self) -> None:
        """Drop the cached answer, so the next look-up asks the index again."""
        self._files = None
        self.cache.drop_json(self.cache_key)

    def list_versions(self, *, prereleases: bool = False) -> list[str]:
        """Every release with a wheel or an sdist that is not yanked, oldest first."""
        found: dict[str, Version] = {}
        for f in self.files():
            version = _parse_version(f.version)
            if version is None or f.yanked or (version.is_prerelease and not prereleases):
                continue
            found[f.version] = version
        return sorted(found, key=found.__getitem__)

    def release(self, version: str) -> Release:
        """The wheel and sdist of `version` (yanked ones too: the caller asked by name)."""
        target = _parse_version(version)
        mine = [f for f in self.files() if f.version == version or (
            target is not None and _parse_version(f.version) == target)]  # fmt: skip
        if not mine:
            raise SourceError(f"vllm {version} is not on the index at {self.where()}")
        wheels = [f for f in mine if f.kind == "wheel"]
        sdists = sorted(
            (f for f in mine if f.kind == "sdist"), key=lambda f: not f.filename.endswith(".gz")
        )
        return Release(mine[0].version, pick_wheel(wheels), sdists[0] if sdists else None)

    def where(self) -> str:
        return net.redact(self.settings.index_url)

    def _load(self) -> list[IndexFile]:
        cached = self.cache.load_json(self.cache_key)
        if self.offline:
            if cached is None:
                raise SourceError(
                    f"offline, and the index's list of vllm releases is not cached (or is"
                    f" damaged) in {self.cache.root}; run once without --offline"
                )
            return _files_from_record(cached[1])
        if cached is not None and time.time() - cached[0] < self.max_age:
            return _files_from_record(cached[1])
        files = self._fetch()
        self.cache.store_json(
            self.cache_key, {"files": [asdict(f) for f in files]}, source=self.where()
        )
        return files

    def _fetch(self) -> list[IndexFile]:
        from pypi_simple import ProjectPage  # noqa: PLC0415 -- pydantic is slow to import

        url = self.project_url
        LOG.info("asking %s for vllm's files", net.redact(url))
        try:
            final, kind, body = net.fetch_page(
                url,
                accept=ACCEPT,
                timeout=self.timeout,
                retries=self.retries,
                transport=self.transport,
            )
        except net.HTTPStatusError as exc:
            if exc.status == 404:
                raise SourceError(f"vllm is not on the index at {self.where()}") from None
            raise
        mime = kind.split(";")[0].strip().lower()
        try:
            if mime in {"application/vnd.pypi.simple.v1+json", "application/json"}:
                page = ProjectPage.from_json_data(json.loads(body), final)
            elif mime in {"text/html", "application/vnd.pypi.simple.v1+html", ""}:
                page = ProjectPage.from_html(PROJECT, body, final)
            else:
                raise SourceError(f"{net.redact(url)}: an answer of type {mime!r}, not a page")
        except SourceError:
            raise
        except Exception as exc:  # any parse failure of a foreign page is one error
            raise SourceError(
                f"{net.redact(url)}: not a simple-API project page ({type(exc).__name__})"
            ) from None
        files = []
        for package in page.packages:
            sha = (package.digests or {}).get("sha256")
            if package.package_type not in {"wheel", "sdist"} or not package.version or not sha:
                continue
            if not _ours(package.project, package.version):
                LOG.info("%s: not a file of vllm; skipped, as pip does", package.filename)
                continue
            kind_: Literal["wheel", "sdist"] = (
                "wheel" if package.package_type == "wheel" else "sdist"
            )
            files.append(
                IndexFile(
                    version=package.version,
                    filename=package.filename,
                    url=package.url,
                    sha256=sha.lower(),
                    size=int(package.size or 0),
                    kind=kind_,
                    yanked=bool(package.is_yanked),
                )
            )
        if not files:
            raise SourceError(
                f"{net.redact(url)}: the page lists no vllm wheel or sdist with a sha256"
                " (is it an error page?)"
            )
        return files


def _ours(project: str | None, version: str) -> bool:
    """Whether a listed file is one of vLLM's: its file name names the project (another
    project's wheel on the page is not, as pip's link evaluator says) and a version that can
    be one."""
    from packaging.utils import canonicalize_name  # noqa: PLC0415 -- see `pick_wheel`

    return (
        project is not None
        and canonicalize_name(project) == PROJECT
        and _parse_version(version) is not None
    )


def pick_wheel(wheels: list[IndexFile]) -> IndexFile | None:
    """A wheel for this machine's architecture when there is one, else a pure one, else any."""
    machine = os.uname().machine.lower()  # platform.machine(), without importing platform
    machine = {"amd64": "x86_64", "arm64": "aarch64"}.get(machine, machine)

    def rank(f: IndexFile) -> tuple[int, str]:
        platforms = _wheel_platforms(f.filename)
        if platforms is None:
            return (3, f.filename)
        if any(p == machine or p.endswith(f"_{machine}") for p in platforms):
            return (0, f.filename)
        return (1 if "any" in platforms else 2, f.filename)

    return min(wheels, key=rank) if wheels else None


def _wheel_platforms(filename: str) -> set[str] | None:
    """The platform tags of a wheel's file name (``name-version[-build]-python-abi-platform
    .whl``, the platform tags joined by dots); None when it is not one. What packaging's
    `parse_wheel_filename` tells of them, without importing its tags (~4 ms a start)."""
    parts = filename[: -len(".whl")].split("-") if filename.endswith(".whl") else []
    if len(parts) not in (5, 6) or not all(parts) or _parse_version(parts[1]) is None:
        return None
    if len(parts) == 6 and not parts[2][0].isdigit():  # a build tag starts with a digit
        return None
    return set(parts[-1].lower().split("."))


def _files_from_record(data: Any) -> list[IndexFile]:
    try:
        return [IndexFile(**entry) for entry in data["files"]]
    except (KeyError, TypeError) as exc:
        raise SourceError(f"the cached index answer is not readable ({exc})") from None


@functools.lru_cache(maxsize=4096)
def _parse_version(text: str) -> Version | None:
    """The version, or None for what cannot be one of vLLM's (left out as pip does): not
    PEP 440, or longer than any version is (thousands of digits would not convert)."""
    if len(text) > MAX_VERSION:
        return None
    try:
        return Version(text)
    except (InvalidVersion, ValueError):
        return None
