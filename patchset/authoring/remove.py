"""`patchset remove ID`: a patch folder taken out of the registry, whole, and only when nothing
else stands on it: patches that require it, conflict with it or name it as their successor,
and build definitions that list it, are named and the removal refused."""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from patchset.errors import RegistryError, UsageError
from patchset.registry import load_registry
from patchset.registry.builds import load_definitions
from patchset.registry.lock import registry_lock


def remove(root: Path, patch_id: str, *, builds: Path | None = None) -> Path:
    """Remove `root/patch_id/`; refused (nothing removed) while anything names it. Returns
    the folder removed."""
    registry = load_registry(root, tolerant=True)
    # A half-written patch (one with problems) may be removed: that is often the fix. An
    # unknown id is UnknownPatchError, with the close ids named.
    half = patch_id in registry.problems
    folder = root / patch_id if half else registry.get(patch_id).folder
    if not folder.is_dir() or folder.is_symlink() or folder.name.startswith((".", "_")):
        raise UsageError(f"{patch_id}: not a patch folder of the registry", path=folder)
    others = [p for p in registry.patches if p.id != patch_id]
    users = [
        *(f"{p.id} requires it" for p in others if patch_id in p.requires),
        *(f"{p.id} names it in conflicts" for p in others if patch_id in p.conflicts),
        *(f"{p.id} is superseded by it" for p in others if p.lifecycle.superseded_by == patch_id),
    ]
    if builds is not None and builds.is_dir():
        users += [
            f"build definition {d.file.name} lists it"
            for d in load_definitions(builds)
            if patch_id in d.patches
        ]
    if users:
        raise UsageError(
            f"{patch_id} is still named: {'; '.join(users)}; remove or edit those first",
            path=folder,
        )
    try:
        with registry_lock(root):  # an import's swap waits for it
            aside = Path(tempfile.mkdtemp(prefix=f".remove-{patch_id}-", dir=root))
            folder.rename(aside / patch_id)  # one rename: the registry never holds half of it
    except OSError as exc:
        raise RegistryError(
            f"cannot remove it ({exc.strerror}); nothing was removed", path=folder
        ) from None
    shutil.rmtree(aside, ignore_errors=True)
    return folder
