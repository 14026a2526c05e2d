"""Build definitions an import writes, each one `runtime export` takes on its release.

An importer proposes `Plan`s (a release, the patches wanted in the order they are preferred,
the definition's other keys); after the import has landed, each is planned on the landed
registry and the release's own files: a wanted patch is listed when it fits, that is when
its range admits the release and it has a payload for it, it is not retired, its `[applies]`
is not false for the served arguments, its upstream fix is not in the release, what it
`requires` is listed, it conflicts with nothing listed, and it applies (as export evaluates
it) on the files the patches before it leave. A patch that breaks one listed before it is
left out instead. What is left out is said, one line per definition.

What is left is then planned with the planner `runtime export` asks first
(`patchset.image.plan.plan`, default switches and every switch on), and what it refuses is
left out, patch by patch, planned again until it refuses nothing: of two patches changing the
same lines, neither requiring the other, the one on by default is kept, else the one wanted
first (the importer's preferred order: the older id); a patch that required one left out goes
too. Each patch the planner's refusals leave out gets a line of its own (which, and why). The
export's own selection (`choose`) runs last. A definition the planner refuses is never
written; when nothing is left, none is, and that is said.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset._fs import write_atomic
from patchset.engine.evaluate import evaluate
from patchset.errors import PatchsetError
from patchset.image.content import choose, series
from patchset.image.plan import Refusal
from patchset.image.plan import plan as plan_definition
from patchset.importers.common import Releases
from patchset.importers.model import Plan
from patchset.kernel.predicates import Facts
from patchset.kernel.predicates import evaluate as evaluate_predicate
from patchset.kernel.sites import served_from_args
from patchset.registry import Patch, Registry, load_registry
from patchset.registry.builds import BuildDefinition
from patchset.registry.write import toml_text
from patchset.sources.base import ReleaseSource

STOCK_CUDA = "cu129"  # the stock image's CUDA is not named by a pin or a compose


@dataclass
class Planned:
    written: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)


Reader = Callable[[str], bytes | None]


def write_plans(
    plans: Sequence[Plan],
    registry: Path,
    builds: Path | None,
    sources: Sequence[ReleaseSource],
    *,
    dry_run: bool,
) -> Planned:
    """Plan each definition on the landed `registry` and the releases of `sources`; write
    those that export (not on a dry run). An existing file of that name with other content
    is the user's: kept."""
    out = Planned()
    if not plans or builds is None:
        return out
    loaded = load_registry(registry, tolerant=True)
    releases = Releases(sources)
    try:
        try:
            have = set(releases.versions())
        except (PatchsetError, OSError) as exc:  # offline, the index unreachable
            out.notes.extend(
                f"builds/{plan.name}: not written: the releases could not be listed ({exc})"
                for plan in plans
            )
            return out
        for plan in plans:
            if plan.vllm not in have:
                out.notes.append(
                    f"builds/{plan.name}: vLLM {plan.vllm} is not a release the source has:"
                    " not written"
                )
                continue
            refused: dict[str, str] = {}
            try:
                text, left = _planned(
                    plan, loaded, functools.partial(releases.read, plan.vllm), refused
                )
            except (PatchsetError, OSError) as exc:
                out.notes.append(f"builds/{plan.name}: not written: {exc}")
                continue
            lines = [f"builds/{plan.name}: left out {pid}: {why}" for pid, why in refused.items()]
            if text is None:
                out.notes += lines
                out.notes.append(
                    f"builds/{plan.name}: no wanted patch "
                    + ("is left that the planner takes for" if refused else "fits")
                    + f" vLLM {plan.vllm}: not written"
                    + (f" ({_said(left)})" if left else "")
                )
                continue
            path = builds / plan.name
            if path.is_file() and path.read_text() != text:
                out.notes.append(f"builds/{plan.name}: yours (other content): kept")
                continue
            out.written.append(plan.name)
            if left:
                out.notes.append(f"builds/{plan.name}: left out {_said(left)}")
            out.notes += lines  # the planner's: a line each
            if not dry_run:
                builds.mkdir(parents=True, exist_ok=True)
                write_atomic(path, text.encode())
    finally:
        releases.close()
    return out


def _said(left: dict[str, str], cap: int = 12) -> str:
    items = [f"{pid} ({why})" for pid, why in left.items()]
    more = f"; and {len(items) - cap} more" if len(items) > cap else ""
    return f"{len(items)}: " + "; ".join(items[:cap]) + more


def _planned(
    plan: Plan, registry: Registry, read: Reader, refused: dict[str, str]
) -> tuple[str | None, dict[str, str]]:
    """The definition's text (None when nothing fits) and what was left out, and why; what
    the planner's refusals left out goes into `refused` (a line each)."""
    known = {p.id: p for p in registry.patches}
    left: dict[str, str] = {}
    wanted = list(dict.fromkeys(plan.wanted))
    for pid in wanted:
        if pid not in known:
            left[pid] = "not imported"
    serve = plan.data.get("serve")
    args = serve.get("args", []) if isinstance(serve, dict) else []
    served = served_from_args([str(a) for a in args] if isinstance(args, list) else [])
    candidates = [known[pid] for pid in wanted if pid in known]
    fits = _Fit(registry, plan.vllm, read, served)
    kept: list[str] = []
    for patch in candidates:
        if patch.id in kept or patch.id in left:
            continue
        why = fits.alone(patch)
        if why is None:
            group = [*_required(patch, known), patch.id]
            missing = [r for r in group if r not in known]
            if missing:
                why = f"requires {', '.join(missing)}, not in the registry"
            else:
                bad = next((r for r in group[:-1] if r not in kept and fits.alone(known[r])), None)
                why = f"requires {bad}, which does not fit" if bad else None
            if why is None:
                clash = _conflict(group, kept, known)
                why = f"conflicts with {clash}" if clash else fits.stacked(kept, group)
            if why is None:
                kept += [g for g in group if g not in kept]
                continue
        left[patch.id] = why
    kept = _confirmed(plan, registry, kept, fits.original, refused)
    if not kept:
        return None, left
    data = dict(plan.data)
    data["patches"] = _in_registry_order(registry, kept)
    return toml_text(data, header=plan.header), left


def _in_registry_order(registry: Registry, ids: list[str]) -> list[str]:
    order = {pid: n for n, pid in enumerate(p.id for p in registry.patches)}
    return sorted(ids, key=order.__getitem__)


def _required(patch: Patch, known: dict[str, Patch]) -> list[str]:
    """What `patch` requires, transitively, those required first."""
    out: list[str] = []

    def visit(pid: str) -> None:
        for required in known[pid].requires if pid in known else ():
            if required not in out:
                visit(required)
                out.append(required)

    visit(patch.id)
    return out


def _conflict(group: list[str], kept: list[str], known: dict[str, Patch]) -> str | None:
    for pid in group:
        for other in kept:
            if other in known[pid].conflicts or pid in known[other].conflicts:
                return other
    return None


class _Fit:
    """Whether patches fit a release, alone and stacked (in the engine's order), each patch's
    evaluation kept by the chain of patches before it on its files."""

    def __init__(self, registry: Registry, version: str, read: Reader, served: dict[str, str]):
        self.registry, self.version, self.read, self.served = registry, version, read, served
        self.originals: dict[str, bytes | None] = {}
        self.after: dict[tuple[str, tuple[str, ...]], bytes | None] = {}
        self.results: dict[tuple[object, ...], tuple[str, dict[str, bytes], tuple[str, ...]]] = {}

    def original(self, rel: str) -> bytes | None:
        if rel not in self.originals:
            self.originals[rel] = self.read(rel)
        return self.originals[rel]

    def alone(self, patch: Patch) -> str | None:
        """Why `patch` cannot be listed whatever else is (None: it may be)."""
        if not patch.in_range(self.version):
            return f"meant for {patch.vllm}"
        if patch.variant_for(self.version) is None:
            return "no payload for this release"
        if patch.lifecycle.retired(self.version):
            return "retired"
        if patch.applies is not None:
            verdict = evaluate_predicate(patch.applies, Facts(served=self.served))
            if verdict.value is False:
                return f"applies = {patch.applies.describe()} is false for the serve arguments"
        probe = patch.upstream.probe
        if probe is not None:
            data = self.original(probe.file)
            text = None if data is None else data.decode("utf-8", errors="surrogateescape")
            if probe.matches(text):
                return "upstream in this release"
        return None

    def stacked(self, kept: list[str], group: list[str]) -> str | None:
        """Why `group` cannot join `kept` (each evaluated on what the ones before leave)."""
        ids = [*kept, *(g for g in group if g not in kept)]
        chains: dict[str, tuple[str, ...]] = {}
        for patch in series(self.registry, ids):
            variant = patch.variant_for(self.version)
            assert variant is not None
            files = tuple(variant.files) + (patch.targets if patch.kind == "python" else ())
            key = (patch.id, tuple((f, chains.get(f, ())) for f in files))
            if key not in self.results:
                snapshot = dict(chains)

                def reader(rel: str, at: dict[str, tuple[str, ...]] = snapshot) -> bytes | None:
                    chain = at.get(rel, ())
                    return self.after[(rel, chain)] if chain else self.original(rel)

                ev = evaluate(patch, variant, reader, served=self.served, compile_check=False)
                changes = dict(ev.changes) if ev.state == "applies" else {}
                self.results[key] = (ev.state, changes, tuple(ev.removed))
            state, changes, removed = self.results[key]
            if state != "applies":
                if patch.id not in group:
                    return f"{patch.id}, listed before it, would then be {state}"
                on_top = [
                    k for k in kept if set(_files(self.registry.get(k), self.version)) & set(files)
                ]
                return f"{state} on this release" + (
                    f" on top of {', '.join(on_top[:3])}" if on_top else ""
                )
            if patch.kind == "python":
                continue
            for rel in variant.files:
                if rel in changes or rel in removed:
                    chain = (*chains.get(rel, ()), patch.id)
                    self.after[(rel, chain)] = None if rel in removed else changes[rel]
                    chains[rel] = chain
        return None


def _files(patch: Patch, version: str) -> tuple[str, ...]:
    variant = patch.variant_for(version)
    return () if variant is None else variant.files


def _definition(plan: Plan, ids: list[str]) -> BuildDefinition:
    """The definition `plan` writes, listing `ids` (as `load_definition` would read it)."""
    data = plan.data
    serve = data.get("serve")
    args = serve.get("args", []) if isinstance(serve, dict) else []
    switches = data.get("switches")
    return BuildDefinition(
        name=Path(plan.name).stem,
        file=Path("builds") / plan.name,
        vllm=plan.vllm,
        cuda=str(data.get("cuda", STOCK_CUDA)),
        base=str(data.get("base", f"vllm/vllm-openai:v{plan.vllm}")),
        repository=str(data.get("repository", "patchset/vllm")),
        tags=("{vllm}",),
        patches=tuple(ids),
        env={},
        serve_args=tuple(str(a) for a in args) if isinstance(args, list) else (),
        switches=(
            {str(k): bool(v) for k, v in switches.items()} if isinstance(switches, dict) else {}
        ),
    )


def _confirmed(
    plan: Plan, registry: Registry, kept: list[str], read: Reader, refused: dict[str, str]
) -> list[str]:
    """`kept` as `runtime export` takes it: planned (`image.plan.plan`, as export's
    `refuse` plans it), what the planner refuses left out (`_refused`) and planned again
    until it refuses nothing; then the export's own selection (`choose`), a patch it refuses
    left out too. Each left out goes into `refused` with why. A refusal no leaving out can
    answer raises: the definition is not written."""
    ids = _in_registry_order(registry, kept)
    preferred = {pid: n for n, pid in enumerate(dict.fromkeys((*plan.wanted, *ids)))}

    def release(wanted: list[str]) -> dict[str, bytes | None]:
        return {rel: read(rel) for rel in wanted}

    for _ in range(len(ids) + 1):
        if not ids:
            return ids
        definition = _definition(plan, ids)
        planned = plan_definition(definition, registry, release, delivery="stock")
        if planned.refusals:
            out = _refused(planned.refusals, definition, registry, preferred)
            if not out:
                raise PatchsetError(
                    "the planner refuses it and leaving a patch out does not answer: "
                    + "; ".join(r.line() for r in planned.refusals)[:400]
                )
        else:
            try:
                choose(definition, registry, release, strict=False, log=lambda _l: None)
            except PatchsetError as exc:
                text = str(exc)
                named = [
                    pid for pid in ids if re.search(rf"(?<![\w-]){re.escape(pid)}(?![\w-])", text)
                ]
                if not named:
                    raise
                culprit = named[-1] if "requires" in text else named[0]
                out = {culprit: f"runtime export refuses it: {text.split(': ', 1)[-1][:160]}"}
            else:
                return ids
        refused.update(out)
        ids = [i for i in ids if i not in out]
        gone = [*out]
        while dropped := [i for i in ids if any(g in registry.get(i).requires for g in gone)]:
            for pid in dropped:
                needed = next(g for g in gone if g in registry.get(pid).requires)
                refused[pid] = f"requires {needed}, left out"
            ids = [i for i in ids if i not in dropped]
            gone = dropped
    raise PatchsetError(f"the planner still refuses it after {len(kept)} rounds")


_OVERLAP = re.compile(r"changes the same lines as (?P<other>\S+) \((?P<where>[^()]*)\)")


def _refused(
    refusals: Sequence[Refusal],
    definition: BuildDefinition,
    registry: Registry,
    preferred: dict[str, int],
) -> dict[str, str]:
    """What to leave out for `refusals`, and why. Two patches on the same lines: the one off
    by default goes, else the one wanted later. A refusal that holds whatever else is listed
    (no switch set named) leaves its patch out; one seen when patches are stacked, only once
    no two listed patches change the same lines (the loser of such a pair may be what it
    does not apply on)."""
    ids = definition.patches
    out: dict[str, str] = {}
    overlapping = False
    for refusal in refusals:
        found = _OVERLAP.match(refusal.problem)
        if found is None or refusal.patch not in ids or found["other"] not in ids:
            continue
        overlapping = True
        a, b = found["other"], refusal.patch
        if a in out or b in out:
            continue  # one of them already goes: planned again
        on_a, on_b = (_on(registry.get(pid), definition.switches) for pid in (a, b))
        if on_a != on_b:
            keep, lose = (a, b) if on_a else (b, a)
            why = "on by default"
        else:
            keep, lose = sorted((a, b), key=lambda pid: preferred.get(pid, len(preferred)))
            why = "wanted first"
        out[lose] = (
            f"changes the same lines as {keep} ({found['where']}) and neither requires the"
            f" other: {keep} kept ({why})"
        )
    for refusal in refusals:
        if refusal.patch not in ids or refusal.patch in out or _OVERLAP.match(refusal.problem):
            continue
        if refusal.sets and overlapping:
            continue
        out[refusal.patch] = f"the planner refuses it: {refusal.problem}"[:300]
    return out


def _on(patch: Patch, switches: dict[str, bool]) -> bool:
    """On by default: no switch, or its switch on (the definition's, else the patch's
    default)."""
    return patch.switch is None or switches.get(patch.switch.env, patch.switch.default)


def final_release(pin: str) -> str | None:
    """`pin` as a final release (`v0.24.0` -> `0.24.0`), or None for a nightly, a
    pre-release or a local build."""
    text = pin.strip().removeprefix("v")
    try:
        version = Version(text)
    except InvalidVersion:
        return None
    if version.is_prerelease or version.is_devrelease or version.local or version.is_postrelease:
        return None
    return str(version)


def commit_of(pin: str) -> str | None:
    """The vLLM commit a nightly pin names (`+g51f22dcfd`, `nightly-<sha>`)."""
    found = re.search(r"(?:\+g|nightly-)([0-9a-f]{7,40})\b", pin)
    return found.group(1) if found else None
