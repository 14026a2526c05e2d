"""Where a project keeps its patches and build definitions, and `patchset init` to lay them out.

Each setting is taken from the first of: the command-line flag (`--registry`, `--builds`), the
environment (`PATCHSET_REGISTRY`, `PATCHSET_BUILDS`), the `[tool.patchset]` table of the
nearest `pyproject.toml` (searching up from the working folder; paths relative to that file),
and the default `patches` / `builds` (beside that `pyproject.toml` when it has the table, else
in the working folder).

The table also holds defaults for the commands that read releases: `index-url` (`--index-url`),
`offline` (`--offline`), `cache-dir` (`$PATCHSET_CACHE_DIR`) and `since` (`check --since` when
no release is named). Its JSON Schema is `patchset/schemas/tool-patchset.json`.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from patchset import schemas
from patchset._fs import write_atomic
from patchset.errors import RegistryError
from patchset.registry.toml import TOO_DEEP, Table, load_toml

PYPROJECT = "pyproject.toml"
ENV = {"registry": "PATCHSET_REGISTRY", "builds": "PATCHSET_BUILDS"}
DEFAULTS = {"registry": "patches", "builds": "builds"}


@dataclass(frozen=True)
class ToolTable:
    """The validated `[tool.patchset]` table; paths relative to its pyproject.toml."""

    pyproject: Path
    registry: str | None = None
    builds: str | None = None
    index_url: str | None = None
    offline: bool = False
    cache_dir: str | None = None
    since: str | None = None

    def get(self, key: str, default: str) -> str:
        value = getattr(self, key)
        return value if isinstance(value, str) else default


@dataclass(frozen=True)
class Project:
    registry: Path
    builds: Path
    pyproject: Path | None = None  # the file whose [tool.patchset] table was read
    index_url: str | None = None
    offline: bool = False
    cache_dir: Path | None = None
    since: str | None = None


def find_pyproject(start: Path) -> Path | None:
    """The nearest pyproject.toml in `start` or a folder above it."""
    start = start.absolute()
    for folder in (start, *start.parents):
        candidate = folder / PYPROJECT
        if candidate.is_file():
            return candidate
    return None


def read_tool_table(pyproject: Path) -> ToolTable | None:
    """The validated `[tool.patchset]` table of `pyproject`, or None when it has none."""
    data = load_toml(pyproject)
    tool = data.get("tool")
    if tool is None:
        return None
    if not isinstance(tool, dict):
        raise RegistryError(f"tool: expected a table, got {type(tool).__name__}", path=pyproject)
    if "patchset" not in tool:
        return None
    table = Table(tool["patchset"], file=pyproject, where="tool.patchset")
    result = ToolTable(
        pyproject=pyproject,
        registry=table.opt_str("registry", required=False),
        builds=table.opt_str("builds", required=False),
        index_url=table.opt_str("index-url", required=False),
        offline=table.flag("offline", default=False),
        cache_dir=table.opt_str("cache-dir", required=False),
        since=table.version("since"),
    )
    table.finish()
    return result


def resolve(
    *,
    registry: Path | None = None,
    builds: Path | None = None,
    cwd: Path | None = None,
    environ: Mapping[str, str] | None = None,
) -> Project:
    """The registry and builds folders to use (see the module docstring for the order)."""
    environ = os.environ if environ is None else environ
    given = {"registry": registry, "builds": builds}
    chosen: dict[str, Path | None] = {
        key: value if value is not None else _env_path(environ.get(ENV[key]))
        for key, value in given.items()
    }
    here = cwd or Path.cwd()
    found = find_pyproject(here)
    table = read_tool_table(found) if found is not None else None
    if table is None:
        return Project(
            registry=chosen["registry"] or Path(DEFAULTS["registry"]),
            builds=chosen["builds"] or Path(DEFAULTS["builds"]),
        )
    for key, default in DEFAULTS.items():
        if chosen[key] is None:
            chosen[key] = _beside(table.pyproject, table.get(key, default), here)
    return Project(
        registry=chosen["registry"] or Path(DEFAULTS["registry"]),
        builds=chosen["builds"] or Path(DEFAULTS["builds"]),
        pyproject=table.pyproject,
        index_url=table.index_url,
        offline=table.offline,
        cache_dir=(
            table.pyproject.parent / Path(table.cache_dir).expanduser() if table.cache_dir else None
        ),
        since=table.since,
    )


def _env_path(value: str | None) -> Path | None:
    return Path(value).expanduser() if value else None


def _beside(pyproject: Path, value: str, cwd: Path) -> Path:
    """`value` relative to the pyproject's folder, shown relative to `cwd` when inside it."""
    path = pyproject.parent / Path(value).expanduser()
    try:
        return path.relative_to(cwd.absolute())
    except ValueError:
        return path


# -- patchset init ---------------------------------------------------------------------------

PATCHES_README = """\
# Patches

One folder per patch: `<id>/patch.toml` plus its payload (`patch.diff` or `sites.toml`).
Add one with `patchset add ID --pr owner/repo#N`, `patchset add ID --diff FILE` or
`patchset add --runtime ID`; check them with `patchset validate` and `patchset check`.
"""

SCHEMA_FOLDER = ".patchset/schemas"  # copies of the shipped file schemas, for editors

TAPLO = """\
# Editors with a TOML language server (taplo, "Even Better TOML") check patchset's files
# against the JSON Schemas `patchset init` copied into .patchset/schemas/ (`patchset validate`
# checks them too). Delete that folder and run `patchset init` again after upgrading patchset.
[[rule]]
include = ["patches/*/patch.toml"]
schema = { path = "./.patchset/schemas/patch.json" }

[[rule]]
include = ["patches/*/sites.toml", "patches/*/*.sites.toml"]
schema = { path = "./.patchset/schemas/sites.json" }

[[rule]]
include = ["builds/*.toml", "builds/*.toml.sample"]
schema = { path = "./.patchset/schemas/build-definition.json" }
"""

EXAMPLE_BUILD = """\
#:schema ../.patchset/schemas/build-definition.json
# An example build definition. Copy it to <vLLM version>.toml (e.g. 0.19.1.toml), remove the
# leading '# ' of each line below and fill in your own; every *.toml in this folder is a build
# target of `patchset build` and `patchset bake`. This file (.sample) is never read.
#
# vllm = "0.19.1"
# cuda = "cu130"
# base = "vllm/vllm-openai:v0.19.1-cu130"
# repository = "registry.example:5000/me/vllm-openai"
# # <vllm>-<cuda> moves with the registry; <vllm>-<cuda>-ps<digest> never does.
# tags = ["{vllm}-{cuda}", "{vllm}-{cuda}-ps{registry}"]
# patches = ["my-patch-id"]
#
# [env]
# VLLM_USE_FLASHINFER_SAMPLER = "1"
#
# [serve]
# args = ["--model", "org/model", "--max-model-len", "32768"]
"""


@dataclass(frozen=True)
class InitResult:
    root: Path
    created: tuple[Path, ...]  # files and folders written
    kept: tuple[Path, ...]  # already there, left as they were


def init_project(root: Path) -> InitResult:
    """Lay out `root/patches/`, `root/builds/` (with a commented example) and the
    `[tool.patchset]` table of `root/pyproject.toml`; anything already there is kept. A write
    that fails (a full disk) removes what this run made: one line, nothing half-laid-out."""
    from patchset.registry.write import why_not_written  # noqa: PLC0415 -- slow: `init` only

    root.mkdir(parents=True, exist_ok=True)
    made: list[Path] = []  # what this run made, in order: removed again if a write fails
    try:
        return _lay_out(root, made)
    except OSError as exc:
        for path in reversed(made):
            if path.is_dir() and not path.is_symlink():
                shutil.rmtree(path, ignore_errors=True)
            else:  # pyproject.toml is not here: written last, whole or not at all
                path.unlink(missing_ok=True)
        raise RegistryError(
            f"{why_not_written(exc)}; nothing was laid out", path=exc.filename or root
        ) from None


def _lay_out(root: Path, made: list[Path]) -> InitResult:
    created: list[Path] = []
    kept: list[Path] = []
    for folder, name, text in (
        (root / DEFAULTS["registry"], "README.md", PATCHES_README),
        (root / DEFAULTS["builds"], "example.toml.sample", EXAMPLE_BUILD),
    ):
        if folder.exists() and not folder.is_dir():
            raise RegistryError("exists and is not a folder", path=folder)
        if folder.is_dir():
            kept.append(folder)
            continue
        folder.mkdir()
        made.append(folder)
        (folder / name).write_text(text, encoding="utf-8")
        created += [folder, folder / name]
    schema_folder = root / SCHEMA_FOLDER
    if schema_folder.is_dir():
        kept.append(schema_folder)
    else:
        top = next(p for p in (schema_folder, *schema_folder.parents) if p.parent.exists())
        schema_folder.mkdir(parents=True)
        made.append(top)
        for name in schemas.FILES:
            (schema_folder / f"{name}.json").write_text(schemas.text(name), encoding="utf-8")
        created.append(schema_folder)
    taplo = root / ".taplo.toml"
    if taplo.exists():
        kept.append(taplo)
    else:
        made.append(taplo)
        taplo.write_text(TAPLO, encoding="utf-8")
        created.append(taplo)
    pyproject = root / PYPROJECT
    if _add_tool_table(pyproject):
        created.append(pyproject)
    else:
        kept.append(pyproject)
    return InitResult(root=root, created=tuple(created), kept=tuple(kept))


def _add_tool_table(pyproject: Path) -> bool:
    """Add `[tool.patchset]` to `pyproject` (created if missing), keeping its style;
    False when the table is there already."""
    import tomlkit  # noqa: PLC0415 -- `init` only: slow to import
    from tomlkit.exceptions import TOMLKitError  # noqa: PLC0415

    existing = pyproject.read_text(encoding="utf-8") if pyproject.is_file() else ""
    try:
        doc = tomlkit.parse(existing)
    except TOMLKitError as exc:
        raise RegistryError(f"not valid TOML: {exc}", path=pyproject) from None
    except RecursionError:
        raise RegistryError(TOO_DEEP, path=pyproject) from None
    tool = doc.get("tool")
    if tool is not None and "patchset" in tool:
        read_tool_table(pyproject)  # an existing table must still be a valid one
        return False
    table = tomlkit.table()
    table.add(tomlkit.comment("Where `patchset` finds this project's patches and builds; the keys"))
    table.add(tomlkit.comment("are in .patchset/schemas/tool-patchset.json (docs/projects.md)."))
    table.add("registry", DEFAULTS["registry"])
    table.add("builds", DEFAULTS["builds"])
    if tool is None:
        tool = tomlkit.table(is_super_table=True)
        tool.add("patchset", table)
        if existing and not existing.endswith("\n\n"):
            doc.add(tomlkit.nl())
        doc.add("tool", tool)
    else:
        tool.add("patchset", table)
    text = tomlkit.dumps(doc)
    write_atomic(pyproject, text.encode("utf-8"))
    return True
