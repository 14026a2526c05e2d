"""Release sources: the package index (default), a folder, a git clone, a Docker image.

A source is named on the command line as ``index`` (or nothing), ``PATH`` (or
``folder:PATH``), ``git:PATH`` or ``image:REF``. Each kind is imported only when used:
gitpython and the Docker client are slow to import and not always needed.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Callable
from pathlib import Path
from typing import Any, cast

from patchset.errors import UsageError
from patchset.sources.base import ReleaseInfo, ReleaseSource, ReleaseTree

__all__ = ["SOURCES", "ReleaseInfo", "ReleaseSource", "ReleaseTree", "parse_source"]


def _index(*args: Any, **kwargs: Any) -> ReleaseSource:
    from patchset.sources.package_index import IndexSource  # noqa: PLC0415 -- see the module docstring

    return IndexSource(*args, **kwargs)


def _folder(*args: Any, **kwargs: Any) -> ReleaseSource:
    from patchset.sources.folder import FolderSource  # noqa: PLC0415

    return FolderSource(*args, **kwargs)


def _git(*args: Any, **kwargs: Any) -> ReleaseSource:
    from patchset.sources.git import GitSource  # noqa: PLC0415

    return GitSource(*args, **kwargs)


def _image(*args: Any, **kwargs: Any) -> ReleaseSource:
    image_source = importlib.import_module("patchset.sources.image").ImageSource
    return cast(ReleaseSource, image_source(*args, **kwargs))


SOURCES: dict[str, Callable[..., ReleaseSource]] = {
    "index": _index,
    "folder": _folder,
    "git": _git,
    "image": _image,
}


def parse_source(
    spec: str | None, *, index_url: str | None = None, offline: bool = False
) -> ReleaseSource:
    """The source a command-line spec names; None or ``index`` is the package index."""
    if spec is None or spec.strip() in {"", "index"}:
        return SOURCES["index"](index_url, offline=offline)
    kind, sep, rest = spec.partition(":")
    if sep and kind in SOURCES and kind != "index":
        if not rest:
            raise UsageError(f"{spec!r}: say which {'image' if kind == 'image' else 'folder'}")
        return SOURCES[kind](rest if kind == "image" else Path(rest).expanduser())
    if sep and kind.isalpha() and len(kind) > 1 and not Path(spec).exists():
        hint = difflib.get_close_matches(kind, SOURCES, n=1)
        did_you_mean = f"; did you mean {hint[0]}:?" if hint else ""
        raise UsageError(
            f"{spec!r}: unknown source kind {kind!r} (use PATH, git:PATH, image:REF"
            f" or index){did_you_mean}"
        )
    return SOURCES["folder"](Path(spec).expanduser())
