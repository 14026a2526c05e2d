"""A check's JSON report in parts, as `patchset.cli.replay` keeps it: each result, suggested
range and gate already encoded where it stands in the report, so that a report is printed by
joining them, and brought up to date for a few edited patches by putting their new parts in
place of the old (`edited` says when that may be done, `updated` does it). The report printed
either way is the bytes `dumps(report.to_dict())` gives.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

from patchset.cli.output import Encoded, encoded
from patchset.cli.registry_state import Files, content_digests
from patchset.errors import ExitCode

if TYPE_CHECKING:
    from patchset.registry import Patch, Registry
    from patchset.release_check import CheckReport, CheckResult

EDITED_MOST = 4  # patches edited since the kept report that are checked alone (more: all)
CHECKED_MOST = 16  # and with the patches stacked on them, those checked (more: all)


@dataclass(frozen=True)
class Parts:
    """A check's JSON report in parts (each value already `encoded` where it stands), with
    what an edit of one patch must leave alone for the report to be brought up to date by
    checking that patch only: every patch's digest (the registry's digest is made of them),
    what decides each checked patch's relations to the others (`facts`), the patches stacked
    on each (`required_by`), and the registry folder's `Files.tops` when the report was
    made, with a digest of each one's content (an entry whose status changed but not its
    bytes, as a checkout or a restore leaves it, is not an edit)."""

    schema: str
    registry: str
    versions: tuple[str, ...]
    releases: str
    order: tuple[str, ...]  # the patches checked, in the report's order
    results: tuple[tuple[str, ...], ...]  # per release, one per patch of `order`
    attention: dict[str, int]  # per patch, its results that need attention
    suggested: dict[str, str]
    gates: dict[str, str]
    digests: tuple[tuple[str, str], ...]  # every patch of the registry: id, digest
    support: tuple[tuple[str, str], ...]  # every support package: name, digest
    facts: dict[str, str]
    required_by: dict[str, tuple[str, ...]]  # per patch, those whose `requires` name it
    tops: dict[str, str]
    contents: dict[str, str] = dataclasses.field(default_factory=dict)  # `content_digests`

    @property
    def code(self) -> int:
        return ExitCode.ATTENTION if any(self.attention.values()) else ExitCode.OK

    def text(self) -> str:
        """The report's JSON, as `dumps(report.to_dict())` writes it, and a line end: its
        parts joined as json's indent of 2 lays out a list and an object (the test holds the
        two the same bytes)."""
        return "".join(self.pieces())

    def pieces(self) -> Iterator[str]:
        """`text` in pieces, a release's results each, to be written one after the other:
        a report's megabytes never made one string (each copy of it cost ~5 ms)."""
        yield (
            f'{{\n  "schema": {encoded(self.schema, 1)},'
            f'\n  "registry": {encoded(self.registry, 1)},'
            f'\n  "releases": {self.releases},\n  "results": '
        )
        rows = [each for each in self.results if each]
        if not rows:
            yield "[]"
        for i, each in enumerate(rows):
            yield ("[\n    " if i == 0 else _INNER) + _INNER.join(each)
        if rows:
            yield "\n  ]"
        yield (
            f',\n  "suggested_ranges": {_mapped(self.suggested)},'
            f'\n  "patches": {_mapped(self.gates)},\n  "exit_code": {int(self.code)}\n}}\n'
        )


_INNER = ",\n    "


def _mapped(values: dict[str, str]) -> str:
    """An object one level in, of values encoded two levels in."""
    if not values:
        return "{}"
    return "{\n    " + _INNER.join(f"{encoded(k, 2)}: {v}" for k, v in values.items()) + "\n  }"


def facts(patch: Patch) -> str:
    """What of a patch decides the registry's checks across patches and the files a check of
    it rests on (an edit changing none of it may be checked alone): its id, relations,
    switch names, modules, files read and names touched."""
    switch = (patch.switch.env, patch.switch.aliases) if patch.switch is not None else None
    said = (
        patch.id,
        patch.requires,
        patch.conflicts,
        patch.lifecycle.superseded_by,
        switch,
        patch.modules_needed(),
        patch.reads,
        patch.touches,
    )
    return hashlib.sha256(repr(said).encode("utf-8", "surrogateescape")).hexdigest()


def parts_of(report: CheckReport, registry: Registry, files: Files) -> Parts | None:
    """`report` (of `registry`, whose folder `files` is) in parts; None when its results are
    not one per checked patch in every release, in the same order (then it is not kept)."""
    from patchset.release_check.report import SCHEMA

    versions = tuple(r.version for r in report.releases)
    count = len(report.results) // len(versions) if versions else 0
    order = tuple(r.patch for r in report.results[:count])
    if not versions or count * len(versions) != len(report.results) or len(set(order)) < count:
        return None
    results: list[tuple[str, ...]] = []
    attention = dict.fromkeys(order, 0)
    rests: dict[tuple[object, ...], str] = {}
    for i, version in enumerate(versions):
        mine = report.results[i * count : (i + 1) * count]
        if tuple(r.patch for r in mine) != order or any(r.vllm != version for r in mine):
            return None
        results.append(tuple(result_text(r, rests) for r in mine))
        for r in mine:
            attention[r.patch] += r.needs_attention
    required_by: dict[str, list[str]] = {}
    for p in registry.patches:
        for other in p.requires:
            required_by.setdefault(other, []).append(p.id)
    by_id = {p.id: p for p in registry.patches}
    return Parts(
        schema=SCHEMA,
        registry=report.registry,
        versions=versions,
        releases=encoded(report.release_dicts(), 1),
        order=order,
        results=tuple(results),
        attention=attention,
        suggested={k: encoded(list(v), 2) for k, v in report.suggested.items()},
        gates={k: encoded(v, 2) for k, v in report.patches.items()},
        digests=tuple((p.id, p.digest) for p in registry.patches),
        support=tuple((s.name, s.digest) for s in registry.support),
        facts={i: facts(by_id[i]) for i in order},
        required_by={k: tuple(sorted(v)) for k, v in sorted(required_by.items())},
        tops=files.tops,
    )


_HEAD = '{\n      "vllm": '  # how `encoded(result.to_dict(), 2)` starts: the release first


def result_text(result: CheckResult, rests: dict[tuple[object, ...], str]) -> str:
    """`encoded(result.to_dict(), 2)`, the text after its release encoded once for results
    alike but for the release (`rests`: a patch's result is often the same in many)."""
    values = result.__dict__
    alike = tuple(v for k, v in values.items() if k != "vllm")
    rest = rests.get(alike)
    if rest is None:
        text = encoded(result.to_dict(), 2)
        version = encoded(result.vllm, 0)
        if not text.startswith(_HEAD + version):
            return text  # not laid out as expected: encoded whole, not shared
        rest = rests[alike] = text[len(_HEAD) + len(version) :]
    return Encoded(_HEAD + encoded(result.vllm, 0) + rest)


def to_data(parts: Parts) -> dict[str, Any]:
    return {f.name: getattr(parts, f.name) for f in fields(Parts)}


def from_data(data: Any) -> Parts | None:
    """Parts from their stored form; None for anything else."""
    try:
        made = Parts(
            schema=str(data["schema"]),
            registry=str(data["registry"]),
            versions=tuple(map(str, data["versions"])),
            releases=str(data["releases"]),
            order=tuple(map(str, data["order"])),
            results=tuple(tuple(map(str, each)) for each in data["results"]),
            attention={str(k): int(v) for k, v in data["attention"].items()},
            suggested={str(k): str(v) for k, v in data["suggested"].items()},
            gates={str(k): str(v) for k, v in data["gates"].items()},
            digests=tuple((str(i), str(d)) for i, d in data["digests"]),
            support=tuple((str(n), str(d)) for n, d in data["support"]),
            facts={str(k): str(v) for k, v in data["facts"].items()},
            required_by={str(k): tuple(map(str, v)) for k, v in data["required_by"].items()},
            tops={str(k): str(v) for k, v in data["tops"].items()},
            contents={str(k): str(v) for k, v in data["contents"].items()},
        )
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    regular = len(made.results) == len(made.versions) and all(
        len(each) == len(made.order) for each in made.results
    )
    return made if regular else None


def edited(parts: Parts, files: Files, root: Path) -> tuple[list[str], dict[str, str]] | None:
    """The patches whose folders' content changed since `parts` were made (entries whose
    status changed are read again: one whose bytes did not is not an edit), with every
    entry's content digest now, when a check of them alone may bring the report up to date:
    nothing else under the registry changed (the same patch folders, the support packages
    and other files as they were), at most `EDITED_MOST` of them, each checked in the report.
    None: the whole check runs."""
    before, now = parts.tops, files.tops
    if before.keys() != now.keys() or before.keys() != parts.contents.keys():
        return None
    touched = [name for name in now if now[name] != before[name]]
    contents = {**parts.contents, **content_digests(root, touched)}
    changed = [name for name in touched if contents[name] != parts.contents[name]]
    folders = [name[:-1] for name in changed]
    if (
        len(changed) > EDITED_MOST
        or not all(name.endswith("/") and name[:1] not in "._" for name in changed)
        or not all(f in parts.facts for f in folders)
    ):
        return None
    return folders, contents


def stacked_on(parts: Parts, ids: Sequence[str]) -> list[str]:
    """The patches whose results rest on those of `ids`: each stacked on one of them (its
    `requires` chain names it), in the report's order; `ids` not among them."""
    found: set[str] = set()
    todo = list(ids)
    while todo:
        for other in parts.required_by.get(todo.pop(), ()):
            if other not in found:
                found.add(other)
                todo.append(other)
    return [i for i in parts.order if i in found and i not in ids]


def updated(
    parts: Parts,
    patches: Sequence[Patch],
    report: CheckReport,
    files: Files,
    contents: dict[str, str],
) -> Parts | None:
    """`parts` with each of `patches` (edited, loaded again, each as `facts` said before)
    and its results in `report` (a check of those patches alone, of the same releases) in
    place of what they were; None when the report's releases are not those of `parts`."""
    from patchset.registry.load import registry_digest

    if tuple(r.version for r in report.releases) != parts.versions:
        return None
    mine = {p.id: p for p in patches}
    count = len(patches)
    order = [r.patch for r in report.results[:count]]
    if set(order) != set(mine) or len(report.results) != count * len(parts.versions):
        return None
    at = {patch_id: i for i, patch_id in enumerate(parts.order)}
    results = [list(each) for each in parts.results]
    attention = dict(parts.attention)
    for patch_id in mine:
        attention[patch_id] = 0
    for k, version in enumerate(parts.versions):
        for r in report.results[k * count : (k + 1) * count]:
            if r.vllm != version or r.patch not in mine:
                return None
            results[k][at[r.patch]] = encoded(r.to_dict(), 2)
            attention[r.patch] += r.needs_attention
    suggested = dict(parts.suggested)
    for patch_id, ranges in report.suggested.items():
        suggested[patch_id] = encoded(list(ranges), 2)
    gates = dict(parts.gates)
    for patch_id, patch in mine.items():
        if patch_id in gates:
            gates[patch_id] = encoded(patch.gates(), 2)
    digests = tuple((i, mine[i].digest if i in mine else d) for i, d in parts.digests)
    return dataclasses.replace(
        parts,
        registry=registry_digest(digests, parts.support),
        results=tuple(tuple(each) for each in results),
        attention=attention,
        suggested=suggested,
        gates=gates,
        digests=digests,
        tops=files.tops,
        contents=contents,
    )


__all__ = [
    "CHECKED_MOST",
    "EDITED_MOST",
    "Parts",
    "edited",
    "facts",
    "from_data",
    "parts_of",
    "stacked_on",
    "to_data",
    "updated",
]
