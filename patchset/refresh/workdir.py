"""The work folder a conflicted diff refresh leaves: the merged files to edit, the release's
own copies and a `RefreshState` under `.patchset/`, read back by `finish` and `abort`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any

from patchset._fs import sha256_hex, write_atomic
from patchset._plain import fields_dict
from patchset.errors import UsageError, one_line
from patchset.refresh.job import Job
from patchset.registry import Registry, ranges

WORK_FOLDER = ".patchset-refresh"  # beside the registry: <registry>/../.patchset-refresh/<id>
STATE = ".patchset/refresh.json"  # inside the work folder, with the release's files beside it
STATE_SCHEMA = "patchset.refresh-state/1"
LOG = logging.getLogger(__name__)


def default_workdir(registry: Registry, patch_id: str) -> Path:
    return registry.root.resolve().parent / WORK_FOLDER / patch_id


@dataclass(frozen=True)
class RefreshState:
    """What an unfinished diff refresh needs to finish: `.patchset/refresh.json`."""

    patch: str
    revision: int  # the patch's revision when the refresh began
    from_variant: str
    from_sha256: str  # the variant's payload digest then: a changed patch is refused
    base: str
    vllm: str  # the target release
    versions: tuple[str, ...]  # the releases the source offered
    files: Mapping[str, str | None]  # variant path: sha256 of the release's copy, None: absent
    moves: Mapping[str, str] = field(default_factory=dict)  # variant path: the release's path

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": STATE_SCHEMA,
            **fields_dict(self, skip=("files",)),
            "files": dict(self.files),
        }

    @classmethod
    def from_json(cls, data: object, *, path: Path) -> RefreshState:
        """The state in `data` (parsed JSON); a UsageError naming `path` when it is not one."""
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise UsageError("not a patchset refresh state", path=path)
        for key, kind in _STATE_KEYS.items():
            value = data.get(key)
            if not isinstance(value, kind) or isinstance(value, bool):
                raise UsageError(f"refresh state without a valid {key!r}", path=path)
        for key in ("vllm", "base"):
            if not _version(data[key]):
                raise UsageError(f"refresh state: {key!r} is not a version", path=path)
        if not all(_version(v) for v in data["versions"]):
            raise UsageError("refresh state: 'versions' holds what is not a version", path=path)
        moves = data.get("moves", {})  # absent in a state written before moves were followed
        if not isinstance(moves, dict) or not all(
            _release_path(k) and isinstance(v, str) and _release_path(v) for k, v in moves.items()
        ):
            raise UsageError("refresh state without a valid 'moves'", path=path)
        files = data["files"]
        if not all(_release_path(k) and isinstance(v, str | None) for k, v in files.items()):
            raise UsageError("refresh state without a valid 'files'", path=path)
        checked = {key: data[key] for key in _STATE_KEYS}  # the keys checked are the ones kept
        versions = tuple(str(v) for v in data["versions"])
        return cls(**{**checked, "versions": versions, "moves": moves})


def _version(text: object) -> bool:
    """Whether `text` is a version as a release spells one (a bounded length: a 5,000-digit
    number is no release, and too long for `int`)."""
    return isinstance(text, str) and len(text) <= 64 and ranges.is_version(text)


def _release_path(name: object) -> bool:
    """Whether `name` is a relative path under vllm/ (nothing absolute, no `..`)."""
    if not isinstance(name, str) or "\x00" in name or "\\" in name:
        return False
    path = PurePosixPath(name)
    return (
        not path.is_absolute()
        and len(path.parts) >= 2
        and path.parts[0] == "vllm"
        and ".." not in path.parts
        and path.as_posix() == name
    )


_STATE_KEYS: dict[str, type] = {
    "patch": str,
    "revision": int,
    "from_variant": str,
    "from_sha256": str,
    "base": str,
    "vllm": str,
    "versions": list,
    "files": dict,
}
MAX_STATE = 16 * 1024 * 1024  # bytes: a refresh.json is a few hundred


def write_work(job: Job, work: Path, merged: dict[str, bytes | None]) -> None:
    """The merged files (edit these) and, under .patchset/, the release's own and the state."""
    if work.exists() and any(work.iterdir()):
        raise UsageError(
            f"an unfinished refresh of {job.patch.id} is in {work}: finish it (--finish) or"
            " drop it (--abort)"
        )
    assert job.base is not None  # a diff refresh merges from its base
    state_path = work / STATE
    created = not work.exists()
    try:
        state_path.parent.mkdir(parents=True, exist_ok=True)
        for rel, data in merged.items():
            path = work / job.moves.get(rel, rel)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data or b"")
        for rel, data in job.files.items():
            if data is not None:
                kept = state_path.parent / "release" / rel
                kept.parent.mkdir(parents=True, exist_ok=True)
                kept.write_bytes(data)
        state = RefreshState(
            patch=job.patch.id,
            revision=job.patch.revision,
            from_variant=job.variant.name,
            from_sha256=job.variant.sha256,
            base=job.base,
            vllm=job.target,
            versions=job.versions,
            moves=dict(job.moves),
            files={
                rel: None if data is None else sha256_hex(data) for rel, data in job.files.items()
            },
        )
        text = json.dumps(state.to_json(), indent=2) + "\n"
        write_atomic(state_path, text.encode("utf-8"))  # last, whole or not at all
    except OSError as exc:
        if created:
            shutil.rmtree(work, ignore_errors=True)
        raise UsageError(f"cannot write the work folder: {exc.strerror}", path=work) from None


def load_state(work: Path, patch_id: str) -> RefreshState:
    path = work / STATE
    if not os.path.lexists(path):
        raise UsageError(f"no unfinished refresh of {patch_id} here", path=work)
    data = work_file(work, STATE, limit=MAX_STATE)
    try:
        parsed = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as exc:  # deep nesting is a RecursionError
        reason = "nested too deeply" if isinstance(exc, RecursionError) else str(exc)
        raise UsageError(f"unreadable refresh state: {one_line(reason)}", path=path) from None
    state = RefreshState.from_json(parsed, path=path)
    if state.patch != patch_id:
        raise UsageError(f"this is a refresh of {state.patch!r}, not {patch_id}", path=path)
    return state


def work_file(work: Path, rel: str, *, limit: int | None = None) -> bytes:
    """A file of the work folder: a regular file reached through no symlink (neither it nor
    a folder above it, below `work`); anything else is refused, never followed or waited on."""
    path = work
    for part in PurePosixPath(rel).parts:
        path = path / part
        try:
            info = path.lstat()
        except FileNotFoundError:
            raise UsageError(f"{rel} is missing from the work folder", path=work) from None
        except OSError as exc:
            raise UsageError(f"{rel}: cannot be read ({exc.strerror})", path=work) from None
        if stat.S_ISLNK(info.st_mode):
            raise UsageError(
                f"{path.relative_to(work)} is a symlink: the work folder holds only the files"
                " refresh wrote (start again: --abort)",
                path=work,
            )
    if not stat.S_ISREG(info.st_mode):
        raise UsageError(f"{rel} is not a regular file (start again: --abort)", path=work)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
        with os.fdopen(fd, "rb") as handle:
            if not stat.S_ISREG(os.fstat(handle.fileno()).st_mode):
                raise UsageError(f"{rel} is not a regular file", path=work)
            data = handle.read() if limit is None else handle.read(limit + 1)
    except OSError as exc:
        raise UsageError(f"{rel}: cannot be read ({exc.strerror})", path=work) from None
    if limit is not None and len(data) > limit:
        raise UsageError(f"{rel}: larger than {limit} bytes", path=work)
    return data


def remove_work(work: Path) -> None:
    try:
        shutil.rmtree(work)
        if work.parent.name == WORK_FOLDER and not any(work.parent.iterdir()):
            work.parent.rmdir()
    except OSError as exc:  # the registry is written: a leftover folder is only clutter
        LOG.warning("could not remove the work folder %s: %s", work, exc.strerror)
