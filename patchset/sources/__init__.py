"""Release sources: the package index (default), a folder, a git clone, a Docker image.

A source is named on the command line as ``index`` (or nothing), ``PATH`` (or
``folder:PATH``), ``git:PATH`` or ``image:REF``. Each kind is imported only when used:
gitpython and the Docker client are slow to import and not always needed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal, get_args

from patchset.errors import UsageError
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

if TYPE_CHECKING:
    from patchset.sources.package_index import Artifact

__all__ = [
    "KINDS",
    "SOURCES",
    "ReleaseInfo",
    "ReleaseSource",
    "ReleaseTree",
    "SourceKind",
    "parse_source",
]


SourceKind = Literal["index", "folder", "git", "image"]
KINDS: tuple[SourceKind, ...] = get_args(SourceKind)


@dataclass(frozen=True)
class SourceOptions:
    """The command line's source options, as a source kind's factory takes them: only the
    index uses `index_url` and `offline`; `version` (``--source-version``) is a tree's."""

    index_url: str | None = None
    offline: bool = False
    prereleases: bool = False
    version: str | None = None


# Makes a source of one kind from the text after ``kind:`` (a path, an image reference; empty
# for the index) and the options.
SourceFactory = Callable[[str, SourceOptions], ReleaseSource]


def _index(where: str, given: SourceOptions) -> ReleaseSource:
    return parse_source(
        None, index_url=given.index_url, offline=given.offline, prereleases=given.prereleases
    )


def _folder(where: str, given: SourceOptions) -> ReleaseSource:
    from patchset.sources.folder import FolderSource  # noqa: PLC0415

    return FolderSource(Path(where).expanduser(), version=given.version)


def _git(where: str, given: SourceOptions) -> ReleaseSource:
    from patchset.sources.git import GitSource  # noqa: PLC0415

    version = given.version
    if version is not None:
        from patchset.sources.folder import checked_version  # noqa: PLC0415

        version = checked_version(version)
    return GitSource(Path(where).expanduser(), prereleases=given.prereleases, version=version)


def _image(where: str, given: SourceOptions) -> ReleaseSource:
    from patchset.sources.image import ImageSource  # noqa: PLC0415

    return ImageSource(where)


SOURCES: dict[SourceKind, SourceFactory] = {
    "index": _index,
    "folder": _folder,
    "git": _git,
    "image": _image,
}


def parse_source(
    spec: str | None,
    *,
    index_url: str | None = None,
    offline: bool = False,
    prereleases: bool = False,
    artifact: Artifact | None = None,
    verify_full: bool = False,
    timeout: float | None = None,
    version: str | None = None,
) -> ReleaseSource:
    """The source a command-line spec names; None or ``index`` is the package index (the one
    place the default source is built), which lists pre-releases only with `prereleases`.
    `artifact`, `verify_full` and `timeout` are the index's only (a UsageError elsewhere).
    `version` (``--source-version``) says which release a folder or a ``git:PATH@REF`` tree
    holds."""
    text = (spec or "").strip()
    tagged = text in {"", "index"} or text.startswith("image:")
    if version is not None and (tagged or (text.startswith("git:") and "@" not in text)):
        raise UsageError("--source-version: only with a folder or git:PATH@REF source")
    if spec is None or spec.strip() in {"", "index"}:
        from patchset.adapters import net  # noqa: PLC0415 -- see the module docstring
        from patchset.sources.package_index import IndexSource  # noqa: PLC0415

        return IndexSource(
            index_url,
            offline=offline,
            prereleases=prereleases,
            artifact=artifact or "auto",
            verify_full=verify_full,
            timeout=net.DEFAULT_TIMEOUT if timeout is None else timeout,
        )
    given = {"--artifact": artifact, "--verify-full": verify_full, "--timeout": timeout}
    if flags := [flag for flag, value in given.items() if value not in (None, False)]:
        raise UsageError(f"{', '.join(flags)}: only for the package index, not --source")
    kind, sep, rest = spec.partition(":")
    for known in KINDS:
        if sep and kind == known and known != "index":
            if not rest:
                raise UsageError(f"{spec!r}: say which {'image' if kind == 'image' else 'folder'}")
            return SOURCES[known](rest, SourceOptions(index_url, offline, prereleases, version))
    if sep and kind.isalpha() and len(kind) > 1 and not Path(spec).exists():
        import difflib  # noqa: PLC0415 -- a misspelt kind only

        hint = difflib.get_close_matches(kind, SOURCES, n=1)
        did_you_mean = f"; did you mean {hint[0]}:?" if hint else ""
        raise UsageError(
            f"{spec!r}: unknown source kind {kind!r} (use PATH, git:PATH, image:REF"
            f" or index){did_you_mean}"
        )
    return SOURCES["folder"](spec, SourceOptions(index_url, offline, version=version))
