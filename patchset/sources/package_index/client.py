"""The package-index client: where the index is, which vLLM releases it has, their sdists.

The index is pip's: ``--index-url`` from the caller, else ``PIP_INDEX_URL``, else pip's
configuration, else pip's default. Only its JSON API is used (``<base>/vllm/json``), whose
base is derived from a simple-API URL (``https://host/simple`` -> ``https://host/pypi``).
Extra indexes are ignored on purpose: one release must come from one place.

The project JSON is cached with the time it was fetched, so ``offline=True`` can answer
from the cache, and several look-ups within ``max_age`` cost no request.
"""

from __future__ import annotations

import hashlib
import logging
import os
import time
import urllib.parse
from dataclasses import dataclass
from typing import Any

from packaging.version import InvalidVersion, Version

from patchset.adapters import net
from patchset.errors import SourceError
from patchset.sources.package_index.cache import Cache

LOG = logging.getLogger(__name__)

PROJECT = "vllm"
MAX_AGE = 600.0  # seconds an online look-up reuses the cached project JSON


@dataclass(frozen=True)
class SdistFile:
    """One release's sdist as the index describes it."""

    version: str
    filename: str
    url: str  # absolute
    sha256: str
    size: int
    yanked: bool = False


def index_json_base(index_url: str | None = None) -> str:
    """The JSON API base URL (``<...>/pypi``) of the index pip would use."""
    url = index_url or os.environ.get("PIP_INDEX_URL") or _pip_config_index_url()
    if url:
        return json_base_from_index_url(url)
    try:
        from pip._internal.models.index import PyPI  # noqa: PLC0415 -- pip is slow to import
    except ImportError:
        raise SourceError(
            "pip is not installed here, so its default index is unknown; pass --index-url"
        ) from None
    return PyPI.pypi_url.rstrip("/")


def json_base_from_index_url(index_url: str) -> str:
    """``https://host/simple/`` -> ``https://host/pypi``; other URLs are taken as the base."""
    parts = urllib.parse.urlsplit(index_url.strip())
    path = parts.path.rstrip("/")
    head, _, last = path.rpartition("/")
    if last in {"simple", "+simple"}:
        path = f"{head}/pypi"
    return urllib.parse.urlunsplit(parts._replace(path=path, query="", fragment=""))


def _pip_config_index_url() -> str | None:
    """``global.index-url`` from pip's configuration files (the environment is read first)."""
    try:
        from pip._internal.configuration import Configuration  # noqa: PLC0415 -- slow import
        from pip._internal.exceptions import ConfigurationError  # noqa: PLC0415
    except ImportError:
        return None

    config = Configuration(isolated=False)
    try:
        config.load()
        value = config.get_value("global.index-url")
    except ConfigurationError:
        return None
    return str(value) if value else None


class PackageIndex:
    """vLLM's entries on one package index, with the project JSON cached on disk."""

    def __init__(
        self,
        index_url: str | None = None,
        *,
        offline: bool = False,
        cache: Cache | None = None,
        max_age: float = MAX_AGE,
        timeout: float = 30.0,
        retries: int = 3,
    ) -> None:
        self.json_base = index_json_base(index_url)
        self.offline = offline
        self.cache = cache or Cache.default()
        self.max_age = max_age
        self.timeout = timeout
        self.retries = retries
        self._project: dict[str, Any] | None = None

    @property
    def project_url(self) -> str:
        return f"{self.json_base}/{PROJECT}/json"

    @property
    def cache_key(self) -> str:
        """One cached answer per index, named by a hash of its (credential-free) base URL."""
        base = net.redact(self.json_base)
        return f"{PROJECT}-{hashlib.sha256(base.encode()).hexdigest()[:16]}"

    def project_json(self) -> dict[str, Any]:
        """The index's JSON for vLLM: fetched, or from the cache when fresh or offline."""
        if self._project is None:
            self._project = self._load_project()
        return self._project

    def cached_project_json(self) -> dict[str, Any] | None:
        """The cached answer whatever its age, without touching the network."""
        cached = self.cache.load_json(self.cache_key)
        return _checked_project(cached[1], self.project_url) if cached else None

    def forget(self) -> None:
        """Drop the cached answer, so the next look-up asks the index again."""
        self._project = None
        self.cache.drop_json(self.cache_key)

    def list_versions(self, *, prereleases: bool = False) -> list[str]:
        """Every release with an sdist that is not yanked, oldest first."""
        found: list[tuple[Version, str]] = []
        for name, files in self.project_json()["releases"].items():
            version = _parse_version(name)
            if version is None or (version.is_prerelease and not prereleases):
                continue
            if any(_is_sdist(f) and not f.get("yanked") for f in files):
                found.append((version, name))
        return [name for _, name in sorted(found)]

    def release_files(self, version: str) -> SdistFile:
        """The sdist of `version` (a yanked one too: the caller asked for it by name)."""
        releases: dict[str, list[dict[str, Any]]] = self.project_json()["releases"]
        name = _find_release(releases, version)
        if name is None:
            raise SourceError(f"vllm {version} is not on the index at {self._where()}")
        sdists = sorted(
            (f for f in releases[name] if _is_sdist(f)),
            key=lambda f: not str(f.get("filename", "")).endswith(".tar.gz"),
        )
        if not sdists:
            raise SourceError(f"vllm {name} has no sdist on the index at {self._where()}")
        entry = sdists[0]
        try:
            return SdistFile(
                version=name,
                filename=str(entry["filename"]),
                url=urllib.parse.urljoin(self.project_url, str(entry["url"])),
                sha256=str(entry["digests"]["sha256"]).lower(),
                size=int(entry.get("size") or 0),
                yanked=bool(entry.get("yanked")),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SourceError(
                f"the index's entry for {entry.get('filename', name)} lacks {exc}"
            ) from None

    def _load_project(self) -> dict[str, Any]:
        cached = self.cache.load_json(self.cache_key)
        if self.offline:
            if cached is None:
                raise SourceError(
                    f"offline, and the index's list of vllm releases is not cached in "
                    f"{self.cache.root}; run once without --offline"
                )
            return _checked_project(cached[1], self.project_url)
        if cached is not None and time.time() - cached[0] < self.max_age:
            return _checked_project(cached[1], self.project_url)
        try:
            data = net.fetch_json(self.project_url, timeout=self.timeout, retries=self.retries)
        except net.HTTPStatusError as exc:
            if exc.status == 404:
                raise SourceError(f"vllm is not on the index at {self._where()}") from None
            raise
        project = _trimmed(_checked_project(data, self.project_url))
        self.cache.store_json(self.cache_key, project, source=net.redact(self.project_url))
        return project

    def _where(self) -> str:
        return net.redact(self.json_base)


def _checked_project(data: Any, url: str) -> dict[str, Any]:
    if not isinstance(data, dict) or not isinstance(data.get("releases"), dict):
        raise SourceError(f"{net.redact(url)}: not a project answer of the JSON API")
    return data


def _trimmed(project: dict[str, Any]) -> dict[str, Any]:
    """Only what is used: the sdist entries (a tenth of the answer, quick to load again)."""
    keep = ("filename", "url", "digests", "size", "yanked", "packagetype")
    releases = {
        name: [{k: f[k] for k in keep if k in f} for f in files if _is_sdist(f)]
        for name, files in project["releases"].items()
        if isinstance(files, list)
    }
    return {"releases": releases}


def _find_release(releases: dict[str, Any], wanted: str) -> str | None:
    """The release key equal to `wanted` as a version (so ``v0.19.1`` finds ``0.19.1``)."""
    if wanted in releases:
        return wanted
    target = _parse_version(wanted)
    if target is None:
        return None
    return next((name for name in releases if _parse_version(name) == target), None)


def _parse_version(text: str) -> Version | None:
    try:
        return Version(text)
    except InvalidVersion:
        return None


def _is_sdist(entry: dict[str, Any]) -> bool:
    return entry.get("packagetype") == "sdist"
