"""The registry as commands read it: a patch that does not load is skipped with a warning
naming it (asking for it by id still raises its problem); `validate` lists every one."""

from __future__ import annotations

from pathlib import Path

from patchset.cli.output import err_console
from patchset.registry import Registry, load_registry


def load(root: Path) -> Registry:
    registry = load_registry(root, tolerant=True)
    for patch_id, problem in registry.problems.items():
        err_console().print(
            f"patchset: warning: skipped patch {patch_id!r}: {problem}",
            markup=False,
            soft_wrap=True,
        )
    return registry
