"""How `patchset check` shows its report to people: a summary first, then a grid that fits.

A table of a few releases has one column per release, each verdict in words. Past `WIDE`
releases, releases whose every verdict is the same are grouped into one column (a range of
releases); when even that does not fit `FIT` columns, each patch gets one run-length strip
(``NNNNNN uuuuuuuuuu mmmmmmmmm``, a symbol per release). ``--wide`` shows the full grid. The
patch column never wraps. Markdown (a pull-request comment, a job summary) stays under
`MAX_MARKDOWN` characters by summarising: the full report is the JSON.
"""

from __future__ import annotations

import html
from collections.abc import Callable, Sequence

from rich.table import Table
from rich.text import Text

from patchset.cli.output import OUTCOME_STYLE, console, styled, table, text
from patchset.errors import one_line
from patchset.registry import Patch, Registry
from patchset.release_check import CheckReport, CheckResult

SYMBOLS = {"needed": "N", "upstream": "U", "conflict": "C", "partial": "P", "missing-target": "M"}
LEGEND = (
    "N needed  U upstream  C conflict  P partial  M missing-target;"
    "  lower case: out of the patch's range;  !: signals disagree"
)
WIDE = 6  # more releases than this: one short symbol per cell, and a legend
FIT = 80  # columns the grid fits in (without --wide)
MAX_NOTES = 40  # note lines a table shows; --explain shows them all
MAX_NAMED = 8  # patches a summary line names before "and N more"
MAX_MARKDOWN = 60_000  # characters: a pull-request comment holds 65,536


def symbol(r: CheckResult) -> str:
    """One character for a verdict: upper case in the patch's range, lower case outside."""
    mark = SYMBOLS.get(r.verdict, "?")
    return mark if r.in_range else mark.lower()


def _span(versions: Sequence[str]) -> str:
    return versions[0] if len(versions) == 1 else f"{versions[0]}..{versions[-1]} ({len(versions)})"


def _named(ids: list[str]) -> str:
    shown = ", ".join(ids[:MAX_NAMED])
    return shown + (f" and {len(ids) - MAX_NAMED} more" if len(ids) > MAX_NAMED else "")


class Grid:
    """The report as rows of patches and columns of releases, in the registry's order."""

    def __init__(self, report: CheckReport, registry: Registry) -> None:
        self.versions = [i.version for i in report.releases]
        self.found = {(r.vllm, r.patch): r for r in report.results}
        self.patches: list[Patch] = [
            p for p in registry.patches if any((v, p.id) in self.found for v in self.versions)
        ]

    def row(self, patch: Patch) -> list[CheckResult]:
        return [self.found[(v, patch.id)] for v in self.versions if (v, patch.id) in self.found]

    def groups(self) -> list[list[str]]:
        """Runs of consecutive releases in which every patch's verdict is the same."""
        out: list[list[str]] = []
        last: tuple[str, ...] | None = None
        for v in self.versions:
            key = tuple(
                symbol(r) + ("!" if r.disagreement else "")
                for p in self.patches
                if (r := self.found.get((v, p.id))) is not None
            )
            if out and key == last:
                out[-1].append(v)
            else:
                out.append([v])
            last = key
        return out


def summary_lines(report: CheckReport, registry: Registry) -> list[str]:
    """What a reader needs first: how many patches need attention, and what changed from the
    previous release to the newest."""
    grid = Grid(report, registry)
    if not grid.versions:
        return []
    attention = [p.id for p in grid.patches if any(r.needs_attention for r in grid.row(p))]
    head = (
        f"{len(grid.patches)} patch(es) x {len(grid.versions)} release(s)"
        f" ({_span(grid.versions)}): "
    )
    head += (
        f"{len(attention)} need attention in range: {_named(attention)}"
        if attention
        else "nothing in range needs attention"
    )
    lines = [head]
    if len(grid.versions) > 1:
        before, newest = grid.versions[-2], grid.versions[-1]
        changed = [
            f"{p.id} {a.verdict} -> {b.verdict}"
            for p in grid.patches
            if (a := grid.found.get((before, p.id))) is not None
            and (b := grid.found.get((newest, p.id))) is not None
            and a.verdict != b.verdict
        ]
        lines.append(
            f"from {before} to {newest}: {len(changed)} changed: {_named(changed)}"
            if changed
            else f"from {before} to {newest}: no verdict changed"
        )
    return lines


def _heads(versions: list[str]) -> list[str]:
    """Column heads; with many releases a shared leading "0." is dropped to save width."""
    if len(versions) > WIDE and all(v.startswith("0.") for v in versions):
        return [v[2:] for v in versions]
    return versions


def _cell(r: CheckResult, *, variant: bool = False, short: bool = False) -> Text:
    if short:
        style = OUTCOME_STYLE.get(r.verdict, "") if r.in_range else "dim"
        cell = text(symbol(r), style)
        if r.disagreement:
            cell.append_text(text("!", "yellow"))
        return cell
    cell = styled(r.verdict)
    if r.disagreement:
        cell.append(" ").append_text(text("!", "yellow"))
    if not r.in_range:
        cell.append(" ").append_text(text("(out of range)", "dim"))
    if variant:  # for patches with several variants
        cell.append(" ").append_text(text(r.variant, "dim"))
    return cell


def strip(results: list[CheckResult], style: Callable[[str, CheckResult], Text]) -> Text:
    """One symbol per release, a space where the verdict changes (``NNN uuuu mm``)."""
    out = Text()
    previous: str | None = None
    for r in results:
        mark = symbol(r)
        if previous is not None and mark != previous:
            out.append(" ")
        out.append_text(style(mark, r))
        previous = mark
    return out


def _styled_mark(mark: str, r: CheckResult) -> Text:
    return text(mark, OUTCOME_STYLE.get(r.verdict, "") if r.in_range else "dim")


def _patch_table(title: str, heads: list[str], label_width: int) -> Table:
    out = table(title, ["patch", *heads])
    out.columns[0].no_wrap = True  # a patch's name is read whole, never two letters a line
    out.columns[0].min_width = label_width
    for column in out.columns[1:]:
        column.no_wrap = True
    return out


def grid_table(report: CheckReport, registry: Registry, *, wide: bool = False) -> Table:
    """The grid: every release a column (a few releases, or `wide`), else release ranges
    when they fit `FIT` columns, else one strip per patch."""
    grid = Grid(report, registry)
    title = f"patchset check  (registry {registry.short_digest})"
    labels = {p.id: f"{p.id} r{p.revision}" for p in grid.patches}
    width = max((len(label) for label in labels.values()), default=5)
    several = {p.id for p in grid.patches if len(p.variants) > 1}
    versions = grid.versions
    if wide or len(versions) <= WIDE:
        short = len(versions) > WIDE
        out = _patch_table(title, _heads(versions), width)
        for patch in grid.patches:
            cells = [_cell(r, variant=patch.id in several, short=short) for r in grid.row(patch)]
            out.add_row(labels[patch.id], *cells)
        return out
    groups = grid.groups()
    heads = [_span_head(g) for g in groups]
    if width + sum(len(h) + 3 for h in heads) + 4 <= FIT:
        out = _patch_table(title, heads, width)
        for patch in grid.patches:
            out.add_row(
                labels[patch.id],
                *[_cell(grid.found[(g[0], patch.id)], short=True) for g in groups],
            )
        return out
    out = _patch_table(title, [f"{versions[0]}..{versions[-1]}"], width)
    for patch in grid.patches:
        out.add_row(labels[patch.id], strip(grid.row(patch), _styled_mark))
    return out


def _span_head(group: list[str]) -> str:
    short = _heads(group) if all(v.startswith("0.") for v in group) else group
    short = [v[2:] if v.startswith("0.") else v for v in short]
    return short[0] if len(short) == 1 else f"{short[0]}-{short[-1]}"


def show_table(
    report: CheckReport,
    registry: Registry,
    *,
    suggest: bool,
    all_notes: bool = False,
    wide: bool = False,
) -> None:
    """A summary, the grid (see `grid_table`) and its legend, then the notes, folded per
    patch and cut at `MAX_NOTES` lines with a count."""
    con = console()
    for line in summary_lines(report, registry):
        con.print(line, markup=False, soft_wrap=True)
    con.print(grid_table(report, registry, wide=wide))
    for patch in Grid(report, registry).patches:  # switch, lifecycle, predicate: said here
        if patch.gates_text():
            con.print(f"{patch.id}: {patch.gates_text()}", markup=False)
    if len(report.releases) > WIDE:
        con.print(LEGEND, style="dim", markup=False)
    notes = _notes(report)
    shown = notes if all_notes else notes[:MAX_NOTES]
    for line in shown:
        con.print(line, markup=False)
    if len(shown) < len(notes):
        con.print(
            f"... {len(notes) - len(shown)} more note lines (--explain shows them all;"
            " --format json has every detail)",
            markup=False,
        )
    if suggest:
        con.print()
        rows = table("suggested ranges (where needed)", ["patch", "declared", "needed in"])
        rows.columns[0].no_wrap = True
        for patch in Grid(report, registry).patches:
            rows.add_row(
                patch.id, str(patch.vllm), " | ".join(report.suggested.get(patch.id, ())) or "none"
            )
        con.print(rows)


def _notes(report: CheckReport) -> list[str]:
    """Per patch with anything to say: its verdicts folded into runs of releases on one line,
    then each distinct detail of what needs a look (in its range, or a disagreement) once."""
    by_patch: dict[str, list[CheckResult]] = {}
    for r in report.results:
        by_patch.setdefault(r.patch, []).append(r)
    lines: list[str] = []
    for patch, results in by_patch.items():
        if all(r.verdict == "needed" and not r.shifted and not r.disagreement for r in results):
            continue
        runs: list[tuple[str, list[str]]] = []
        for r in results:
            if runs and runs[-1][0] == r.verdict:
                runs[-1][1].append(r.vllm)
            else:
                runs.append((r.verdict, [r.vllm]))
        lines.append(f"{patch}: " + "; ".join(f"{v} {_span(vs)}" for v, vs in runs))
        details: dict[tuple[str, str, str | None], list[str]] = {}
        for r in results:
            clean = r.verdict == "needed" and not r.shifted
            if (r.in_range and not clean) or r.disagreement:
                details.setdefault((r.verdict, r.detail, r.disagreement), []).append(r.vllm)
        for (verdict, detail, disagreement), vs in details.items():
            lines.append(f"    {_span(vs)}: {verdict}: {detail}")
            if disagreement:
                lines.append(f"    signals disagree: {disagreement}")
    return lines


def md(value: str) -> str:
    """Text from a registry, a release or a detail, safe in markdown: HTML escaped (a site
    named ``<img src=x onerror=...>`` is shown, never rendered), one line, `|` kept out of
    table cells."""
    return html.escape(one_line(value), quote=False).replace("|", "\\|")


def render_markdown(report: CheckReport, registry: Registry, *, headline: bool = True) -> str:
    """The report as markdown: a summary (with `headline`), the table, then the notes. Past
    `WIDE` releases or `MAX_MARKDOWN` characters it summarises: a strip per patch instead of
    a column per release, the notes folded per patch, then cut, with a line saying so (the
    JSON report holds every result)."""
    grid = Grid(report, registry)
    lead = [f"**patchset check** (registry `{registry.short_digest}`)", ""]
    if headline:
        lead += [f"- {md(line)}" for line in summary_lines(report, registry)] + [""]
    full = [*lead, *_md_columns(grid), *_md_notes(report)]
    if len(grid.versions) <= WIDE and len("\n".join(full)) <= MAX_MARKDOWN:
        return "\n".join(full)
    rows = _md_strips(grid)
    notes = [
        ("  - " if line.startswith(" ") else "- ") + md(line.strip()) for line in _notes(report)
    ]
    cut = "- ... {} more note lines (the JSON report, `--format json`, has every result)"
    out = [*lead, *rows, "", *notes]
    budget = MAX_MARKDOWN - len("\n".join([*lead, *rows, ""])) - len(cut) - 16
    kept: list[str] = []
    for line in notes:
        budget -= len(line) + 1
        if budget < 0:
            break
        kept.append(line)
    if len(kept) < len(notes):
        out = [*lead, *rows, "", *kept, cut.format(len(notes) - len(kept))]
    text_out = "\n".join(out)
    if len(text_out) > MAX_MARKDOWN:  # more patches than even strips hold: attention first
        text_out = text_out[: MAX_MARKDOWN - 80].rsplit("\n", 1)[0]
        text_out += "\n\n... cut at 60,000 characters (`--format json` has every result)"
    return text_out


def _md_columns(grid: Grid) -> list[str]:
    lines = [
        "| patch | " + " | ".join(grid.versions) + " |",
        "|---|" + "---|" * len(grid.versions),
    ]
    for patch in grid.patches:
        cells = [r.verdict + ("" if r.in_range else " (out of range)") for r in grid.row(patch)]
        lines.append(f"| `{patch.id}` r{patch.revision} | " + " | ".join(cells) + " |")
    return lines


def _md_strips(grid: Grid) -> list[str]:
    lines = [
        f"| patch | releases {_span(grid.versions)}, one symbol each |",
        "|---|---|",
    ]
    for patch in grid.patches:
        row = strip(grid.row(patch), lambda mark, _: Text(mark)).plain
        lines.append(f"| `{patch.id}` r{patch.revision} | `{row}` |")
    return [*lines, "", md(LEGEND)]


def _md_notes(report: CheckReport) -> list[str]:
    notes = [r for r in report.results if r.verdict != "needed" or r.disagreement]
    if not notes:
        return []
    return [
        "",
        *(
            f"- {r.vllm} `{r.patch}`: **{r.verdict}**: {md(r.detail)}"
            + (f" (signals disagree: {md(r.disagreement)})" if r.disagreement else "")
            for r in notes
        ),
    ]
