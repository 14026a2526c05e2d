"""The package index as a release source: which artifact a release is read from, its manifest
(built from the wheel's central directory and RECORD, or a whole download), and prefetching
several releases in parallel. Trees (`tree`) read members through `members`."""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version

from patchset.adapters import net
from patchset.errors import SourceError
from patchset.registry import ranges
from patchset.sources.base import DownloadProgress, ReleaseSource
from patchset.sources.package_index import wheel
from patchset.sources.package_index.cache import Cache
from patchset.sources.package_index.client import MAX_AGE, IndexFile, PackageIndex, pick_wheel
from patchset.sources.package_index.members import Members, Meter, each_done
from patchset.sources.package_index.packing import Manifest, member_sha256
from patchset.sources.package_index.settings import IndexSettings
from patchset.sources.package_index.tree import IndexTree

LOG = logging.getLogger(__name__)

Artifact = Literal["auto", "wheel", "sdist"]
ARTIFACTS: tuple[Artifact, ...] = ("auto", "wheel", "sdist")

FULL_KEEP = 1 << 20  # with verify_full, wheel members up to this size are kept


class IndexSource(ReleaseSource):
    """vLLM releases from the package index, cached and verified; the default source."""

    name = "index"
    fork_safe = True  # its cache files; its connections are reset in a child
    named_on_trust = True  # its list leaves out pre-releases unless asked; offline, the cache

    def default_versions(self) -> list[str]:
        """None: from the index, releases are named (``--vllm``, ``--since``)."""
        return []

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
        self._chosen: dict[str, Manifest] = {}  # offline: version -> the manifest it opens
        self.members = Members(self.cache, offline=offline, manifests=self, net=self._net)
        self._parsing = threading.Lock()

    def versions(self) -> list[str]:
        """The index's releases; offline, the releases in the cache."""
        if self.offline:
            return sorted(set(self.cache.cached_tree_versions()), key=ranges.version_key)
        return self.index.list_versions(prereleases=self.prereleases)

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[IndexTree]:
        manifest, fallback = self._manifest(version)
        yield IndexTree(self.members, manifest, fallback)

    def fetch(self, version: str, paths: Iterable[str] = ()) -> IndexTree:
        """The release's manifest cached, and `paths` (those it has) with it."""
        manifest, fallback = self._manifest(version)
        tree = IndexTree(self.members, manifest, fallback)
        wanted = list(paths)
        listed = tree.listed()
        more = tree.stand_ins([p for p in wanted if p not in listed])
        tree.fetch([*wanted, *more], keep=False)
        return tree

    def cached_versions(self) -> list[str]:
        """The releases with a manifest in the cache, oldest first."""
        return sorted(set(self.cache.cached_tree_versions()), key=ranges.version_key)

    def settle(self) -> None:
        self.index.settle()

    def prefetch(
        self,
        versions: Iterable[str],
        *,
        paths: Sequence[str] | None = None,
        progress: DownloadProgress | None = None,
        also: Sequence[str] | None = None,
        workers: int = 32,
    ) -> dict[str, Path]:
        """Fetch several releases (their manifests, `paths` and `also` of each) in parallel;
        `progress(version, received, expected)` in bytes as requests are answered, with
        ``received == expected`` once a release is ready. Returns each release's manifest file.

        First every release's manifest, then the members (`_to_fetch`): each sha256 once, from
        the first release holding it (consecutive releases share most files), none the cache
        has. Every release is tried; then a SourceError names all that failed. The workers are
        daemon threads: Ctrl-C ends the run at once, without waiting for them.
        """
        wanted = list(dict.fromkeys(versions))
        files = list(paths or ())
        if not wanted:
            return {}
        if not self.offline:
            self.index.files()  # once, before the threads want it
        meter = self.members.meter = Meter(progress) if progress is not None else None
        failed: dict[str, BaseException] = {}
        trees: dict[str, IndexTree] = {}

        def build(version: str) -> None:
            manifest, fallback = self._manifest(version)
            trees[version] = IndexTree(self.members, manifest, fallback)

        def fetch(version: str) -> None:
            trees[version].fetch(todo[version], keep=False)

        try:
            failed.update(_failures(each_done(build, wanted, workers=max(1, workers))))
            ordered = sorted(trees, key=ranges.version_key)
            todo = _to_fetch(
                [(v, trees[v]) for v in ordered], files, self.members.has, also=also or ()
            )
            failed.update(_failures(each_done(fetch, ordered, workers=max(1, workers))))
        finally:
            if meter is not None:
                for version in wanted:
                    meter.finish(version)
            self.members.meter = None
        for exc in failed.values():
            if not isinstance(exc, SourceError):
                raise exc
        if failed:
            raise SourceError(
                f"{len(failed)} of {len(wanted)} releases failed: "
                + "; ".join(sorted(f"{v}: {exc}" for v, exc in failed.items()))
            )
        return {v: self.cache.manifest_path(trees[v].manifest.artifact) for v in wanted}

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
        """Offline: the release's manifest in the cache (the wheel unless sdist is asked for);
        chosen once a run (a check opens a release again to read a vanished file there)."""
        chosen = self._chosen.get(version)
        if chosen is not None and self._known.get(chosen.artifact) is chosen:
            return chosen, None
        name = _canonical(version)
        wheels = [] if self.artifact == "sdist" else self._cached_wheels(name)
        sdist = [] if self.artifact == "wheel" else [f"vllm-{name}.tar.gz"]
        for artifact in [*wheels, *sdist]:
            manifest = self._known.get(artifact) or self.cache.load_manifest(artifact, later=True)
            if manifest is not None and (not self.verify_full or manifest.verified == "full"):
                self._known[artifact] = manifest  # read once a run, not once per look
                self._chosen[version] = manifest
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

    def rebuild(self, manifest: Manifest, *, damaged: bool = False) -> Manifest:
        """Build the manifest again from its artifact (a member it names went missing, or,
        `damaged`, its cached file list does not match its digest: removed first)."""
        if damaged:
            self.drop_manifest(manifest.artifact)
        if self.offline:
            if damaged:
                raise SourceError(
                    f"offline, and vllm {manifest.version} is not in the cache at"
                    f" {self.cache.root} (its file list there was damaged); run without"
                    " --offline to fetch it"
                )
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
            manifest = self.cache.store_manifest(manifest)
            self._known[file.filename] = manifest
            return manifest

    def drop_manifest(self, artifact: str) -> None:
        """Forget the artifact's manifest, here and in the cache: it is built again."""
        self._known.pop(artifact, None)
        self.cache.drop_manifest(artifact)

    def _usable(self, file: IndexFile, full: bool) -> Manifest | None:
        manifest = self._known.get(file.filename) or self.cache.load_manifest(
            file.filename, later=True
        )
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
        meter = self.members.meter
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

    def _from_download(self, file: IndexFile) -> Manifest:
        """Download the whole artifact into a file of no name in the cache's downloads folder
        (gone when closed, even by a kill; a `cache clear` meanwhile cannot take it away),
        check the index's sha256, read it."""
        meter = self.members.meter
        counted = [0, 0]  # bytes received and expected so far, as told to the meter

        def report(done: int, total: int) -> None:
            if self.progress is not None:
                self.progress(file.version, done, total or file.size)
            if meter is not None:
                expected = total or file.size
                meter.add(file.version, expected=expected - counted[1], received=done - counted[0])
                counted[:] = [done, expected]

        LOG.info("downloading %s", net.redact(file.url))
        with self.cache.scratch_file() as out:
            try:
                net.download(file.url, out, sha256=file.sha256, progress=report, **self._net())
            except SourceError:
                if isinstance(self.index, PackageIndex):
                    self.index.forget()  # the answer may be stale: ask again next time
                raise
            if file.kind == "sdist":
                # sdists only: tarfile is not imported by a check of wheels
                from patchset.sources.package_index.sdist import sdist_manifest  # noqa: PLC0415

                out.seek(0)
                members = sdist_manifest(out, file.filename, self.cache)
                return _manifest(file, "full", members)

            def tail(n: int) -> tuple[bytes, int]:
                return net.read_range(out, n, None)

            def fetch(start: int, end: int) -> bytes:
                return net.read_range(out, start, end)[0]

            directory = wheel.read_directory(tail, fetch, file.filename)
            keep = [
                n
                for n, e in directory.entries.items()
                if n.startswith("vllm/") and e.size <= FULL_KEEP
            ]
            for member in wheel.fetch_members(directory, keep, fetch, file.filename).values():
                self.cache.store_blob(member.sha256, member.deflated)
            return _wheel_to_manifest(file, directory, "full")

    def _net(self) -> dict[str, Any]:
        return {
            "timeout": self.timeout,
            "retries": self.retries,
            "transport": self.index.transport,
        }


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


def _canonical(version: str) -> str:
    """The version as the index's file names spell it (``0.20`` is ``vllm-0.20``...)."""
    return str(Version(version)) if ranges.is_version(version) else version


def _to_fetch(
    trees: list[tuple[str, IndexTree]],
    paths: list[str],
    cached: Callable[[str], bool],
    *,
    also: Sequence[str] = (),
) -> dict[str, list[str]]:
    """What each release of a prefetch (oldest first) fetches: `paths`, and for a path it
    lacks the files a moved-file search would read (`IndexTree.stand_ins`), unless the path
    is only in later releases (not written yet: nothing to look for); `also` where it has
    them (no search: a python patch's modules, looked up, never searched for); a member
    whose sha256 an older release fetches, or the cache holds, is left to them. An sdist's
    tree is given all (its files come with its manifest)."""
    listed = [tree.listed() for _, tree in trees]
    first = {p: next((i for i, members in enumerate(listed) if p in members), None) for p in paths}
    claimed: set[str] = set()
    out: dict[str, list[str]] = {}
    for i, (version, tree) in enumerate(trees):
        members = listed[i]
        lacking = [p for p in paths if p not in members]
        vanished = [p for p in lacking if (at := first[p]) is None or at < i]
        wanted = [*paths, *also, *tree.stand_ins(vanished)]
        if tree.manifest.kind != "wheel":
            out[version] = wanted
            continue
        mine = []
        for p in dict.fromkeys(wanted):
            sha = member_sha256(members, p)
            if sha is None or sha in claimed:
                continue
            claimed.add(sha)
            if not cached(sha):
                mine.append(p)
        out[version] = mine
    return out


def _failures(
    done: Iterable[tuple[str, object, BaseException | None]],
) -> dict[str, BaseException]:
    """The releases of a parallel step that failed, with what they raised."""
    return {version: exc for version, _, exc in done if exc is not None}
