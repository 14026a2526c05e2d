"""`patchset bump`: a build definition carried onto a newer vLLM release.

For each patch the definition lists, the release check on the new release decides: a patch
still ``needed`` is kept; one ``upstream`` is dropped, with the check's evidence; one that
conflicts (``conflict``, ``partial``, ``missing-target``) is refreshed (`patchset.refresh`: a
three-way merge for a diff patch, new anchors for a runtime one) where that is clean, and
listed for hand work where it is not. The new definition keeps the old one's text (comments,
env, serve) with ``vllm``, ``base`` and literal versions in ``tags`` and the file name moved
to the new release, and lists the patches kept and refreshed.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomlkit
from packaging.version import InvalidVersion, Version

from patchset._fs import write_atomic
from patchset.errors import ExitCode, PatchsetError, RegistryError, UsageError
from patchset.image.definition import BuildDefinition, load_definition
from patchset.registry import Registry, load_registry
from patchset.registry.write import why_not_written
from patchset.release_check import ATTENTION, CheckResult, check
from patchset.sources.base import ReleaseSource

SCHEMA = "patchset.bump/1"
Action = Literal["kept", "dropped", "refreshed", "hand-work"]
Refresher = Callable[..., Any]  # patchset.refresh.refresh, passed in so tests can count calls


@dataclass(frozen=True)
class PatchStep:
    patch: str
    verdict: str  # the check's verdict on the new release
    action: Action
    evidence: str  # why: the check's detail, the refresh's outcome
    variant: str | None = None  # refreshed: the new payload
    shifted: bool = False  # kept, but fits only at an offset or with fuzz


@dataclass(frozen=True)
class BumpReport:
    definition: Path
    old: str
    new: str
    target: Path  # the new definition's file
    base: str
    steps: tuple[PatchStep, ...]
    text: str  # the new definition's TOML
    written: tuple[Path, ...] = ()
    notes: tuple[str, ...] = field(default=())  # hand work outside the patches (the base)

    @property
    def patches(self) -> tuple[str, ...]:
        return tuple(s.patch for s in self.steps if s.action in ("kept", "refreshed"))

    @property
    def complete(self) -> bool:
        return not self.notes and not any(s.action == "hand-work" for s in self.steps)

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.complete else ExitCode.ATTENTION

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "definition": str(self.definition),
            "from": self.old,
            "to": self.new,
            "target": str(self.target),
            "base": self.base,
            "patches": list(self.patches),
            "steps": [s.__dict__ for s in self.steps],
            "notes": list(self.notes),
            "complete": self.complete,
            "written": [str(p) for p in self.written],
            "exit_code": int(self.exit_code),
        }


def bump(
    registry: Registry,
    definition: Path | str,
    to: str,
    *,
    source: ReleaseSource,
    write: bool = False,
    refresher: Refresher | None = None,
) -> BumpReport:
    """The definition `definition` carried onto release `to` ('latest': the source's newest
    final release); with `write`, refreshed variants and the new definition are written."""
    old = load_definition(definition)
    for patch_id in old.patches:  # a definition naming a patch the registry lacks: exit 2
        registry.get(patch_id)
    new = _target_version(old, to, source)
    results = check(registry, [new], source=source, patches=list(old.patches))
    if refresher is None:
        from patchset.refresh import refresh  # noqa: PLC0415 -- gitpython: on use

        refresher = refresh
    target = _target_file(old, new)
    if write and target.exists():
        raise UsageError("exists already; not overwritten (remove it to bump again)", path=target)
    steps = [
        _step(
            registry,
            results.result(new, p),
            new=new,
            source=source,
            write=write,
            refresher=refresher,
        )
        for p in old.patches
    ]
    if write and any(s.action == "refreshed" for s in steps):
        registry = load_registry(registry.root)
    kept = [s.patch for s in steps if s.action in ("kept", "refreshed")]
    text, base = _new_text(old, new, kept)
    notes: tuple[str, ...] = ()
    if base == old.base:
        notes = (f"base {old.base!r} does not name {old.vllm}: set the base for {new} by hand",)
    report = BumpReport(old.file, old.vllm, new, target, base, tuple(steps), text, notes=notes)
    if not write:
        return report
    written = [Path(s.variant) for s in steps if s.action == "refreshed" and s.variant]
    try:
        write_atomic(target, text.encode("utf-8"))
    except OSError as exc:
        done = f" (the {len(written)} refreshed variant(s) are in the registry)" if written else ""
        raise RegistryError(f"{why_not_written(exc)}; not written{done}", path=target) from None
    try:
        load_definition(target).check_patches(registry)
    except PatchsetError as exc:
        target.unlink(missing_ok=True)
        raise RegistryError(f"the new definition would not load ({exc}); not written") from None
    return BumpReport(old.file, old.vllm, new, target, base, tuple(steps), text, (*written, target))


def newest_release(source: ReleaseSource) -> str:
    """The source's newest final release (``--to latest``)."""
    finals = [v for v in source.versions() if not Version(v).is_prerelease]
    if not finals:
        raise UsageError("--to latest: the source offers no final release")
    return finals[-1]


def _target_version(old: BuildDefinition, to: str, source: ReleaseSource) -> str:
    available = source.versions()
    if to == "latest":
        to = newest_release(source)
    try:
        wanted = Version(to)
    except InvalidVersion:
        raise UsageError(f"--to {to!r} is not a version (e.g. 0.20.0)") from None
    if wanted <= Version(old.vllm):
        raise UsageError(
            f"--to {to}: not newer than the definition's release {old.vllm}", path=old.file
        )
    match = next((v for v in available if Version(v) == wanted), None)
    if match is None:
        raise UsageError(f"--to {to}: the {source.name} has no such release")
    return match


def _step(
    registry: Registry,
    result: CheckResult,
    *,
    new: str,
    source: ReleaseSource,
    write: bool,
    refresher: Refresher,
) -> PatchStep:
    patch = registry.get(result.patch)
    detail = result.detail
    if result.verdict == "upstream":
        return PatchStep(patch.id, result.verdict, "dropped", _evidence(result))
    if result.verdict == "needed":
        if not patch.in_range(new):
            why = f"needed on {new}, but its range {patch.vllm} leaves {new} out: widen it"
            return PatchStep(patch.id, "needed", "hand-work", f"{why} (check --suggest-ranges)")
        return PatchStep(patch.id, "needed", "kept", detail, shifted=result.shifted)
    assert result.verdict in ATTENTION
    try:
        done = refresher(registry, patch.id, new, source=source, write=write)
    except PatchsetError as exc:
        return PatchStep(patch.id, result.verdict, "hand-work", f"{detail}; refresh: {exc}")
    if done.outcome in ("written", "proposed"):
        how = "written" if done.outcome == "written" else "clean, not written (no --write)"
        variant = done.variant
        if done.outcome == "written" and variant:
            variant = str(patch.folder / variant)
        return PatchStep(
            patch.id, result.verdict, "refreshed", f"{how}: {done.variant}", variant=variant
        )
    where = f" (work folder {done.workdir})" if done.workdir else ""
    left = ", ".join(c.file for c in done.conflicts) or done.outcome
    return PatchStep(
        patch.id, result.verdict, "hand-work", f"refresh: {done.outcome} in {left}{where}"
    )


def _evidence(result: CheckResult) -> str:
    signals = result.signals
    said = [result.detail]
    if signals.probe:
        said.append("its upstream probe matches")
    if signals.reverse:
        said.append("the release already holds the patched lines")
    if signals.ancestry:
        said.append("the release's history holds the upstream commit")
    return "; ".join(s for s in said if s)


def _target_file(old: BuildDefinition, new: str) -> Path:
    stem = old.file.stem
    name = stem.replace(old.vllm, new) if old.vllm in stem else f"{stem}-{new}"
    return old.file.with_name(f"{name}.toml")


def _new_text(old: BuildDefinition, new: str, patches: list[str]) -> tuple[str, str]:
    """The old definition's text, comments kept, moved to `new`; and the new base."""
    doc = tomlkit.parse(old.file.read_text(encoding="utf-8"))
    literal = re.compile(rf"(?<![\d.]){re.escape(old.vllm)}(?![\d])")
    doc["vllm"] = new
    base = literal.sub(new, old.base)
    doc["base"] = base
    doc["tags"] = [literal.sub(new, t) for t in old.tags]
    doc["patches"] = patches
    return tomlkit.dumps(doc), base
