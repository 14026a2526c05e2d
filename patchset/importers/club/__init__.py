"""`patchset import club-3090 DIR`: the club's vLLM patches, in their five forms.

Facts of the collection this relies on:
- `scripts/lib/profiles/patches.yml` (`schema_version: 1`) lists `patches:` with `id`,
  `model` (model folders), `files` (paths in the repository: a patch folder or files),
  `upstream: {ref, status, drop_when}`, `load_bearing_when`, `drift_guard` (a check and
  what to do when it fails), `delivery_mechanism`, `deprecated_on`. `arch_patches.yml` names
  which patches each architecture requires.
- Patch folders are `models/<model>/vllm/patches/<name>/`. Their forms: a PR diff (`*.patch`
  or `*.diff`, applied by `install.sh` with `patch -p1` from site-packages or from inside
  `vllm/`, helper files copied in with `cp "$PATCHDIR/x.py" "$VLLM/<path>"`); whole-file
  overlays (files laid out as under `vllm/`, or flat files mounted by a compose file onto
  `.../vllm/<path>`); anchor scripts (`patch_*.py`, or a `python3 - <<'PY'` block inside
  `install.sh`) that edit installed files in place; `sitecustomize.py` import hooks.
- Composes `models/<model>/vllm/compose/**.yml` pin `vllm/vllm-openai:v<release>`.
"""

from __future__ import annotations

import copy
import functools
import hashlib
import re
from collections.abc import Sequence
from pathlib import Path

from patchset.authoring.runtime_sites import sites_from_edit
from patchset.errors import PatchsetError
from patchset.importers import sandbox
from patchset.importers import scripts as anchor_scripts
from patchset.importers.club.diffs import diff_payload, diff_targets, edits_files
from patchset.importers.club.meta import (
    CLUB,
    PATCHES_YML,
    Making,
    metadata,
    models_of,
    plan_builds,
    read_composes,
)
from patchset.importers.club.overlays import overlay_patch
from patchset.importers.club.range import evidence_range, widen_anchor
from patchset.importers.common import Releases, origin_of, refuse_escapes
from patchset.importers.model import Collected, CollectionError, Draft, Entry, Skipped
from patchset.importers.probes import drop_unfixed_probes
from patchset.importers.pystatic import Package, Scope, rebinds
from patchset.importers.scripts import ScriptRefused
from patchset.registry.ranges import version_key
from patchset.registry.write import TomlData, toml_text
from patchset.sources.base import ReleaseSource


def detect(folder: Path) -> Path:
    return CLUB.checkout_file(folder, PATCHES_YML, "models")


def _yaml(path: Path) -> object:
    import yaml  # noqa: PLC0415 - only this importer reads YAML

    return yaml.safe_load(path.read_text())


def collect(  # noqa: PLR0915 - one pass over patches.yml, each form a branch
    folder: Path,
    *,
    only: set[str] | None = None,
    run_scripts: bool = False,
    timeout: float = 60.0,
    sources: Sequence[ReleaseSource] = (),
) -> Collected:
    path = detect(folder)
    refuse_escapes(folder, ["models", "scripts/lib/profiles"])  # the folders read
    if run_scripts:
        sandbox.require()  # no boundary, no collection code run: one line
    broken: dict[str, str] = {}
    try:
        data = _yaml(path)
    except Exception as exc:
        raise CollectionError(f"{path}: does not parse: {str(exc).splitlines()[0]}") from None
    if (
        not isinstance(data, dict)
        or data.get("schema_version") != 1
        or not isinstance(data.get("patches"), list)
    ):
        raise CollectionError(
            f"{path}: an unknown layout (looked for schema_version: 1 and patches:)"
        )
    _check_entries(path, data["patches"])
    repository, commit = origin_of(folder, CLUB.repository)
    mounts, pins, composes = read_composes(folder, broken)
    releases = Releases(sources)
    pinned = sorted({v for by_model in pins.values() for v in by_model}, key=version_key)
    floor = pinned[0] if pinned else None  # ranges from evidence: from the oldest pin on
    drafts: list[Draft] = []
    entries: list[Entry] = []
    seen_folders: dict[str, str] = {}
    digests: dict[str, str] = {}
    try:
        listed = {str(p.get("id")): p for p in data["patches"] if isinstance(p, dict)}
        for raw, meta in listed.items():
            if only and raw not in only and CLUB.id_of(raw) not in only:
                continue
            given = meta.get("files") or []
            files = [given] if isinstance(given, str) else [str(f) for f in given]
            scope = _scope(files, meta)
            if scope is not None:
                entries.append(Entry(raw, "out-of-scope", reasons=[scope]))
                continue
            target = _folder(folder, files)
            if target is None:
                entries.append(
                    Entry(raw, "not-imported", reasons=[f"files {files} not found in the checkout"])
                )
                continue
            rel = str(target.relative_to(folder))
            if rel in seen_folders:
                entries.append(
                    Entry(raw, "not-imported", reasons=[f"the same folder as {seen_folders[rel]}"])
                )
                continue
            seen_folders[rel] = raw
            code = _code_digest(target)
            if code in digests:
                entries.append(
                    Entry(raw, "not-imported", reasons=[f"the same code as {digests[code]}"])
                )
                continue
            digests[code] = CLUB.id_of(raw)
            wanted = sorted({v for m in models_of(meta) for v in pins.get(m, ())}, key=version_key)
            try:
                draft = _draft(
                    raw,
                    meta,
                    folder,
                    target,
                    mounts,
                    releases,
                    repository,
                    commit,
                    run_scripts,
                    timeout,
                    wanted,
                )
            except ScriptRefused as why:
                entries.append(Entry(raw, "not-imported", reasons=[f"refused: {why}"]))
                continue
            except Skipped as why:
                entries.append(
                    Entry(raw, "out-of-scope" if why.scope else "not-imported", reasons=[str(why)])
                )
                continue
            except PatchsetError as exc:
                entries.append(Entry(raw, "not-imported", reasons=[str(exc)]))
                continue
            for one in draft if isinstance(draft, list) else [draft]:
                same = digests.get(_digest(one))
                if same:
                    entries.append(
                        Entry(raw, "not-imported", reasons=[f"the same patch as {same}"])
                    )
                    continue
                digests[_digest(one)] = one.id
                evidence_range(one, releases, wanted, floor)
                drafts.append(one)
        dropped = drop_unfixed_probes(drafts, releases)
    finally:
        releases.close()
    plans, notes = plan_builds(composes, drafts)
    notes = [*dropped, *notes]
    docs = [] if only else sorted(folder.glob("models/*/vllm/patches/**/*.md"))
    entries.extend(
        Entry(str(doc.relative_to(folder)), "out-of-scope", reasons=["documentation"])
        for doc in docs
    )
    ran = [
        f"{d.source_id}: {', '.join(map(str, _at(d.meta, 'x', 'scripts_run')))}"
        for d in drafts
        if d.meta.get("kind") == "runtime"
    ]
    return Collected(
        CLUB.name,
        repository,
        commit,
        drafts,
        entries,
        broken=broken,
        plans=plans,
        notes=notes,
        ran=ran,
    )


_TYPES: dict[str, tuple[type, ...]] = {
    "id": (str, int),
    "files": (list, str),
    "model": (list, str),
    "upstream": (dict,),
    "deprecated_on": (str, int, float),
    "delivery_mechanism": (str,),
}


def _check_entries(path: Path, patches: list[object]) -> None:
    """Each entry of patches.yml a mapping whose keys this importer reads have the types the
    collection uses; else one line naming the entry and key (exit 2), nothing written."""
    for index, item in enumerate(patches):
        where = f"{path}: patches[{index}]"
        if not isinstance(item, dict):
            raise CollectionError(f"{where}: expected a mapping, got {type(item).__name__}")
        where += f" (id {item.get('id')!r})" if "id" in item else ""
        if item.get("id") in (None, ""):
            raise CollectionError(f"{where}: no id")
        for key, types in _TYPES.items():
            value = item.get(key)
            if value is not None and (not isinstance(value, types) or isinstance(value, bool)):
                raise CollectionError(
                    f"{where}: {key} must be {' or '.join(_NAMES[t] for t in types)},"
                    f" got {type(value).__name__}"
                )
        for key in ("files", "model"):
            value = item.get(key)
            if isinstance(value, list) and not all(isinstance(v, str) for v in value):
                raise CollectionError(f"{where}: {key} must list strings")
        upstream = item.get("upstream")
        for key in ("ref", "status", "drop_when"):
            value = upstream.get(key) if isinstance(upstream, dict) else None
            if value is not None and not isinstance(value, str | int | float):
                raise CollectionError(
                    f"{where}: upstream.{key} must be text, got {type(value).__name__}"
                )


_NAMES = {str: "text", int: "a number", float: "a number", list: "a list", dict: "a mapping"}


def _at(data: object, *keys: str) -> list[object]:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return list(data) if isinstance(data, list) else []


def _code_digest(target: Path) -> str:
    """The patch's code (not its docs): two folders holding the same code are one patch."""
    files = [target] if target.is_file() else sorted(target.rglob("*"))
    whole = hashlib.sha256()
    for file in files:
        if file.is_file() and file.suffix in (".py", ".sh", ".patch", ".diff"):
            whole.update(file.name.encode() + b"\0" + file.read_bytes() + b"\0")
    return whole.hexdigest()


def _digest(draft: Draft) -> str:
    return "\0".join(f"{k}\0{v}" for k, v in sorted(draft.payloads.items()))


def _scope(files: list[str], meta: dict[str, object]) -> str | None:
    if not files:
        upstream = meta.get("upstream")
        if isinstance(upstream, dict) and str(upstream.get("status", "")).startswith("genesis"):
            return "a Genesis switch, not a patch of the club (import Genesis)"
        return "no files"
    if (
        all(f.endswith(".jinja") for f in files)
        or meta.get("delivery_mechanism") == "chat_template"
    ):
        return "a chat template"
    if not any("/vllm/" in f for f in files):
        return "not a vLLM patch (another engine)"
    return None


def _folder(root: Path, files: list[str]) -> Path | None:
    for file in files:
        path = root / file
        if path.is_dir():
            return path
        if path.is_file():
            return path.parent if path.parent.name != "patches" else path
    return None


def _draft(  # noqa: PLR0917 - one patch and what it is read against
    raw: str,
    meta: dict[str, object],
    root: Path,
    target: Path,
    mounts: dict[str, str],
    releases: Releases,
    repository: str,
    commit: str | None,
    run_scripts: bool,
    timeout: float,
    pinned: list[str],
) -> Draft | list[Draft]:
    rel = str(target.relative_to(root))
    out = metadata(raw, meta, repository, commit, rel)
    out["provenance"] = {**out["provenance"], "file": rel}
    lost: list[str] = []
    files = [target] if target.is_file() else sorted(p for p in target.rglob("*") if p.is_file())
    given = meta.get("files") or []  # a string or a list (checked when read)
    listed = [given] if isinstance(given, str) else given if isinstance(given, list) else []
    named = [root / str(f) for f in listed]
    if named and all(f.is_file() and f.suffix == ".py" for f in named):
        files = named  # the patch is these files of a shared folder
    code = [f for f in files if f.suffix in (".py", ".patch", ".diff", ".sh")]
    diffs = [f for f in code if f.suffix in (".patch", ".diff")]
    scripts = [
        f
        for f in code
        if (f.name.startswith("patch") and f.suffix == ".py")
        or f.name.startswith("_check")
        or (f.suffix == ".py" and f.name != "sitecustomize.py" and edits_files(f))
    ]
    install = next((f for f in code if f.name == "install.sh"), None)
    heredoc = install is not None and "<<'PY'" in install.read_text(errors="replace")
    hooks = [f for f in code if f.name == "sitecustomize.py"]
    if hooks and not diffs:
        return _python(raw, out, hooks[0], root, lost)
    if diffs:
        payload = diff_payload(target, diffs, install, lost)
        script_meta = copy.deepcopy(out)
        out.update(kind="diff", payload="patch.diff", targets=diff_targets(payload))
        version = re.search(r"v(\d+\.\d+\.\d+)", target.name)
        if version:
            out["vllm"] = f">={version.group(1)}"
            out["base"] = version.group(1)
        main = Draft(str(out["id"]), raw, out, {"patch.diff": payload}, lost)
        if not (scripts or heredoc):
            return main
        if not run_scripts:
            lost.append(
                "its anchor script (run by install.sh besides the diff) is not carried:"
                " needs --run-scripts"
            )
            return main
        # install.sh runs a script besides the diff: its edit is a patch of its own
        script_meta["id"] = CLUB.id_of(f"{raw}-script")
        script_meta["title"] = f"club-3090 {raw}: the edit of its install script"
        try:
            extra = _scripted(Making(raw, script_meta), target, releases, pinned, timeout)
        except Skipped as why:
            lost.append(f"its anchor script is not carried: {why}")
            return main
        extra.id = str(script_meta["id"])
        return [main, extra]
    if scripts or heredoc:
        if not run_scripts:
            raise Skipped(
                "an anchor script (the collection's code): run with --run-scripts to import it"
            )
        own = None if install is not None else [f for f in scripts if not f.name.startswith("_")]
        return _scripted(Making(raw, out, lost), target, releases, pinned, timeout, own)
    overlay = [f for f in files if f.suffix == ".py"]
    if not overlay:
        raise Skipped("no vLLM code in the folder", scope=True)
    return overlay_patch(Making(raw, out, lost), root, target, overlay, mounts, releases)


def _scripted(  # noqa: PLR0917 - one script folder and what it runs against
    patch: Making,
    folder: Path,
    releases: Releases,
    pinned: list[str],
    timeout: float,
    files: list[Path] | None = None,
) -> Draft:
    """Run the anchor scripts (the collection's code) on a scratch copy of each release they
    target; the edit of the newest release they fit becomes runtime sites."""
    raw, out, lost = patch.raw, patch.meta, patch.lost
    found = anchor_scripts.pieces(folder if folder.is_dir() else folder.parent, files)
    if not found:
        raise Skipped("an install.sh that runs no script this importer can find")
    available = releases.versions()
    versions = [v for v in pinned if v in available] or available[-1:]
    if not versions:
        raise Skipped("an anchor script: no release to run it on (give --source)")
    runs = [
        anchor_scripts.run(found, v, functools.partial(releases.read, v), timeout=timeout)
        for v in versions
    ]
    good = [r for r in runs if r.ok]
    if not good:
        # none of the releases it is pinned to needs it: the releases where it still edits
        tried = {r.version for r in runs}
        extra = [
            anchor_scripts.run(found, v, functools.partial(releases.read, v), timeout=timeout)
            for v in available
            if v not in tried
        ]
        good = [r for r in extra if r.ok]
        if good:
            lost.append(
                "the script edits nothing on the releases its composes pin"
                f" ({', '.join(sorted(tried, key=version_key))}); imported for"
                f" {good[0].version}..{good[-1].version}"
            )
            runs = sorted([*runs, *extra], key=lambda r: version_key(r.version))
    if not good:
        why = "; ".join(f"{r.version}: {r.reason}" for r in runs)
        raise Skipped(f"the script fits no release it targets ({why})")
    lost.extend(
        f"the script does not fit {r.version}: {r.reason}"
        for r in runs
        if not r.ok
        and version_key(good[0].version) <= version_key(r.version) <= version_key(good[-1].version)
    )
    newest = good[-1]
    lost.extend(f"the script creates {created}: not carried" for created in newest.created)
    sites: list[dict[str, object]] = []
    for path, (old, new) in newest.edits.items():
        try:
            edits = sites_from_edit(old, new, path)
        except PatchsetError as exc:
            raise Skipped(f"the script's edit of {path} is no set of sites: {exc}") from None
        for n, site in enumerate(edits, start=1):
            sites.append(
                {
                    "name": f"{Path(path).stem}-{n}",
                    "file": path,
                    "action": site.action,
                    "marker": f"club-3090 {raw} {Path(path).name} site {n}",
                    "anchor": site.anchor,
                    "text": site.text,
                }
            )
    _widened(
        sites,
        newest,
        releases,
        good[0].version,
        None if good[-1] is runs[-1] else good[-1].version,
        lost,
    )
    needles, patterns = anchor_scripts.upstream_needles(found)
    if needles or patterns:
        up = out["upstream"]
        assert isinstance(up, dict)
        probe: dict[str, object] = {"file": next(iter(newest.edits))}
        if needles:
            probe["any"] = needles
        if patterns:
            probe["regex"] = patterns[0]
        up["probe"] = probe
    out.update(
        kind="runtime",
        apply="startup",
        targets=sorted(newest.edits),
        vllm=f">={good[0].version}" + ("" if good[-1] is runs[-1] else f",<={good[-1].version}"),
        base=newest.version,
    )
    x = out["x"]
    assert isinstance(x, dict)
    x["scripts_run"] = [p.name for p in found]
    x["scripts_fit"] = [r.version for r in good]
    header = (
        f"club-3090 {raw}: the edit its script(s) {', '.join(p.name for p in found)} made on"
        f" vLLM {newest.version} (the collection's code, run by patchset import --run-scripts)."
    )
    payload = toml_text({"site": sites}, header=header)
    return Draft(str(out["id"]), raw, out, {"sites.toml": payload}, lost)


def _widened(  # noqa: PLR0917 - the sites and the releases of the range
    sites: list[dict[str, object]],
    newest: anchor_scripts.Run,
    releases: Releases,
    first: str,
    last: str | None,
    lost: list[str],
) -> None:
    """Each site's anchor unique on every release of the range that holds it (widened from
    the file it was read from; one line unique there may not be elsewhere)."""
    in_range = [
        v
        for v in releases.versions()
        if version_key(first) <= version_key(v)
        and (last is None or version_key(v) <= version_key(last))
    ]
    for site in sites:
        path = str(site["file"])
        old = newest.edits[path][0]
        others = {}
        for version in in_range:
            data = releases.read(version, path)
            if data is not None:
                others[version] = data.decode(errors="replace")
        before = str(site["anchor"]).count("\n") + 1
        ambiguous = widen_anchor(site, old, others)
        if ambiguous:
            lost.append(
                f"site {site['name']}: its {before}-line anchor is not unique on"
                f" {', '.join(ambiguous)}: widened to {str(site['anchor']).count(chr(10)) + 1}"
                " lines"
            )


def _python(raw: str, out: TomlData, hook: Path, root: Path, lost: list[str]) -> Draft:
    text = hook.read_text()
    try:
        import ast  # noqa: PLC0415 - only for this form

        tree = ast.parse(text)
    except SyntaxError as exc:
        raise Skipped(f"{hook.relative_to(root)} does not parse: {exc}") from None
    scope = Scope(raw, tree, Package(hook.parent), hook)
    touches, approximate = rebinds(scope)
    named = sorted(set(re.findall(r"[\"'](vllm(?:\.\w+)+)[\"']", text)))
    if not touches and named:
        # an import hook: the module it waits for, and the names it sets on its classes
        # `emb = getattr(module, "Class", None)` ... `emb.method = method`: Class.method
        bound = dict(
            re.findall(r"^\s*(\w+)\s*=\s*getattr\(\s*module\s*,\s*[\"'](\w+)[\"']", text, re.M)
        )
        rebound = re.findall(r"^\s+(\w+)\.(\w+)\s*=\s*\w+\s*$", text, re.M)
        touches = [f"{named[0]}:{bound[o]}.{a}" for o, a in dict.fromkeys(rebound) if o in bound]
        if touches:
            approximate = False
            lost.append("touches read from the hook: the module it waits for, the names it rebinds")
        else:
            attrs = [a for o, a in rebound]
            touches = [f"{named[0]}:{a}" for a in dict.fromkeys(attrs)][:1]
            lost.append("touches read from the module name the hook waits for")
    if not touches:
        raise Skipped(f"{hook.relative_to(root)}: rebinds no vLLM name that can be read statically")
    if approximate:
        lost.append("touches are the vLLM names it imports")
    body = (
        text
        if re.search(r"^def apply\(", text, re.M)
        else (
            text.rstrip("\n")
            + '\n\n\ndef apply():\n    """Importing this module installed the hooks."""\n'
            + "    return None\n"
        )
    )
    out.update(
        kind="python",
        apply="startup",
        touches=touches,
        targets=list(dict.fromkeys(t.partition(":")[0].replace(".", "/") + ".py" for t in touches)),
    )
    header = f'"""club-3090 {raw}: {hook.name}, imported by `patchset import club-3090`."""\n'
    return Draft(str(out["id"]), raw, out, {"plugin.py": header + body}, lost)
