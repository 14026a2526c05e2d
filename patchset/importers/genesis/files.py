"""Genesis's patchers that pick their file at run time, as variants by release.

A patcher on `resolve_vllm_file("a") or resolve_vllm_file("b")` patches `b` where the
release has no `a`; a factory returning one of several patchers by which file exists patches
the first it finds. Read statically, the import targets `a` (and every file of the either
group, optional) and says so. Given releases (`patchset import genesis --source SPEC`), it
looks at which of those files each release of the patch's range has, and writes one
`[[variants]]` payload per run of releases that pick the same files, each on the files
Genesis would patch there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from packaging.specifiers import InvalidSpecifier, SpecifierSet

from patchset.importers.common import Releases
from patchset.importers.genesis.text import Patcher, runtime_patch
from patchset.registry.ranges import as_version, is_version
from patchset.registry.write import TomlData


def picks_files(patchers: list[Patcher]) -> bool:
    return any(p.other_files or p.either for p in patchers)


def chosen(patchers: list[Patcher], has: Callable[[str], bool]) -> list[Patcher]:
    """The patchers Genesis builds on a release holding the files `has` says: a fallback
    patcher on the first of its files there, of an either group the first whose file is."""
    out: list[Patcher] = []
    done: set[int] = set()
    for patcher in patchers:
        if id(patcher) in done:
            continue
        if patcher.either:
            group = [q for q in patchers if q is patcher or (q.either and q.file in patcher.either)]
            done |= {id(q) for q in group}
            pick = next((q for q in group if has(q.file)), group[0])
            out.append(dataclasses.replace(pick, either=[]))
            continue
        files = [patcher.file, *patcher.other_files]
        file = next((f for f in files if has(f)), patcher.file)
        out.append(dataclasses.replace(patcher, file=file, other_files=[]))
    return out


Meta = TomlData  # patch.toml data
Made = tuple[dict[str, str], list[str]]  # payloads (name -> text), modules the text imports


def by_release(ids: tuple[str, str], found: list[Patcher], meta: Meta, at: Releases) -> Made | None:
    """Payloads and `[[variants]]` (set in `meta`) for the patchers `found` of the patch
    `ids` (patchset's id, Genesis's), by the files each release `at` has of the patch's
    range; None when no release of its range is known (the static reading stands)."""
    try:
        wanted = SpecifierSet(str(meta.get("vllm", "")))
    except InvalidSpecifier:
        return None
    versions = [v for v in at.versions() if is_version(v) and as_version(v) in wanted]
    files = sorted({f for p in found for f in (p.file, *p.other_files)})
    runs: list[tuple[str, list[Patcher]]] = []  # (first release, patchers) per run
    for version in versions:
        held = {f for f in files if at.read(version, f) is not None}
        picked = chosen(found, held.__contains__)
        if not runs or [p.file for p in runs[-1][1]] != [p.file for p in picked]:
            runs.append((version, picked))
    if not runs:
        return None
    payloads: dict[str, str] = {}
    modules: list[str] = []
    variants: list[dict[str, object]] = []
    targets: list[str] = []
    for index, (first, picked) in enumerate(runs):
        upstream = meta["upstream"]
        assert isinstance(upstream, dict)
        own = {**meta, "upstream": dict(upstream)}
        # The patch's probe reads the first run's file; a later run on another file reads
        # its first patcher's drift markers in its sites.
        other = index > 0 and picked[0].file != runs[0][1][0].file
        made, used = runtime_patch(*ids, picked, own, [], drift_in_sites=other)
        name = "sites.toml" if index == 0 else f"v{first}.sites.toml"
        payloads[name] = made["sites.toml"]
        modules += used
        targets += [p.file for p in picked]
        upto = runs[index + 1][0] if index + 1 < len(runs) else None
        spec = ",".join(
            part for part in (f">={first}" if index else "", f"<{upto}" if upto else "") if part
        )
        variants.append({"payload": name, "vllm": spec or str(meta["vllm"])})
        if index == 0:
            meta["upstream"] = own["upstream"]
    meta["kind"] = "runtime"
    meta["targets"] = list(dict.fromkeys(targets))
    if len(variants) > 1:
        meta["variants"] = variants
    return payloads, list(dict.fromkeys(modules))
