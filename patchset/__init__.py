"""patchset: a versioned patch registry, apply engine, release check and image builds for vLLM.

The public API, for other projects' CI (docs/api.md)::

    import patchset
    registry = patchset.load_registry("patches")          # a patchset.Registry
    report = patchset.check(registry, ["0.20.0"])          # a CheckReport, schema patchset.check/1
    assert report.exit_code == 0, report.to_dict()
    applied = patchset.apply(registry, "/path/to/site-packages", dry_run=True)

`patchset.build` is imported on first use, so `import patchset` does not import the Docker SDK.
`patchset.check` is the function; its package's other names come from `patchset.release_check` as
usual (`from patchset.release_check import CheckReport`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from patchset.adapters.actions import escape_data, escape_property, workflow_command
from patchset.engine.apply import ApplyReport, PatchResult, apply, revert
from patchset.errors import ExitCode, PatchsetError
from patchset.registry import Patch, Registry, Variant, load_registry
from patchset.release_check import CheckReport, CheckResult, check

if TYPE_CHECKING:
    from patchset.image.build import BuildReport, build

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

_LAZY = {"build", "BuildReport"}  # patchset.image.build imports the Docker SDK


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        from patchset.image import build as image_build  # noqa: PLC0415 - imported on first use

        return getattr(image_build, name)
    raise AttributeError(f"module 'patchset' has no attribute {name!r}")
