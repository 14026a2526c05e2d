"""The download progress bar `check` shows on a terminal (rich's progress module is imported
only when there is one to show it on)."""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator

from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, ProgressColumn, Task
from rich.text import Text

from patchset.cli.output import text
from patchset.sources.base import DownloadProgress

REDRAW = 0.1  # seconds between two drawings of the bar at most (rich's default refresh rate)


class DescriptionColumn(ProgressColumn):
    """A progress task's description (a file name from the index), as text."""

    def render(self, task: Task) -> Text:
        return text(task.description)


class _Bytes(DownloadColumn):
    """Bytes received of those expected, or nothing while none are (a warm check fetches
    nothing: its bar counts releases, never "25/25 bytes")."""

    def render(self, task: Task) -> Text:
        if not task.total and not task.completed:
            return Text("")
        return super().render(task)


@contextlib.contextmanager
def download_bar(shown_on: Console, versions: list[str]) -> Iterator[DownloadProgress]:
    """The prefetch's progress bar on `shown_on`: bytes, and releases ready in its
    description."""
    counts: dict[str, tuple[int, int]] = {}  # version -> (bytes received, bytes expected)
    lock = threading.Lock()
    columns = (DescriptionColumn(), BarColumn(), _Bytes())
    drawn = [0.0]  # when the bar was last drawn
    # Drawn as it hears of bytes, at most every REDRAW seconds, not by rich's own refresh
    # thread: rich stops that thread without waiting for it, and the check that follows
    # forks only when no other thread runs.
    with Progress(*columns, console=shown_on, transient=True, auto_refresh=False) as progress:
        task = progress.add_task(f"vllm releases 0/{len(versions)}", total=None)
        progress.refresh()

        def report(version: str, done: int, total: int) -> None:
            """The bar counts bytes (its end grows as each release's plan is known); the
            description, releases ready."""
            with lock:
                counts[version] = (done, total)
                ready = sum(1 for d, t in counts.values() if d >= t)  # 0 of 0: cached
                progress.update(
                    task,
                    completed=sum(d for d, _ in counts.values()),
                    total=sum(t for _, t in counts.values()) or None,
                    description=f"vllm releases {ready}/{len(versions)}",
                )
                now = time.monotonic()
                if now - drawn[0] >= REDRAW or ready == len(versions):
                    progress.refresh()
                    drawn[0] = now

        yield report
