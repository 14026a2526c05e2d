"""`patchset check --format github`: workflow commands that GitHub Actions shows as
annotations on the patch files, and a job summary when `$GITHUB_STEP_SUMMARY` is set.

- `::error` for an in-range `conflict`, `partial` or `missing-target` (what fails the check);
  `::warning` for an in-range patch that applies only at an offset or with fuzz, and for
  signals that disagree.
- One annotation per (patch, finding), with the releases listed; the detail shown is the
  newest release's.
- `file=` is the payload relative to the repository root (`$GITHUB_WORKSPACE`, else the git
  top level, else the working folder); `line=` the failing hunk's `@@` line in the diff, or
  the failing site's `anchor =` line in `sites.toml` (a missing file: its header line).
- GitHub shows at most 10 annotations of a kind per step: past that, the last one shown
  rolls up the rest, which the job summary lists in full.
- The summary lists in-range attention first, then warnings; out-of-range results are
  folded into a `<details>` block with the full table.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from patchset.adapters.actions import workflow_command
from patchset.cli.check_report import md
from patchset.cli.output import err_console
from patchset.registry import Registry, Variant
from patchset.release_check import CheckReport, CheckResult

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"
WORKSPACE_ENV = "GITHUB_WORKSPACE"
PER_STEP = 10  # annotations of one level GitHub shows for a step; more are dropped


@dataclass(frozen=True)
class Finding:
    """One annotation: a patch's finding, folded over the releases that share it."""

    level: str  # error | warning
    patch: str
    what: str  # the verdict, or "signals disagree"
    results: tuple[CheckResult, ...]  # oldest release first

    @property
    def newest(self) -> CheckResult:
        return self.results[-1]

    @property
    def releases(self) -> list[str]:
        return [r.vllm for r in self.results]

    def detail(self) -> str:
        newest = self.newest
        text = f"{newest.verdict}; {newest.disagreement}" if self.what == "signals disagree" else ""
        text = text or newest.detail
        if len({r.detail for r in self.results}) > 1:
            text += f" (the detail differs between releases; this is {newest.vllm}'s)"
        return text


def findings(report: CheckReport) -> list[Finding]:
    """The annotations to make, errors first, each in the report's order."""
    groups: dict[tuple[str, str, str], list[CheckResult]] = {}
    for r in report.results:
        if r.needs_attention:
            groups.setdefault(("error", r.patch, r.verdict), []).append(r)
        elif r.in_range and r.verdict == "needed" and r.shifted:
            groups.setdefault(("warning", r.patch, "needs a refresh"), []).append(r)
        if r.disagreement and r.in_range:
            groups.setdefault(("warning", r.patch, "signals disagree"), []).append(r)
    found = [Finding(level, p, what, tuple(rs)) for (level, p, what), rs in groups.items()]
    return sorted(found, key=lambda f: f.level != "error")


def repo_root(environ: dict[str, str] | None = None) -> Path:
    """Where `file=` paths start: $GITHUB_WORKSPACE, else the git top level, else cwd."""
    env = os.environ if environ is None else environ
    if env.get(WORKSPACE_ENV):
        return Path(env[WORKSPACE_ENV])
    from patchset.adapters.gitrepo import toplevel  # (GitPython: only here)

    return toplevel(Path.cwd()) or Path.cwd()


def shown(path: Path, root: Path) -> str:
    """`path` relative to `root` (both resolved), else as it is."""
    try:
        return path.resolve().relative_to(root.resolve()).as_posix()
    except (ValueError, OSError):
        return path.as_posix()


def payload_line(variant: Variant, result: CheckResult) -> int | None:
    """The line in `variant`'s payload of the first thing that did not fit in `result`: a
    failing hunk's `@@`, a failing site's `anchor`, else a missing file's header or `file`
    (the lines the registry recorded when it loaded)."""
    if variant.sites:
        lines = list(zip(variant.sites, variant.site_lines, strict=True))
        for site, (anchor, _) in lines:
            if site.name in result.failing_sites and anchor is not None:
                return anchor
        for site, (_, file) in lines:
            if site.file in result.missing and file is not None:
                return file
        return None
    failing = set(result.failing_hunks)
    for hunk, line in variant.hunk_lines.items():  # in the diff's order
        if hunk in failing:
            return line
    for missing in result.missing:
        if missing in variant.file_lines:
            return variant.file_lines[missing]
    return None


def _span(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}..{versions[-1]} ({len(versions)})"


def annotation(finding: Finding, registry: Registry, root: Path) -> str:
    patch = registry.get(finding.patch)
    newest = finding.newest
    payload = patch.folder / newest.variant
    variant = next((v for v in patch.variants if v.name == newest.variant), None)
    file = payload if payload.is_file() else patch.folder / "patch.toml"
    line = payload_line(variant, newest) if variant is not None and payload.is_file() else None
    title = f"{finding.patch} r{patch.revision}: {finding.what} on vLLM {_span(finding.releases)}"
    message = f"vLLM {', '.join(finding.releases)}: {finding.detail()}"
    return workflow_command(finding.level, message, file=shown(file, root), line=line, title=title)


def workflow_commands(
    report: CheckReport, registry: Registry, root: Path | None = None
) -> list[str]:
    """The annotations, at most PER_STEP of each level (the last one rolling up the rest)."""
    root = repo_root() if root is None else root
    lines: list[str] = []
    for level in ("error", "warning"):
        these = [f for f in findings(report) if f.level == level]
        shown_here = these if len(these) <= PER_STEP else these[: PER_STEP - 1]
        lines += [annotation(f, registry, root) for f in shown_here]
        rest = these[len(shown_here) :]
        if rest:
            listed = "; ".join(f"{f.patch}: {f.what} on {_span(f.releases)}" for f in rest)
            lines.append(
                workflow_command(
                    level,
                    f"{len(rest)} more not shown as annotations (GitHub shows {PER_STEP} per"
                    f" step; the job summary lists them all): {listed}",
                    title=f"patchset check: {len(rest)} more {level}s",
                )
            )
    return lines


def summary(report: CheckReport, registry: Registry, table: str) -> str:
    """The job summary: in-range attention first, then warnings; out of range folded."""
    found = findings(report)
    failing = sum(1 for r in report.results if r.needs_attention)
    checked = _span([i.version for i in report.releases]) if report.releases else "none"
    out = [
        "## patchset check",
        "",
        f"registry `{registry.short_digest}`, releases {checked}: "
        + (
            f"**{failing} in range need attention**"
            if failing
            else "nothing in range needs attention"
        ),
        "",
    ]
    for level, heading in (
        ("error", "Needs attention (in range)"),
        ("warning", "Warnings (in range)"),
    ):
        these = [f for f in found if f.level == level]
        if these:
            out += [f"### {heading}", ""]
            for f in these:  # one line each: a detail's own newlines would end the list item
                releases = ", ".join(f.releases)
                out.append(f"- **`{f.patch}`: {f.what}** on vLLM {releases}: {md(f.detail())}")
            out.append("")
    outside = [r for r in report.results if not r.in_range]
    out += [
        f"<details><summary>Every verdict ({len(outside)} out of range)</summary>",
        "",
        table,
        "",
        "</details>",
        "",
    ]
    return "\n".join(out)


def render(report: CheckReport, registry: Registry, markdown: str) -> str:
    """The workflow commands, one per line, and a closing line; the summary (around the
    `markdown` table) is appended to `$GITHUB_STEP_SUMMARY` when set. A summary that cannot
    be written is a warning (stderr and an annotation); the exit code stays the check's."""
    lines = workflow_commands(report, registry)
    target = os.environ.get(SUMMARY_ENV)
    if target:
        try:
            with Path(target).open("a", encoding="utf-8") as fh:
                fh.write(summary(report, registry, markdown) + "\n")
        except OSError as exc:
            why = f"{SUMMARY_ENV}={target}: cannot write the job summary: {exc.strerror or exc}"
            err_console().print(f"patchset: warning: {why}", markup=False, soft_wrap=True)
            lines.append(workflow_command("warning", why, title="patchset check"))
    failing = sum(1 for r in report.results if r.needs_attention)
    checked = _span([i.version for i in report.releases]) if report.releases else "none"
    lines.append(
        f"patchset check: {len(report.results)} results, releases {checked};"
        f" {failing} in range need attention"
    )
    return "\n".join(lines) + "\n"
