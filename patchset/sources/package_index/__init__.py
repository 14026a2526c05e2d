"""Releases from the package index, read from their wheels and only as far as needed.

A release is its wheel (one for this machine's architecture when there is one) read
lazily: the central directory once, then each member asked for, through HTTP range
requests, each checked against the wheel's RECORD and its zip CRC before it is used or
cached (see `wheel`). The sdist is the fallback: when the release has no wheel, when the
server does not serve ranges, and per file for paths outside ``vllm/`` that a wheel cannot
hold. ``artifact="sdist"`` or ``"wheel"`` forces one; ``verify_full=True`` downloads the
whole artifact and checks the index's sha256 first. Whole artifacts are deleted once read.

`source` is the source (artifacts, manifests, prefetch), `tree` one release's files, and
`members` what a tree reads through (cache, memory, range requests); `wheel` reads a wheel's
directory and members, `sdist` an sdist, `client` the index, `cache` the user cache.
"""
# Each name is imported on first use: a module of this package is imported without the rest
# (`patchset check` answering from a kept report imports none of the loader).

from __future__ import annotations

from typing import TYPE_CHECKING

from patchset._lazy import exports

if TYPE_CHECKING:
    from patchset.sources.package_index.source import ARTIFACTS, Artifact, IndexSource
    from patchset.sources.package_index.tree import IndexTree

__all__ = ["ARTIFACTS", "Artifact", "IndexSource", "IndexTree"]

_WHERE = {
    **dict.fromkeys(
        ("ARTIFACTS", "Artifact", "IndexSource"), "patchset.sources.package_index.source"
    ),
    **dict.fromkeys(("IndexTree",), "patchset.sources.package_index.tree"),
}

__getattr__, __dir__ = exports(__name__, _WHERE, __all__)
