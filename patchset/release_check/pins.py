"""Per-build pins: each build definition's patches checked on the release it pins, and on the
releases after it as "would carry forward" (shown, never failing): `check --build` /
`check --builds`. One check runs over every release and patch the definitions name."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from packaging.version import Version

from patchset.errors import ExitCode
from patchset.image.plan import Plan, plan, switch_sets
from patchset.registry import Registry
from patchset.registry.builds import BuildDefinition
from patchset.release_check.prefetch import ProgressBar
from patchset.release_check.report import CheckReport, CheckResult
from patchset.release_check.run import check
from patchset.sources import select
from patchset.sources.base import ReleaseSource

SCHEMA = "patchset.check-builds/1"
Role = Literal["pinned", "carry-forward"]


@dataclass(frozen=True)
class PinnedResult:
    definition: str  # the definition's file name
    pinned: str  # the release it pins
    role: Role
    result: CheckResult

    @property
    def attention(self) -> bool:
        return self.role == "pinned" and self.result.needs_attention


@dataclass(frozen=True)
class BuildsReport:
    check: CheckReport  # the one check underneath, every release and patch
    rows: tuple[PinnedResult, ...]
    plans: tuple[Plan, ...] = ()  # the planner's, per definition: what export would refuse

    @property
    def refusals(self) -> int:
        return sum(len(p.refusals) for p in self.plans)

    @property
    def exit_code(self) -> int:
        attention = any(r.attention for r in self.rows) or self.refusals
        return ExitCode.ATTENTION if attention else ExitCode.OK

    def pinned_report(self) -> CheckReport:
        """The check with only what the definitions run (their pinned releases): what
        annotations and the exit code are about."""
        pinned = {(r.result.vllm, r.result.patch) for r in self.rows if r.role == "pinned"}
        kept = tuple(r for r in self.check.results if (r.vllm, r.patch) in pinned)
        versions = {v for v, _ in pinned}
        releases = tuple(i for i in self.check.releases if i.version in versions)
        return dataclasses.replace(self.check, results=kept, releases=releases)

    def to_dict(self) -> dict[str, Any]:
        by: dict[str, dict[str, Any]] = {}
        for row in self.rows:
            entry = by.setdefault(
                row.definition, {"definition": row.definition, "vllm": row.pinned, "results": []}
            )
            entry["results"].append(
                {**row.result.to_dict(), "role": row.role, "attention": row.attention}
            )
        for planned in self.plans:
            entry = by.setdefault(
                planned.definition,
                {"definition": planned.definition, "vllm": planned.vllm, "results": []},
            )
            entry["plan"] = planned.to_dict()
        return {
            "schema": SCHEMA,
            "registry": self.check.registry,
            "definitions": list(by.values()),
            "exit_code": int(self.exit_code),
        }


def check_builds(
    registry: Registry,
    definitions: Sequence[BuildDefinition],
    *,
    source: ReleaseSource,
    versions: Sequence[str] = (),
    since: str | None = None,
    pre: bool = False,
    switches: Sequence[str] = (),
    max_fuzz: int = 0,
    served: Mapping[str, str] | None = None,
    progress: ProgressBar | None = None,
    jobs: int = 1,
) -> BuildsReport:
    """Each definition's patches on its own release (pinned) and, as carry-forward, on each
    later release `versions` and `since` select (`sources.select.for_check`; neither: none);
    `max_fuzz`, `served`, `progress` and `jobs` go to `patchset.check`. Then the planner, per
    definition (its defaults and the switch sets `switches`): every refusal export would make."""
    later: list[str] = []
    if versions or since:
        later = select.for_check(source, versions=versions, since=since, pre=pre)
    for definition in definitions:
        for patch_id in definition.patches:
            registry.get(patch_id)  # a definition naming a patch the registry lacks: exit 2
    releases = sorted({d.vllm for d in definitions} | set(later), key=Version)
    patches = list(dict.fromkeys(p for d in definitions for p in d.patches))
    report = check(
        registry,
        releases,
        source=source,
        patches=patches,
        max_fuzz=max_fuzz,
        served=served,
        progress=progress,
        jobs=jobs,
    )
    found = {(r.vllm, r.patch): r for r in report.results}  # report.result() is a scan
    rows: list[PinnedResult] = []
    for definition in definitions:
        pin = Version(definition.vllm)
        for version in releases:
            if Version(version) < pin:
                continue
            role: Role = "pinned" if Version(version) == pin else "carry-forward"
            rows.extend(
                PinnedResult(definition.file.name, definition.vllm, role, found[version, p])
                for p in definition.patches
            )
    plans = []
    for definition in definitions:  # every refusal `runtime export` would make, at once
        with source.open(definition.vllm) as tree:
            read = lambda wanted, tree=tree: {rel: tree.read(rel) for rel in wanted}  # noqa: E731
            sets = switch_sets(definition, registry, switches)
            plans.append(plan(definition, registry, read, sets=sets))
    return BuildsReport(report, tuple(rows), tuple(plans))
