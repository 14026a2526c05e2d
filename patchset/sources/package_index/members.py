"""What an index tree reads its files through: the cache, the members checked this run (kept
in memory), the range requests that fetch more, and the manifests its source builds.

It sits between `source` (which makes trees) and `tree` (which reads them): a tree is given a
`Members` when it is made and never holds the source that made it; neither module imports the
other's class.
"""

from __future__ import annotations

import logging
import queue
import threading
import zlib
from collections.abc import Callable, Iterator
from typing import Any, Protocol, TypeVar

from patchset.adapters import net
from patchset.errors import SourceError
from patchset.sources.base import DownloadProgress
from patchset.sources.package_index import wheel
from patchset.sources.package_index.cache import Cache
from patchset.sources.package_index.packing import Manifest

LOG = logging.getLogger(__name__)

MEMORY = 256 << 20  # bytes of members checked this run kept in memory for the check

_T = TypeVar("_T")
_R = TypeVar("_R")


class Manifests(Protocol):
    """The manifest work a tree asks of its source: build one again, the sdist's, forget one."""

    def rebuild(self, manifest: Manifest, *, damaged: bool = False) -> Manifest: ...

    def sdist_for(self, version: str) -> Manifest | None: ...

    def drop_manifest(self, artifact: str) -> None: ...


class Members:
    """A source's members: cached blobs, those checked this run (in memory), range fetches."""

    def __init__(
        self,
        cache: Cache,
        *,
        offline: bool,
        manifests: Manifests,
        net: Callable[[], dict[str, Any]],
    ) -> None:
        self.cache = cache
        self.offline = offline
        self.manifests = manifests
        self.net = net  # the keyword arguments of each request (timeout, retries, transport)
        self.meter: Meter | None = None  # set while a prefetch reports progress
        self._memory: dict[str, bytes] = {}  # sha256 -> member bytes checked this run
        self._size = 0
        self._lock = threading.Lock()

    def keep(self, sha256: str, data: bytes, deflated: bytes | None = None) -> None:
        """A member just checked: into the cache (raw deflate) and the run's memory."""
        self.cache.store_blob(sha256, deflated if deflated is not None else _deflate(data))
        self.remember(sha256, data)

    def has(self, sha256: str) -> bool:
        return self.recall(sha256) is not None or self.cache.has_blob(sha256)

    def remember(self, sha256: str, data: bytes) -> None:
        """Keep a member read and checked this run in memory (up to MEMORY bytes in all): the
        check reads it next, without reading, inflating and hashing its cache file again."""
        with self._lock:
            if sha256 not in self._memory and self._size + len(data) <= MEMORY:
                self._memory[sha256] = data
                self._size += len(data)

    def recall(self, sha256: str) -> bytes | None:
        """A member checked this run (see `remember`), or None."""
        return self._memory.get(sha256)

    def recall_or_read(self, sha256: str) -> bytes | None:
        """A member checked this run, else from the cache (checked against `sha256` there)
        and kept for the run: consecutive releases share most files, read once a run."""
        data = self.recall(sha256)
        if data is None:
            data = self.cache.read_blob(sha256)
            if data is not None:
                self.remember(sha256, data)
        return data

    def fetch(self, manifest: Manifest, paths: list[str]) -> dict[str, wheel.Member]:
        """Members of a wheel through range requests, each checked against RECORD and CRC."""
        if self.offline:
            raise SourceError(
                f"offline, and {paths[0]} of {manifest.artifact} is not in the cache at"
                f" {self.cache.root}; run without --offline to fetch it"
            )
        entries = {}
        record = {}
        for p in paths:
            sha, size, offset, compressed, crc, method = manifest.members[p]
            entries[p] = wheel.Entry(p, offset, compressed, size, crc, method)
            record[p] = sha
        directory = wheel.Directory(manifest.size, manifest.end, entries, record)
        url = manifest.url

        meter = self.meter

        def fetch(start: int, end: int) -> bytes:
            data = net.fetch_range(url, start, end, **self.net())[0]
            if meter is not None:
                meter.add(manifest.version, received=len(data))
            return data

        def fetch_all(ranges: list[tuple[int, int]]) -> list[bytes]:
            if meter is not None:
                meter.add(manifest.version, expected=sum(b - a + 1 for a, b in ranges))
            return in_parallel(lambda r: fetch(r[0], r[1]), ranges, workers=4)

        LOG.info("reading %d member(s) of %s", len(paths), manifest.artifact)
        got = wheel.fetch_members(directory, paths, fetch, manifest.artifact, fetch_all=fetch_all)
        missing = [p for p in paths if p not in got]
        if missing:  # pragma: no cover -- fetch_members returns every entry or raises
            raise SourceError(f"{manifest.artifact}: {missing[0]} could not be read")
        return got


class Meter:
    """Bytes asked of the index and received, per release, for a progress bar: reported as
    ``report(version, received, expected)``; `expected` grows as the work becomes known (the
    central directory names the members to read), and equals `received` when it is done
    (0 of 0 for a release nothing was fetched for: the cache had it)."""

    def __init__(self, report: DownloadProgress) -> None:
        self._report = report
        self._lock = threading.Lock()
        self._counts: dict[str, list[int]] = {}

    def add(self, version: str, *, expected: int = 0, received: int = 0) -> None:
        with self._lock:
            counts = self._counts.setdefault(version, [0, 0])
            counts[0] += received
            counts[1] = max(counts[1] + expected, counts[0])
            done, total = counts
        self._report(version, done, total)

    def finish(self, version: str) -> None:
        with self._lock:
            counts = self._counts.setdefault(version, [0, 0])
            counts[0] = counts[1] = max(counts[0], counts[1])  # nothing fetched: 0 of 0
            done, total = counts
        self._report(version, done, total)


def each_done(
    fn: Callable[[_T], _R], items: list[_T], *, workers: int
) -> Iterator[tuple[_T, _R | None, BaseException | None]]:
    """`fn` over `items` in daemon threads (Ctrl-C does not wait for them): each item with its
    result, or with what it raised, as it is done (one item is run here, without a thread)."""
    if len(items) <= 1:
        for item in items:
            try:
                value = fn(item)
            except BaseException as exc:  # as a thread's failure is handed over
                yield item, None, exc
            else:
                yield item, value, None
        return
    jobs: queue.Queue[_T] = queue.Queue()
    for item in items:
        jobs.put(item)
    results: queue.Queue[tuple[_T, _R | None, BaseException | None]] = queue.Queue()

    def work() -> None:
        while True:
            try:
                item = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((item, fn(item), None))
            except BaseException as exc:  # handed to the caller's thread
                results.put((item, None, exc))

    threads = [threading.Thread(target=work, daemon=True) for _ in range(min(workers, len(items)))]
    for thread in threads:
        thread.start()
    for _ in items:
        yield results.get()
    for thread in threads:  # none left running once all is handed over (a fork may follow)
        thread.join()


def in_parallel(fn: Callable[[_T], _R], items: list[_T], *, workers: int) -> list[_R]:
    """`fn` over `items` in daemon threads, results in order; the first failure is raised
    once all are done."""
    out: dict[int, _R] = {}
    failure: BaseException | None = None
    for i, value, exc in each_done(
        lambda i: fn(items[i]), list(range(len(items))), workers=workers
    ):
        if exc is not None:
            failure = failure or exc
        else:
            out[i] = value  # type: ignore[assignment]
    if failure is not None:
        raise failure
    return [out[i] for i in range(len(items))]


def _deflate(data: bytes) -> bytes:
    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()
