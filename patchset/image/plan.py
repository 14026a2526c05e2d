"""The one planner of a build definition (issue 35.2): every refusal `runtime export`, `build`
and the start would make, listed at once, each with its fix, before anything is written.

`check --build`, `validate --build`, `runtime export` and `build` ask it; the start applies
the same rules with the same kernel code (`patchset.kernel.stack`): for a set of switches
(default: the definition's defaults; `all`: every switch on; `ENV=1,ENV=0`: those over the
defaults) the patches that are on go in, in the engine's order, each by its own hunks or
sites on what the patches before it left.

Refusals: a patch the registry lacks or whose range excludes the release; a `requires` the
definition does not list (or a build patch on a startup one); a switch no listed patch has;
no payload for the release; a python patch whose touched name is absent; two listed patches
changing the same lines that do not require one another; a patch that does not apply on what
the patches on before it leave (in each switch set planned, and with every switch on: the
export's own run, which puts every listed patch in); an `[applies]` leaf nobody can decide
where the patch is decided (`undecidable`: a build patch built into an image is in whatever
the start finds, so its leaves must be known at build, from the definition's serve
arguments).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchset.engine import order
from patchset.engine.evaluate import evaluate
from patchset.errors import BuildError, PatchsetError
from patchset.image.content import series, wanted_files
from patchset.image.manifest import patch_entry
from patchset.kernel import stack
from patchset.kernel.modelconfig import undecided
from patchset.kernel.predicates import SERVED_LEAVES, Facts, served_value
from patchset.kernel.predicates import evaluate as evaluate_predicate
from patchset.kernel.sites import served_from_args
from patchset.kernel.tree import digest
from patchset.registry import Patch, Registry, Variant
from patchset.registry.builds import BuildDefinition

Reader = Callable[[list[str]], dict[str, bytes | None]]
SwitchSet = tuple[str, dict[str, bool]]  # its name, and env -> on
Delivery = Literal["stock", "image", "any"]  # runtime export, build, or both (check, validate)


@dataclass(frozen=True)
class Refusal:
    patch: str
    problem: str
    fix: str
    sets: tuple[str, ...] = ()  # the switch sets it happens with (none: any)

    def line(self) -> str:
        where = f" (switches: {', '.join(self.sets)})" if self.sets else ""
        return f"{self.patch} {self.problem}{where}; fix: {self.fix}"

    def to_dict(self) -> dict[str, object]:
        return {"patch": self.patch, "problem": self.problem, "fix": self.fix, "sets": self.sets}


@dataclass(frozen=True)
class Plan:
    definition: str
    vllm: str
    sets: tuple[str, ...]
    refusals: tuple[Refusal, ...]

    def to_dict(self) -> dict[str, object]:
        return {
            "definition": self.definition,
            "vllm": self.vllm,
            "sets": list(self.sets),
            "refusals": [r.to_dict() for r in self.refusals],
        }

    def error(self, path: Path) -> BuildError:
        each = " ".join(f"[{n}] {r.line()}" for n, r in enumerate(self.refusals, 1))
        return BuildError(
            f"{len(self.refusals)} refusal(s) for vLLM {self.vllm}, all of them (`patchset"
            f" check --build` lists them one a line): {each}",
            path=path,
        )


def refuse(
    definition: BuildDefinition,
    registry: Registry,
    read: Reader,
    asked: Sequence[str] = (),
    *,
    delivery: Delivery = "stock",
) -> Reader:
    """Plan `definition` (its defaults and the switch sets `asked`) for `delivery` and raise
    every refusal at once; else return `read` remembering what it read (the export reads the
    same files)."""
    seen: dict[str, bytes | None] = {}

    def cached(wanted: list[str]) -> dict[str, bytes | None]:
        missing = [rel for rel in wanted if rel not in seen]
        if missing:
            seen.update(read(missing))
        return {rel: seen[rel] for rel in wanted}

    sets = switch_sets(definition, registry, asked)
    planned = plan(definition, registry, cached, sets=sets, delivery=delivery)
    if planned.refusals:
        raise planned.error(definition.file)
    return cached


def switch_sets(
    definition: BuildDefinition, registry: Registry, asked: Sequence[str]
) -> list[SwitchSet]:
    """The switch sets to plan: the defaults, then each of `asked` (`all`, `defaults`, or
    `ENV=1,ENV=0,...` over the defaults); a name no listed patch switches is refused."""
    known = {
        p.switch.env: definition.switches.get(p.switch.env, p.switch.default)
        for p in _listed(definition, registry)
        if p.switch is not None
    }
    found: list[SwitchSet] = [("defaults", dict(known))]
    for text in asked:
        if text == "defaults":
            continue
        if text == "all":
            found.append(("all", dict.fromkeys(known, True)))
            continue
        chosen = dict(known)
        for part in filter(None, (p.strip() for p in text.split(","))):
            env, eq, value = part.partition("=")
            if not eq or env not in known or value.strip().lower() not in _WORDS:
                raise BuildError(
                    f"--switches {text!r}: {part!r} is not ENV=1 or ENV=0 for a switch of"
                    f" this definition ({', '.join(sorted(known)) or 'none'})"
                )
            chosen[env] = _WORDS[value.strip().lower()]
        found.append((text, chosen))
    return list({name: (name, on) for name, on in found}.values())


_WORDS = dict.fromkeys(("1", "true", "yes", "on"), True)
_WORDS |= dict.fromkeys(("0", "false", "no", "off"), False)


def _listed(definition: BuildDefinition, registry: Registry) -> list[Patch]:
    out = []
    for patch_id in definition.patches:
        try:
            out.append(registry.get(patch_id))
        except PatchsetError:
            continue
    return out


def plan(
    definition: BuildDefinition,
    registry: Registry,
    read: Reader,
    *,
    sets: Sequence[SwitchSet] | None = None,
    delivery: Delivery = "any",
) -> Plan:
    """Every refusal for `definition` with each switch set of `sets` (default: its defaults),
    delivered as `delivery` (`any`: what `runtime export` or `build` would refuse)."""
    sets = list(sets) if sets is not None else switch_sets(definition, registry, ())
    refusals: list[Refusal] = []
    patches = _static(definition, registry, refusals)
    if delivery != "stock":
        refusals += [
            r for p in patches if _kept(definition, p) for r in _undecidable(definition, p)
        ]
    variants: dict[str, Variant] = {}
    for patch in patches:
        variant = patch.variant_for(definition.vllm)
        if variant is None:
            refusals.append(
                Refusal(
                    patch.id,
                    f"has no payload for vLLM {definition.vllm}",
                    "add one, or take it out of patches",
                )
            )
        elif _kept(definition, patch):
            variants[patch.id] = variant
    originals = read(wanted_files(registry, variants)) if variants else {}
    for patch_id, variant in list(variants.items()):
        patch = registry.get(patch_id)
        probe = patch.upstream.probe
        data = None if probe is None else originals.get(probe.file)
        if probe is not None and probe.matches(
            None if data is None else data.decode("utf-8", "surrogateescape")
        ):
            del variants[patch_id]  # upstream already: left out with a line, never refused
            continue
        if patch.kind == "python":
            ev = evaluate(patch, variant, originals.get)
            if ev.state != "applies":
                refusals.append(
                    Refusal(
                        patch_id,
                        "touches names vLLM lacks: " + "; ".join(ev.missing),
                        "point [python] touches at a module, package or attribute it has",
                    )
                )
    refusals += _overlaps(definition, registry, variants, originals)
    for switches in sets:
        refusals += _stacked(definition, registry, variants, originals, switches)
    if not any(name == "all" for name, _ in sets) and not all(all(on.values()) for _, on in sets):
        # the export's own run: every listed patch in, each on what those before it leave
        every = dict.fromkeys((env for _, on in sets for env in on), True)
        refusals += _stacked(definition, registry, variants, originals, ("all", every))
    return Plan(definition.file.name, definition.vllm, tuple(n for n, _ in sets), _merged(refusals))


def _static(
    definition: BuildDefinition, registry: Registry, refusals: list[Refusal]
) -> list[Patch]:
    """The listed patches that exist; what the definition alone gets wrong, into `refusals`."""
    found: list[Patch] = []
    for patch_id in definition.patches:
        try:
            patch = registry.get(patch_id)
        except PatchsetError:
            refusals.append(
                Refusal(patch_id, "is not in the registry", "add it, or take it out of patches")
            )
            continue
        found.append(patch)
        if not patch.in_range(definition.vllm):
            refusals.append(
                Refusal(
                    patch_id,
                    f"is meant for vLLM {patch.vllm}, not {definition.vllm}",
                    "take it out of patches, or widen its vllm range if it fits",
                )
            )
        for required in patch.requires:
            if required not in definition.patches:
                refusals.append(
                    Refusal(
                        patch_id,
                        f"requires {required}, which this definition does not list",
                        f"add {required} to patches",
                    )
                )
            elif patch.apply == "build" and registry.get(required).apply != "build":
                refusals.append(
                    Refusal(
                        patch_id,
                        f"is applied at build but requires {required}, applied at startup",
                        "make both build (or both startup) patches",
                    )
                )
    known = {p.switch.env for p in found if p.switch is not None}
    refusals.extend(
        Refusal(
            f"switches.{env}:",
            "no patch of this definition has that switch",
            f"use one of {', '.join(sorted(known)) or 'none'}",
        )
        for env in definition.switches
        if env not in known
    )
    return found


def _kept(definition: BuildDefinition, patch: Patch) -> bool:
    """Not retired, and its predicate not false for the served configuration (export leaves
    those out with a line; the model leaves the arguments leave open are the start's, as
    export reads them)."""
    if patch.lifecycle.retired(definition.vllm):
        return False
    served = served_from_args(definition.serve_args)
    verdict = evaluate_predicate(
        patch.applies, Facts(served=served, unknown_served=undecided(served))
    )
    return verdict.value is not False


def undecidable(definition: BuildDefinition, patch: Patch) -> list[str]:
    """The `[applies]` leaves of `patch` that nobody decides where it is decided, described
    (``compute_capability = '12.0'``). A startup patch (and every patch of a runtime export)
    is decided at start, which knows every leaf (`kernel.startup.facts`, the model's config);
    a build patch built into an image is in whatever the start finds, so only the served
    leaves the definition's serve arguments decide (or vLLM's defaults) are known for it:
    the GPU's, the installed versions' and the model leaves the arguments leave open are not."""
    if patch.apply != "build" or patch.kind == "python" or patch.applies is None:
        return []
    served = served_from_args(definition.serve_args)
    open_model = undecided(served)
    return list(
        dict.fromkeys(
            leaf.describe()
            for leaf in patch.applies.leaves()
            if leaf.key not in SERVED_LEAVES
            or leaf.key in open_model
            or served_value(leaf.key, served) is None
        )
    )


def _undecidable(definition: BuildDefinition, patch: Patch) -> list[Refusal]:
    leaves = undecidable(definition, patch)
    if not leaves:
        return []
    served = [x.split(" = ")[0] for x in leaves if x.split(" = ")[0] in SERVED_LEAVES]
    how = (
        f", or decide {', '.join(served)} in the definition's [serve] args (--model,"
        " --hf-overrides architectures/model_type, --quantization)"
        if served and len(served) == len(leaves)
        else ""
    )
    return [
        Refusal(
            patch.id,
            f"is built into the image (`patchset build`) but its [applies] leaf"
            f"{'s' if len(leaves) > 1 else ''} {'; '.join(leaves)} cannot be known at build,"
            " and the start keeps a built-in patch whatever it finds",
            f'make it a startup patch (apply = "startup"), which the start decides{how}',
        )
    ]


def _overlaps(
    definition: BuildDefinition,
    registry: Registry,
    variants: Mapping[str, Variant],
    originals: Mapping[str, bytes | None],
) -> list[Refusal]:
    """Two listed patches changing the same lines of the release's file, neither requiring
    the other (each evaluated alone on the release: one that needs another to apply is
    judged by the stacked run instead)."""
    patches = [registry.get(i) for i in variants if registry.get(i).kind != "python"]
    by_id = {p.id: p for p in registry.patches}
    served = served_from_args(definition.serve_args)
    spans: dict[str, dict[str, Sequence[order.Span]]] = {}
    for patch in patches:
        ev = evaluate(
            patch,
            variants[patch.id],
            originals.get,
            served=served,
            compile_check=False,
            nearest=False,
        )
        if ev.state == "applies":
            spans[patch.id] = {
                f: ev.spans[f] if f in ev.spans else order.changed_spans(originals.get(f), new)
                for f, new in ev.changes.items()
            }
    out: list[Refusal] = []
    for i, a in enumerate(patches):
        for b in patches[i + 1 :]:
            if a.id not in spans or b.id not in spans or order.related(a, b, by_id):
                continue
            for file in sorted(spans[a.id].keys() & spans[b.id].keys()):
                where = order.spans_meet(spans[a.id][file], spans[b.id][file])
                if where is not None:
                    out.append(
                        Refusal(
                            b.id,
                            f"changes the same lines as {a.id} ({file} line {where[0] + 1}) and"
                            " neither requires the other",
                            f'say requires = ["{a.id}"] if it is written on top of it, or list'
                            " only one of them",
                        )
                    )
                    break
    return out


def _stacked(
    definition: BuildDefinition,
    registry: Registry,
    variants: Mapping[str, Variant],
    originals: Mapping[str, bytes | None],
    switches: SwitchSet,
) -> list[Refusal]:
    """The start with switch set `on`: each patch that is on, on what those before it left
    (the kernel's own stacking); a patch whose required one is off is skipped, as at start."""
    name, on = switches
    served = served_from_args(definition.serve_args)
    current: dict[str, bytes | None] = dict(originals)
    touched: dict[str, list[str]] = {}
    out: list[Refusal] = []
    left: set[str] = set()
    for patch in series(registry, list(variants)) if variants else ():
        if patch.kind == "python":
            continue
        switch = patch.switch
        if (switch is not None and not on.get(switch.env, switch.default)) or any(
            r in left or r not in variants for r in patch.requires
        ):
            left.add(patch.id)
            continue
        variant = variants[patch.id]
        files = {
            rel: (digest(originals.get(rel)), "" if _deletes(variant, rel) else "-")
            for rel in variant.files
        }
        entry = patch_entry(patch, variant, "needed", files)
        new: dict[str, bytes | None] = {}
        try:
            for rel in variant.files:
                new[rel] = stack.patched_text(entry, rel, current.get(rel), served)
        except stack.StackError as exc:
            left.add(patch.id)
            before = sorted({p for rel in variant.files for p in touched.get(rel, [])})
            what = f"what {', '.join(before)} leave" if before else "the release's files"
            out.append(
                Refusal(
                    patch.id,
                    f"does not apply on {what}: {exc}",
                    (
                        f"say requires = [...] naming the patch it is written on top of, or"
                        f" rebase it on {', '.join(before)}, or switch one of them off by default"
                    )
                    if before
                    else "rebase its payload on this release",
                    (name,),
                )
            )
            continue
        if patch.kind == "runtime" and all(new[rel] == current.get(rel) for rel in new):
            left.add(patch.id)  # every site skipped (optional, `when`): export's "no site applies"
            before = sorted({p for rel in variant.files for p in touched.get(rel, [])})
            what = f"what {', '.join(before)} leave" if before else "the release's files"
            out.append(
                Refusal(
                    patch.id,
                    f"changes nothing on {what}: no site applies (each is optional or its"
                    " `when` is false for the served configuration)",
                    "point its anchors at this release, or take it out of patches",
                    (name,),
                )
            )
            continue
        current.update(new)
        for rel in variant.files:
            touched.setdefault(rel, []).append(patch.id)
    return out


def _deletes(variant: Variant, rel: str) -> bool:
    return any(d.path == rel and d.removed for d in variant.diffs)


def _merged(refusals: list[Refusal]) -> tuple[Refusal, ...]:
    """One refusal per patch and problem, naming every switch set it happens with."""
    merged: dict[tuple[str, str], Refusal] = {}
    for r in refusals:
        key = (r.patch, r.problem)
        if key in merged:
            had = merged[key]
            merged[key] = Refusal(
                r.patch, r.problem, r.fix, tuple(dict.fromkeys(had.sets + r.sets))
            )
        else:
            merged[key] = r
    return tuple(merged.values())


__all__ = ["Plan", "Refusal", "plan", "refuse", "switch_sets", "undecidable"]
