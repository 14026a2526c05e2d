"""Releases from the package index: verified sdists, read through the cache's tree zips."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset._fs import file_sha256
from patchset.adapters import net
from patchset.errors import IntegrityError, SourceError
from patchset.registry.ranges import is_version
from patchset.sources.base import DownloadProgress, ReleaseInfo, ReleaseSource, ReleaseTree
from patchset.sources.package_index.cache import Cache, TreeStamp, TreeZip
from patchset.sources.package_index.client import MAX_AGE, PackageIndex, SdistFile

LOG = logging.getLogger(__name__)


class ZipTree(ReleaseTree):
    """A release tree read from a cached tree zip; holds the zip open while in use."""

    def __init__(self, info: ReleaseInfo, zf: TreeZip) -> None:
        self.info = info
        self._zf = zf

    def read(self, relpath: str) -> bytes | None:
        return self._zf.read(relpath)

    def paths(self) -> Iterator[str]:
        return iter(self._zf.names())


class IndexSource(ReleaseSource):
    """vLLM sdists from the package index, cached and verified; the default source."""

    name = "index"

    def __init__(
        self,
        index_url: str | None = None,
        *,
        offline: bool = False,
        progress: DownloadProgress | None = None,
        cache: Cache | None = None,
        prereleases: bool = False,
        max_age: float = MAX_AGE,
        timeout: float = 60.0,
        retries: int = 3,
    ) -> None:
        self.cache = cache or Cache.default()
        self.index = PackageIndex(
            index_url, offline=offline, cache=self.cache, max_age=max_age, retries=retries
        )
        self.offline = offline
        self.progress = progress
        self.prereleases = prereleases
        self.timeout = timeout
        self.retries = retries

    def versions(self) -> list[str]:
        """The index's releases; offline without a cached answer, the releases in the cache."""
        try:
            return self.index.list_versions(prereleases=self.prereleases)
        except SourceError:
            if not self.offline or self.index.cached_project_json() is not None:
                raise
            return sorted(set(self.cache.cached_tree_versions()), key=_sort_key)

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[ZipTree]:
        zf = self._tree_zip(version, self.progress)
        stamp = zf.stamp
        with zf:
            info = ReleaseInfo(
                version=stamp.version,
                origin=f"index sdist {stamp.sdist} sha256:{stamp.sha256[:12]}",
                digest=stamp.sha256,
            )
            yield ZipTree(info, zf)

    def fetch(self, version: str, progress: DownloadProgress | None = None) -> Path:
        """Make sure the release's tree zip is in the cache (downloading if need be)."""
        with self._tree_zip(version, progress) as zf:
            return zf.path

    def cached_versions(self) -> list[str]:
        """The releases whose trees are in the cache, oldest first."""
        cached = [v for v in self.cache.cached_tree_versions() if is_version(v)]
        return sorted(cached, key=Version)

    def prefetch(
        self,
        versions: Iterable[str],
        *,
        progress: DownloadProgress | None = None,
        workers: int = 4,
    ) -> dict[str, Path]:
        """Fetch several releases in parallel, reporting each download to `progress` (called
        from the worker threads). Every release is tried; then a SourceError names all that
        failed."""
        wanted = list(dict.fromkeys(versions))
        if not self.offline and wanted:
            self.index.project_json()  # once, before the threads want it

        done: dict[str, Path] = {}
        failed: list[str] = []
        with ThreadPoolExecutor(max_workers=max(1, workers)) as pool:
            futures = {pool.submit(self.fetch, v, progress): v for v in wanted}
            for future in as_completed(futures):
                try:
                    done[futures[future]] = future.result()
                except SourceError as exc:
                    failed.append(f"{futures[future]}: {exc}")
        if failed:
            raise SourceError(
                f"{len(failed)} of {len(wanted)} releases failed: " + "; ".join(failed)
            )
        return {v: done[v] for v in wanted}

    # -- the cache ---------------------------------------------------------------------

    def _tree_zip(self, version: str, progress: DownloadProgress | None) -> TreeZip:
        if self.offline:
            return self._cached_tree_zip(version)
        sdist = self.index.release_files(version)
        stamp = TreeStamp(sdist.version, sdist.filename, sdist.sha256)
        zf = self._open_zip(sdist.version, stamp)
        if zf is None:
            with self.cache.lock(f"release-{sdist.version}"):
                zf = self._open_zip(sdist.version, stamp)  # another process may have built it
                if zf is None:
                    self._build(sdist, stamp, progress)
                    zf = self._open_zip(sdist.version, stamp)
        if zf is None:  # pragma: no cover -- only if the cache is changed under our feet
            raise SourceError(f"vllm {version}: the cached tree vanished after it was built")
        return zf

    def _cached_tree_zip(self, version: str) -> TreeZip:
        """Offline: the cached tree, checked against the cached index answer when there is one."""
        expected: SdistFile | None = None
        with contextlib.suppress(SourceError):  # no cached answer, or no such release in it
            expected = self.index.release_files(version)
        name = expected.version if expected else _canonical(version)
        zf = self.cache.open_tree(name)
        if zf is not None:
            if expected is None or zf.stamp.sha256 == expected.sha256:
                return zf
            zf.close()
        if expected is not None and self.cache.sdist_path(expected.filename).is_file():
            stamp = TreeStamp(expected.version, expected.filename, expected.sha256)
            with self.cache.lock(f"release-{expected.version}"):
                if self._verified_sdist(expected) is not None:
                    self.cache.build_tree(self.cache.sdist_path(expected.filename), stamp)
                    zf = self._open_zip(expected.version, stamp)
                    if zf is not None:
                        return zf
        raise SourceError(
            f"offline, and vllm {version} is not in the cache at {self.cache.root};"
            " run without --offline to download it"
        )

    def _open_zip(self, version: str, stamp: TreeStamp) -> TreeZip | None:
        """The cached tree zip if it is sound and made from the sdist `stamp`."""
        zf = self.cache.open_tree(version)
        if zf is not None and zf.stamp != stamp:
            zf.close()
            return None
        return zf

    def _build(self, sdist: SdistFile, stamp: TreeStamp, progress: DownloadProgress | None) -> None:
        """Download the sdist unless a verified copy is cached, then write its tree zip."""
        path = self._verified_sdist(sdist)
        if path is None:
            path = self.cache.sdist_path(sdist.filename)

            def report(done: int, total: int) -> None:
                if progress is not None:
                    progress(sdist.version, done, total or sdist.size)

            LOG.info("downloading %s", net.redact(sdist.url))
            try:
                net.download(
                    sdist.url,
                    path,
                    sha256=sdist.sha256,
                    timeout=self.timeout,
                    retries=self.retries,
                    progress=report,
                )
            except IntegrityError:
                self.index.forget()  # the answer may be stale: ask again next time
                raise
        self.cache.build_tree(path, stamp)

    def _verified_sdist(self, sdist: SdistFile) -> Path | None:
        """The cached sdist if its sha256 is the index's; a mismatching copy is deleted."""
        path = self.cache.sdist_path(sdist.filename)
        if not path.is_file():
            return None
        if file_sha256(path) == sdist.sha256:
            return path
        LOG.warning("%s: sha256 does not match the index; deleting it", path)
        path.unlink(missing_ok=True)
        return None


def _canonical(version: str) -> str:
    try:
        return str(Version(version))
    except InvalidVersion:
        return version


def _sort_key(version: str) -> tuple[int, Version | str]:
    try:
        return (0, Version(version))
    except InvalidVersion:
        return (1, version)
