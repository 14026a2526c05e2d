"""Where a diff's paths start: `-pN` stripping, a `--root` folder, and the automatic finding
of diffs written relative to the `vllm/` package (`cd .../site-packages/vllm && patch -p1`)."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import PurePosixPath

from patchset.errors import UsageError
from patchset.sources.base import ReleaseSource


@dataclass(frozen=True)
class Layout:
    """How to turn a path in the diff into one relative to the folder holding vllm/."""

    strip: int | None = None  # leading components to drop, as `patch -pN`; None: the usual a/ b/
    root: str | None = None  # the folder the (stripped) paths are relative to, e.g. "vllm"

    def __post_init__(self) -> None:
        if self.strip is not None and self.strip < 0:
            raise UsageError(f"--strip {self.strip}: give 0 or more")
        if self.root is not None:
            parts = PurePosixPath(self.root).parts
            if not parts or parts[0] != "vllm" or ".." in parts or self.root.startswith("/"):
                raise UsageError(
                    f"--root {self.root!r}: give the folder the diff's paths are relative to,"
                    " inside the vllm package (e.g. 'vllm' for a diff made inside vllm/)"
                )

    @property
    def explicit(self) -> bool:
        return self.strip is not None or self.root is not None

    def place(self, raw: str) -> str:
        """`raw` (a path as the diff has it, after any a/ b/ handling the caller did when
        strip is None) placed under the root."""
        path = raw
        if self.strip:
            parts = PurePosixPath(raw).parts
            path = "/".join(parts[self.strip :]) if len(parts) > self.strip else ""
        if self.root:
            path = f"{self.root.rstrip('/')}/{path}"
        return path


@dataclass(frozen=True)
class Detected:
    version: str  # the release whose vllm/ holds every file the diff changes
    checked: int  # how many releases were looked at


def find_package_relative(
    paths: Sequence[str], source: ReleaseSource, versions: Iterable[str]
) -> Detected | None:
    """The first of `versions` (newest first) whose `vllm/` holds every one of `paths`
    (paths of files the diff changes, not creates), or None."""
    if not paths:
        return None
    for checked, version in enumerate(versions, start=1):
        with source.open(version) as tree:
            if all(tree.read(f"vllm/{p}") is not None for p in paths):
                return Detected(version, checked)
    return None
