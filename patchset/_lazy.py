"""A package's names imported from their modules on first use (PEP 562): one module of the
package is imported without the rest of it (a kept check report is printed without loading
the registry). `patchset` itself has its own (`import patchset` imports nothing else)."""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any


def exports(
    package: str, where: Mapping[str, str], names: Sequence[str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`: each name of `where` imported from the
    module it maps to when first asked for (then kept in the package), `names` listed."""

    def getattr_(name: str) -> Any:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)
        setattr(sys.modules[package], name, value)
        return value

    def dir_() -> list[str]:
        return sorted({*vars(sys.modules[package]), *names})

    return getattr_, dir_


__all__ = ["exports"]
