"""club-3090's whole-file overlays: files laid out as under `vllm/`, or flat files a
compose mounts onto vLLM's, compared with the release they replace.

The facts of the collection this relies on are in `patchset.importers.club`.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path

from patchset.authoring.tree import unified
from patchset.importers.club.diffs import vllm_path
from patchset.importers.club.meta import Making
from patchset.importers.common import Releases
from patchset.importers.model import Draft, Skipped
from patchset.registry.ranges import version_key


def overlay_patch(  # noqa: PLR0917 - one overlay and what it is compared with
    patch: Making,
    root: Path,
    folder: Path,
    files: list[Path],
    mounts: dict[str, str],
    releases: Releases,
) -> Draft:
    raw, out, lost = patch.raw, patch.meta, patch.lost
    where: dict[str, Path] = {}
    for file in files:
        rel = str(file.relative_to(root))
        inner = file.relative_to(folder).as_posix() if folder.is_dir() else file.name
        short = "/".join(file.parts[-2:])
        if rel in mounts or short in mounts:
            where[mounts.get(rel) or mounts[short]] = file
        elif "/" in inner:
            where[vllm_path(inner)] = file
        else:
            lost.append(f"{file.name}: no compose mounts it and it is not laid out under vllm/")
    if not where:
        raise Skipped("overlay files whose place under vllm/ is not known")
    versions = releases.versions()
    if not versions:
        raise Skipped("an overlay: no release to compare it with (give --source)")
    best: tuple[int, str] | None = None
    contents = {p: f.read_text() for p, f in where.items()}
    for version in versions:
        cost = 0
        for path, text in contents.items():
            old = releases.read(version, path)
            if old is None:
                cost += len(text.splitlines())
                continue
            # lines one side has and the other has not (as multisets): linear, and zero
            # exactly when the files hold the same lines
            ours, theirs = (
                Counter(text.splitlines()),
                Counter(old.decode(errors="replace").splitlines()),
            )
            cost += sum(((ours - theirs) + (theirs - ours)).values())
            cost += (
                old.decode(errors="replace") != text and not (ours - theirs) and not (theirs - ours)
            )
        if (
            best is None
            or cost < best[0]
            or (cost == best[0] and version_key(version) > version_key(best[1]))
        ):
            best = (cost, version)
    assert best is not None
    cost, base = best
    if cost == 0:
        raise Skipped(f"identical to vLLM {base}: nothing to import")
    parts = []
    for path, text in contents.items():
        old = releases.read(base, path)
        old_text = None if old is None else old.decode(errors="replace")
        if old_text != text:
            parts.append(unified(path, old_text, text))
    out.update(
        kind="diff", payload="patch.diff", targets=sorted(contents), base=base, vllm=f">={base}"
    )
    out["x"] = {**out["x"], "overlay_base": base}
    return Draft(str(out["id"]), raw, out, {"patch.diff": "".join(parts)}, lost)
