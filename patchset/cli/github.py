"""`patchset check --format github`: workflow commands that GitHub Actions shows as
annotations on the patch files, plus the markdown table in the job summary when there is one.

`::error` for each in-range `conflict`, `partial` or `missing-target` (what fails the check);
`::warning` for an in-range patch that only applies at an offset or with fuzz (refresh it)
and for signals that disagree. Releases with the same finding are folded into one line.
"""

from __future__ import annotations

import os
from pathlib import Path

from patchset.registry import Registry
from patchset.release_check.verdicts import CheckReport, CheckResult

SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


def escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def escape_property(text: str) -> str:
    return escape_data(text).replace(":", "%3A").replace(",", "%2C")


def command(level: str, message: str, **properties: str) -> str:
    props = ",".join(f"{key}={escape_property(value)}" for key, value in properties.items())
    return f"::{level} {props}::{escape_data(message)}" if props else f"::{level}::{message}"


def _shown(path: Path) -> str:
    """The path as the workflow's checkout sees it: relative to the working folder if inside."""
    try:
        return path.absolute().relative_to(Path.cwd()).as_posix()
    except ValueError:
        return path.as_posix()


def _span(versions: list[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}..{versions[-1]} ({len(versions)})"


def workflow_commands(report: CheckReport, registry: Registry) -> list[str]:
    groups: dict[tuple[str, str, str, str], list[CheckResult]] = {}
    for r in report.results:
        if r.needs_attention:
            groups.setdefault(("error", r.patch, r.verdict, r.detail), []).append(r)
        elif r.in_range and r.verdict == "needed" and r.shifted:
            groups.setdefault(("warning", r.patch, r.verdict, r.detail), []).append(r)
        if r.disagreement:
            key = ("warning", r.patch, "signals disagree", f"{r.verdict}; {r.disagreement}")
            groups.setdefault(key, []).append(r)
    lines = []
    for (level, patch_id, what, detail), results in groups.items():
        patch = registry.get(patch_id)
        first = results[0]
        payload = patch.folder / first.variant
        file = payload if payload.is_file() else patch.folder / "patch.toml"
        title = f"{patch_id} r{patch.revision} on vLLM {_span([r.vllm for r in results])}: {what}"
        lines.append(command(level, detail, file=_shown(file), title=title))
    return lines


def render(report: CheckReport, registry: Registry, markdown: str) -> str:
    """The workflow commands, one per line; `markdown` goes to the job summary if set."""
    summary = os.environ.get(SUMMARY_ENV)
    if summary:
        with Path(summary).open("a", encoding="utf-8") as fh:
            fh.write(markdown + "\n")
    lines = workflow_commands(report, registry)
    failing = sum(1 for r in report.results if r.needs_attention)
    checked = _span([i.version for i in report.releases]) if report.releases else "none"
    lines.append(
        f"patchset check: {len(report.results)} results, releases {checked};"
        f" {failing} in range need attention"
    )
    return "\n".join(lines) + "\n"
