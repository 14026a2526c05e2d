"""The check's prefetch (`ReleaseSource.prefetch`), done when the check first needs it."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext

from patchset.sources.base import DownloadProgress, ReleaseSource

ProgressBar = Callable[[list[str]], AbstractContextManager[DownloadProgress | None]]
"""Given the releases selected, a context around the prefetch yielding the callback that hears
of its bytes (`patchset check` draws a bar with it; None hears nothing)."""


class Prefetch:
    """The check's prefetch (`ReleaseSource.prefetch`: what the check reads, fetched ahead
    in parallel), done once, when first needed: before the first result the memo does not
    hold is worked out, or the check is split among processes. A check the memo answers
    reads no file: it fetches nothing and decodes no release's file list."""

    def __init__(
        self,
        source: ReleaseSource,
        ordered: list[str],
        paths: list[str],
        progress: ProgressBar | None,
        also: list[str] | None = None,
    ) -> None:
        self.source, self.ordered, self.paths, self.progress = source, ordered, paths, progress
        # the other files the verdicts rest on (a python patch's modules, looked up, never
        # searched for): fetched where a release has them (`ReleaseSource.prefetch`); read
        # one by one as the check goes, each would be a request of its own
        fetched = set(paths)
        self.also = [f for f in also or () if f not in fetched]
        self.done = False

    def __call__(self) -> None:
        if self.done:
            return
        self.done = True
        progress, ordered = self.progress, self.ordered
        with progress(ordered) if progress is not None else nullcontext() as heard:
            if self.also:
                self.source.prefetch(ordered, paths=self.paths, progress=heard, also=self.also)
            else:
                self.source.prefetch(ordered, paths=self.paths, progress=heard)
