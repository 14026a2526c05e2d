"""A release's files as a check reads them (`ReleaseFiles`), and what a process knows of each
release across the groups of patches it checks (`Releases`): the files' digests and the
python files a moved-file search looks in."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from patchset.release_check.memo import Memo, file_digest
from patchset.release_check.moves import PythonFiles
from patchset.sources.base import KnowsDigests, ReleaseTree


class Releases:
    """What a process knows of each release's files across the groups it checks (`Known`):
    the digests (the memo's, read once a release, and those it took itself: kept in the memo
    once its work is done, `keep`, not once per group and release) and the python files'
    list a moved-file search looks in (listed once)."""

    def __init__(self, memo: Memo | None) -> None:
        self.memo = memo
        self._known: dict[str, Known] = {}

    def files(self, tree: ReleaseTree) -> ReleaseFiles:
        """The release's files, with the digests the memo keeps for a release whose digest
        pins its content (the index's): a warm check then reads no file."""
        pinned = tree.info.digest
        if self.memo is None or not pinned:
            return ReleaseFiles(tree, Known({}))
        if pinned not in self._known:
            self._known[pinned] = Known(self.memo.digests(pinned))
        return ReleaseFiles(tree, self._known[pinned])

    def keep(self) -> None:
        """The digests taken since the last `keep`, kept in the memo."""
        for pinned, known in self._known.items():
            if self.memo is not None and known.fresh:
                self.memo.put_digests(pinned, known.fresh)
            known.fresh = {}


@dataclass
class Known:
    """What is known of one release's files: their digests (`fresh`: those not from the
    memo, to keep in it) and, once listed, its python files."""

    digests: dict[str, str]
    fresh: dict[str, str] = dataclasses.field(default_factory=dict)
    python: PythonFiles | None = None


class ReleaseFiles:
    """One release's files as a check reads them: each file read once; a digest taken from
    the memo, else from the tree's own list (the wheel's RECORD), else by reading the file;
    the release's python files listed once (for moved-file hints)."""

    def __init__(self, tree: ReleaseTree, known: Known) -> None:
        self.tree = tree
        self._known = known
        self.known = known.digests
        self._cache: dict[str, bytes | None] = {}
        self._lists = tree if isinstance(tree, KnowsDigests) else None

    @classmethod
    def of(cls, tree: ReleaseTree, memo: Memo | None) -> ReleaseFiles:
        """The release's files, with the digests the memo keeps for a release whose digest
        pins its content (the index's)."""
        return Releases(memo).files(tree)

    def read(self, rel: str) -> bytes | None:
        if rel not in self._cache:
            said = self.known.get(rel) if self._lists is not None else None
            if said == "-":  # the release's list, as the memo keeps it, has no such file
                self._cache[rel] = None
            elif said is not None and self._lists is not None:
                self._cache[rel] = self._lists.read_listed(rel, said)
            else:
                self._cache[rel] = self.tree.read(rel)
        return self._cache[rel]

    def digest(self, rel: str) -> str:
        if rel not in self.known:
            said = self._lists.listed_digest(rel) if self._lists is not None else None
            self.known[rel] = self._known.fresh[rel] = (
                said if said is not None else file_digest(self.read(rel))
            )
        return self.known[rel]

    def python_files(self) -> PythonFiles:
        if self._known.python is None:
            self._known.python = PythonFiles(self.tree.paths())
        return self._known.python


__all__ = ["Known", "ReleaseFiles", "Releases"]
