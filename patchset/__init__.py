"""patchset: a versioned patch registry, apply engine, release check and image builds for vLLM.

The public API, for other projects' CI (docs/api.md)::

    import patchset
    registry = patchset.load_registry("patches")          # a patchset.Registry
    report = patchset.check(registry, ["0.20.0"])          # a CheckReport, schema patchset.check/1
    assert report.exit_code == 0, report.to_dict()
    applied = patchset.apply(registry, "/path/to/site-packages", dry_run=True)

Every name is imported on first use (`import patchset` itself is cheap, so the command line
can take over Ctrl-C before the heavy imports), and `patchset.build` keeps the Docker SDK out
until it is asked for. `patchset.check` is the function; its package's other names come from
`patchset.release_check` as usual (`from patchset.release_check import CheckReport`).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from patchset.adapters.actions import escape_data, escape_property, workflow_command
    from patchset.engine.apply import ApplyReport, PatchResult, apply, revert
    from patchset.errors import ExitCode, PatchsetError
    from patchset.image.build import BuildReport, build
    from patchset.registry import Patch, Registry, Variant, load_registry
    from patchset.release_check import CheckReport, CheckResult, check

__version__ = "0.1.0"

__all__ = [
    "ApplyReport",
    "BuildReport",
    "CheckReport",
    "CheckResult",
    "ExitCode",
    "Patch",
    "PatchResult",
    "PatchsetError",
    "Registry",
    "Variant",
    "__version__",
    "apply",
    "build",
    "check",
    "escape_data",
    "escape_property",
    "load_registry",
    "revert",
    "workflow_command",
]

_WHERE = {
    **dict.fromkeys(("escape_data", "escape_property", "workflow_command"), "adapters.actions"),
    **dict.fromkeys(("ApplyReport", "PatchResult", "apply", "revert"), "engine.apply"),
    **dict.fromkeys(("ExitCode", "PatchsetError"), "errors"),
    **dict.fromkeys(("BuildReport", "build"), "image.build"),  # the Docker SDK: only on use
    **dict.fromkeys(("Patch", "Registry", "Variant", "load_registry"), "registry"),
    **dict.fromkeys(("CheckReport", "CheckResult", "check"), "release_check"),
}


def __getattr__(name: str) -> Any:
    """A public name, imported from its module on first use (then kept here)."""
    if name not in _WHERE:
        raise AttributeError(f"module 'patchset' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"patchset.{_WHERE[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
