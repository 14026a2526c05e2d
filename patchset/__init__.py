"""patchset: a versioned patch registry, apply engine, release check and image builds for vLLM.

The public API, for other projects' CI::

    import patchset
    registry = patchset.load_registry("patches")
    report = patchset.apply(registry, "/path/to/site-packages", dry_run=True)
    assert report.exit_code == 0, report.to_dict()
"""

from patchset.engine.apply import ApplyReport, PatchResult, apply, revert
from patchset.errors import ExitCode, PatchsetError
from patchset.registry import Patch, Registry, Variant, load_registry

__version__ = "0.1.0"

__all__ = [
    "ApplyReport",
    "ExitCode",
    "Patch",
    "PatchResult",
    "PatchsetError",
    "Registry",
    "Variant",
    "__version__",
    "apply",
    "load_registry",
    "revert",
]
