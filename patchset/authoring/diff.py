"""Reading a diff leniently into the registry's strict form.

A diff is read leniently and written strictly: `diff --git` headers or plain `diff -u`
output, `a/`/`b/` prefixes or none, paths below some other folder (`vllm-0.19.1/vllm/...`);
files outside `vllm/` (tests, docs) are left out and named. The payload is written in one
form (`--- a/vllm/...`, `+++ b/vllm/...`, the hunks as they were), the registry's own rules
applied to it.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from packaging.version import Version
from unidiff.patch import PatchedFile, PatchSet

from patchset.authoring import preamble as preambles
from patchset.authoring.layout import Detected, Layout, find_package_relative
from patchset.errors import PatchsetError, PayloadError, UsageError
from patchset.registry.diffs import parse_diff, read_patchset
from patchset.sources.base import ReleaseSource

NO_PREAMBLE = preambles.Preamble(None)
_MODE = re.compile(r"^deleted file mode ([0-7]+)$", re.MULTILINE)
_NEW_MODE = re.compile(r"^new file mode ([0-7]+)$", re.MULTILINE)


@dataclass(frozen=True)
class DiffPayload:
    """A diff reduced to the files under vllm/, in the registry's form."""

    text: str
    targets: tuple[str, ...]
    dropped: tuple[str, ...]  # files outside vllm/, left out
    preamble: preambles.Preamble = NO_PREAMBLE  # the text above the diff
    detected: Detected | None = None  # paths found relative to the vllm/ package


def _vllm_path(raw: str, *, git: bool) -> str:
    """The path relative to the folder holding vllm/. A git diff's paths are already relative
    to the repository; a plain diff's may sit below any folder (`vllm-0.19.1/vllm/x.py`)."""
    if raw == "/dev/null":
        return raw
    parts = PurePosixPath(raw).parts
    if git:
        return raw
    if "vllm" in parts:
        return "/".join(parts[parts.index("vllm") :])
    return raw


def normalize_diff(
    text: str,
    *,
    file: Path | str,
    layout: Layout | None = None,
    detect: Callable[[list[str]], Detected | None] | None = None,
) -> DiffPayload:
    """Read a unified diff from a forge or a file; PayloadError if it does not parse, touches
    no file under vllm/, or changes a vllm/ file in a way the engine does not apply.

    The text above the diff is kept as `preamble`. With no `layout` and no path under vllm/,
    `detect` is asked whether the paths are relative to the vllm/ package (it gets the paths
    of the files the diff changes); if it finds a release holding them all, they are read so.
    """
    if text.count("\r\n") == text.count("\n") > 0:  # saved with CRLF line ends throughout
        text = text.replace("\r\n", "\n")
    layout = layout or Layout()
    head, body = preambles.split(text)
    patch = read_patchset(body, file=file, empty="not a unified diff: it holds no file changes")
    payload = _payload(patch, file=file, layout=layout)
    if payload.targets or layout.explicit:
        return _checked(payload, head, file, None)
    existing = [p for p, added in payload.seen if not added]
    detected = detect(existing) if detect is not None else None
    if detected is not None:
        payload = _payload(patch, file=file, layout=Layout(root="vllm"))
        return _checked(payload, head, file, detected)
    dropped = [p for p, _ in payload.seen]
    more = len(dropped) - 3
    shown = ", ".join(dropped[:3]) + (f" and {more} more" if more > 0 else "")
    hint = (
        "; no known release has them under vllm/ either"
        if detect is not None
        else "; no release was at hand to see whether they are relative to the vllm/ package"
    )
    raise PayloadError(
        f"touches no file under vllm/ (only {shown}){hint}: for a diff made inside the vllm/"
        " package give --root vllm (and --strip N as for patch -pN); a diff for another package"
        " does not belong here",
        path=file,
    )


@dataclass(frozen=True)
class _Read:
    parts: list[str]
    targets: list[str]
    dropped: list[str]
    seen: list[tuple[str, bool]]  # every file's path and whether the diff creates it


def _payload(patch: PatchSet, *, file: Path | str, layout: Layout) -> _Read:
    parts: list[str] = []
    targets: list[str] = []
    dropped: list[str] = []
    seen: list[tuple[str, bool]] = []
    for pf in patch:
        git = str(pf.patch_info or "").startswith("diff --git")
        source, target = _paths(pf, git=git, layout=layout)
        path = target if target != "/dev/null" else source
        added = pf.is_added_file or source == "/dev/null"
        seen.append((path, added))
        if not path.startswith("vllm/"):
            dropped.append(path)
            continue
        if pf.is_binary_file:
            raise PayloadError(f"{path}: binary diffs are not supported", path=file)
        if target == "/dev/null":  # a deletion: git's header keeps the mode to put back
            mode = _MODE.search(str(pf.patch_info or ""))
            parts.append(
                f"diff --git a/{path} b/{path}\ndeleted file mode {mode[1] if mode else '100644'}\n"
                + (f"--- a/{path}\n+++ /dev/null\n" if len(pf) else "")
            )
            parts += [_hunk_text(h) for h in pf]
            targets.append(path)
            continue
        if (git and pf.is_rename) or not _same_file(source, target):
            raise PayloadError(f"{source} -> {target}: renames are not supported", path=file)
        created = _NEW_MODE.search(str(pf.patch_info or "")) if added else None
        if created is not None and created[1] == "100755":  # git's mode for a new script
            parts.append(f"diff --git a/{path} b/{path}\nnew file mode 100755\n")
        parts.append(f"--- {'/dev/null' if added else 'a/' + path}\n+++ b/{path}\n")
        parts += [_hunk_text(h) for h in pf]
        targets.append(path)
    return _Read(parts, targets, dropped, seen)


def _checked(
    read: _Read, head: preambles.Preamble, file: Path | str, detected: Detected | None
) -> DiffPayload:
    canonical = "".join(read.parts)
    parse_diff(canonical, file=file)  # the registry's own rules, named against the input
    return DiffPayload(
        canonical, tuple(dict.fromkeys(read.targets)), tuple(read.dropped), head, detected
    )


def detector(
    source: ReleaseSource, versions: Sequence[str]
) -> Callable[[list[str]], Detected | None]:
    """`normalize_diff`'s `detect`: the newest of `versions` holding every path under vllm/."""
    newest_first = sorted(versions, key=Version, reverse=True)
    return lambda paths: find_package_relative(paths, source, newest_first)


def newest_detector(source: ReleaseSource) -> Callable[[list[str]], Detected | None]:
    """`normalize_diff`'s `detect` with no release at hand (an empty cache): the source's
    newest final release, asked for only when a diff's paths need it (its few members read,
    not the whole release); None when the source cannot say."""

    def detect(paths: list[str]) -> Detected | None:
        try:
            finals = [v for v in source.versions() if not Version(v).is_prerelease]
            return find_package_relative(paths, source, finals[-1:]) if finals else None
        except PatchsetError:  # offline and uncached, the index unreachable: as before
            return None

    return detect


def _paths(pf: PatchedFile, *, git: bool, layout: Layout) -> tuple[str, str]:
    source, target = str(pf.source_file), str(pf.target_file)
    if layout.strip is not None:
        place = layout.place
        return (
            source if source == "/dev/null" else place(source),
            target if target == "/dev/null" else place(target),
        )
    if source.startswith("a/") and target.startswith("b/"):
        source, target = source[2:], target[2:]
    elif source == "/dev/null" and target.startswith("b/"):
        target = target[2:]
    elif target == "/dev/null" and source.startswith("a/"):
        source = source[2:]
    if layout.root:
        return (
            source if source == "/dev/null" else layout.place(source),
            target if target == "/dev/null" else layout.place(target),
        )
    return _vllm_path(source, git=git), _vllm_path(target, git=git)


_BACKUP_SUFFIXES = (".orig", ".old", ".bak", ".save", "~")


def _same_file(source: str, target: str) -> bool:
    """Whether a diff's two headers name one file: the same path, or a backup copy of it
    beside it (`diff -u x.py.orig x.py`). Two different files are a rename, refused."""
    if source in ("/dev/null", target):
        return True
    return any(source == target + suffix for suffix in _BACKUP_SUFFIXES)


def _hunk_text(hunk: object) -> str:
    text = str(hunk)
    return text if text.endswith("\n") else text + "\n"


MAX_INPUT = 256 * 1024 * 1024  # bytes: a diff or an overlay larger than this is refused


def read_diff_file(path: Path | str, *, what: str = "diffs") -> str:
    """A diff or an overlay the user named, as UTF-8 text: `-` is stdin; anything else must
    be a regular file (a FIFO, a device or a folder is refused at once, never waited on) of
    at most MAX_INPUT bytes. UsageError or PayloadError in one line, naming it."""
    data = read_input(path)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PayloadError(f"line {line}: not UTF-8; {what} are UTF-8 text", path=path) from None


def read_input(path: Path | str, *, limit: int = MAX_INPUT) -> bytes:
    """The bytes of a user's input file (`-`: stdin), bounded by `limit`."""
    if str(path) == "-":
        stream = getattr(sys.stdin, "buffer", None)  # None: a text stream put in its place
        data = stream.read(limit + 1) if stream else sys.stdin.read(limit + 1).encode()
        if len(data) > limit:
            raise UsageError(f"more than {_size(limit)} on stdin: refused (at most {_size(limit)})")
        return data
    try:
        # O_NONBLOCK: opening a FIFO with no writer returns at once instead of waiting.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise UsageError(f"cannot read: {exc.strerror}", path=path) from None
    info = os.fstat(fd)
    if not stat.S_ISREG(info.st_mode):
        os.close(fd)
        raise UsageError(f"not a regular file ({_kind(info.st_mode)}): give a file", path=path)
    with os.fdopen(fd, "rb") as handle:
        if info.st_size > limit:
            raise UsageError(
                f"{_size(info.st_size)}: larger than {_size(limit)}, refused", path=path
            )
        try:
            data = handle.read(limit + 1)
        except OSError as exc:
            raise UsageError(f"cannot read: {exc.strerror}", path=path) from None
    if len(data) > limit:  # it grew while read
        raise UsageError(f"larger than {_size(limit)}, refused", path=path)
    return data


def _kind(mode: int) -> str:
    for test, name in (
        (stat.S_ISDIR, "a folder"),
        (stat.S_ISFIFO, "a FIFO"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
        (stat.S_ISSOCK, "a socket"),
    ):
        if test(mode):
            return name
    return "not a file"


def _size(count: int) -> str:
    return f"{count / (1024 * 1024):.0f} MiB" if count >= 1024 * 1024 else f"{count} bytes"
