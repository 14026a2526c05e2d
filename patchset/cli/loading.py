"""The registry as commands read it: a patch that does not load is skipped with a warning
naming it (asking for it by id still raises its problem); `validate` lists every one."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from patchset.cli.output import err_console
from patchset.registry import Registry, load_registry


def load(root: Path, asked: Sequence[str] | None = None) -> Registry:
    """The registry, warning about each patch that does not load, except those `asked` for
    by id (their problem is the error, when the command gets them)."""
    registry = load_registry(root, tolerant=True)
    for patch_id, problem in registry.problems.items():
        if asked and patch_id in asked:
            continue
        what = "support package" if patch_id.startswith("_") else "patch"
        err_console().print(
            f"patchset: warning: skipped {what} {patch_id!r}: {problem}",
            markup=False,
            soft_wrap=True,
        )
    return registry
