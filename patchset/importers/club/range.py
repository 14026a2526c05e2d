"""A club-3090 patch's range from evidence: where the collection states none (a PR diff in a
folder naming no release, a `sitecustomize.py` hook), the releases the patch applies to.

The draft is loaded as patchset loads a patch and evaluated, as `check` does, on each release
of the source from the oldest release the club's composes pin; the range is the run of
consecutive releases where it applies that holds the newest release its model's composes pin
(else the newest run). A patch that applies nowhere keeps an open range, said.
"""

from __future__ import annotations

import functools
import tempfile
from pathlib import Path

from packaging.version import Version

from patchset.engine.evaluate import evaluate
from patchset.errors import PatchsetError
from patchset.importers.common import Releases
from patchset.importers.model import Draft
from patchset.registry.load import load_patch
from patchset.registry.ranges import version_key
from patchset.registry.write import write_patch_folder

OPEN = ">=0.0"


def evidence_range(draft: Draft, releases: Releases, pinned: list[str], floor: str | None) -> None:
    """Set `draft`'s `vllm` from the releases it applies to, when the collection gives none."""
    if draft.meta.get("vllm") != OPEN:
        return
    with tempfile.TemporaryDirectory(prefix="patchset-club-range-") as tmp:
        folder = Path(tmp) / draft.id
        folder.mkdir()
        write_patch_folder(folder, draft.meta, draft.payloads, durable=False)
        try:
            patch = load_patch(folder)
        except PatchsetError:
            return  # the import's own load says why, once landed
    versions = [
        v
        for v in releases.versions()
        if not Version(v).is_prerelease and (floor is None or version_key(v) >= version_key(floor))
    ]
    fits: list[bool] = []
    for version in versions:
        variant = patch.variant_for(version)
        if variant is None:
            fits.append(False)
            continue
        try:
            read = functools.partial(releases.read, version)
            ev = evaluate(patch, variant, read, compile_check=False)
        except (PatchsetError, OSError):
            fits.append(False)
            continue
        fits.append(ev.state == "applies")
    runs: list[tuple[int, int]] = []  # [start, end) indexes of consecutive releases it fits
    for n, ok in enumerate(fits):
        if ok and (not runs or runs[-1][1] != n):
            runs.append((n, n + 1))
        elif ok:
            runs[-1] = (runs[-1][0], n + 1)
    if not runs:
        if versions:
            draft.lost.append(
                f"applies to none of the releases {versions[0]}..{versions[-1]}: its range"
                " is left open"
            )
        return
    newest_pin = max(pinned, key=version_key) if pinned else None
    run = next(
        (r for r in runs if newest_pin in versions[r[0] : r[1]]),
        runs[-1],
    )
    start, end = versions[run[0]], versions[run[1]] if run[1] < len(versions) else None
    draft.meta["vllm"] = f">={start}" + (f",<{end}" if end else "")
    x = draft.meta.get("x")
    if isinstance(x, dict):
        x["range_from"] = (
            f"the releases it applies to ({versions[0]}..{versions[-1]} checked):"
            f" {start}..{versions[run[1] - 1]}"
        )
    if len(runs) > 1:
        others = ", ".join(f"{versions[a]}..{versions[b - 1]}" for a, b in runs if (a, b) != run)
        draft.lost.append(f"it also applies to {others}, outside the range kept")


_MAX_ANCHOR = 12  # lines an anchor is widened to, at most


def _count(text: str, block: str) -> int:
    """How often `block` occurs in `text` as whole lines."""
    return f"\n{text}\n".count(f"\n{block}\n")


def widen_anchor(site: dict[str, object], old: str, others: dict[str, str]) -> list[str]:
    """Widen `site`'s anchor (found once in `old`, the file it was read from) with the lines
    above it (and, for a replace, below it) until it is unique in every file of `others`
    (release -> the file there) that holds it; the releases where it was ambiguous."""
    anchor, text = str(site["anchor"]), str(site["text"])
    lines = old.split("\n")
    block = anchor.split("\n")
    starts = [i for i in range(len(lines) - len(block) + 1) if lines[i : i + len(block)] == block]
    if len(starts) != 1:
        return []
    ambiguous = [v for v, t in others.items() if _count(t, anchor) > 1]
    if not ambiguous:
        return []
    top, end = starts[0], starts[0] + len(block)
    replace = site["action"] == "replace"
    while any(_count(others[v], anchor) > 1 for v in ambiguous) and end - top < _MAX_ANCHOR:
        if top > 0:
            top -= 1
            while top > 0 and not lines[top].strip():  # a blank edge line is no context
                top -= 1
            if replace:
                text = "\n".join(lines[top : starts[0]]) + "\n" + text
        elif replace and end < len(lines):
            text = text + "\n" + lines[end]
            end += 1
        else:
            break
        anchor = "\n".join(lines[top:end])
        starts = [top] if replace else starts
    site["anchor"], site["text"] = anchor, text
    return ambiguous
