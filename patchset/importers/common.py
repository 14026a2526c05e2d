"""What both importers share: the collection's provenance, the imports a text makes."""

from __future__ import annotations

import re
from pathlib import Path

from patchset.adapters.gitrepo import provenance

_IMPORT = re.compile(
    r"^\s*(?:from\s+([A-Za-z_][\w.]*)\s+import\b|import\s+([A-Za-z_][\w.]*))", re.M
)


def origin_of(folder: Path, default: str) -> tuple[str, str | None]:
    """(owner/name, commit) of the checkout: the repository from its `origin` remote where
    it names one (a mirror folder `owner+name/repo` too), else `default`."""
    revision, source = provenance(folder)
    commit = revision.removesuffix("-dirty") if revision != "unknown" else None
    repository = default
    parts = [p for p in re.split(r"[/:]", source.removesuffix(".git")) if p]
    if parts and parts[-1] == "repo" and len(parts) >= 2 and "+" in parts[-2]:
        repository = parts[-2].replace("+", "/", 1)
    elif len(parts) >= 2 and source != str(folder.resolve()):
        candidate = f"{parts[-2]}/{parts[-1]}"
        if re.match(r"^[\w.-]+/[\w.-]+$", candidate):
            repository = candidate
    return repository, commit


def imported_modules(text: str, package: str) -> list[str]:
    """The modules of `package` an inserted text imports (`from sndr.x import y`, `import
    sndr.x`), read line by line: a site's text is a fragment, not a module."""
    found: list[str] = []
    for match in _IMPORT.finditer(text):
        module = match.group(1) or match.group(2)
        if module == package or module.startswith(package + "."):
            found.append(module)
    return list(dict.fromkeys(found))
