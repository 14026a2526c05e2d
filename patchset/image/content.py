"""What an image or a stock-image bundle carries, chosen and checked the same way for both
(`patchset build` and `runtime export`): the payload of each patch for the release, the
patches left out (retired, `[applies]` false, upstream already), the release files they
need, the files patched at build, each patch's manifest entry, and the manifest itself.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchset.engine.apply import apply
from patchset.engine.evaluate import evaluate
from patchset.engine.order import in_order
from patchset.errors import BuildError
from patchset.image.manifest import patch_entry
from patchset.image.plugins import plugin_files
from patchset.image.support import needed, support_files, wanted_modules
from patchset.kernel import tree
from patchset.kernel.manifest import Base, Manifest, PatchEntry
from patchset.kernel.modelconfig import undecided
from patchset.kernel.predicates import Facts
from patchset.kernel.predicates import evaluate as evaluate_predicate
from patchset.kernel.sites import served_from_args
from patchset.kernel.touches import touch_files
from patchset.registry import Patch, Registry, Variant
from patchset.registry.builds import BuildDefinition

LogSink = Callable[[str], None]
Reader = Callable[[list[str]], dict[str, bytes | None]]  # release paths -> bytes (None: none)


@dataclass(frozen=True)
class Content:
    """What an image or a bundle carries: each kept patch's payload, the release files as the
    build patches leave them, and each patch's manifest entry."""

    variants: dict[str, Variant]
    patched: dict[str, bytes]
    entries: list[PatchEntry]
    targets: dict[str, str]  # each target file's sha256 in the release ("": none)
    built: dict[str, str]  # the same once the build patches are in (what an image holds)


def choose(
    definition: BuildDefinition,
    registry: Registry,
    read: Reader,
    *,
    strict: bool,
    log: LogSink,
) -> Content:
    """The definition's patches for its release, with the release files they need (`read`),
    less those that are no part of it (`without_upstream`), patched and checked
    (`patch_files`): `patchset build` and `runtime export` alike."""
    variants = pick_variants(definition, registry)
    originals = read(wanted_files(registry, variants))
    variants = without_upstream(definition, registry, variants, originals, strict=strict, log=log)
    patched, entries = patch_files(
        definition, registry, variants=variants, originals=originals, log=log
    )
    targets = {
        rel: tree.digest(originals.get(rel))
        for e in entries
        if e.kind != "python"
        for rel in e.files
    }
    built = dict(targets)
    for rel in {rel for e in entries if e.apply == "build" for rel in e.files}:
        built[rel] = tree.digest(patched.get(rel))
    return Content(
        variants, patched, entries, dict(sorted(targets.items())), dict(sorted(built.items()))
    )


def carried(
    definition: BuildDefinition,
    registry: Registry,
    variants: dict[str, Variant],
    entries: list[PatchEntry],
    *,
    delivery: Literal["image", "stock"],
    base: Base,
    vllm_root: str | None = None,
    release_files: str | None = None,
    targets: dict[str, str] | None = None,
) -> tuple[Manifest, dict[str, bytes], dict[str, bytes]]:
    """The manifest of an image or a bundle, and the files it carries besides: the plugin
    distribution (python patches) and the support packages, each by path, their sha256 in
    the manifest for the start to check."""
    plugins = plugin_files(python_patches(registry, variants))
    support, support_paths = support_files(
        needed(registry, variants), wanted_modules(registry, variants)
    )
    manifest = Manifest(
        delivery=delivery,
        registry=registry.digest,
        vllm=definition.vllm,
        vllm_root=vllm_root,
        base=base,
        release_files=release_files,
        serve_args=tuple(definition.serve_args),
        env=dict(definition.env),
        patches=tuple(entries),
        plugins={rel: tree.sha256(data) for rel, data in plugins.items()},
        support={rel: tree.sha256(data) for rel, data in support.items()},
        support_paths=tuple(support_paths),
        targets=dict(targets or {}),
    )
    return manifest, plugins, support


def pick_variants(definition: BuildDefinition, registry: Registry) -> dict[str, Variant]:
    """The payload of each of the definition's patches meant for its vLLM release."""
    variants: dict[str, Variant] = {}
    for patch in registry.select(definition.patches):
        variant = patch.variant_for(definition.vllm)
        if variant is None:
            raise BuildError(f"{patch.id} has no payload for vLLM {definition.vllm}")
        variants[patch.id] = variant
    return variants


def wanted_files(registry: Registry, variants: dict[str, Variant]) -> list[str]:
    """The release files the patches need: those they edit, and the modules python ones touch."""
    files = {f for v in variants.values() for f in v.files}
    pythons = [registry.get(i) for i in variants if registry.get(i).kind == "python"]
    files |= {t for p in pythons for t in p.targets}
    files |= {f for p in pythons for touch in p.touches for f in touch_files(touch)}
    chosen = registry.select(list(variants)) if variants else ()
    files |= {p.upstream.probe.file for p in chosen if p.upstream.probe}
    return sorted(files)


def _out_here(definition: BuildDefinition, patch: Patch) -> str | None:
    """Why `patch` is no part of this image at all (retired; its `[applies]` false for the
    definition's served configuration), or None. Hardware and version leaves are left for
    the start, which knows the GPU and the image's torch."""
    if patch.lifecycle.retired(definition.vllm):
        return f"{patch.id}: {patch.lifecycle.describe(definition.vllm)}: never exported or built"
    served = served_from_args(definition.serve_args)
    verdict = evaluate_predicate(
        patch.applies, Facts(served=served, unknown_served=undecided(served))
    )
    if verdict.value is False:
        assert patch.applies is not None
        return (
            f"{patch.id}: applies = {patch.applies.describe()} is false for the definition's"
            " served configuration"
        )
    return None


def without_upstream(
    definition: BuildDefinition,
    registry: Registry,
    variants: dict[str, Variant],
    originals: dict[str, bytes | None],
    *,
    strict: bool,
    log: LogSink,
) -> dict[str, Variant]:
    """`variants` less the patches that are no part of this image: retired ones, those whose
    `[applies]` is false for the served configuration, and those whose upstream fix the
    release holds already (their probe matches its file; with `strict`, refused): each left
    out with a line, as `apply` reports it `upstream`."""
    kept: dict[str, Variant] = {}
    for patch_id, variant in variants.items():
        if (why := _out_here(definition, registry.get(patch_id))) is not None:
            log(f"{why}; left out")
            continue
        probe = registry.get(patch_id).upstream.probe
        data = None if probe is None else originals.get(probe.file)
        text = None if data is None else data.decode("utf-8", errors="surrogateescape")
        if probe is None or not probe.matches(text):
            kept[patch_id] = variant
            continue
        why = f"{patch_id}: upstream in {definition.vllm}: nothing to apply ({probe.describe()})"
        if strict:
            raise BuildError(
                f"{why}; --strict refuses it: take it out of patches", path=definition.file
            )
        log(f"{why}; left out")
    return kept


def python_patches(registry: Registry, variants: dict[str, Variant]) -> list[tuple[Patch, Variant]]:
    return [(registry.get(i), v) for i, v in variants.items() if registry.get(i).kind == "python"]


def series(registry: Registry, ids: tuple[str, ...] | list[str]) -> tuple[Patch, ...]:
    """The patches `ids` in the order they go in: those applied at build first (the image
    holds them before its entrypoint runs), each after the patches it requires (the engine's
    order; a build patch never requires a startup one, `check_patches` says so)."""
    ordered = in_order(registry.select(ids))
    return (
        *(p for p in ordered if p.apply == "build"),
        *(p for p in ordered if p.apply != "build"),
    )


def patch_files(
    definition: BuildDefinition,
    registry: Registry,
    *,
    variants: dict[str, Variant],
    originals: dict[str, bytes | None],
    log: LogSink,
) -> tuple[dict[str, bytes], list[PatchEntry]]:
    """Apply the build patches to copies of the base's files (in a scratch tree of their own)
    and check the startup ones."""
    patches = series(registry, list(variants)) if variants else ()  # select([]) is all
    build_ids = [p.id for p in patches if p.apply == "build"]
    served = served_from_args(definition.serve_args)  # what sites' `when` reads
    with tempfile.TemporaryDirectory(prefix="patchset-tree-") as tmp:
        scratch = Path(tmp) / "scratch"
        (scratch / "vllm").mkdir(parents=True)
        (scratch / "vllm" / "__init__.py").write_bytes(b"")
        for rel, data in originals.items():
            if data is not None:
                (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                (scratch / rel).write_bytes(data)
        if build_ids:
            result = apply(  # the image checks the hardware scopes at start: no nvidia-smi here
                registry,
                scratch,
                patches=build_ids,
                version=definition.vllm,
                served=served,
                compute_capability=None,
            )
            bad = [r for r in result.results if r.outcome != "applied"]
            if bad:  # the patch that stopped the run first, then those it kept out
                first = next((r for r in bad if r.outcome != "blocked"), bad[0])
                held = [r.patch for r in bad if r.outcome == "blocked"]
                raise BuildError(
                    f"{first.patch} does not apply to {definition.base}: {first.outcome}: "
                    + "; ".join(first.details[:2])
                    + (f"; it blocked {', '.join(held)} (nothing written)" if held else ""),
                    path=definition.file,
                )
            for r in result.results:
                log(f"patch {r.patch} r{r.revision} ({r.variant}): applied at build")
                for warning in r.warnings:
                    log(f"warning: {r.patch}: {warning}")
        patched = {
            rel: (scratch / rel).read_bytes() for rel in originals if (scratch / rel).is_file()
        }
    # Each patch's files before and after it, in the series' order: a stacked patch is
    # evaluated on the files as the patches before it leave them, as the entrypoint meets them.
    current: dict[str, bytes | None] = dict(originals)
    entries: list[PatchEntry] = []
    first_startup = next((p.id for p in patches if p.apply != "build"), None)
    for patch in patches:
        if patch.id == first_startup and any(
            current.get(rel) != data for rel, data in patched.items()
        ):
            raise BuildError(  # pragma: no cover - the engine and the evaluator disagree
                f"the files patched at build differ from {', '.join(build_ids)} evaluated in turn",
                path=definition.file,
            )
        entries.append(
            _entry(definition, patch, variants[patch.id], current, served=served, log=log)
        )
    return patched, entries


def _entry(
    definition: BuildDefinition,
    patch: Patch,
    variant: Variant,
    current: dict[str, bytes | None],
    *,
    served: dict[str, str],
    log: LogSink,
) -> PatchEntry:
    """`patch`'s manifest entry, evaluated on `current` (updated with its changes)."""
    on_top = f" on top of {', '.join(patch.requires)}" if patch.requires else ""
    files: dict[str, tuple[str, str]] = {}
    if patch.kind == "python":
        ev = evaluate(patch, variant, current.get)
        if ev.state != "applies":
            raise BuildError(
                f"{patch.id} (python) touches names {definition.base} lacks: "
                + "; ".join(ev.missing),
                path=definition.file,
            )
        log(f"patch {patch.id} r{patch.revision} ({variant.name}): plugin, touches found")
        return patch_entry(patch, variant, "needed", files, switches=definition.switches)
    # The entrypoint compiles each file with the image's own Python before writing.
    ev = evaluate(patch, variant, current.get, served=served, compile_check=False)
    if ev.state != "applies":
        raise BuildError(
            f"{patch.id} ({patch.apply}) would not apply to {definition.base}{on_top}:"
            f" {ev.state}" + (f": {ev.failures[0]}" if ev.failures else ""),
            path=definition.file,
        )
    for rel in variant.files:  # "" for no file: one the patch creates, or deletes
        before = current.get(rel)
        after = None if rel in ev.removed else ev.changes.get(rel, before)
        files[rel] = (tree.digest(before), tree.digest(after))
        current[rel] = after
    if patch.apply != "build":
        log(f"patch {patch.id} r{patch.revision} ({variant.name}): checked for startup{on_top}")
    return patch_entry(patch, variant, "needed", files, switches=definition.switches)
