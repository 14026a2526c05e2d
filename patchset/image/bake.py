"""`patchset bake`: a BuildKit bake file for the build definitions, so `docker buildx bake`
can build the whole matrix on any builder, local or remote.

Each target's context is the one `patchset build` prepares (the same patched files, runtime,
manifest, labels and tags), written to ``<bake file stem>.contexts/<target>/`` beside the bake
file, with one difference: the Dockerfile starts ``FROM <base>@<repo digest>`` (when the base
has one) instead of the local image ID, which only the local engine knows. Bake resolves a
relative ``context`` from the folder it runs in (docker/buildx#1028), so run it from the
folder that holds the bake file. A bake build is not verified: `patchset verify IMAGE` does it.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset._fs import replace_folder, write_atomic
from patchset.adapters import dockerengine
from patchset.errors import UsageError
from patchset.image.build import prepare_context
from patchset.image.content import LogSink
from patchset.registry import Registry
from patchset.registry.builds import BuildDefinition

_NOT_IN_NAME = re.compile(r"[^A-Za-z0-9_-]+")


@dataclass(frozen=True)
class BakeTarget:
    name: str  # e.g. build-0-19-1
    definition: str  # the build definition's name, e.g. 0.19.1
    context: Path  # the context folder (as written, beside the bake file)
    base: str  # the Dockerfile's FROM
    tags: tuple[str, ...]
    labels: dict[str, str]


@dataclass(frozen=True)
class BakeResult:
    file: Path
    targets: tuple[BakeTarget, ...]
    data: dict[str, Any]  # the bake file's content


def target_name(definition: BuildDefinition) -> str:
    """`build-` and the definition's name with dots (and anything else bake refuses in a
    target name) turned into dashes: 0.19.1 -> build-0-19-1, like `nox -s build-0.19.1`."""
    return "build-" + _NOT_IN_NAME.sub("-", definition.name).strip("-")


def contexts_folder(bake_file: Path) -> Path:
    return bake_file.with_name(f"{bake_file.stem}.contexts")


def pinned_base(definition: BuildDefinition, info: dockerengine.ImageInfo) -> str:
    """The base reference a remote builder can pull: the name pinned by its repo digest."""
    if "@" in definition.base:
        return definition.base
    digest = next((d.split("@", 1)[1] for d in info.repo_digests if "@" in d), None)
    return f"{definition.base}@{digest}" if digest else definition.base


def bake(
    definitions: Sequence[BuildDefinition],
    registry: Registry,
    output: Path,
    *,
    extra_tags: Sequence[str] = (),
    engine: dockerengine.Engine | None = None,
    log: LogSink | None = None,
) -> BakeResult:
    """Write `output` (the bake JSON) and a context folder per definition beside it. The
    contexts are prepared in a temporary folder and swapped in with the file at the end, so a
    failure leaves the previous bake file and contexts as they were."""
    names = [target_name(d) for d in definitions]
    if len(set(names)) != len(names):
        clash = next(n for n in names if names.count(n) > 1)
        raise UsageError(f"two build definitions give the bake target {clash}")
    for definition in definitions:
        definition.check_patches(registry)
    output.parent.mkdir(parents=True, exist_ok=True)
    final = contexts_folder(output)
    own_engine = engine is None
    engine = engine or dockerengine.connect()
    staging = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=output.parent))
    try:
        targets = []
        for definition, name in zip(definitions, names, strict=True):
            info = engine.ensure_image(definition.base, on_log=log)
            base = pinned_base(definition, info)
            context = prepare_context(
                definition, registry, engine, staging / name, from_ref=base, log=log
            )
            targets.append(
                BakeTarget(
                    name=name,
                    definition=definition.name,
                    context=final / name,
                    base=base,
                    tags=(*context.tags, *extra_tags),
                    labels=context.labels,
                )
            )
        data = bake_data(targets, contexts=final.name)
        text = json.dumps(data, indent=2) + "\n"
        replace_folder(staging, final)
        write_atomic(output, text.encode())  # the contexts it names are in place first
    finally:
        shutil.rmtree(staging, ignore_errors=True)
        if own_engine:
            engine.close()
    return BakeResult(file=output, targets=tuple(targets), data=data)


def bake_data(targets: Sequence[BakeTarget], *, contexts: str) -> dict[str, Any]:
    """The bake file: a `default` group of every target, and per target its context
    (`<contexts>/<target>`, relative to the bake file's folder), Dockerfile, tags, labels."""
    return {
        "group": {"default": {"targets": [t.name for t in targets]}},
        "target": {
            t.name: {
                "context": f"{contexts}/{t.name}",
                "dockerfile": "Dockerfile",
                "tags": list(t.tags),
                "labels": dict(t.labels),
            }
            for t in targets
        },
    }
