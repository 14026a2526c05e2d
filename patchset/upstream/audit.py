"""The upstream audit: what the forge says of each patch's pull request, against what the
registry records (`patchset upstream`), and the registry edit that records it (``--write``).

For each patch with ``[upstream] pr`` the forge's answer (open, merged, closed, gone) is set
beside the recorded ``state``; a merged pull request's first release comes from a local vLLM
clone when one is given (the lowest release tag holding its merge commit).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Literal

from packaging.version import Version
from tomlkit.toml_document import TOMLDocument

from patchset.adapters.forge import ForgeAPI, PullState
from patchset.adapters.gitrepo import open_repo
from patchset.errors import ExitCode
from patchset.registry import Registry
from patchset.registry.model import UpstreamState
from patchset.registry.write import RegistryChange
from patchset.release_check import check
from patchset.sources.git import GitSource, release_tags

SCHEMA = "patchset.upstream/1"
AuditStatus = Literal[
    "newly-merged", "closed-unmerged", "out-of-date", "gone", "still-open", "up-to-date"
]
ATTENTION: frozenset[str] = frozenset({"newly-merged", "closed-unmerged", "out-of-date", "gone"})
JOBS = 8  # requests in flight: the forge answers each in tens of milliseconds


@dataclass(frozen=True)
class Finding:
    """One patch's pull request: recorded state, the forge's, and what follows."""

    patch: str
    pr: str
    recorded: str
    forge: str  # open | merged | closed | gone
    status: AuditStatus
    advice: str
    merged_at: str | None = None
    merge_commit: str | None = None
    first_release: str | None = None
    new_state: UpstreamState | None = None  # what --write records (None: nothing to record)
    cached: bool = False
    # With a clone: the first of its releases the check reads `upstream` (None: none of those
    # up to first_release), and how that disagrees with first_release (None: it agrees)
    check_first_upstream: str | None = None
    disagreement: str | None = None

    @property
    def attention(self) -> bool:
        return self.status in ATTENTION or self.disagreement is not None


@dataclass(frozen=True)
class UpstreamReport:
    findings: tuple[Finding, ...]
    written: tuple[str, ...] = ()  # patch ids whose patch.toml --write changed

    @property
    def exit_code(self) -> int:
        return ExitCode.ATTENTION if any(f.attention for f in self.findings) else ExitCode.OK

    def to_dict(self) -> dict[str, Any]:
        counts: dict[str, int] = {}
        for f in self.findings:
            counts[f.status] = counts.get(f.status, 0) + 1
        return {
            "schema": SCHEMA,
            "findings": [{**asdict(f), "attention": f.attention} for f in self.findings],
            "counts": counts,
            "written": list(self.written),
            "exit_code": int(self.exit_code),
        }


def audit(
    registry: Registry,
    forge: ForgeAPI,
    *,
    patches: Sequence[str] = (),
    git: GitSource | Path | None = None,
    jobs: int = JOBS,
) -> UpstreamReport:
    """Ask the forge about each patch's pull request (those of `patches`, else every patch
    with one), `jobs` at a time, each pull request once; compare with the registry. With
    `git`, a local vLLM clone (or its folder), each merged one's first release."""
    chosen = registry.select(tuple(patches))
    tracked = [(p.id, p.upstream.pr, p.upstream.state) for p in chosen if p.upstream.pr]
    prs = sorted({pr for _, pr, _ in tracked})
    with ThreadPoolExecutor(max_workers=max(1, min(jobs, len(prs) or 1))) as pool:
        answers = dict(zip(prs, pool.map(forge.pull, prs), strict=True))
    clone = git.path if isinstance(git, GitSource) else git
    releases = _first_releases(clone, [a.merge_commit for a in answers.values() if a.merge_commit])
    findings = [
        judge(patch_id, state, answers[pr], releases.get(answers[pr].merge_commit or ""))
        for patch_id, pr, state in sorted(tracked)
    ]
    if git is not None:
        findings = _beside_the_check(registry, findings, git)
    return UpstreamReport(tuple(findings))


def _beside_the_check(
    registry: Registry, findings: list[Finding], git: GitSource | Path
) -> list[Finding]:
    """Each merged pull request's first release (the clone's tags) set beside the first of
    the clone's releases, up to it, that the check reads `upstream`; a difference is said."""
    known = [f for f in findings if f.first_release]
    if not known:
        return findings
    source = git if isinstance(git, GitSource) else GitSource(git)
    finals = [v for v in source.versions() if not Version(v).is_prerelease]
    out = []
    for f in findings:
        if not f.first_release or f.first_release not in finals:
            out.append(f)
            continue
        patch = registry.get(f.patch)
        upto = [
            v
            for v in finals
            if Version(v) <= Version(f.first_release)
            and (patch.in_range(v) or v == f.first_release)
        ]
        results = check(registry, upto, source=source, patches=[patch.id])
        first = next((v for v in upto if results.result(v, patch.id).verdict == "upstream"), None)
        said = None
        if first != f.first_release:
            said = (
                f"the forge's merge first ships in {f.first_release}, but the check reads"
                + (f" upstream from {first}" if first else f" no upstream up to {f.first_release}")
                + ": look at the patch's probe and range"
            )
        out.append(dataclasses.replace(f, check_first_upstream=first, disagreement=said))
    return out


def judge(patch_id: str, recorded: str, pull: PullState, first_release: str | None) -> Finding:
    """The decision table (docs/ci.md, "Weekly"): the forge's state beside the recorded one."""
    forge = pull.state
    status: AuditStatus
    new: UpstreamState | None = None
    if forge == "gone":
        status, advice = "gone", "the forge has no such pull request (404): fix [upstream] pr"
    elif forge == "merged":
        if recorded == "merged":
            status, advice = "up-to-date", "merged, as recorded"
        elif recorded in ("open", "unsubmitted"):
            status, new = "newly-merged", "merged"
            held = f"; first in {first_release}" if first_release else ""
            advice = f"merged upstream{held}: retire the patch, narrow its range, or keep it"
        else:
            status, new, advice = "out-of-date", "merged", f"recorded {recorded}, but merged"
    elif forge == "closed":
        if recorded in ("closed", "superseded"):
            status, advice = "up-to-date", f"closed, recorded {recorded}"
        elif recorded == "open":
            status, new = "closed-unmerged", "closed"
            advice = "closed without merging: find what replaced it, or keep the patch"
        else:
            status, new, advice = (
                "out-of-date",
                "closed",
                f"recorded {recorded}, but closed unmerged",
            )
    elif recorded in ("open", "superseded"):
        status, advice = (
            ("still-open", "open")
            if recorded == "open"
            else (
                "up-to-date",
                "open, recorded superseded",
            )
        )
    else:
        status, new, advice = "out-of-date", "open", f"recorded {recorded}, but open"
    return Finding(
        patch=patch_id,
        pr=pull.pr,
        recorded=recorded,
        forge=forge,
        status=status,
        advice=advice,
        merged_at=pull.merged_at,
        merge_commit=pull.merge_commit,
        first_release=first_release if forge == "merged" else None,
        new_state=new,
        cached=pull.cached,
    )


def _first_releases(git: Path | None, commits: Iterable[str]) -> dict[str, str]:
    """Each commit's first final release in the clone at `git` (the lowest ``vX.Y.Z`` tag
    holding it); commits the clone lacks, or no release holds yet, are left out."""
    found: dict[str, str] = {}
    if git is None:
        return found
    with open_repo(git) as repo:
        for commit in dict.fromkeys(commits):
            tags = repo.tags_containing(commit)
            finals = sorted(v for v in release_tags(tags or []) if not v.is_prerelease)
            if finals:
                found[commit] = str(finals[0])
    return found


def record(registry: Registry, report: UpstreamReport) -> UpstreamReport:
    """Write each finding's new state (and a merged pull request's commit, where none is
    recorded) into its patch.toml, all or nothing, comments kept (registry/write.py)."""
    change = RegistryChange(registry)
    written = []
    for finding in report.findings:
        if finding.new_state is None:
            continue
        patch = registry.get(finding.patch)

        def edit(doc: TOMLDocument, f: Finding = finding) -> None:
            table = doc["upstream"]
            assert isinstance(table, dict)  # a tomlkit Table: the patch loaded with it
            table["state"] = f.new_state
            if f.new_state == "merged" and f.merge_commit and "commit" not in table:
                table["commit"] = f.merge_commit

        change.edit_toml(patch, edit)
        written.append(finding.patch)
    if written:
        change.commit()
    return UpstreamReport(report.findings, tuple(written))
