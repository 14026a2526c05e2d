"""What both importers share: the collection's provenance, the imports a text makes, the
releases it is read against."""

from __future__ import annotations

import errno
import os
import re
import stat
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from pathlib import Path

from patchset.adapters.gitrepo import provenance
from patchset.importers.model import CollectionError
from patchset.registry.ranges import version_key
from patchset.sources.base import ReleaseSource, ReleaseTree

_IMPORT = re.compile(
    r"^\s*(?:from\s+([A-Za-z_][\w.]*)\s+import\b|import\s+([A-Za-z_][\w.]*))", re.M
)


def origin_of(folder: Path, default: str) -> tuple[str, str | None]:
    """(owner/name, commit) of the checkout: the repository from its `origin` remote where
    it names one (a mirror folder `owner+name/repo` too), else `default`."""
    revision, source = provenance(folder)
    commit = revision.removesuffix("-dirty") if revision != "unknown" else None
    repository = default
    parts = [p for p in re.split(r"[/:]", source.removesuffix(".git")) if p]
    if parts and parts[-1] == "repo" and len(parts) >= 2 and "+" in parts[-2]:
        repository = parts[-2].replace("+", "/", 1)
    elif len(parts) >= 2 and source != str(folder.resolve()):
        candidate = f"{parts[-2]}/{parts[-1]}"
        if re.match(r"^[\w.-]+/[\w.-]+$", candidate):
            repository = candidate
    return repository, commit


def imported_modules(text: str, package: str) -> list[str]:
    """The modules of `package` an inserted text imports (`from sndr.x import y`, `import
    sndr.x`), read line by line: a site's text is a fragment, not a module."""
    found: list[str] = []
    for match in _IMPORT.finditer(text):
        module = match.group(1) or match.group(2)
        if module == package or module.startswith(package + "."):
            found.append(module)
    return list(dict.fromkeys(found))


@dataclass
class Releases:
    """The releases a collection is read against (overlays compared, files looked up), each
    tree opened once."""

    sources: Sequence[ReleaseSource]
    _stack: ExitStack = field(default_factory=ExitStack)
    _trees: dict[str, ReleaseTree] = field(default_factory=dict)
    _versions: list[tuple[str, ReleaseSource]] | None = None

    def versions(self) -> list[str]:
        if self._versions is None:
            found: dict[str, ReleaseSource] = {}
            for source in self.sources:
                for version in source.cached_versions() or source.versions():
                    found.setdefault(version, source)
            self._versions = sorted(found.items(), key=lambda kv: version_key(kv[0]))
        return [v for v, _ in self._versions]

    def read(self, version: str, path: str) -> bytes | None:
        return self.tree(version).read(path)

    def tree(self, version: str) -> ReleaseTree:
        if version not in self._trees:
            self.versions()
            assert self._versions is not None
            source = dict(self._versions)[version]
            self._trees[version] = self._stack.enter_context(source.open(version))
        return self._trees[version]

    def close(self) -> None:
        self._stack.close()


def refuse_escapes(root: Path, folders: Sequence[str]) -> None:
    """Refuse (exit 2, one line naming the path) a checkout whose `folders` hold a link
    leading out of the checkout, a link loop (or a folder link to a folder above it, which a
    copy would follow forever), or a special file (a FIFO, a device, a socket): the import
    reads and copies these folders, and would otherwise copy what lies outside as a regular
    file, or block on a FIFO, or read a device without end."""
    top = root.resolve()
    for name in folders:
        start = root / name
        if not start.is_dir() or start.is_symlink():
            if start.is_symlink():
                _check_link(top, start)
            continue
        for here, dirs, files in os.walk(start, followlinks=False):
            for entry in [*dirs, *files]:
                path = Path(here) / entry
                try:
                    info = path.lstat()
                except OSError as exc:
                    raise CollectionError(f"{path}: cannot be read ({exc.strerror})") from None
                if stat.S_ISLNK(info.st_mode):
                    _check_link(top, path)
                elif not (stat.S_ISREG(info.st_mode) or stat.S_ISDIR(info.st_mode)):
                    raise CollectionError(
                        f"{path}: a special file (not a regular file or folder): refused"
                    )


def _check_link(top: Path, path: Path) -> None:
    error = CollectionError
    try:
        target = path.resolve(strict=True)
    except (RuntimeError, OSError) as exc:
        # a loop: RuntimeError before Python 3.13, OSError (ELOOP) from it on
        if not isinstance(exc, OSError) or exc.errno == errno.ELOOP:
            raise error(f"{path}: a symlink loop: refused") from None
        target = path.resolve(strict=False)
        if not target.is_relative_to(top):
            raise error(
                f"{path}: a link leading out of the checkout (-> {target}): refused"
            ) from None
        return  # a dangling link inside the checkout reads as a missing file
    if not target.is_relative_to(top):
        raise error(f"{path}: a link leading out of the checkout (-> {target}): refused")
    if target.is_dir() and path.parent.resolve().is_relative_to(target):
        raise error(f"{path}: a link to a folder above it (a loop for a copy): refused")
    mode = target.stat().st_mode
    if not (stat.S_ISREG(mode) or stat.S_ISDIR(mode)):
        raise error(f"{path}: a link to a special file (-> {target}): refused")
