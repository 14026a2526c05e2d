"""Genesis's import-time wiring: a module without a TextPatcher, whose `apply()` rebinds
vLLM names, imported as a python patch calling it.

The facts of the collection this relies on are in `patchset.importers.genesis`.
"""

from __future__ import annotations

from patchset.importers.genesis.registry import PACKAGE
from patchset.importers.model import Skipped
from patchset.importers.pystatic import Scope, rebinds
from patchset.registry.write import TomlData


def python_patch(
    gid: str, module: str, scope: Scope, meta: TomlData, lost: list[str]
) -> dict[str, str]:
    if "apply" not in scope.functions:
        raise Skipped(f"{module} defines no apply()")
    touches, approximate = rebinds(scope)
    if not touches:
        raise Skipped(f"{module}: rebinds no vLLM name that can be read statically")
    if approximate:
        lost.append("touches are the vLLM names it imports (what it rebinds is not readable)")
    meta["kind"] = "python"
    meta["touches"] = touches
    meta["targets"] = list(
        dict.fromkeys(t.partition(":")[0].replace(".", "/") + ".py" for t in touches)
    )
    plugin = f'''"""Genesis {gid}: calls the collection's own wiring, {module}.apply().

Imported by `patchset import genesis`; the collection's package comes from the registry's
support package `{PACKAGE}` (patches/_support/{PACKAGE}/).
"""

MODULE = {module!r}


def apply():
    import importlib

    result = importlib.import_module(MODULE).apply()
    status = result[0] if isinstance(result, tuple) and result else result
    if status == "failed":
        raise RuntimeError(f"Genesis {gid}: {{result[1] if isinstance(result, tuple) else result}}")
    return result
'''
    return {"plugin.py": plugin}
