"""One release's files from the index: its manifest, members fetched (and cached) when read.

A tree reads through the `Members` it is given (cache, memory, range fetches), never through
the source that made it.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator, Mapping
from pathlib import PurePosixPath
from typing import Any

from patchset.sources.base import ReleaseInfo, ReleaseTree
from patchset.sources.package_index import packing, wheel
from patchset.sources.package_index.members import Members
from patchset.sources.package_index.packing import Manifest, member_sha256

READAHEAD = 1 << 20  # bytes of a folder's other members fetched with one asked for
_PYTHON_MEMBERS: dict[str, tuple[dict[str, list[str]], dict[str, list[str]]]] = {}
_PYTHON_MEMBERS_KEPT = 64  # releases' indexes kept (a check's prefetch, then its trees)


def _python_members(manifest: Manifest) -> tuple[dict[str, list[str]], dict[str, list[str]]]:
    """A release's Python members by file name and by folder name (each list in the
    manifest's order), made once per artifact: a wheel has thousands of members."""
    key = manifest.sha256 or manifest.artifact
    kept = _PYTHON_MEMBERS.get(key)
    if kept is None:
        by_name: dict[str, list[str]] = {}
        by_folder: dict[str, list[str]] = {}
        for p in manifest.members:
            if p.endswith(".py"):  # string splits, not pathlib: thousands of members
                folder, _, name = p.rpartition("/")
                by_name.setdefault(name, []).append(p)
                by_folder.setdefault(folder.rpartition("/")[2], []).append(p)
        if len(_PYTHON_MEMBERS) >= _PYTHON_MEMBERS_KEPT:
            del _PYTHON_MEMBERS[next(iter(_PYTHON_MEMBERS))]
        kept = _PYTHON_MEMBERS[key] = (by_name, by_folder)
    return kept


class IndexTree(ReleaseTree):
    """One release's files from its manifest; members fetched (and cached) when read.

    `info` lists what was checked so far (made again when asked for after a read)."""

    def __init__(self, members: Members, manifest: Manifest, fallback: str | None) -> None:
        self._members = members
        self.manifest = manifest
        self.fallback = fallback
        self._near: dict[str, bytes] = {}  # read ahead, checked, not yet asked for
        self._checked: dict[str, str] = {}  # path -> sha256 of what was read
        self._sdist: IndexTree | None = None
        self._lock = threading.Lock()
        self._said: ReleaseInfo | None = None  # `info` as last made, until the next read

    @property
    def info(self) -> ReleaseInfo:
        """Which release this is, and the files checked so far (made when asked for, not
        after every read: a check reads hundreds of files of a release)."""
        if self._said is None:
            self._said = self._info()
        return self._said

    @info.setter
    def info(self, value: ReleaseInfo) -> None:
        self._said = value

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

    def listed(self) -> Mapping[str, list[Any]]:
        """The release's file list, read and checked when first wanted (a cached manifest
        is loaded by its header: `Cache.load_manifest`); one found damaged is built again
        from the index (`IndexSource.rebuild`), never believed."""
        members = self.manifest.members
        if isinstance(members, packing.Members) and not members.checked:
            try:
                members.check()
            except packing.DamagedListError:
                self.manifest = self._members.manifests.rebuild(self.manifest, damaged=True)
                members = self.manifest.members
        return members

    def paths(self) -> Iterator[str]:
        return iter(sorted(p for p in self.listed() if p.startswith("vllm/")))

    def read(self, relpath: str) -> bytes | None:
        entry = self.listed().get(relpath)
        if entry is None:
            return self._outside_wheel(relpath)
        with self._lock:
            data = self._near.pop(relpath, None)
        if data is not None:
            self._members.keep(entry[0], data)
        else:
            data = self._members.recall_or_read(entry[0])
        if data is None:
            data = self.fetch([relpath], readahead=True)[relpath]
        self._checked[relpath] = entry[0]
        self._said = None
        return data

    def read_many(self, relpaths: Iterable[str]) -> dict[str, bytes | None]:
        """Several files at once: what is not cached comes in one round of range requests."""
        wanted = list(dict.fromkeys(relpaths))
        listed = self.listed()
        inside = [p for p in wanted if p in listed]
        with self._lock:
            cold = [p for p in inside if p not in self._near]
        self.fetch(cold, keep=False)  # `read` then takes each from memory or the cache, once
        return {p: self.read(p) for p in wanted}

    def fetch(
        self, paths: Iterable[str], *, readahead: bool = False, keep: bool = True
    ) -> dict[str, bytes]:
        """Make sure `paths` (those in the release) are cached; their bytes, checked (with
        ``keep=False`` only those fetched now: the others are not read back)."""
        listed = self.listed()
        m = self.manifest
        wanted = [p for p in dict.fromkeys(paths) if p in listed]
        missing = [p for p in wanted if not self._members.has(listed[p][0])]
        out: dict[str, bytes] = {}
        if missing and m.kind == "sdist":
            self.manifest = self._members.manifests.rebuild(
                self.manifest
            )  # a blob was pruned or damaged
            return {p: d for p in wanted if (d := self.read(p)) is not None}
        if missing:
            extra = self._neighbours(missing) if readahead else []
            try:
                got = self._members.fetch(m, [*missing, *extra])
            except wheel.DamagedWheel:
                self._members.manifests.drop_manifest(m.artifact)  # read it all again next time
                raise
            for path in missing:
                self._members.keep(got[path].sha256, got[path].data, got[path].deflated)
                out[path] = got[path].data
            with self._lock:
                self._near.update({p: got[p].data for p in extra if p in got})
        for path in wanted if keep else ():
            sha = listed[path][0]
            if path not in out and (
                data := self._members.recall(sha) or self._members.cache.read_blob(sha)
            ):
                out[path] = data
        return out

    def stand_ins(self, missing: list[str]) -> list[str]:
        """For paths the release lacks, the Python files a moved-file search reads next (fetched
        ahead, in parallel): those of the same name, else those in a folder of the same name."""
        wanted = [PurePosixPath(p) for p in missing if p.endswith(".py")]
        if not wanted:
            return []
        self.listed()
        by_name, by_folder = _python_members(self.manifest)
        found: list[str] = []
        for pure in wanted:
            found += by_name.get(pure.name) or by_folder.get(pure.parent.name, [])
        return found

    def _neighbours(self, paths: list[str]) -> list[str]:
        """Small members in the same folders (a moved-file search reads them next)."""
        folders = {p.rpartition("/")[0] for p in paths}  # string splits: thousands of members
        budget = READAHEAD
        found = []
        for name, entry in sorted(self.listed().items()):
            if name.rpartition("/")[0] in folders and name not in paths:
                if name in self._near or self._members.cache.has_blob(entry[0]):
                    continue
                budget -= entry[1]
                if budget < 0:
                    break
                found.append(name)
        return found

    def listed_digest(self, relpath: str) -> str | None:
        """The sha256 the manifest lists for `relpath` (the one its bytes are checked against
        when read), "-" for a file the release lacks; None for one outside the wheel."""
        sha = member_sha256(self.listed(), relpath)
        if sha is not None:
            return sha
        if self.manifest.kind != "wheel" or relpath.startswith("vllm/"):
            return "-"
        return None  # a wheel cannot hold it: the sdist's list would say

    def listed_size(self, relpath: str) -> int | None:
        """The size the manifest lists for `relpath` (None for a file it does not hold)."""
        entry = self.listed().get(relpath)
        return int(entry[1]) if entry is not None else None

    def read_listed(self, relpath: str, digest: str) -> bytes | None:
        """`relpath` whose sha256 a memo of this release's list gives: from the cache by that
        digest (checked against it), without decoding the list; else as `read`."""
        if self.manifest.kind != "wheel" or not relpath.startswith("vllm/"):
            return self.read(relpath)  # from the sdist, or not in a wheel: said in `info`
        data = self._members.recall_or_read(digest)
        if data is None:
            return self.read(relpath)
        self._checked[relpath] = digest
        self._said = None
        return data

    def _outside_wheel(self, relpath: str) -> bytes | None:
        """A path a wheel cannot hold (csrc/, setup.py...) is read from the sdist."""
        if self.manifest.kind != "wheel" or relpath.startswith("vllm/"):
            return None
        if self._sdist is None:
            manifest = self._members.manifests.sdist_for(self.manifest.version)
            if manifest is None:
                return None
            self._sdist = IndexTree(self._members, manifest, None)
            note = f"sdist {manifest.artifact} for files outside vllm/"
            self.fallback = f"{self.fallback}; {note}" if self.fallback else note
        data = self._sdist.read(relpath)
        self._said = None
        return data
