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

import dataclasses
import os
import re
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import tomlkit
from packaging.version import InvalidVersion, Version

from patchset._fs import staged_file, sync_folder
from patchset.errors import ExitCode, PatchsetError, RegistryError, UsageError
from patchset.registry import Registry, load_registry
from patchset.registry.builds import BuildDefinition, load_definition
from patchset.registry.write import why_not_written
from patchset.release_check import ATTENTION, CheckResult, check
from patchset.release_check.verdicts import PROBE_ALONE
from patchset.sources.base import ReleaseSource

SCHEMA = "patchset.bump/1"
BumpAction = Literal["kept", "dropped", "refreshed", "hand-work"]
Refresher = Callable[..., Any]  # patchset.refresh.refresh, passed in so tests can count calls


EVIDENCE_CHARS = 200  # a step's one line of evidence; the whole of it is in `details`


@dataclass(frozen=True)
class PatchStep:
    patch: str
    verdict: str  # the check's verdict on the new release
    action: BumpAction
    evidence: str  # why, in one line of at most EVIDENCE_CHARS: files and lines
    variant: str | None = None  # refreshed: the new payload
    shifted: bool = False  # kept, but fits only at an offset or with fuzz
    details: tuple[str, ...] = ()  # the whole evidence: the check's locations, the refresh's

    @classmethod
    def of(
        cls,
        patch: str,
        verdict: str,
        action: BumpAction,
        evidence: str,
        details: tuple[str, ...] = (),
        **more: Any,
    ) -> PatchStep:
        """A step whose evidence is one line, capped, never empty."""
        line = " ".join(evidence.split()) or f"{verdict} on the new release"
        full = tuple(dict.fromkeys([line, *details]))
        if len(line) > EVIDENCE_CHARS:
            line = line[: EVIDENCE_CHARS - 1].rstrip() + "…"
        return cls(patch, verdict, action, line, details=full, **more)

    def to_dict(self) -> dict[str, Any]:
        return {**self.__dict__, "details": list(self.details)}


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
    comments: tuple[str, ...] = ()  # comment lines naming the old release, flagged to check

    @property
    def patches(self) -> tuple[str, ...]:
        return tuple(s.patch for s in self.steps if s.action in ("kept", "refreshed"))

    @property
    def complete(self) -> bool:
        return not self.notes and not any(s.action == "hand-work" for s in self.steps)

    @property
    def stock(self) -> bool:
        """Nothing is left to patch: every patch is upstream in the new release."""
        return bool(self.steps) and all(s.action == "dropped" for s in self.steps)

    @property
    def exit_code(self) -> int:
        return ExitCode.OK if self.complete else ExitCode.ATTENTION

    def headline(self) -> str | None:
        """The one line of a bump that leaves nothing to patch."""
        if not self.stock:
            return None
        return f"every patch is upstream in {self.new}: serve the stock image (nothing written)"

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "definition": str(self.definition),
            "from": self.old,
            "to": self.new,
            "target": str(self.target),
            "base": self.base,
            "patches": list(self.patches),
            "steps": [s.to_dict() for s in self.steps],
            "notes": list(self.notes),
            "comments": list(self.comments),
            "stock": self.stock,
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
    pre: bool = False,
) -> BumpReport:
    """The definition `definition` carried onto release `to` ('latest': the source's newest
    final release); with `write`, refreshed variants and the new definition are written.
    A pre-release is refused unless `pre`. Nothing left to patch (every patch upstream):
    nothing is written, and the report says so (`stock`)."""
    old = load_definition(definition)
    for patch_id in old.patches:  # a definition naming a patch the registry lacks: exit 2
        registry.get(patch_id)
    new = _target_version(old, to, source, pre=pre)
    target = _target_file(old, new)
    if write and target.exists():
        raise UsageError("exists already; not overwritten (remove it to bump again)", path=target)
    results = check(registry, [new], source=source, patches=list(old.patches))
    if refresher is None:
        from patchset.refresh import refresh  # noqa: PLC0415 -- gitpython: on use

        refresher = refresh
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
    text, base, comments = _new_text(old, new, kept)
    notes: tuple[str, ...] = ()
    if base == old.base:
        notes = (f"base {old.base!r} does not name {old.vllm}: set the base for {new} by hand",)
    if not kept and not all(s.action == "dropped" for s in steps):
        notes = (
            *notes,
            f"no patch is left to list: {target.name} is not written until the hand work is done",
        )
    report = BumpReport(
        old.file, old.vllm, new, target, base, tuple(steps), text, notes=notes, comments=comments
    )
    if not write or not kept:
        return report
    written = [Path(s.variant) for s in steps if s.action == "refreshed" and s.variant]
    _create(target, text.encode("utf-8"), written)
    try:
        load_definition(target).check_patches(registry)
    except PatchsetError as exc:
        target.unlink(missing_ok=True)
        raise RegistryError(f"the new definition would not load ({exc}); not written") from None
    return dataclasses.replace(report, written=(*written, target))


def _create(target: Path, data: bytes, written: list[Path]) -> None:
    """`target` made with `data`, never over a file that appeared there meanwhile: the bytes
    are staged beside it, then hard-linked in (a link fails where the name exists)."""
    done = f" (the {len(written)} refreshed variant(s) are in the registry)" if written else ""
    try:
        staged = staged_file(target, data)
    except OSError as exc:
        raise RegistryError(f"{why_not_written(exc)}; not written{done}", path=target) from None
    try:
        os.link(staged, target)
        sync_folder(target.parent)
    except FileExistsError:
        raise UsageError(
            f"exists already (made while the bump ran); not overwritten{done}", path=target
        ) from None
    except OSError as exc:
        raise RegistryError(f"{why_not_written(exc)}; not written{done}", path=target) from None
    finally:
        staged.unlink(missing_ok=True)


def newest_release(source: ReleaseSource) -> str:
    """The source's newest final release (``--to latest``)."""
    finals = [v for v in source.versions() if not Version(v).is_prerelease]
    if not finals:
        raise UsageError("--to latest: the source offers no final release")
    return finals[-1]


MAX_VERSION_CHARS = 64  # longer is no release anyone made (and int() refuses 4,300 digits)


def _target_version(
    old: BuildDefinition, to: str, source: ReleaseSource, *, pre: bool = False
) -> str:
    if to == "latest":
        to = newest_release(source)
    shown = to if len(to) <= MAX_VERSION_CHARS else f"{to[:20]}... ({len(to)} characters)"
    try:
        if len(to) > MAX_VERSION_CHARS:
            raise InvalidVersion(to)
        wanted = Version(to)
    except (InvalidVersion, ValueError):
        raise UsageError(f"--to {shown!r} is not a version (e.g. 0.20.0)") from None
    if wanted.is_prerelease and not pre:
        raise UsageError(f"--to {to} is a pre-release: add --pre to bump to it")
    available = source.versions()
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
    where = tuple(result.locations)
    if result.verdict == "upstream" and (result.disagreement or "").startswith(PROBE_ALONE):
        # The probe alone says upstream, while every hunk or site still applies and none of
        # their changes is there: not evidence enough to drop it; a person decides.
        why = f"{result.disagreement}: keep it (fix the probe) or drop it by hand"
        return PatchStep.of(patch.id, result.verdict, "hand-work", why, where)
    if result.verdict == "upstream":
        return PatchStep.of(patch.id, result.verdict, "dropped", _evidence(result), where)
    if result.verdict == "needed":
        if not patch.in_range(new):
            why = f"needed on {new}, but its range {patch.vllm} leaves {new} out: widen it"
            return PatchStep.of(
                patch.id, "needed", "hand-work", f"{why} (check --suggest-ranges)", where
            )
        line = _first(result.detail, where)
        return PatchStep.of(patch.id, "needed", "kept", line, where, shifted=result.shifted)
    assert result.verdict in ATTENTION
    from patchset.refresh.landed import RefusedRefreshError  # noqa: PLC0415 -- gitpython: on use

    try:
        done = refresher(registry, patch.id, new, source=source, write=write)
    except RefusedRefreshError as exc:
        found = tuple(x.describe() for x in exc.landed) + exc.lines
        action: BumpAction = "dropped" if exc.upstream else "hand-work"
        return PatchStep.of(patch.id, result.verdict, action, str(exc), (*found, *where))
    except PatchsetError as exc:
        return PatchStep.of(
            patch.id,
            result.verdict,
            "hand-work",
            f"{_first(result.detail, where)}; refresh: {exc}",
            where,
        )
    if done.outcome in ("written", "proposed"):
        how = "written" if done.outcome == "written" else "clean, not written (no --write)"
        variant = done.variant
        if done.outcome == "written" and variant:
            variant = str(patch.folder / variant)
        failing = [f"{f}#{i}" for f, i in result.failing_hunks] + list(result.failing_sites)
        was = ", ".join(failing[:3]) or (where[0] if where else "its files")
        return PatchStep.of(
            patch.id,
            result.verdict,
            "refreshed",
            f"{how}: {done.variant} ({result.verdict} was at {was})",
            where,
            variant=variant,
        )
    return PatchStep.of(patch.id, result.verdict, "hand-work", _unfinished(done), where)


def _unfinished(done: Any) -> str:
    """A refresh left for hand work, in one line naming files and lines."""
    if done.conflicts:
        where = f" (work folder {done.workdir})" if done.workdir else ""
        said = ", ".join(
            f"{c.file}:{','.join(str(n) for n in c.lines[:3])}" if c.lines else c.file
            for c in done.conflicts
        )
        return f"refresh: three-way merge conflicts at {said}{where}"
    stuck = [s for s in done.sites if not s.resolved]
    if stuck:
        said = "; ".join(f"site {s.site} in {s.file}: {s.reason or s.status}" for s in stuck)
        return f"refresh: no clear new anchor ({said}): refresh {done.patch} --pick"
    return f"refresh: {done.outcome} ({done.from_variant} onto vllm {done.vllm})"


def _first(detail: str, where: tuple[str, ...]) -> str:
    """The check's detail and the first place it names (a file and a line)."""
    if where and where[0] not in detail:
        return f"{detail}; {where[0]}" if detail else where[0]
    return detail


def _evidence(result: CheckResult) -> str:
    signals = result.signals
    said = [_first(result.detail, tuple(result.locations))]
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


def _new_text(
    old: BuildDefinition, new: str, patches: list[str]
) -> tuple[str, str, tuple[str, ...]]:
    """The old definition's text, comments kept, moved to `new`; the new base; and the
    comment lines that name the old release, flagged (not rewritten: "in 0.20.0 upstream
    made X opt-in" is history, "on the 0.20.0 image" is not; a person tells them apart)."""
    doc = tomlkit.parse(old.file.read_text(encoding="utf-8"))
    literal = re.compile(rf"(?<![\d.]){re.escape(old.vllm)}(?![\d])")
    doc["vllm"] = new
    base = literal.sub(new, old.base)
    doc["base"] = base
    doc["tags"] = [literal.sub(new, t) for t in old.tags]
    doc["patches"] = patches
    text = tomlkit.dumps(doc)
    comments = tuple(
        f"line {number} names {old.vllm}: {line.strip()[:120]!r}"
        for number, line in enumerate(text.splitlines(), start=1)
        if line.lstrip().startswith("#") and literal.search(line)
    )
    return text, base, comments
