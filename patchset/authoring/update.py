"""`patchset update ID`: a new payload for an existing diff patch (from its pull request again,
a new diff, or an edited tree), its `revision` bumped, every other key and comment of
`patch.toml` kept (tomlkit), written all or nothing, then its range checked again."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from tomlkit.toml_document import TOMLDocument

from patchset.errors import UnknownPatchError, UsageError
from patchset.registry import Patch, Registry, load_registry
from patchset.registry.write import RegistryChange
from patchset.release_check import CheckReport, check
from patchset.sources.base import ReleaseSource


@dataclass(frozen=True)
class UpdateResult:
    patch: Patch  # as written (or as it was, when nothing changed)
    changed: bool
    old_revision: int
    report: CheckReport | None  # the check of the new payload; None when none ran
    suggested: tuple[str, ...]  # the ranges where the check finds it `needed`
    outside: tuple[str, ...]  # releases inside the declared range where it is not `needed`


def find(registry: Registry, patch_id: str) -> Patch:
    try:
        patch = registry.get(patch_id)
    except UnknownPatchError as exc:
        raise UnknownPatchError(f"{exc}; `patchset add {patch_id}` makes a new one") from None
    if patch.kind != "diff":
        raise UsageError(
            f"{patch_id} is a {patch.kind} patch; update replaces a diff payload (edit"
            " its sites.toml by hand, then `patchset validate`)",
            path=patch.folder,
        )
    if len(patch.variants) > 1:
        raise UsageError(
            f"{patch_id} has {len(patch.variants)} payload variants; update carries one"
            " (`patchset refresh` adds variants)",
            path=patch.folder,
        )
    return patch


def update(
    root: Path,
    patch_id: str,
    text: str,
    targets: Sequence[str],
    *,
    pr: str | None = None,
    source: ReleaseSource | None = None,
    versions: Sequence[str] = (),
    on_release: Callable[[str], None] | None = None,
) -> UpdateResult:
    """Replace the payload of `patch_id` with `text` (already in the registry's form)."""
    registry = load_registry(root, tolerant=True)
    patch = find(registry, patch_id)
    variant = patch.variants[0]
    current = (patch.folder / variant.name).read_text(encoding="utf-8")
    unchanged = current == text and (pr is None or pr == patch.upstream.pr)
    if not unchanged:
        change = RegistryChange(registry)
        change.replace_file(patch, variant.name, text.encode("utf-8"))

        def edit(doc: TOMLDocument) -> None:
            doc["revision"] = patch.revision + 1
            known = [t for t in patch.targets if t in targets]
            doc["targets"] = known + [t for t in targets if t not in known]
            if pr is not None:
                upstream = doc.get("upstream")
                if upstream is None:
                    upstream = tomlkit.table()
                    doc["upstream"] = upstream
                upstream["pr"] = pr

        change.edit_toml(patch, edit)
        registry = change.commit()
    new = registry.get(patch_id)
    report = (
        check(registry, versions, source=source, patches=[patch_id], on_release=on_release)
        if versions and source is not None
        else None
    )
    suggested = report.suggested.get(patch_id, ()) if report else ()
    outside = tuple(
        r.vllm for r in (report.results if report else ()) if r.in_range and r.verdict != "needed"
    )
    return UpdateResult(new, not unchanged, patch.revision, report, suggested, outside)
