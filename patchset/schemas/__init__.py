"""The JSON Schemas patchset ships: its reports, and the files a project writes.

Reports: ``load("check")`` is the schema of ``patchset.check/1`` (`patchset check --format
json`, ``CheckReport.to_dict()``); ``load("build")`` that of ``patchset.build/1``
(report.json); ``load("apply")`` that of ``patchset.apply/1`` (`apply`/`revert --format json`);
``load("upstream")``, ``load("bump")`` and ``load("check-builds")`` those of
``patchset.upstream/1`` (`patchset upstream`), ``patchset.bump/1`` (`patchset bump`) and
``patchset.check-builds/1`` (`patchset check --build/--builds`), all with ``--format json``.

Files: ``load("patch")`` (patches/<id>/patch.toml), ``load("sites")`` (a runtime payload),
``load("support")`` (patches/_support/<name>/support.toml), ``load("build-definition")``
(builds/<name>.toml) and ``load("tool-patchset")`` (the
`[tool.patchset]` table of pyproject.toml). `patchset validate` checks every such file
against them (`check_document`) besides loading it, so the schemas cannot drift from what
loads; `patchset init` points editors at them.
"""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

from patchset.errors import RegistryError

# Schemas of what patchset writes (a "schema" tag each), then of the files people write.
REPORTS = ("check", "build", "apply", "upstream", "bump", "check-builds")
FILES = ("patch", "sites", "support", "build-definition", "tool-patchset")
NAMES = REPORTS + FILES


def load(name: str) -> dict[str, Any]:
    if name not in NAMES:
        raise ValueError(f"no schema {name!r}; there are {', '.join(NAMES)}")
    schema: dict[str, Any] = json.loads(text(name))
    return schema


def text(name: str) -> str:
    """The schema's JSON text, as shipped."""
    return resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")


def check_document(name: str, data: object, *, path: Path | str, where: str = "") -> None:
    """Raise a RegistryError naming `path` and the key when `data` breaks schema `name`."""
    import jsonschema  # noqa: PLC0415  (only validate needs it)

    validator = jsonschema.Draft202012Validator(load(name))
    error = jsonschema.exceptions.best_match(validator.iter_errors(data))
    if error is None:
        return
    keys = [where] if where else []
    keys += [str(part) if isinstance(part, str) else f"[{part}]" for part in error.absolute_path]
    at = ".".join(keys).replace(".[", "[")
    raise RegistryError(
        f"{at + ': ' if at else ''}{error.message} (JSON Schema {name}.json)", path=path
    )


def document_problems(name: str, data: object, *, where: str = "") -> list[str]:
    """Every way `data` breaks schema `name`, one line each (key path: message); [] if none."""
    import jsonschema  # noqa: PLC0415  (only validate needs it)

    validator = jsonschema.Draft202012Validator(load(name))
    lines = []
    for error in sorted(validator.iter_errors(data), key=lambda e: list(map(str, e.path))):
        keys = [where] if where else []
        keys += [str(p) if isinstance(p, str) else f"[{p}]" for p in error.absolute_path]
        at = ".".join(keys).replace(".[", "[")
        lines.append(f"{at + ': ' if at else ''}{error.message}")
    return lines


def check_project(
    registry_root: Path, *, builds: Path | None = None, pyproject: Path | None = None
) -> int:
    """Check the project's files against their schemas: every patch.toml and runtime payload
    under `registry_root`, every builds/*.toml, and pyproject.toml's `[tool.patchset]`.
    Returns how many were checked; the first that breaks its schema raises a RegistryError."""
    from patchset.registry.toml import load_toml  # noqa: PLC0415  (schemas stay import-light)

    checked = 0
    folders = sorted(p for p in registry_root.iterdir() if p.is_dir() and p.name[0] not in "._")
    support = registry_root / "_support"
    for file in sorted(support.glob("*/support.toml")) if support.is_dir() else []:
        check_document("support", load_toml(file), path=file)
        checked += 1
    for folder in folders:
        data = load_toml(folder / "patch.toml")
        check_document("patch", data, path=folder / "patch.toml")
        checked += 1
        if data.get("kind") == "runtime":
            names = [v.get("payload") for v in data.get("variants", [])] or [
                data.get("payload", "sites.toml")
            ]
            for name in names:
                check_document("sites", load_toml(folder / name), path=folder / name)
                checked += 1
    for path in sorted(builds.glob("*.toml")) if builds is not None and builds.is_dir() else []:
        check_document("build-definition", load_toml(path), path=path)
        checked += 1
    if pyproject is not None:
        tool = load_toml(pyproject).get("tool", {}).get("patchset")
        if tool is not None:
            check_document("tool-patchset", tool, path=pyproject, where="tool.patchset")
            checked += 1
    return checked
