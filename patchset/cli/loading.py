"""The registry as commands read it: a patch that does not load is skipped with a warning
naming it (asking for it by id still raises its problem); `validate` lists every one."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path

from patchset import __version__
from patchset.cachedir import cache_root
from patchset.cli.output import err_console
from patchset.registry import Registry, load_registry


def load(root: Path, asked: Sequence[str] | None = None) -> Registry:
    """The registry, warning about each patch that does not load, except those `asked` for
    by id (their problem is the error, when the command gets them)."""
    registry = load_registry(root, tolerant=True, parsed=parsed_file(root))
    for line in warnings(registry, asked):
        err_console().print(line, markup=False, soft_wrap=True)
    return registry


def warnings(registry: Registry, asked: Sequence[str] | None = None) -> list[str]:
    """The warning `load` gives for each patch that did not load, but those `asked` for."""
    lines = []
    for patch_id, problem in registry.problems.items():
        if asked and patch_id in asked:
            continue
        what = "support package" if patch_id.startswith("_") else "patch"
        lines.append(f"patchset: warning: skipped {what} {patch_id!r}: {problem}")
    return lines


def parsed_file(root: Path) -> Path:
    """Where what TOML parsing made of the registry at `root` is kept between runs (one file a
    registry folder and patchset version, in the cache: `registry.toml.parsed_cache`)."""
    where = hashlib.sha256(str(Path(root).resolve()).encode("utf-8", "surrogateescape"))
    return cache_root() / "registry" / f"parsed-{__version__}-{where.hexdigest()[:16]}.json"
