"""The registry edit of a refresh: the new payload, its variant, the old variant capped, the
patch's range widened and its revision bumped, in one checked write.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import tomlkit
from packaging.version import Version
from tomlkit.toml_document import TOMLDocument

from patchset.errors import RegistryError, UsageError
from patchset.refresh.job import Job, RangeChange
from patchset.registry import Patch, ranges
from patchset.registry.write import RegistryChange


def payload_name(patch: Patch, target: str, suffix: str) -> str:
    taken = {v.name for v in patch.variants} | {p.name for p in patch.folder.iterdir()}
    name = f"v{target}{suffix}"
    number = 2
    while name in taken:
        name = f"v{target}-{number}{suffix}"
        number += 1
    return name


def record(
    job: Job, name: str, data: bytes
) -> tuple[tuple[Path, ...], tuple[RangeChange, ...], int]:
    """Add the payload, a variant for it from the target on, cap the old variant below the
    target, widen the patch's range to hold it, bump the revision; all in one checked write."""
    patch, variant, target, versions = job.patch, job.variant, job.target, job.versions
    target_v = Version(target)
    later = next(
        (
            v
            for v in versions
            if Version(v) > target_v
            and any(
                other is not variant and other.vllm.contains(Version(v), prereleases=True)
                for other in patch.variants
            )
        ),
        None,
    )
    new_range = ranges.range_text([f">={target}", f"<{later}" if later else ""])
    after = next((v for v in versions if Version(v) > target_v), None)
    changes: list[RangeChange] = []
    revision = patch.revision + 1

    def edit(doc: TOMLDocument) -> None:
        doc["revision"] = revision
        _add_targets(doc, list(job.moves.values()))
        top = str(doc["vllm"])
        widened = ranges.widen(top, target, after)
        if widened is None:  # pragma: no cover -- the release after the target always fits
            raise UsageError(f"cannot widen the range {top!r} to hold {target}; edit it by hand")
        if widened != top:
            doc["vllm"] = widened
            changes.append(RangeChange("vllm", top, widened))
        new_table = _variant_table(name, new_range, target)
        if "variants" in doc:
            tables = doc["variants"]
            for table in tables:
                if table["payload"] == variant.name:
                    old = str(table["vllm"])
                    capped = ranges.cap(old, target)
                    if capped != old:
                        table["vllm"] = capped
                        changes.append(RangeChange(variant.name, old, capped))
            tables.append(new_table)
        else:
            capped = ranges.cap(top, target)
            old_table = _variant_table(variant.name, capped, variant.base)
            for key in ("payload", "base"):
                if key in doc:
                    del doc[key]
            tables = tomlkit.aot()
            tables.append(old_table)
            tables.append(new_table)
            doc.append("variants", tables)
            changes.append(RangeChange(variant.name, top, capped))
        changes.append(RangeChange(name, None, new_range))

    change = RegistryChange(job.registry)
    payload_path = change.add_file(patch, name, data)
    change.edit_toml(patch, edit)
    after_write = change.commit()
    picked = after_write.get(patch.id).variant_for(target)
    if picked is None or picked.name != name:  # pragma: no cover -- the ranges above say so
        raise RegistryError(f"{name} is not the variant for {target}", path=patch.folder)
    return (payload_path, patch.folder / "patch.toml"), tuple(changes), revision


def _variant_table(payload: str, vllm: str, base: str | None) -> Any:
    table = tomlkit.table()
    table["payload"] = payload
    table["vllm"] = vllm
    if base is not None:
        table["base"] = base
    return table


def _add_targets(doc: TOMLDocument, paths: list[str]) -> None:
    """The moved files' new paths added to `targets` (the old paths stay: older variants
    patch them); a one-line list that grows too long is laid out one path a line."""
    targets = doc["targets"]
    new = [p for p in paths if p not in targets]
    if not new:
        return
    one_line = "\n" not in targets.as_string()
    for path in new:
        targets.append(path)
    if one_line and len(f"targets = {targets.as_string()}") > 100:
        targets.multiline(True)
