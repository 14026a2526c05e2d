"""Runtime patches: anchor candidates for each site that no longer matches, one clearly best
becoming the proposal, and the new sites file.
"""

from __future__ import annotations

import dataclasses
import difflib
import tempfile
import textwrap
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import tomlkit
from packaging.specifiers import SpecifierSet

from patchset.engine.evaluate import evaluate
from patchset.errors import UsageError
from patchset.kernel.hunks import rank_windows, split_text
from patchset.kernel.sites import Site, check_site, find_block, shift
from patchset.refresh.job import AnchorCandidate, Job, RefreshResult, SiteRefresh, read_release
from patchset.refresh.landed import refuse_deletions
from patchset.refresh.record import payload_name, record
from patchset.registry import Variant, load_sites
from patchset.registry.toml import did_you_mean
from patchset.sources.base import ReleaseSource

MIN_SIMILARITY = 0.6  # a proposed anchor is at least this much like the old one
MARGIN = 0.1  # and this much ahead of the next candidate


def refresh_runtime(
    job: Job, source: ReleaseSource, *, write: bool, picks: Mapping[str, int]
) -> RefreshResult:
    patch, variant, target = job.patch, job.variant, job.target
    names = [s.name for s in variant.sites]
    for name in picks:
        if name not in names:
            raise UsageError(
                f"--pick {name}: {variant.name} has no such site{did_you_mean(name, names)}"
            )
    texts = {rel: split_text(_decode(data or b""))[0] for rel, data in job.files.items()}
    base_texts: dict[str, list[str]] = {}
    if job.base is not None:
        base_texts = {
            rel: split_text(_decode(data))[0]
            for rel, data in read_release(source, job.base, variant.files, job=job).items()
            if data is not None
        }
    sites = tuple(
        _site_refresh(site, texts[site.file], base_texts.get(site.file), picks.get(site.name))
        for site in variant.sites
    )
    if not all(s.resolved for s in sites):
        return job.result("unresolved", sites=sites)
    old_text = (patch.folder / variant.name).read_text(encoding="utf-8")
    new_text = _new_sites_file(old_text, variant.sites, sites)
    name = payload_name(patch, target, ".sites.toml", new_text.encode("utf-8"))
    failures, edited = _check_sites(job, new_text, name)
    if not failures:
        refuse_deletions(patch.id, variant, target, job.files, edited)
    if failures:
        reason = "the proposed sites do not apply: " + "; ".join(failures)
        unresolved = tuple(s if s.anchor is None else _without_anchor(s, reason) for s in sites)
        return job.result("unresolved", sites=unresolved)
    shown = "".join(
        difflib.unified_diff(
            old_text.splitlines(keepends=True),
            new_text.splitlines(keepends=True),
            fromfile=f"a/{variant.name}",
            tofile=f"b/{name}",
        )
    )
    if not write:
        return job.result("proposed", variant=name, payload=shown, sites=sites)
    written, changes, revision = record(job, name, new_text.encode("utf-8"))
    return job.result(
        "written",
        variant=name,
        revision=revision,
        payload=shown,
        ranges=changes,
        sites=sites,
        written=written,
    )


def _without_anchor(site: SiteRefresh, reason: str) -> SiteRefresh:
    return dataclasses.replace(site, anchor=None, text_follows=False, reason=reason)


def _site_refresh(
    site: Site, lines: list[str], base_lines: list[str] | None, pick: int | None
) -> SiteRefresh:
    found = check_site(site, lines)
    if found.status == "applies":
        if pick is not None:
            raise UsageError(f"--pick {site.name}: its anchor still matches; nothing to pick")
        return SiteRefresh(site.name, site.file, "applies", line=found.line)
    if found.status != "anchor-not-found":
        return SiteRefresh(site.name, site.file, found.status, reason=found.describe())
    kept = _kept_lines(base_lines, site, lines) if base_lines is not None else set()
    candidates = tuple(
        AnchorCandidate(
            start + 1,
            ratio,
            window,
            unchanged=bool(window) and all(i in kept for i in range(start, start + len(window))),
        )
        for start, window, ratio in rank_windows(lines, site.anchor_lines, limit=4)
    )
    if pick is not None:
        if not 1 <= pick <= len(candidates):
            raise UsageError(f"--pick {site.name}={pick}: there are {len(candidates)} candidates")
        chosen: AnchorCandidate | None = candidates[pick - 1]
        reason = ""
    else:
        chosen, reason = _clear_best(candidates)
    if chosen is None:
        return SiteRefresh(site.name, site.file, found.status, candidates=candidates, reason=reason)
    # Written where the old anchor's first line was written, so the text (shifted together
    # with the anchor) keeps its place relative to it: column 0 stays column 0.
    anchor = _dedent(chosen.lines)
    anchor = shift(anchor, _indent(anchor[0]), _indent(site.anchor_lines[0])) if anchor else []
    matches = len(find_block(lines, anchor))
    if matches != 1:
        reason = f"candidate {candidates.index(chosen) + 1} occurs {matches} times in the file"
        return SiteRefresh(site.name, site.file, found.status, candidates=candidates, reason=reason)
    follows = (
        site.action == "replace" and len(find_block(_text_lines(site), site.anchor_lines)) == 1
    )
    return SiteRefresh(
        site.name,
        site.file,
        found.status,
        candidates=candidates,
        anchor="\n".join(anchor),
        picked=candidates.index(chosen) + 1,
        text_follows=follows,
    )


def _clear_best(candidates: tuple[AnchorCandidate, ...]) -> tuple[AnchorCandidate | None, str]:
    eligible = [c for c in candidates if not c.unchanged]
    if not eligible:
        return None, "no candidate: every near window is code the base release has too"
    best = eligible[0]
    if best.similarity < MIN_SIMILARITY:
        return None, f"the best candidate is only {best.similarity:.0%} alike; pick one"
    if len(eligible) > 1 and best.similarity - eligible[1].similarity < MARGIN:
        return None, (
            f"no clear best: {best.similarity:.0%} at line {best.line} and"
            f" {eligible[1].similarity:.0%} at line {eligible[1].line}; pick one"
        )
    return best, ""


def _kept_lines(base_lines: list[str], site: Site, lines: list[str]) -> set[int]:
    """0-based lines of the target that are base-release lines outside the anchor, unchanged."""
    anchor_at = find_block(base_lines, site.anchor_lines)
    if len(anchor_at) != 1:
        return set()
    start, size = anchor_at[0], len(site.anchor_lines)
    fold = [" ".join(line.split()) for line in base_lines]
    new = [" ".join(line.split()) for line in lines]
    kept: set[int] = set()
    matcher = difflib.SequenceMatcher(None, fold, new, autojunk=False)
    for tag, i1, i2, j1, _j2 in matcher.get_opcodes():
        if tag == "equal":
            kept.update(j1 + k for k in range(i2 - i1) if not start <= i1 + k < start + size)
    return kept


def _indent(line: str) -> str:
    return line[: len(line) - len(line.lstrip())]


def _dedent(lines: tuple[str, ...]) -> list[str]:
    block = textwrap.dedent("\n".join(lines)).splitlines()
    while block and not block[-1].strip():
        block.pop()
    while block and not block[0].strip():
        block.pop(0)
    return [line.rstrip() for line in block]


def _text_lines(site: Site) -> list[str]:
    """A replace site's text as a block (edited_lines without the marker comment)."""
    return site.edited_lines()[1:]


def _new_text(site: Site, anchor: list[str]) -> str:
    """A replace site's text with its copy of the old anchor swapped for the new one."""
    text = _text_lines(site)
    at = find_block(text, site.anchor_lines)[0]
    new = shift(anchor, _indent(anchor[0]), _indent(text[at]))
    return "\n".join([*text[:at], *new, *text[at + len(site.anchor_lines) :]])


def _new_sites_file(old_text: str, old: tuple[Site, ...], sites: tuple[SiteRefresh, ...]) -> str:
    """The old sites file with new anchors (and texts that follow them); comments kept."""
    by_name = {s.name: s for s in old}
    doc = tomlkit.parse(old_text)
    for table in doc["site"]:
        refreshed = next(s for s in sites if s.site == table["name"])
        if refreshed.anchor is None:
            continue
        anchor = refreshed.anchor.splitlines()
        table["anchor"] = _multiline(anchor)
        if refreshed.text_follows:
            table["text"] = _multiline(_new_text(by_name[refreshed.site], anchor).splitlines())
    return tomlkit.dumps(doc)


def _multiline(lines: list[str]) -> Any:
    """A multi-line TOML string written as the registry's files write them: the opening
    quotes alone on their line (tomlkit would put the first line right after them)."""
    body = tomlkit.string("\n".join(lines) + "\n", multiline=True).as_string()[3:-3]
    return tomlkit.parse(f'v = """\n{body}"""\n')["v"]


def _check_sites(job: Job, text: str, name: str) -> tuple[list[str], dict[str, bytes | None]]:
    """Load the new sites file as the registry will, and dry-run it on the target release."""
    with tempfile.TemporaryDirectory(prefix="patchset-refresh-") as tmp:
        path = Path(tmp) / name
        path.write_text(text, encoding="utf-8")
        sites = load_sites(path)
    variant = Variant(name, SpecifierSet(f">={job.target}"), "", sites=sites)
    ev = evaluate(job.patch, variant, job.files.get)
    if ev.state != "applies":
        return list(ev.failures) or [ev.state], {}
    edited = {rel: ev.changes.get(rel, data) for rel, data in job.files.items()}
    return [], edited


def _decode(data: bytes) -> str:
    return data.decode("utf-8", errors="surrogateescape")
