"""Build definitions an import writes, each one `runtime export` takes on its release.

An importer proposes `Plan`s (a release, the patches wanted in the order they are preferred,
the definition's other keys); after the import has landed, each is planned on the landed
registry and the release's own files: a wanted patch is listed when it fits, that is when
its range admits the release and it has a payload for it, it is not retired, its `[applies]`
is not false for the served arguments, its upstream fix is not in the release, what it
`requires` is listed, it conflicts with nothing listed, and it applies (as export evaluates
it) on the files the patches before it leave. A patch that breaks one listed before it is
left out instead. What is left out is said, one line per definition. A definition is then
checked with the code `runtime export` runs (`choose`), and written only when that passes.
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
            try:
                text, left = _planned(plan, loaded, functools.partial(releases.read, plan.vllm))
            except (PatchsetError, OSError) as exc:
                out.notes.append(f"builds/{plan.name}: not written: {exc}")
                continue
            if text is None:
                out.notes.append(
                    f"builds/{plan.name}: no wanted patch fits vLLM {plan.vllm}: not written"
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


def _planned(plan: Plan, registry: Registry, read: Reader) -> tuple[str | None, dict[str, str]]:
    """The definition's text (None when nothing fits) and what was left out, and why."""
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
    kept = _confirmed(plan, registry, kept, read, left)
    if not kept:
        return None, left
    data = dict(plan.data)
    order = {pid: n for n, pid in enumerate(p.id for p in registry.patches)}
    data["patches"] = sorted(kept, key=order.__getitem__)
    return toml_text(data, header=plan.header), left


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


def _confirmed(
    plan: Plan, registry: Registry, kept: list[str], read: Reader, left: dict[str, str]
) -> list[str]:
    """`kept` as `runtime export` takes it: its own checks run (`check_patches`, `choose`);
    a patch they refuse is left out (and said), up to a bound."""
    ids = list(kept)
    for _ in range(len(ids) + 1):
        if not ids:
            return ids
        data = plan.data
        serve = data.get("serve")
        args = serve.get("args", []) if isinstance(serve, dict) else []
        definition = BuildDefinition(
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
        )
        try:
            definition.check_patches(registry)
            choose(
                definition,
                registry,
                lambda wanted: {r: read(r) for r in wanted},
                strict=False,
                log=lambda _l: None,
            )
        except PatchsetError as exc:
            text = str(exc)
            named = [pid for pid in ids if re.search(rf"(?<![\w-]){re.escape(pid)}(?![\w-])", text)]
            if not named:
                raise
            culprit = named[-1] if "requires" in text else named[0]
            left[culprit] = f"runtime export refuses it: {text.split(': ', 1)[-1][:160]}"
            ids.remove(culprit)
            ids = [i for i in ids if culprit not in registry.get(i).requires]
            continue
        return ids
    return ids


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
