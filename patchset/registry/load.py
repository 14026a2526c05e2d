"""Loading the registry: `patches/<id>/patch.toml` plus payload, validated as it loads.

Every problem names its file and key; `patch_problems` collects them all (for `validate`),
every other caller stops at the first.
"""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import cast

from packaging.specifiers import SpecifierSet

from patchset._fs import sha256_hex
from patchset.errors import PayloadError, RegistryError
from patchset.kernel.capability import parse_scope
from patchset.kernel.pycompile import compile_error, tree_error
from patchset.kernel.touches import (
    defines,
    module_files,
    parse_touch,
    parsed,  # the parse `defines` shares
)
from patchset.registry import semantics
from patchset.registry.diffs import FileDiff, parse_diff
from patchset.registry.model import (
    KINDS,
    PATCH_FILE,
    STATES,
    SUPPORT_FOLDER,
    WHENS,
    Failure,
    Hardware,
    Kind,
    Lifecycle,
    Patch,
    Probe,
    Registry,
    SupportPackage,
    Upstream,
    UpstreamState,
    Variant,
    Verify,
    When,
    check_relations,
)
from patchset.registry.problems import Problems
from patchset.registry.problems import inside as _inside
from patchset.registry.problems import relpath as _relpath
from patchset.registry.semantics import read_modules
from patchset.registry.sites import probe_strings, read_sites
from patchset.registry.support import load_support, module_problems
from patchset.registry.toml import Table, key_line, key_lines, load_toml, parsed_cache

DEFAULT_PAYLOAD: dict[str, str] = {
    "diff": "patch.diff",
    "runtime": "sites.toml",
    "python": "plugin.py",
}
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}[a-z0-9]$")
_PR = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


def load_registry(
    root: Path | str, *, tolerant: bool = False, parsed: Path | None = None
) -> Registry:
    """Load and validate every patch under `root`. The first problem raises RegistryError;
    with `tolerant`, each patch that does not load is left out and its problem kept in
    `Registry.problems` (asking for it by id raises it). `parsed`: a file in which what TOML
    parsing made of the registry's files is kept for the next load (`toml.parsed_cache`:
    only the parsing is skipped, every check is made again)."""
    with parsed_cache(parsed):
        return _load_registry(Path(root), tolerant=tolerant)


def _load_registry(root: Path, *, tolerant: bool) -> Registry:
    if not root.is_dir():
        raise RegistryError("registry folder does not exist", path=root)
    support, problems = load_support(root)
    if problems and not tolerant:
        raise next(iter(problems.values()))
    patches = []
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and p.name[0] not in "._"):
        try:
            _inside(folder, root, "the registry folder")
            if not (folder / PATCH_FILE).is_file():
                raise RegistryError(f"no {PATCH_FILE} in this patch folder", path=folder)
            patches.append(load_patch(folder))
        except RegistryError as exc:
            if not tolerant:
                raise
            problems[folder.name] = exc
    found = check_relations(patches, set(problems))
    for patch_id, problem in registry_problems(patches, support).items():
        found.setdefault(patch_id, problem)
    for patch_id, problem in found.items():
        if not tolerant:
            raise problem
        problems[patch_id] = problem
        patches = [p for p in patches if p.id != patch_id]
    return Registry(
        root=root,
        patches=tuple(patches),
        digest=registry_digest(
            [(p.id, p.digest) for p in patches], [(s.name, s.digest) for s in support]
        ),
        problems=problems,
        support=tuple(support),
    )


def registry_digest(patches: Sequence[tuple[str, str]], support: Sequence[tuple[str, str]]) -> str:
    """A registry's digest: of each patch's id and digest, in order, then each support
    package's name and digest."""
    whole = hashlib.sha256()
    for patch_id, digest in patches:
        whole.update(f"{patch_id}\0{digest}\0".encode())
    for name, digest in support:
        whole.update(f"{SUPPORT_FOLDER}/{name}\0{digest}\0".encode())
    return f"sha256:{whole.hexdigest()}"


def registry_problems(
    patches: Sequence[Patch], support: Sequence[SupportPackage]
) -> dict[str, RegistryError]:
    """What holds across patches: no two share a switch, and every module a patch or site
    requires comes from a support package (or needs none)."""
    bad: dict[str, RegistryError] = {}
    switches: dict[str, str] = {}
    for patch in patches:
        if patch.switch is None:
            continue
        for key, name in [("switch.env", patch.switch.env)] + [
            ("switch.aliases", alias) for alias in patch.switch.aliases
        ]:
            other = switches.setdefault(name, patch.id)
            if other != patch.id and patch.id not in bad:
                error = RegistryError(
                    f"{key}: {name} is already the switch of patch {other!r} (one variable"
                    " per patch)",
                    path=patch.folder / PATCH_FILE,
                )
                error.key = key
                bad[patch.id] = error
    for patch in patches:
        missing = module_problems(patch, support)
        if missing and patch.id not in bad:
            bad[patch.id] = missing[0]
    return bad


def load_patch(folder: Path) -> Patch:
    """The patch in `folder`; its first problem raises RegistryError (`patch_problems` lists
    every one)."""
    patch = _load_patch(folder, Problems(collect=False))
    assert patch is not None  # without collecting, a problem raised
    return patch


@dataclass(frozen=True)
class LoadProblem:
    """One problem of a patch that does not load, and the line of the TOML file holding its
    key (None: the key is missing at the top level, or the problem has no key)."""

    error: RegistryError
    line: int | None = None

    def __str__(self) -> str:
        return f"{self.error} (line {self.line})" if self.line else str(self.error)


def patch_problems(folder: Path, also: Sequence[RegistryError] = ()) -> list[LoadProblem]:
    """Every problem of the patch in `folder` (each names its file and key, and the line),
    then those of `also` (found elsewhere, e.g. its `requires`); [] when it loads. A key whose
    value is wrong does not hide the others; only a patch.toml that cannot be read or parsed
    (one problem, with the line TOML gives) stops the reading."""
    problems = Problems(collect=True)
    try:
        _load_patch(folder, problems)
    except RegistryError as exc:
        problems.errors.append(exc)
    seen = {str(e) for e in problems.errors}
    texts: dict[str, str] = {}
    found = []
    for error in [*problems.errors, *(e for e in also if str(e) not in seen)]:
        line = None
        if error.key and error.path and error.path.endswith(".toml"):
            if error.path not in texts:
                try:
                    texts[error.path] = Path(error.path).read_text(errors="replace")
                except OSError:
                    texts[error.path] = ""
            line = key_line(texts[error.path], error.key)
        found.append(LoadProblem(error, line))
    # In the order of the files, then of their lines (a key missing, with no line, first).
    files = list(dict.fromkeys(p.error.path for p in found))
    return sorted(found, key=lambda p: (files.index(p.error.path), p.line or 0))


def _load_patch(folder: Path, problems: Problems) -> Patch | None:
    file = folder / PATCH_FILE
    _inside(file, folder, "its patch folder")
    try:
        raw = file.read_bytes()
    except OSError as exc:
        raise RegistryError(f"cannot read: {exc.strerror}", path=file) from None
    top = Table(load_toml(file), file=file)
    step = problems.step
    patch_id = step(lambda: _patch_id(top, folder), None)
    kind = step(lambda: cast(Kind, top.choice("kind", KINDS)), None)
    when = step(lambda: cast(When, top.choice("apply", WHENS)), None)
    vllm = step(lambda: top.specifier("vllm"), None)
    targets = step(lambda: _targets(top), None)
    digest = hashlib.sha256(raw)
    variants: tuple[Variant, ...] | None = None
    if kind is not None and vllm is not None:
        variants = step(lambda: _variants(top, folder, kind, vllm, digest, problems=problems), None)
    else:  # read with the kind and range only: not unknown keys
        top.known("payload", "variants", "base")
    if variants is not None and targets is not None:
        step(lambda: _covered(top, variants, targets), None)
    touches: tuple[str, ...] = ()
    if kind is not None and when is not None and targets is not None:
        touches = step(lambda: _touches(top, kind, when, targets), ())
    else:
        top.known("touches")
    title = step(lambda: top.req_str("title"), "")
    description = step(lambda: top.req_str("description"), "")
    revision = step(lambda: top.integer("revision", minimum=1), 1)
    state_line = key_lines(raw.decode("utf-8", errors="replace")).get("upstream.state")
    upstream = step(lambda: _upstream(top, problems, state_line=state_line), None)
    hardware = step(lambda: _hardware(top, problems), None)
    origin = step(lambda: top.req_str("origin"), "")
    credit: tuple[str, ...] = step(lambda: top.str_list("credit"), ())
    requires: tuple[str, ...] = step(lambda: top.matching_list("requires", _ID, "a patch id"), ())
    conflicts: tuple[str, ...] = step(lambda: top.matching_list("conflicts", _ID, "a patch id"), ())
    x: Mapping[str, object] = step(lambda: top.free_table("x"), {})
    switch = step(lambda: semantics.read_switch(top), None)
    applies = step(lambda: semantics.read_applies(top), None)
    failure = step(lambda: semantics.read_failure(top), Failure())
    modules: tuple[str, ...] = step(lambda: read_modules(top, "requires_modules"), ())
    verify: tuple[Verify, ...] = step(lambda: semantics.read_verify(top), ())
    lifecycle = step(lambda: semantics.read_lifecycle(top), Lifecycle())
    provenance = step(lambda: semantics.read_provenance(top), None)
    if lifecycle.superseded_by == patch_id and patch_id:
        problems.add(top.error("names the patch itself", "lifecycle.superseded_by"))
    problems.finish(top)
    if problems.errors:
        return None
    assert patch_id and kind and when and vllm and targets is not None and variants
    assert upstream is not None and hardware is not None
    return Patch(
        id=patch_id,
        title=title,
        description=description,
        kind=kind,
        revision=revision,
        vllm=vllm,
        apply=when,
        targets=targets,
        upstream=upstream,
        hardware=hardware,
        origin=origin,
        credit=credit,
        variants=variants,
        folder=folder,
        digest=digest.hexdigest(),
        touches=touches,
        requires=requires,
        conflicts=conflicts,
        x=x,
        switch=switch,
        applies=applies,
        failure=failure,
        requires_modules=modules,
        verify=verify,
        lifecycle=lifecycle,
        provenance=provenance,
    )


def _patch_id(top: Table, folder: Path) -> str:
    patch_id = top.req_str("id")
    if not _ID.match(patch_id):
        raise top.error(f"{patch_id!r}: use 3-64 lowercase letters, digits and '-'", "id")
    if patch_id != folder.name:
        raise top.error(f"{patch_id!r} differs from the folder name {folder.name!r}", "id")
    return patch_id


def _targets(top: Table) -> tuple[str, ...]:
    targets = top.str_list("targets")
    for target in targets:
        _relpath(top, "targets", target)
    return targets


def _covered(top: Table, variants: tuple[Variant, ...], targets: tuple[str, ...]) -> None:
    covered = {f for v in variants for f in v.files}
    if covered - set(targets):
        raise top.error(
            f"payload touches files not listed: {sorted(covered - set(targets))}", "targets"
        )


def _touches(top: Table, kind: Kind, when: When, targets: tuple[str, ...]) -> tuple[str, ...]:
    """`touches` of a python patch: each module's file must be one of its targets."""
    touches = top.str_list("touches", required=kind == "python")
    if kind != "python":
        if touches:
            raise top.error("only python patches declare touches", "touches")
        return ()
    if when != "startup":
        raise top.error("a python patch runs in vLLM's processes: apply = 'startup'", "apply")
    for touch in touches:
        try:
            module, _ = parse_touch(touch)
        except ValueError as exc:
            raise top.error(str(exc), "touches") from None
        if not set(module_files(module)) & set(targets):
            raise top.error(
                f"{touch!r}: list its module's file {module_files(module)[0]} in targets",
                "touches",
            )
    return touches


def _variants(
    top: Table,
    folder: Path,
    kind: Kind,
    vllm: SpecifierSet,
    digest: hashlib._Hash,
    *,
    problems: Problems,
) -> tuple[Variant, ...] | None:
    """The payloads (None when one has a problem: each is kept in `problems`)."""
    tables = top.tables("variants")
    payload = top.opt_str("payload", required=False)
    base = top.version("base")
    if tables and payload:
        raise top.error("give either 'payload' or [[variants]], not both", "payload")
    if tables and base:
        raise top.error("with [[variants]], give 'base' inside each variant", "base")
    mark = len(problems.errors)
    step = problems.step
    specs: list[tuple[str, SpecifierSet, str | None, str]] = []
    if not tables:
        specs.append((payload or DEFAULT_PAYLOAD[kind], vllm, base, "payload"))
    names: set[str] = set()
    for table in tables:
        name = step(functools.partial(table.req_str, "payload"), None)
        if name in names:
            problems.add(table.error(f"payload {name!r} is listed twice", "payload"))
        spec = step(functools.partial(table.specifier, "vllm"), None)
        variant_base = step(functools.partial(table.version, "base"), None)
        problems.finish(table)
        if name is not None and spec is not None and name not in names:
            specs.append((name, spec, variant_base, f"{table.where}.payload"))
        if name is not None:
            names.add(name)
    variants = []
    read = functools.partial(_variant, top, folder, kind, digest, problems)
    for name, spec, variant_base, where in specs:
        variant = step(
            functools.partial(read, name=name, spec=spec, base=variant_base, where=where), None
        )
        if variant is not None:
            variants.append(variant)
    return None if problems.since(mark) else tuple(variants)


def _variant(
    top: Table,
    folder: Path,
    kind: Kind,
    digest: hashlib._Hash,
    problems: Problems,
    *,
    name: str,
    spec: SpecifierSet,
    base: str | None,
    where: str,
) -> Variant | None:
    """One payload, read and checked (a sites.toml's problems kept in `problems`: None)."""
    path = folder / name
    if "/" in name or not path.is_file():
        raise top.error(f"payload file {name!r} not found in {folder}", where)
    _inside(path, folder, "its patch folder")
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise RegistryError(f"cannot read: {exc.strerror}", path=path) from None
    digest.update(f"\0{name}\0".encode() + data)
    try:
        text = data.decode("utf-8", errors="strict")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        raise PayloadError(
            f"line {line}: not UTF-8 (byte {data[exc.start]:#04x}); payloads are UTF-8 text",
            path=path,
        ) from None
    sha = sha256_hex(data)
    if kind == "diff":
        diffs = parse_diff(text, file=path)
        files, hunks = _diff_lines(text, diffs)
        return Variant(name, spec, sha, diffs=diffs, base=base, file_lines=files, hunk_lines=hunks)
    if kind == "python":
        _check_plugin(text, path)
        return Variant(name, spec, sha, base=base)
    sites = read_sites(path, problems)
    if sites is None:
        return None
    keys = key_lines(text)
    lines = tuple(
        (keys.get(f"site[{i}].anchor"), keys.get(f"site[{i}].file")) for i in range(len(sites))
    )
    return Variant(name, spec, sha, sites=sites, base=base, site_lines=lines)


_HUNK_AT = re.compile(r"@@ -(\d+)(?:,\d+)? \+(\d+)")


def _diff_lines(
    text: str, diffs: tuple[FileDiff, ...]
) -> tuple[dict[str, int], dict[tuple[str, int], int]]:
    """Where each file's header (its `--- ` line) and each hunk's `@@` line are in the
    payload `text` (lines counted on LF, as an editor does). The `@@` lines, in order, are
    the parsed hunks in order (one that does not start where the next hunk does, below a
    mail's signature say, is passed over). A deletion of an empty file has neither."""
    expected = [
        (d.path, h.index, h.old_start, h.new_start) for d in diffs for h in d.hunks if h.lines
    ]
    files: dict[str, int] = {}
    hunks: dict[tuple[str, int], int] = {}
    at, line, pos = 0, 1, 0
    start = text.find("\n@@ ") + 1  # str.find, not a regex's ^: a payload may be 60 MB
    while start > 0 and at < len(expected):
        path, index, old, new = expected[at]
        match = _HUNK_AT.match(text, start)
        if match and (int(match[1]), int(match[2])) == (old, new):
            line += text.count("\n", pos, start)
            pos = start
            hunks[path, index] = line
            if path not in files:  # the `--- ` and `+++ ` lines just above the first `@@`
                plus = text.rfind("\n", 0, start - 1) + 1
                minus = text.rfind("\n", 0, plus - 1) + 1 if plus > 1 else 0
                if plus and text.startswith("+++ ", plus) and text.startswith("--- ", minus):
                    files[path] = line - 2
            at += 1
        start = text.find("\n@@ ", start) + 1
    return files, hunks


def _check_plugin(text: str, path: Path) -> None:
    """A python patch's module: it compiles and defines ``apply``, the function vLLM calls."""
    if not path.name.endswith(".py"):
        raise PayloadError("a python patch's payload is a .py module", path=path)
    tree = parsed(text)  # parsed once: `defines` and validate's import check read it too
    problem = compile_error(text, path.name) if tree is None else tree_error(tree, path.name)
    if problem is not None:
        raise PayloadError(problem.describe(), path=path)
    if not defines(text, "apply"):
        raise PayloadError("defines no apply() for vLLM's plugin hook to call", path=path)


def _upstream(top: Table, problems: Problems, *, state_line: int | None) -> Upstream | None:
    """`[upstream]` (None when it has a problem: each is kept in `problems`), and the line
    of its `state` key."""
    table = top.table("upstream")
    assert table is not None
    mark = len(problems.errors)
    step = problems.step
    state = step(lambda: cast(UpstreamState, table.choice("state", STATES)), None)
    pr = step(lambda: _pr(table, "pr", required=state not in ("unsubmitted", None)), None)
    superseded_by = step(lambda: _pr(table, "superseded_by", required=False), None)
    probe = step(lambda: _probe(table, problems), None)
    superseded_in = step(lambda: table.version("superseded_in"), None)
    commit = step(lambda: _commit(table), None)
    note = step(lambda: table.opt_str("note", required=False), None)
    problems.finish(table)
    if problems.since(mark) or state is None:
        return None
    return Upstream(
        state=state,
        pr=pr,
        superseded_by=superseded_by,
        superseded_in=superseded_in,
        commit=commit,
        probe=probe,
        note=note,
        state_line=state_line,
    )


def _pr(table: Table, key: str, *, required: bool) -> str | None:
    value = table.opt_str(key, required=required)
    if value is not None and not _PR.match(value):
        raise table.error(f"{value!r}: expected owner/repo#number", key)
    return value


def _probe(upstream: Table, problems: Problems) -> Probe | None:
    """`[upstream.probe]`, when there is one."""
    probe_table = upstream.table("probe", required=False)
    if probe_table is None:
        return None
    mark = len(problems.errors)
    step = problems.step

    def probe_file() -> str:
        file = probe_table.req_str("file")
        _relpath(probe_table, "file", file)
        return file

    file = step(probe_file, None)
    strings = step(lambda: probe_strings(probe_table, "upstream.probe"), None)
    problems.finish(probe_table)
    if problems.since(mark) or file is None or strings is None:
        return None
    contains, any_of, regex = strings
    return Probe(file, contains, regex, any_of)


def _hardware(top: Table, problems: Problems) -> Hardware | None:
    """`[hardware]` (None when it has a problem: each is kept in `problems`)."""
    table = top.table("hardware", required=False)
    if table is None:
        return Hardware()
    mark = len(problems.errors)
    scope = problems.step(lambda: _scope(table), None)
    note = problems.step(lambda: table.opt_str("note", required=False), None)
    problems.finish(table)
    if problems.since(mark):
        return None
    return Hardware(compute_capability=scope, note=note)


def _scope(table: Table) -> SpecifierSet | None:
    scope = table.specifier("compute_capability", required=False)
    if scope is not None:
        try:  # the evaluator the image runs: what loads here also runs there
            parse_scope(str(scope))
        except ValueError as exc:
            raise table.error(str(exc), "compute_capability") from None
    return scope


_SHA = re.compile(r"^[0-9a-f]{7,40}$")


def _commit(table: Table) -> str | None:
    """`upstream.commit`: the fix's commit upstream (merged or superseding), hex sha."""
    value = table.opt_str("commit", required=False)
    if value is not None and not _SHA.match(value):
        raise table.error(f"{value!r}: expected a hex commit sha (7-40 characters)", "commit")
    return value
