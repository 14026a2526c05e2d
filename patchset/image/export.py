"""`patchset runtime export`: patches for the stock vLLM image, without building anything.

The bundle is the same standard-library runtime a built image carries under /opt/patchset
(the entrypoint and `patchset.kernel` as ``patchset_kernel``), a manifest with
``"delivery": "stock"``, the definition's payloads (for provenance), the python patches as a
plugin distribution under ``plugins/``, a ``compose.yaml`` service and the equivalent
``docker run`` line. Mounted read-only at /opt/patchset into the stock image and started with
``--entrypoint python3 ... /opt/patchset/entrypoint.py``, it applies every patch (build-time
ones too) to the container's vLLM, checks and compiles the result, then execs ``vllm serve``.

The files are checked against the release's own files, read from a release source (the
package index by default, as `check` reads it): the sha256 of each file before and after goes
into the manifest, so the container refuses a file that is not the release's.
"""

from __future__ import annotations

import json
import shlex
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset._fs import replace_folder
from patchset.errors import TargetError, UsageError
from patchset.image.build import runtime_sources
from patchset.image.compose_in import ComposeIn, command_text, environment, image_for, judged
from patchset.image.content import LogSink, carried, choose
from patchset.image.manifest import RUNTIME_DIR
from patchset.image.plan import refuse
from patchset.image.support import needed
from patchset.image.support import said_left_out as support_left_out
from patchset.image.switchnames import FILE, bundle_names
from patchset.kernel import stack
from patchset.kernel.manifest import Base, PatchEntry
from patchset.registry import Registry
from patchset.registry.builds import BuildDefinition
from patchset.sources import ReleaseSource, parse_source

SERVICE = "vllm"
PORT = "8000"
REPORT_KEYS = ("id", "revision", "kind", "apply", "variant", "payload_sha256")
HF_CACHE = "~/.cache/huggingface:/root/.cache/huggingface"


@dataclass(frozen=True)
class ExportReport:
    folder: Path
    definition: str
    vllm: str
    base: str
    registry: str
    release_files: str  # where the release's files came from (the source's origin)
    patches: tuple[PatchEntry, ...]
    files: tuple[str, ...]  # every file written, relative to `folder`
    docker_run: str
    compose_in: tuple[str, ...] = ()  # --compose: each switch-like variable, as judged
    support_left_out: tuple[int, int] = (0, 0)  # support files no patch imports: count, bytes

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "patchset.runtime-export/1",
            "folder": str(self.folder),
            "definition": self.definition,
            "vllm": self.vllm,
            "base": self.base,
            "registry": self.registry,
            "release_files": self.release_files,
            "patches": [p.summary(REPORT_KEYS) for p in self.patches],
            "files": list(self.files),
            "docker_run": self.docker_run,
            "compose_in": list(self.compose_in),
            "support_left_out": dict(zip(("files", "bytes"), self.support_left_out, strict=True)),
        }


def docker_run_args(definition: BuildDefinition, bundle: str) -> list[str]:
    """``docker run`` with the bundle at `bundle` (a host path) mounted read-only."""
    args = ["docker", "run", "--rm", "--gpus", "all", "--ipc=host", "-p", f"{PORT}:{PORT}"]
    args += ["-v", f"{bundle}:{RUNTIME_DIR}:ro", "-v", HF_CACHE.replace("~", "$HOME", 1)]
    for key, value in definition.env.items():
        args += ["-e", f"{key}={value}"]
    args += ["--entrypoint", "python3", definition.base, f"{RUNTIME_DIR}/entrypoint.py"]
    return args


def _yaml(value: str) -> str:
    """A YAML double-quoted scalar (a JSON string is one)."""
    return json.dumps(value)


def compose_yaml(
    definition: BuildDefinition,
    registry: Registry,
    entries: Sequence[PatchEntry] = (),
    carried: ComposeIn | None = None,  # a user's compose file (--compose): theirs carried over
) -> str:
    """The compose service; `entries`' switches listed under `environment:`, each commented
    out with the value that flips it from its default (one line per patch to switch)."""
    lines = [
        f"# Written by `patchset runtime export` from {definition.file.name} (vLLM"
        f" {definition.vllm}, registry {registry.short_digest}).",
        "# The stock image runs patchset's entrypoint from this folder, mounted read-only: it",
        "# applies and checks the patches, then execs `vllm serve` with the definition's",
        "# arguments and those of `command:`. Switches: PATCHSET_DISABLE=id,...,",
        "# PATCHSET_ONLY=id,..., PATCHSET_ON_FAILURE=fail|warn, PATCHSET_COMPUTE_CAPABILITY.",
        "services:",
        f"  {SERVICE}:",
        f"    image: {_yaml(image_for(definition.base, definition.vllm, carried))}",
        f'    entrypoint: ["python3", "{RUNTIME_DIR}/entrypoint.py"]',
        f"    command: {command_text(carried)}",
        "    volumes:",
        f"      - {_yaml(f'./:{RUNTIME_DIR}:ro')}",
        f"      - {_yaml(HF_CACHE)}",
        "    environment:",
    ]
    env = environment(definition.env, carried)
    lines += [f"      {k}:" + ("" if v is None else f" {_yaml(v)}") for k, v in env.items()]
    switches = [e for e in entries if e.switch is not None and e.switch not in env]
    if switches:
        lines.append(
            "      # Per-patch switches: uncomment a line to flip that patch from its default."
        )
    for entry in switches:
        state = "on" if entry.switch_default else "off"
        flip = "0" if entry.switch_default else "1"
        lines.append(f'      # {entry.switch}: "{flip}"  # {entry.id}: {state} by default')
    lines += [
        '      PATCHSET_ON_FAILURE: "fail"',
        "    ports:",
        f'      - "{PORT}:{PORT}"',
        "    ipc: host",
        "    deploy:",
        "      resources:",
        "        reservations:",
        "          devices:",
        "            - driver: nvidia",
        "              count: all",
        "              capabilities: [gpu]",
    ]
    return "\n".join(lines) + "\n"


def shell_line(args: list[str]) -> str:
    """`args` as one shell line; $HERE and $HOME (and only they) expand when it runs."""
    return " ".join(f'"{a}"' if "$HERE" in a or "$HOME" in a else shlex.quote(a) for a in args)


def _run_script(definition: BuildDefinition) -> str:
    quoted = shell_line(docker_run_args(definition, "$HERE"))
    return (
        "#!/bin/sh\n"
        "# The `docker run` equivalent of compose.yaml; extra arguments go to `vllm serve`.\n"
        'HERE="$(cd "$(dirname "$0")" && pwd)"\n'
        f'exec {quoted} "$@"\n'
    )


def _check_folder(folder: Path) -> None:
    """`folder` is new, empty, or an earlier export (replaced whole)."""
    if not folder.exists():
        return
    if not folder.is_dir():
        raise TargetError("not a folder", path=folder)
    entries = list(folder.iterdir())
    if entries and not (folder / "manifest.json").is_file():
        raise TargetError(
            "folder is not empty and holds no earlier export: pick a new one", path=folder
        )


def export_runtime(
    definition: BuildDefinition,
    registry: Registry,
    folder: Path,
    *,
    source: ReleaseSource | None = None,
    log: LogSink | None = None,
    strict: bool = False,
    compose: ComposeIn | None = None,
    switches: Sequence[str] = (),
) -> ExportReport:
    """Write the stock-image bundle of `definition` to `folder`; nothing half-written. A
    patch whose upstream fix the release already holds is left out with a line (`strict`:
    refused). The planner runs first, with the defaults and each switch set of `switches`
    (`all`, or `ENV=1,ENV=0,...`): every refusal is raised at once."""
    sink: LogSink = log or (lambda _line: None)
    _check_folder(folder)
    source = source or parse_source(None)
    with source.open(definition.vllm) as tree:
        origin = tree.info.origin

        def release(wanted: list[str]) -> dict[str, bytes | None]:
            return {rel: tree.read(rel) for rel in wanted}

        read = refuse(definition, registry, release, switches)
        definition.check_patches(registry)  # what the planner found already: never raises
        sink(f"release files: {origin}")
        chosen = choose(definition, registry, read, strict=strict, log=sink)
        python_files = [rel for rel in chosen.targets if rel.endswith(".py")]
        units = stack.units_document(read(python_files) if python_files else {})
    variants, entries = chosen.variants, chosen.entries
    manifest, plugins, support = carried(
        definition,
        registry,
        variants,
        entries,
        delivery="stock",
        base=Base(definition.base),
        release_files=origin,  # vllm_root: found at start by the image's own python3
        targets=chosen.targets,  # the release's own files: the start checks each once
    )
    files: dict[str, bytes] = {**runtime_sources(), **support}
    dropped = support_left_out(needed(registry, variants), support, sink)
    files["manifest.json"] = manifest.dumps().encode()
    for patch_id, variant in variants.items():
        patch = registry.get(patch_id)
        for name in ("patch.toml", variant.name):
            files[f"payloads/{patch_id}/{name}"] = (patch.folder / name).read_bytes()
    for rel, data in plugins.items():
        files[f"plugins/{rel}"] = data
    files[stack.UNITS_FILE] = units.encode()  # the start compiles only the units changed
    names = bundle_names(registry, definition, entries)  # the switch names the start checks
    files[FILE] = names.dumps().encode()
    compose_in = judged(compose, names, entries) if compose is not None else []
    files["compose.yaml"] = compose_yaml(definition, registry, entries, compose).encode()
    files["docker-run.sh"] = _run_script(definition).encode()
    _write_bundle(folder, files)
    sink(f"wrote {len(files)} files to {folder}")
    return ExportReport(
        folder=folder,
        definition=definition.name,
        vllm=definition.vllm,
        base=definition.base,
        registry=registry.digest,
        release_files=origin,
        patches=tuple(entries),
        files=tuple(sorted(files)),
        docker_run=shell_line(docker_run_args(definition, str(folder.resolve()))),
        compose_in=tuple(compose_in),
        support_left_out=dropped,
    )


def _write_bundle(folder: Path, files: dict[str, bytes]) -> None:
    """Write into a sibling staging folder, then swap it in: readable by every user (the
    container may run as another one), never half-written."""
    folder.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{folder.name}.", dir=folder.parent))
    try:
        for rel, data in files.items():
            path = staging / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            path.chmod(0o755 if rel == "docker-run.sh" else 0o644)
        for sub in sorted({p for p in staging.rglob("*") if p.is_dir()}):
            sub.chmod(0o755)
        staging.chmod(0o755)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    replace_folder(staging, folder)


def default_definition(builds: Path) -> Path:
    """The one definition in `builds`, when there is exactly one."""
    found = sorted(builds.glob("*.toml")) if builds.is_dir() else []
    if len(found) != 1:
        names = ", ".join(p.name for p in found) or "none"
        raise UsageError(f"say which definition with --build ({builds} holds {names})")
    return found[0]


__all__ = [
    "ExportReport",
    "compose_yaml",
    "default_definition",
    "docker_run_args",
    "export_runtime",
]
