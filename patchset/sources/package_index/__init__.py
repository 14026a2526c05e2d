"""Releases from the package index, read from their wheels and only as far as needed.

A release is its wheel (one for this machine's architecture when there is one) read
lazily: the central directory once, then each member asked for, through HTTP range
requests, each checked against the wheel's RECORD and its zip CRC before it is used or
cached (see `wheel`). The sdist is the fallback: when the release has no wheel, when the
server does not serve ranges, and per file for paths outside ``vllm/`` that a wheel cannot
hold. ``artifact="sdist"`` or ``"wheel"`` forces one; ``verify_full=True`` downloads the
whole artifact and checks the index's sha256 first. Whole artifacts are deleted once read.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path, PurePosixPath
from typing import Any, Literal, TypeVar

from packaging.version import InvalidVersion, Version

from patchset._gc import collector_paused
from patchset.adapters import net
from patchset.errors import SourceError
from patchset.sources.base import DownloadProgress, ReleaseInfo, ReleaseSource, ReleaseTree
from patchset.sources.package_index import wheel
from patchset.sources.package_index.cache import Cache, Manifest
from patchset.sources.package_index.client import MAX_AGE, IndexFile, PackageIndex, pick_wheel
from patchset.sources.package_index.sdist import sdist_manifest
from patchset.sources.package_index.settings import IndexSettings

LOG = logging.getLogger(__name__)

Artifact = Literal["auto", "wheel", "sdist"]
ARTIFACTS: tuple[Artifact, ...] = ("auto", "wheel", "sdist")

_T = TypeVar("_T")
_R = TypeVar("_R")

READAHEAD = 1 << 20  # bytes of a folder's other members fetched with one asked for
FULL_KEEP = 1 << 20  # with verify_full, wheel members up to this size are kept
MEMORY = 256 << 20  # bytes of members checked this run kept in memory for the check


class IndexTree(ReleaseTree):
    """One release's files from its manifest; members fetched (and cached) when read.

    `info` is renewed after every read: it lists what was checked so far."""

    def __init__(self, source: IndexSource, manifest: Manifest, fallback: str | None) -> None:
        self._source = source
        self.manifest = manifest
        self.fallback = fallback
        self._near: dict[str, bytes] = {}  # read ahead, checked, not yet asked for
        self._checked: dict[str, str] = {}  # path -> sha256 of what was read
        self._sdist: IndexTree | None = None
        self._lock = threading.Lock()
        self.info = self._info()

    def _info(self) -> ReleaseInfo:
        m = self.manifest
        origin = f"index {m.kind} {m.artifact} sha256:{m.sha256[:12]}"
        if self.fallback:
            origin += f" (fallback: {self.fallback})"
        checked = dict(self._checked)
        if self._sdist is not None:
            checked.update(self._sdist._checked)
        how = "sha256 of the whole artifact" if m.verified == "full" else "RECORD sha256 + CRC"
        details = {
            "kind": m.kind,
            "filename": m.artifact,
            "sha256": m.sha256,
            "verified": m.verified,
            "members_checked_by": how,
            "checked": [{"path": p, "sha256": s} for p, s in sorted(checked.items())],
            "fallback": self.fallback,
        }
        return ReleaseInfo(version=m.version, origin=origin, digest=m.sha256, details=details)

    def paths(self) -> Iterator[str]:
        return iter(sorted(p for p in self.manifest.members if p.startswith("vllm/")))

    def read(self, relpath: str) -> bytes | None:
        entry = self.manifest.members.get(relpath)
        if entry is None:
            return self._outside_wheel(relpath)
        with self._lock:
            data = self._near.pop(relpath, None)
        if data is not None:
            self._source.cache.store_blob(entry[0], _deflate(data))
            self._source.remember(entry[0], data)
        else:
            data = self._source.recall_or_read(entry[0])
        if data is None:
            data = self.fetch([relpath], readahead=True)[relpath]
        self._checked[relpath] = entry[0]
        self.info = self._info()
        return data

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes | None]:
        """Several files at once: what is not cached comes in one round of range requests."""
        wanted = list(dict.fromkeys(relpaths))
        inside = [p for p in wanted if p in self.manifest.members]
        with self._lock:
            cold = [p for p in inside if p not in self._near]
        self.fetch(cold, keep=False)  # `read` then takes each from memory or the cache, once
        return {p: self.read(p) for p in wanted}

    def fetch(
        self, paths: Iterable[str], *, readahead: bool = False, keep: bool = True
    ) -> dict[str, bytes]:
        """Make sure `paths` (those in the release) are cached; their bytes, checked (with
        ``keep=False`` only those fetched now: the others are not read back)."""
        m = self.manifest
        wanted = [p for p in dict.fromkeys(paths) if p in m.members]
        missing = [
            p
            for p in wanted
            if self._source.recall(m.members[p][0]) is None
            and not self._source.cache.has_blob(m.members[p][0])
        ]
        out: dict[str, bytes] = {}
        if missing and m.kind == "sdist":
            self.manifest = self._source.rebuild(self.manifest)  # a blob was pruned or damaged
            return {p: d for p in wanted if (d := self.read(p)) is not None}
        if missing:
            extra = self._neighbours(missing) if readahead else []
            try:
                got = self._source.fetch_wheel_members(m, [*missing, *extra])
            except wheel.DamagedWheel:
                self._source.drop_manifest(m.artifact)  # read it all again next time
                raise
            for path in missing:
                self._source.cache.store_blob(got[path].sha256, got[path].deflated)
                self._source.remember(got[path].sha256, got[path].data)
                out[path] = got[path].data
            with self._lock:
                self._near.update({p: got[p].data for p in extra if p in got})
        for path in wanted if keep else ():
            sha = m.members[path][0]
            if path not in out and (
                data := self._source.recall(sha) or self._source.cache.read_blob(sha)
            ):
                out[path] = data
        return out

    def stand_ins(self, missing: list[str]) -> list[str]:
        """For paths the release lacks, the Python files a moved-file search reads next (fetched
        ahead, in parallel): those of the same name, else those in a folder of the same name."""
        found: list[str] = []
        # (folder name, file name) of each Python member; string splits, not pathlib: a
        # wheel has thousands of members
        members = [
            (p, p.rpartition("/")[0].rpartition("/")[2], p.rpartition("/")[2])
            for p in self.manifest.members
            if p.endswith(".py")
        ]
        for path in missing:
            pure = PurePosixPath(path)
            if pure.suffix != ".py":
                continue
            same = [p for p, _, name in members if name == pure.name]
            if not same:
                same = [p for p, folder, _ in members if folder == pure.parent.name]
            found += same
        return found

    def _neighbours(self, paths: list[str]) -> list[str]:
        """Small members in the same folders (a moved-file search reads them next)."""
        folders = {str(PurePosixPath(p).parent) for p in paths}
        budget = READAHEAD
        found = []
        for name, entry in sorted(self.manifest.members.items()):
            if str(PurePosixPath(name).parent) in folders and name not in paths:
                if name in self._near or self._source.cache.has_blob(entry[0]):
                    continue
                budget -= entry[1]
                if budget < 0:
                    break
                found.append(name)
        return found

    def listed_digest(self, relpath: str) -> str | None:
        """The sha256 the manifest lists for `relpath` (the one its bytes are checked against
        when read), "-" for a file the release lacks; None for one outside the wheel."""
        entry = self.manifest.members.get(relpath)
        if entry is not None:
            return str(entry[0])
        if self.manifest.kind != "wheel" or relpath.startswith("vllm/"):
            return "-"
        return None  # a wheel cannot hold it: the sdist's list would say

    def listed_size(self, relpath: str) -> int | None:
        """The size the manifest lists for `relpath` (None for a file it does not hold)."""
        entry = self.manifest.members.get(relpath)
        return int(entry[1]) if entry is not None else None

    def read_listed(self, relpath: str, digest: str) -> bytes | None:
        """`relpath` whose sha256 a memo of this release's list gives: from the cache by that
        digest (checked against it), without decoding the list; else as `read`."""
        if self.manifest.kind != "wheel" or not relpath.startswith("vllm/"):
            return self.read(relpath)  # from the sdist, or not in a wheel: said in `info`
        data = self._source.recall_or_read(digest)
        if data is None:
            return self.read(relpath)
        self._checked[relpath] = digest
        self.info = self._info()
        return data

    def _outside_wheel(self, relpath: str) -> bytes | None:
        """A path a wheel cannot hold (csrc/, setup.py...) is read from the sdist."""
        if self.manifest.kind != "wheel" or relpath.startswith("vllm/"):
            return None
        if self._sdist is None:
            manifest = self._source.sdist_for(self.manifest.version)
            if manifest is None:
                return None
            self._sdist = IndexTree(self._source, manifest, None)
            note = f"sdist {manifest.artifact} for files outside vllm/"
            self.fallback = f"{self.fallback}; {note}" if self.fallback else note
        data = self._sdist.read(relpath)
        self.info = self._info()
        return data


class _Meter:
    """Bytes asked of the index and received, per release, for a progress bar: reported as
    ``report(version, received, expected)``; `expected` grows as the work becomes known (the
    central directory names the members to read), and equals `received` when it is done."""

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
            counts[0] = counts[1] = max(counts[0], counts[1], 1)
            done, total = counts
        self._report(version, done, total)


class IndexSource(ReleaseSource):
    """vLLM releases from the package index, cached and verified; the default source."""

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
        timeout: float = net.DEFAULT_TIMEOUT,
        retries: int = 3,
        artifact: Artifact = "auto",
        verify_full: bool = False,
        settings: IndexSettings | None = None,
    ) -> None:
        if artifact not in ARTIFACTS:
            raise SourceError(f"artifact {artifact!r} is not one of {', '.join(ARTIFACTS)}")
        self.cache = cache or Cache.default()
        self.index = PackageIndex(
            index_url,
            offline=offline,
            cache=self.cache,
            max_age=max_age,
            timeout=timeout,
            retries=retries,
            settings=settings,
        )
        self.offline = offline
        self.progress = progress  # (version, bytes, total) while a whole artifact downloads
        self.prereleases = prereleases
        self.timeout = timeout
        self.retries = retries
        self.artifact = artifact
        self.verify_full = verify_full
        self._known: dict[str, Manifest] = {}  # artifact -> manifest built or read this run
        self._members: dict[str, bytes] = {}  # sha256 -> member bytes checked this run
        self._members_size = 0
        self._members_lock = threading.Lock()
        self._parsing = threading.Lock()
        self._meter: _Meter | None = None  # set while `prefetch` reports progress

    def versions(self) -> list[str]:
        """The index's releases; offline, the releases in the cache."""
        if self.offline:
            return sorted(set(self.cache.cached_tree_versions()), key=_sort_key)
        return self.index.list_versions(prereleases=self.prereleases)

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[IndexTree]:
        manifest, fallback = self._manifest(version)
        yield IndexTree(self, manifest, fallback)

    def fetch(self, version: str, paths: Iterable[str] = ()) -> IndexTree:
        """The release's manifest cached, and `paths` (those it has) with it."""
        manifest, fallback = self._manifest(version)
        tree = IndexTree(self, manifest, fallback)
        wanted = list(paths)
        more = tree.stand_ins([p for p in wanted if p not in manifest.members])
        tree.fetch([*wanted, *more], keep=False)
        return tree

    def cached_versions(self) -> list[str]:
        """The releases with a manifest in the cache, oldest first."""
        return sorted(set(self.cache.cached_tree_versions()), key=_sort_key)

    def prefetch(
        self,
        versions: Iterable[str],
        *,
        progress: DownloadProgress | None = None,
        paths: Iterable[str] = (),
        workers: int = 32,
    ) -> dict[str, Path]:
        """Fetch several releases (their manifests, and `paths` of each) in parallel;
        `progress(version, received, expected)` in bytes as requests are answered, with
        ``received == expected`` once a release is ready. Returns each release's manifest file.

        Every release is tried; then a SourceError names all that failed. The workers are
        daemon threads: Ctrl-C ends the run at once, without waiting for them.
        """
        wanted = list(dict.fromkeys(versions))
        files = list(paths)
        if not wanted:
            return {}
        if not self.offline:
            self.index.files()  # once, before the threads want it
        jobs: queue.Queue[str] = queue.Queue()
        for v in wanted:
            jobs.put(v)
        results: queue.Queue[tuple[str, Exception | None]] = queue.Queue()
        kept: dict[str, Path] = {}
        meter = self._meter = _Meter(progress) if progress is not None else None

        def work() -> None:
            while True:
                try:
                    version = jobs.get_nowait()
                except queue.Empty:
                    return
                try:
                    artifact = self.fetch(version, files).manifest.artifact
                    kept[version] = self.cache.manifest_path(artifact)
                    results.put((version, None))
                except Exception as exc:  # handed to the main thread as is
                    results.put((version, exc))

        failed: list[str] = []
        with collector_paused():
            for _ in range(max(1, min(workers, len(wanted)))):
                threading.Thread(target=work, daemon=True).start()
            for _ in wanted:
                version, exc = results.get()
                if meter is not None:
                    meter.finish(version)
                if isinstance(exc, SourceError):
                    failed.append(f"{version}: {exc}")
                elif exc is not None:
                    raise exc
        self._meter = None
        if failed:
            raise SourceError(
                f"{len(failed)} of {len(wanted)} releases failed: " + "; ".join(sorted(failed))
            )
        return {v: kept[v] for v in wanted}

    # -- choosing and building manifests --------------------------------------------------

    def _manifest(self, version: str) -> tuple[Manifest, str | None]:
        if self.offline:
            return self._cached_manifest(version)
        release = self.index.release(version)
        fallback = None
        if self.artifact == "sdist" or release.wheel is None:
            if release.sdist is None:
                lacking = "sdist" if release.wheel else "wheel and no sdist"
                raise SourceError(
                    f"vllm {release.version} has no {lacking} on the index at {self.index.where()}"
                )
            if self.artifact != "sdist":
                fallback = "the index has no wheel"
            return self._build(release.sdist), fallback
        if self.artifact == "wheel" and release.wheel is None:
            raise SourceError(f"vllm {release.version} has no wheel on the index")
        try:
            return self._build(release.wheel), None
        except net.RangeError as exc:
            if self.artifact == "wheel" or release.sdist is None:
                LOG.info("%s; downloading the whole wheel", exc)
                return self._build(release.wheel, full=True), f"whole wheel: {exc}"
            LOG.info("%s; reading the sdist instead", exc)
            return self._build(release.sdist), f"sdist: {exc}"

    def _cached_manifest(self, version: str) -> tuple[Manifest, str | None]:
        """Offline: the release's manifest in the cache (the wheel unless sdist is asked for)."""
        name = _canonical(version)
        wheels = [] if self.artifact == "sdist" else self._cached_wheels(name)
        sdist = [] if self.artifact == "wheel" else [f"vllm-{name}.tar.gz"]
        for artifact in [*wheels, *sdist]:
            manifest = self._known.get(artifact) or self.cache.load_manifest(artifact)
            if manifest is not None and (not self.verify_full or manifest.verified == "full"):
                self._known[artifact] = manifest  # read once a run, not once per look
                return manifest, None
        raise SourceError(
            f"offline, and vllm {version} is not in the cache at {self.cache.root};"
            " run without --offline to fetch it"
        )

    def _cached_wheels(self, name: str) -> list[str]:
        folder = self.cache.root / "manifests"
        names = [p.name[: -len(".json")] for p in folder.glob(f"vllm-{name}-*.whl.json")]
        files = [IndexFile(name, n, "", "", 0, "wheel") for n in names]
        best = pick_wheel(files)
        return sorted(names, key=lambda n: best is None or n != best.filename)

    def sdist_for(self, version: str) -> Manifest | None:
        """The release's sdist manifest (built if need be), or None when it has none."""
        if self.offline:
            return self.cache.load_manifest(f"vllm-{_canonical(version)}.tar.gz")
        sdist = self.index.release(version).sdist
        return None if sdist is None else self._build(sdist)

    def rebuild(self, manifest: Manifest) -> Manifest:
        """Build the manifest again from its artifact (a member it names went missing)."""
        if self.offline:
            raise SourceError(
                f"offline, and files of {manifest.artifact} are missing from the cache at"
                f" {self.cache.root}; run without --offline to fetch them again"
            )
        release = self.index.release(manifest.version)
        for file in (release.wheel, release.sdist):
            if file is not None and file.filename == manifest.artifact:
                self.drop_manifest(file.filename)
                return self._build(file, full=manifest.verified == "full")
        raise SourceError(f"{manifest.artifact} is no longer on the index at {self.index.where()}")

    def _build(self, file: IndexFile, *, full: bool = False) -> Manifest:
        full = full or self.verify_full or file.kind == "sdist"
        cached = self._usable(file, full)
        if cached is not None:
            return cached
        with self.cache.lock(f"artifact-{file.filename}"):
            cached = self._usable(file, full)  # another process may have built it
            if cached is not None:
                return cached
            manifest = self._from_download(file) if full else self._wheel_manifest(file)
            self.cache.store_manifest(manifest)
            self._known[file.filename] = manifest
            return manifest

    def remember(self, sha256: str, data: bytes) -> None:
        """Keep a member read and checked this run in memory (up to MEMORY bytes in all): the
        check reads it next, without reading, inflating and hashing its cache file again."""
        with self._members_lock:
            if sha256 not in self._members and self._members_size + len(data) <= MEMORY:
                self._members[sha256] = data
                self._members_size += len(data)

    def recall(self, sha256: str) -> bytes | None:
        """A member checked this run (see `remember`), or None."""
        return self._members.get(sha256)

    def recall_or_read(self, sha256: str) -> bytes | None:
        """A member checked this run, else from the cache (checked against `sha256` there)
        and kept for the run: consecutive releases share most files, read once a run."""
        data = self.recall(sha256)
        if data is None:
            data = self.cache.read_blob(sha256)
            if data is not None:
                self.remember(sha256, data)
        return data

    def drop_manifest(self, artifact: str) -> None:
        """Forget the artifact's manifest, here and in the cache: it is built again."""
        self._known.pop(artifact, None)
        self.cache.drop_manifest(artifact)

    def _usable(self, file: IndexFile, full: bool) -> Manifest | None:
        manifest = self._known.get(file.filename) or self.cache.load_manifest(file.filename)
        if manifest is None:
            return None
        self._known[file.filename] = manifest  # read once a run, not once per look
        if manifest.sha256 != file.sha256:
            LOG.info("%s: the index now gives another sha256; reading it again", file.filename)
            return None
        if full and manifest.verified != "full":
            return None
        return manifest

    def _wheel_manifest(self, file: IndexFile) -> Manifest:
        url = file.url

        def tail(n: int) -> tuple[bytes, int]:
            return net.fetch_range(url, n, None, **self._net())

        def fetch(start: int, end: int) -> bytes:
            return net.fetch_range(url, start, end, **self._net())[0]

        LOG.info("reading the central directory of %s", file.filename)
        meter = self._meter
        if meter is not None:
            meter.add(file.version, expected=wheel.TAIL)
        got = tail(wheel.TAIL)
        if meter is not None:
            meter.add(file.version, expected=len(got[0]) - wheel.TAIL, received=len(got[0]))
        # One release's directory parsed at a time (it is pure Python: threads only share the
        # interpreter): the first one read is done first and its members are asked for while
        # the next is parsed, instead of every release finishing its parse last together.
        with self._parsing:
            directory = wheel.read_directory(lambda n: got, fetch, file.filename)
            return _wheel_to_manifest(file, directory, "members")

    def fetch_wheel_members(self, manifest: Manifest, paths: list[str]) -> dict[str, wheel.Member]:
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

        meter = self._meter

        def fetch(start: int, end: int) -> bytes:
            data = net.fetch_range(url, start, end, **self._net())[0]
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

    def _from_download(self, file: IndexFile) -> Manifest:
        """Download the whole artifact, check the index's sha256, read it, delete it."""
        dest = self.cache.downloads / f"{threading.get_ident()}-{file.filename}"

        meter = self._meter
        counted = [0, 0]  # bytes received and expected so far, as told to the meter

        def report(done: int, total: int) -> None:
            if self.progress is not None:
                self.progress(file.version, done, total or file.size)
            if meter is not None:
                expected = total or file.size
                meter.add(file.version, expected=expected - counted[1], received=done - counted[0])
                counted[:] = [done, expected]

        LOG.info("downloading %s", net.redact(file.url))
        try:
            net.download(file.url, dest, sha256=file.sha256, progress=report, **self._net())
        except SourceError:
            if isinstance(self.index, PackageIndex):
                self.index.forget()  # the answer may be stale: ask again next time
            raise
        try:
            if file.kind == "sdist":
                members = sdist_manifest(dest, self.cache)
                return _manifest(file, "full", members)
            url = dest.resolve().as_uri()

            def tail(n: int) -> tuple[bytes, int]:
                return net.fetch_range(url, n, None)

            def fetch(start: int, end: int) -> bytes:
                return net.fetch_range(url, start, end)[0]

            directory = wheel.read_directory(tail, fetch, file.filename)
            keep = [
                n
                for n, e in directory.entries.items()
                if n.startswith("vllm/") and e.size <= FULL_KEEP
            ]
            for member in wheel.fetch_members(directory, keep, fetch, file.filename).values():
                self.cache.store_blob(member.sha256, member.deflated)
            return _wheel_to_manifest(file, directory, "full")
        finally:
            dest.unlink(missing_ok=True)

    def _net(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "retries": self.retries,
            "transport": self.index.transport,
        }


def in_parallel(fn: Callable[[_T], _R], items: list[_T], *, workers: int) -> list[_R]:
    """`fn` over `items` in daemon threads (Ctrl-C does not wait for them), results in order;
    the first failure is raised once all are done."""
    if len(items) <= 1:
        return [fn(item) for item in items]
    jobs: queue.Queue[int] = queue.Queue()
    for i in range(len(items)):
        jobs.put(i)
    results: queue.Queue[tuple[int, _R | None, BaseException | None]] = queue.Queue()

    def work() -> None:
        while True:
            try:
                i = jobs.get_nowait()
            except queue.Empty:
                return
            try:
                results.put((i, fn(items[i]), None))
            except BaseException as exc:  # handed to the caller's thread
                results.put((i, None, exc))

    for _ in range(min(workers, len(items))):
        threading.Thread(target=work, daemon=True).start()
    out: dict[int, _R] = {}
    failure: BaseException | None = None
    for _ in items:
        i, value, exc = results.get()
        if exc is not None:
            failure = failure or exc
        else:
            out[i] = value  # type: ignore[assignment]
    if failure is not None:
        raise failure
    return [out[i] for i in range(len(items))]


def _wheel_to_manifest(file: IndexFile, directory: wheel.Directory, verified: str) -> Manifest:
    members = {
        name: [directory.record.get(name, ""), e.size, e.offset, e.compressed, e.crc, e.method]
        for name, e in directory.entries.items()
        if name in directory.record  # RECORD (and signatures) have no hash: never read
    }
    return Manifest(
        version=file.version,
        artifact=file.filename,
        kind="wheel",
        sha256=file.sha256,
        verified=verified,  # type: ignore[arg-type]
        url=net.redact(file.url),
        members=members,
        size=directory.size,
        end=directory.end,
    )


def _manifest(file: IndexFile, verified: str, members: dict[str, list[Any]]) -> Manifest:
    return Manifest(
        version=file.version,
        artifact=file.filename,
        kind=file.kind,
        sha256=file.sha256,
        verified=verified,  # type: ignore[arg-type]
        url=net.redact(file.url),
        members=members,
        size=file.size,
    )


def _deflate(data: bytes) -> bytes:
    import zlib  # noqa: PLC0415

    compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
    return compressor.compress(data) + compressor.flush()


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


__all__ = ["ARTIFACTS", "Artifact", "IndexSource", "IndexTree", "Path"]
