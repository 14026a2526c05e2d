"""The work folder a conflicted diff refresh leaves: the merged files to edit, the release's
own copies and a `RefreshState` under `.patchset/`, read back by `finish` and `abort`.
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from patchset.errors import UsageError
from patchset.refresh.job import Job
from patchset.registry import Registry

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
            "patch": self.patch,
            "revision": self.revision,
            "from_variant": self.from_variant,
            "from_sha256": self.from_sha256,
            "base": self.base,
            "vllm": self.vllm,
            "versions": list(self.versions),
            "moves": dict(self.moves),
            "files": dict(self.files),
        }

    @classmethod
    def from_json(cls, data: object, *, path: Path) -> RefreshState:
        """The state in `data` (parsed JSON); a UsageError naming `path` when it is not one."""
        if not isinstance(data, dict) or data.get("schema") != STATE_SCHEMA:
            raise UsageError("not a patchset refresh state", path=path)
        for key, kind in _STATE_KEYS.items():
            if not isinstance(data.get(key), kind):
                raise UsageError(f"refresh state without a valid {key!r}", path=path)
        moves = data.get("moves", {})  # absent in a state written before moves were followed
        if not isinstance(moves, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in moves.items()
        ):
            raise UsageError("refresh state without a valid 'moves'", path=path)
        files = data["files"]
        if not all(isinstance(k, str) and isinstance(v, str | None) for k, v in files.items()):
            raise UsageError("refresh state without a valid 'files'", path=path)
        return cls(
            patch=data["patch"],
            revision=data["revision"],
            from_variant=data["from_variant"],
            from_sha256=data["from_sha256"],
            base=data["base"],
            vllm=data["vllm"],
            versions=tuple(str(v) for v in data["versions"]),
            files=files,
            moves=moves,
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
                rel: None if data is None else hashlib.sha256(data).hexdigest()
                for rel, data in job.files.items()
            },
        )
        text = json.dumps(state.to_json(), indent=2) + "\n"
        state_path.write_text(text, encoding="utf-8")  # last
    except OSError as exc:
        if created:
            shutil.rmtree(work, ignore_errors=True)
        raise UsageError(f"cannot write the work folder: {exc.strerror}", path=work) from None


def load_state(work: Path, patch_id: str) -> RefreshState:
    path = work / STATE
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UsageError(f"no unfinished refresh of {patch_id} here", path=work) from None
    except (OSError, ValueError) as exc:
        raise UsageError(f"unreadable refresh state: {exc}", path=path) from None
    state = RefreshState.from_json(data, path=path)
    if state.patch != patch_id:
        raise UsageError(f"this is a refresh of {state.patch!r}, not {patch_id}", path=path)
    return state


def stored_release(work: Path, rel: str, sha: str | None) -> bytes | None:
    if sha is None:
        return None
    path = work / STATE
    kept = path.parent / "release" / rel
    data = kept.read_bytes() if kept.is_file() else b""
    if hashlib.sha256(data).hexdigest() != sha:
        raise UsageError("the release's copy was changed: start again (--abort)", path=kept)
    return data


def remove_work(work: Path) -> None:
    try:
        shutil.rmtree(work)
        if work.parent.name == WORK_FOLDER and not any(work.parent.iterdir()):
            work.parent.rmdir()
    except OSError as exc:  # the registry is written: a leftover folder is only clutter
        LOG.warning("could not remove the work folder %s: %s", work, exc.strerror)
