"""`patchset build`: a thin patched image on top of an official vLLM image.

The base is used as it is (pulled only when not local); vLLM is found inside it by running its
own Python; the target files are copied out, patched with the same engine as `patchset apply`,
and copied back in one layer beside the standard-library runtime that applies startup patches
and execs `vllm serve`. Nothing is tagged unless the build and its verification succeed.
"""

from __future__ import annotations

import dataclasses
import json
import shlex
import tempfile
from dataclasses import dataclass, field
from datetime import UTC, datetime
from importlib import resources
from pathlib import Path
from typing import Any

from patchset.adapters import dockerengine, gitrepo
from patchset.errors import BuildError, DockerError
from patchset.image.content import LogSink, carried, choose
from patchset.image.manifest import RUNTIME_DIR, labels, public_source
from patchset.image.plan import refuse
from patchset.image.switchnames import FILE as SWITCH_NAMES
from patchset.image.switchnames import bundle_names
from patchset.image.verify import verify_image
from patchset.kernel import tree, vllm
from patchset.kernel.manifest import Base, Manifest, PatchEntry
from patchset.registry import Registry
from patchset.registry.builds import BuildDefinition

REPORT_KEYS = ("id", "revision", "apply", "variant", "payload_sha256", "verdict")


@dataclass(frozen=True)
class BuildReport:
    name: str
    base: str
    base_id: str
    base_digest: str
    vllm: str
    vllm_root: str
    registry: str
    image_id: str
    tags: tuple[str, ...]
    patches: tuple[PatchEntry, ...]
    added_bytes: int
    pushed: dict[str, str] = field(default_factory=dict)
    log: str = ""

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": "patchset.build/1",
            "name": self.name,
            "base": {"name": self.base, "id": self.base_id, "digest": self.base_digest},
            "vllm": self.vllm,
            "vllm_root": self.vllm_root,
            "registry": self.registry,
            "image_id": self.image_id,
            "tags": list(self.tags),
            "patches": [p.summary(REPORT_KEYS) for p in self.patches],
            "added_bytes": self.added_bytes,
            "pushed": self.pushed,
            "log": self.log,
        }


def runtime_sources() -> dict[str, bytes]:
    """The files of the in-image runtime, keyed by their path under /opt/patchset.

    The entrypoint, and `patchset.kernel` copied whole as the top-level package
    `patchset_kernel` (its modules import each other relatively, so the name does not matter).
    """
    package = resources.files("patchset")
    files = {"entrypoint.py": package.joinpath("image", "runtime", "entrypoint.py").read_bytes()}
    for item in package.joinpath("kernel").iterdir():
        if item.name.endswith(".py"):
            files[f"patchset_kernel/{item.name}"] = item.read_bytes()
    return files


def locate_vllm(engine: dockerengine.Engine, image: str) -> tuple[str, str | None]:
    out = engine.run_python(image, vllm.locate_script(), network=False)
    found = json.loads(out.strip().splitlines()[-1])
    if not found.get("root"):
        raise BuildError(f"{image}: its python3 finds no vllm package")
    return str(found["root"]), found.get("version")


def build(
    definition: BuildDefinition,
    registry: Registry,
    *,
    extra_tags: tuple[str, ...] = (),
    push: bool = False,
    nocache: bool = False,
    output: Path | None = None,
    on_log: LogSink | None = None,
    engine: dockerengine.Engine | None = None,
    strict: bool = False,
) -> BuildReport:
    """Build, verify and tag (and push) the image of `definition`; raise on any failure.
    A patch whose upstream fix the base already holds is left out with a line (`strict`:
    refused)."""
    definition.check_patches(registry)
    log_lines: list[str] = []

    def log(line: str) -> None:
        log_lines.append(line)
        if on_log is not None:
            on_log(line)

    own_engine = engine is None
    engine = engine or dockerengine.connect()
    try:
        report = _build(
            definition,
            registry,
            engine,
            extra_tags=extra_tags,
            push=push,
            nocache=nocache,
            log=log,
            strict=strict,
        )
    except BaseException:
        _write_outputs(output, None, log_lines)
        raise
    finally:
        if own_engine:
            engine.close()
    report = dataclasses.replace(report, log=str(output / "build.log") if output else "")
    _write_outputs(output, report, log_lines)
    return report


def _write_outputs(output: Path | None, report: BuildReport | None, lines: list[str]) -> None:
    if output is None:
        return
    output.mkdir(parents=True, exist_ok=True)
    (output / "build.log").write_text("\n".join(lines) + "\n", encoding="utf-8")
    if report is not None:
        (output / "report.json").write_text(json.dumps(report.to_dict(), indent=2) + "\n")


@dataclass(frozen=True)
class PreparedContext:
    """A build context folder (Dockerfile, patched files, runtime) and what goes with it."""

    folder: Path
    base: dockerengine.ImageInfo
    base_digest: str  # the base's repo digest, or its ID when it has none
    vllm_root: str  # the folder holding vllm/ in the base
    labels: dict[str, str]
    tags: tuple[str, ...]  # the definition's tags (no extra ones)
    entries: tuple[PatchEntry, ...]  # the manifest's patch entries


def prepare_context(
    definition: BuildDefinition,
    registry: Registry,
    engine: dockerengine.Engine,
    folder: Path,
    *,
    from_ref: str | None = None,
    log: LogSink | None = None,
    strict: bool = False,
) -> PreparedContext:
    """Write the build context of `definition` into `folder`: find vLLM in the base, copy its
    target files out, patch them, and lay out the Dockerfile, files and runtime.

    The Dockerfile starts ``FROM <from_ref>``: the base's local image ID by default (what
    `build` uses); `patchset bake` passes the base's name pinned by digest instead, which a
    remote builder can pull.
    """
    sink: LogSink = log or (lambda _line: None)
    base = engine.ensure_image(definition.base, on_log=sink)
    base_digest = next((d.split("@", 1)[1] for d in base.repo_digests if "@" in d), base.id)
    sink(f"base {definition.base}: {base.id} ({base_digest})")
    root, found_version = locate_vllm(engine, base.id)
    sink(f"vllm {found_version} at {root}")
    if found_version is not None and found_version.split("+")[0] != definition.vllm:
        raise BuildError(
            f"{definition.base} holds vLLM {found_version}, the definition says {definition.vllm}",
            path=definition.file,
        )
    modes: dict[str, int] = {}

    def copy_out(wanted: list[str]) -> dict[str, bytes | None]:
        copied = engine.copy_files(base.id, [f"{root}/{rel}" for rel in wanted])
        found = {rel: copied[f"{root}/{rel}"] for rel in wanted}
        modes.update((rel, f.mode) for rel, f in found.items() if f is not None)
        return {rel: None if f is None else f.data for rel, f in found.items()}

    read = refuse(definition, registry, copy_out, delivery="image")  # every refusal at once
    chosen = choose(definition, registry, read, strict=strict, log=sink)
    variants, patched, entries = chosen.variants, chosen.patched, chosen.entries
    build_ids = [e.id for e in entries if e.apply == "build"]
    short = registry.short_digest
    revision, source = gitrepo.provenance(registry.root)
    image_labels = labels(
        base=definition.base,
        base_digest=base_digest,
        version=f"{definition.vllm}-{definition.cuda}-ps{short}",
        created=datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        revision=revision,
        source=public_source(source),
        registry=registry.digest,
        entries=entries,
    )
    manifest, plugins, support = carried(
        definition,
        registry,
        variants,
        entries,
        delivery="image",
        base=Base(definition.base, base.id, base_digest),
        vllm_root=root,
        targets=chosen.built,  # the files as built: the start's patches go on top
    )
    _write_context(
        folder,
        definition=definition,
        from_ref=from_ref or base.id,
        root=root,
        build_ids=build_ids,
        patched=patched,
        manifest=manifest,
        plugins=plugins,
        modes=modes,
        support=support,
        switch_names=bundle_names(registry, definition, entries, at="build").dumps(),
    )
    return PreparedContext(
        folder=folder,
        base=base,
        base_digest=base_digest,
        vllm_root=root,
        labels=image_labels,
        tags=definition.tag_names(registry.digest),
        entries=tuple(entries),
    )


def _build(
    definition: BuildDefinition,
    registry: Registry,
    engine: dockerengine.Engine,
    *,
    extra_tags: tuple[str, ...],
    push: bool,
    nocache: bool,
    log: LogSink,
    strict: bool = False,
) -> BuildReport:
    with tempfile.TemporaryDirectory(prefix="patchset-build-") as tmp:
        context = prepare_context(
            definition, registry, engine, Path(tmp) / "context", log=log, strict=strict
        )
        base, base_digest, root = context.base, context.base_digest, context.vllm_root
        entries = context.entries
        tags = (*context.tags, *extra_tags)
        image_id = engine.build(
            context.folder, (), labels=context.labels, nocache=nocache, on_log=log
        )
    try:
        _verify(engine, image_id, log)
        for ref in tags:
            engine.tag(image_id, ref)
            log(f"tagged {ref}")
        pushed = {}
        if push:
            for ref in tags:
                pushed[ref] = engine.push(ref, on_log=log)
                log(f"pushed {ref} {pushed[ref]}")
    except BaseException:
        for ref in tags:
            try:
                engine.untag(ref)
            except DockerError as exc:  # the first error is the one to report
                log(f"could not remove tag {ref}: {exc}")
        raise
    added = engine.image_size(image_id) - base.size
    return BuildReport(
        name=definition.name,
        base=definition.base,
        base_id=base.id,
        base_digest=base_digest,
        vllm=definition.vllm,
        vllm_root=root,
        registry=registry.digest,
        image_id=image_id,
        tags=tags,
        patches=entries,
        added_bytes=added,
        pushed=pushed,
    )


def _write_context(
    context: Path,
    *,
    definition: BuildDefinition,
    from_ref: str,
    root: str,
    build_ids: list[str],
    patched: dict[str, bytes],
    manifest: Manifest,
    plugins: dict[str, bytes],
    modes: dict[str, int] | None = None,
    support: dict[str, bytes] | None = None,
    switch_names: str | None = None,
) -> None:
    """The build context, laid out by the kernel's rules for vLLM's files (`kernel/tree.py`,
    those of `apply` and the entrypoint): `modes` holds the base's permission bits of the
    files it had, kept (a `COPY` gives each file the context's mode); a new file gets 644, or
    755 when the payload makes it executable; a deletion's emptied folders go after it.
    `switch_names`: the ``switches.json`` the start checks switch names with, as a bundle's."""
    runtime = context / "runtime"
    for rel, data in {**runtime_sources(), **(support or {})}.items():
        (runtime / rel).parent.mkdir(parents=True, exist_ok=True)
        (runtime / rel).write_bytes(data)
    (runtime / "manifest.json").write_text(manifest.dumps())
    if switch_names is not None:
        (runtime / SWITCH_NAMES).write_text(switch_names)
    built = {f for e in manifest.patches if e.apply == "build" for f in e.files}
    lines = [f"FROM {from_ref}"]
    if build_ids:
        executable = {f for e in manifest.patches for f in e.executable}
        for rel in sorted(built & patched.keys()):
            (context / "files" / rel).parent.mkdir(parents=True, exist_ok=True)
            (context / "files" / rel).write_bytes(patched[rel])
            mode = tree.file_mode((modes or {}).get(rel), executable=rel in executable)
            (context / "files" / rel).chmod(mode)  # COPY takes the context's mode
        if built & patched.keys():
            lines.append(f"COPY files/ {root}/")
        if deleted := sorted(built - patched.keys()):  # a diff deleted them
            lines.append(_removal(root, deleted))
    if plugins:  # an installed distribution in vLLM's site folder: its entry points load
        for rel, data in plugins.items():
            (context / "plugins" / rel).parent.mkdir(parents=True, exist_ok=True)
            (context / "plugins" / rel).write_bytes(data)
        lines.append(f"COPY plugins/ {root}/")
    lines.append(f"COPY runtime/ {RUNTIME_DIR}/")
    for key, value in definition.env.items():
        lines.append(f"ENV {key}={json.dumps(value)}")
    lines += [
        f'ENTRYPOINT ["python3", "{RUNTIME_DIR}/entrypoint.py"]',
        "CMD []",
    ]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")


def _removal(root: str, deleted: list[str]) -> str:
    """The RUN line deleting files a build patch deletes, then the folders that may leave
    empty (the kernel's `emptied_candidates`, deepest first; `rmdir` takes only an empty one,
    so each goes exactly when `emptied_folders` says it would; POSIX sh)."""
    emptied = tree.emptied_candidates(deleted)
    line = "RUN rm -f -- " + " ".join(shlex.quote(f"{root}/{r}") for r in deleted)
    if emptied:
        quoted = " ".join(shlex.quote(f"{root}/{f}") for f in emptied)
        line += f' && for d in {quoted}; do rmdir -- "$d" 2>/dev/null || true; done'
    return line


def _verify(engine: dockerengine.Engine, image_id: str, log: LogSink) -> None:
    result = verify_image(engine, image_id)
    for r in result.results:
        log(f"verify {r.patch} ({r.apply}): {r.state}")
    if not result.ok:
        first = result.failed[0] if result.failed else None
        why = f"{first.patch}: {first.state}" if first else result.error
        raise BuildError(f"the built image fails verification: {why}")
