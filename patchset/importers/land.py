"""Writing an import into the project: whole or not at all, and again on a newer checkout.

The registry's writer lock is held from the copy to the swap (`registry.lock`: an `add` or
another import waits). The registry folder is copied beside itself, every change is made in
the copy, the copy is loaded (a patch that does not load is put back as it was and listed),
then the copy is swapped in for the registry by `_fs.replace_folder` (journaled: a kill at
any point leaves the old registry or the new one, and the next writer finishes or undoes the
swap). A full disk is one line, exit 2, the registry as it was. Files in a patch folder that
the import did not write (a `NOTES.md`, a `research/` folder) are kept, and named.

What was imported is kept in
`<registry>/.imported/<collection>.json` (inside the registry, so it is swapped with it): per
patch, the collection's id, the patch.toml data and each payload's sha256 as imported. On the
next import a key or a payload whose current value differs from what was imported is the
user's edit: it is kept, and named.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import json
import os
import shutil
import tempfile
import tomllib
from collections.abc import Iterator, Mapping
from pathlib import Path

from patchset._fs import replace_folder, write_atomic
from patchset.errors import RegistryError
from patchset.importers.model import (
    STATE_FOLDER,
    SUPPORT_FOLDER,
    Collected,
    Draft,
    Entry,
    ImportReport,
    Support,
)
from patchset.registry import load_registry, patch_problems
from patchset.registry.lock import IMPORT_STAGE, registry_lock
from patchset.registry.support import import_problems
from patchset.registry.write import toml_text, write_patch_folder, write_text

HEADER = "Written by `patchset import`; edits are kept by the next import (and named)."
_SKIP_COPY = shutil.ignore_patterns("__pycache__", "*.pyc", ".git")
# Other writers' work in progress (an `add`'s staging folder, a temp file): not carried over
_TRANSIENT = shutil.ignore_patterns(".add-*", ".remove-*", ".*.tmp", ".patchset-registry.lock")


def _sha(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def state_file(registry: Path, collection: str) -> Path:
    return registry / STATE_FOLDER / f"{collection}.json"


def read_state(registry: Path, collection: str) -> dict[str, dict[str, object]]:
    path = state_file(registry, collection)
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    patches = data.get("patches") if isinstance(data, dict) else None
    return patches if isinstance(patches, dict) else {}


_WHERE = ("revision", "provenance")  # where it came from: no change of the patch itself


def _comparable(meta: Mapping[str, object]) -> dict[str, object]:
    """The patch as imported, less its revision and where it stood in the collection (a new
    commit, or lines moved by other entries, change no patch)."""
    out = {k: v for k, v in meta.items() if k not in _WHERE}
    x = out.get("x")
    if isinstance(x, dict):
        out["x"] = {k: v for k, v in x.items() if not k.endswith("_line")}
    return out


def _same_origin(folder: Path, collected: Collected, draft: Draft) -> bool:
    """Whether a patch folder not in the state was imported from the same collection patch."""
    try:
        data = tomllib.loads((folder / "patch.toml").read_text())
    except (OSError, ValueError):
        return False
    provenance = data.get("provenance")
    if not isinstance(provenance, dict) or provenance.get("collection") != collected.collection:
        return False
    x = data.get("x")
    source = x.get(f"{collected.collection.replace('-', '_')}_id") if isinstance(x, dict) else None
    return source in (None, draft.source_id)


def land(
    collected: Collected,
    registry: Path,
    *,
    dry_run: bool = False,
    only: set[str] | None = None,
    builds: Path | None = None,
) -> ImportReport:
    with _exclusive(registry, dry_run=dry_run):
        return _land(collected, registry, dry_run=dry_run, only=only, builds=builds)


@contextlib.contextmanager
def _exclusive(registry: Path, *, dry_run: bool) -> Iterator[None]:
    """The registry's writer lock (not for a dry run), and a full disk as one line."""
    if dry_run:
        yield
        return
    try:
        registry.parent.mkdir(parents=True, exist_ok=True)
        with registry_lock(registry):
            yield
    except OSError as exc:
        if not _disk_full(exc):
            raise
        raise RegistryError(
            "the disk is full (No space left on device); nothing was imported", path=registry
        ) from None


def _disk_full(exc: OSError) -> bool:
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return True
    # shutil.copytree gathers its failures in one shutil.Error: (src, dst, why) each
    return isinstance(exc, shutil.Error) and any(
        os.strerror(errno.ENOSPC) in str(why) or os.strerror(errno.EDQUOT) in str(why)
        for *_, why in (exc.args[0] if exc.args and isinstance(exc.args[0], list) else [])
    )


def _land(
    collected: Collected,
    registry: Path,
    *,
    dry_run: bool,
    only: set[str] | None,
    builds: Path | None,
) -> ImportReport:
    state = read_state(registry, collected.collection)
    entries: list[Entry] = []
    new_state: dict[str, dict[str, object]] = dict(state)
    with _stage(registry, dry_run=dry_run) as stage:
        written: list[Draft] = []
        for draft in collected.drafts:
            entry = _one(draft, collected, stage, state, new_state, dry_run=dry_run)
            entries.append(entry)
            if entry.action in ("added", "updated"):
                written.append(draft)
        if not dry_run:
            for support in collected.supports:
                if (
                    any(support.name in d.support for d in written)
                    or not (stage / SUPPORT_FOLDER / support.name).is_dir()
                ):
                    _write_support(stage, support)
            _drop_unloadable(stage, registry, written, entries, new_state, state)
        seen = {d.id for d in collected.drafts}
        for pid, record in state.items():
            source = str(record.get("source", pid))
            if pid in seen or (only and source not in only and pid not in only):
                continue
            entries.append(
                Entry(
                    source, "not-imported", pid, ["no longer in the collection (kept)"], "removed"
                )
            )
        if not dry_run:
            _write_state(stage, collected, new_state)
    entries += collected.entries
    built: list[str] = []
    if builds is not None and collected.builds:
        built = _write_builds(builds, collected.builds, dry_run=dry_run)
    return ImportReport(
        collected.collection,
        collected.commit,
        entries,
        dict(collected.broken),
        dry_run,
        built,
        ran=list(collected.ran),
    )


def _one(
    draft: Draft,
    collected: Collected,
    stage: Path,
    state: dict[str, dict[str, object]],
    new_state: dict[str, dict[str, object]],
    *,
    dry_run: bool,
) -> Entry:
    entry = Entry(draft.source_id, draft.status, draft.id, list(draft.lost))
    folder = stage / draft.id
    previous = state.get(draft.id)
    record: dict[str, object] = {
        "source": draft.source_id,
        "meta": _comparable(draft.meta),
        "payloads": {n: _sha(t) for n, t in draft.payloads.items()},
    }
    if not folder.exists():
        entry.action = "would-add" if dry_run else "added"
        if not dry_run:
            _write_patch(folder, draft.meta, draft.payloads)
            new_state[draft.id] = {**record, "revision": 1}
        return entry
    if previous is None and not _same_origin(folder, collected, draft):
        entry.status = "not-imported"
        entry.reasons = [
            f"id clash: the project's own patch {draft.id} is not from this collection"
        ]
        return entry
    try:
        current = tomllib.loads((folder / "patch.toml").read_text())
    except (OSError, ValueError) as exc:
        entry.status = "not-imported"
        entry.reasons = [f"{draft.id}/patch.toml does not read ({exc}): left as it is"]
        return entry
    before = previous or {"meta": _comparable(current), "payloads": {}}
    old_meta = before.get("meta")
    old_payloads = before.get("payloads")
    assert isinstance(old_meta, dict) and isinstance(old_payloads, dict)
    if old_meta == record["meta"] and old_payloads == record["payloads"]:
        entry.action = "unchanged"
        return entry
    meta = dict(draft.meta)
    kept: list[str] = []
    for key, value in _comparable(current).items():
        if (key not in old_meta or old_meta.get(key) != value) and meta.get(key) != value:
            meta[key] = value
            kept.append(key)
    for key in old_meta:
        if key not in current and key in meta:
            del meta[key]
            kept.append(f"{key} (removed)")
    payloads = dict(draft.payloads)
    for name, digest in old_payloads.items():
        path = folder / name
        if path.is_file() and hashlib.sha256(path.read_bytes()).hexdigest() != digest:
            payloads[name] = path.read_text()
            kept.append(name)
    revision = current.get("revision")
    meta["revision"] = (revision if isinstance(revision, int) else 1) + 1
    entry.action = "updated"
    theirs = _not_written_by_import(folder, {*old_payloads, *payloads})
    entry.kept = kept + [f"{name} (not the import's: kept)" for name in theirs]
    if not dry_run:
        _write_patch(folder, meta, payloads, clean={*old_payloads, *payloads})
        new_state[draft.id] = {**record, "revision": meta["revision"]}
    return entry


def _not_written_by_import(folder: Path, ours: set[str]) -> list[str]:
    """The files (and folders) in a patch folder that no import wrote: the user's own."""
    if not folder.is_dir():
        return []
    return sorted(
        p.name + ("/" if p.is_dir() and not p.is_symlink() else "")
        for p in folder.iterdir()
        if p.name != "patch.toml" and p.name not in ours
    )


def _write_patch(
    folder: Path,
    meta: Mapping[str, object],
    payloads: Mapping[str, str],
    *,
    clean: set[str] | None = None,
) -> None:
    """The patch folder as the import makes it; an update (`clean`: the payload names an
    import wrote there) removes only those and patch.toml, keeping every other file."""
    if clean is not None and folder.exists():
        for name in [*clean, "patch.toml"]:
            path = folder / name
            if path.is_file() or path.is_symlink():
                path.unlink()
    folder.mkdir(parents=True, exist_ok=clean is not None)
    write_patch_folder(folder, meta, payloads, header=HEADER, durable=False)


def _write_support(stage: Path, support: Support) -> None:
    folder = stage / SUPPORT_FOLDER / support.name
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    text = toml_text(support.meta, header="Written by `patchset import`.")
    write_text(folder / "support.toml", text, durable=False)
    path = support.meta.get("path")
    if isinstance(path, str):
        shutil.copytree(support.source, folder / path / support.package, ignore=_SKIP_COPY)


def _drop_unloadable(  # noqa: PLR0917 - the stage, and what was written to it
    stage: Path,
    registry: Path,
    written: list[Draft],
    entries: list[Entry],
    new_state: dict[str, dict[str, object]],
    state: dict[str, dict[str, object]],
) -> None:
    """Each written patch that does not load is put back as it was (or taken out), listed."""
    loaded = load_registry(stage, tolerant=True)
    by_id = {e.patch: e for e in entries}
    patches = {p.id: p for p in loaded.patches}
    for draft in written:
        if draft.id in loaded.problems:
            problems = patch_problems(stage / draft.id)
            why = str(problems[0]) if problems else str(loaded.problems[draft.id])
        else:  # what validate reads besides: the imports of its inserted text
            found = import_problems(patches[draft.id], loaded.support)
            if not found:
                continue
            why = f"validate refuses it: {found[0]}"
        shutil.rmtree(stage / draft.id)
        if (registry / draft.id).is_dir():
            shutil.copytree(registry / draft.id, stage / draft.id, symlinks=True)
        if draft.id in state:
            new_state[draft.id] = state[draft.id]
        else:
            new_state.pop(draft.id, None)
        entry = by_id[draft.id]
        entry.status, entry.action = "not-imported", "none"
        why = why.replace(str(stage), str(registry))
        entry.reasons = [why if why.startswith("validate") else f"does not load: {why}"]


def _write_state(stage: Path, collected: Collected, patches: dict[str, dict[str, object]]) -> None:
    folder = stage / STATE_FOLDER
    folder.mkdir(exist_ok=True)
    data = {
        "collection": collected.collection,
        "repository": collected.repository,
        "commit": collected.commit,
        "patches": patches,
    }
    (folder / f"{collected.collection}.json").write_text(
        json.dumps(data, indent=1, sort_keys=True) + "\n"
    )


@contextlib.contextmanager
def _stage(registry: Path, *, dry_run: bool) -> Iterator[Path]:
    """A copy of the registry to change; swapped in for it when the block ends without an
    error (a dry run: the registry itself, never written)."""
    if dry_run:
        yield registry
        return
    parent = registry.parent
    parent.mkdir(parents=True, exist_ok=True)
    stage = Path(tempfile.mkdtemp(prefix=f"{IMPORT_STAGE}{registry.name}-", dir=parent))
    try:
        if registry.is_dir():
            shutil.copytree(registry, stage, symlinks=True, dirs_exist_ok=True, ignore=_TRANSIENT)
        else:
            stage.chmod(0o777 & ~_umask())
        yield stage
        _carry_staging(registry, stage)
        replace_folder(stage, registry)
    finally:
        shutil.rmtree(stage, ignore_errors=True)


def _carry_staging(registry: Path, stage: Path) -> None:
    """An `add` under way stages its patch in `.add-*` inside the registry (and takes the
    lock only to move it in): those folders are moved into the new copy just before the
    swap, so the add goes on writing there and finishes into the registry that is."""
    if not registry.is_dir():
        return
    for folder in registry.glob(".add-*"):
        if folder.is_dir() and not folder.is_symlink() and not (stage / folder.name).exists():
            with contextlib.suppress(OSError):
                folder.rename(stage / folder.name)


def _umask() -> int:
    mask = os.umask(0o22)
    os.umask(mask)
    return mask


def _write_builds(builds: Path, files: Mapping[str, str], *, dry_run: bool) -> list[str]:
    """Build definitions: each written (atomically) unless one of that name exists with
    other content (the user's own, kept)."""
    done = []
    for name, text in files.items():
        path = builds / name
        if path.is_file() and path.read_text() != text:
            continue
        done.append(name)
        if not dry_run:
            builds.mkdir(parents=True, exist_ok=True)
            write_atomic(path, text.encode())
    return done
