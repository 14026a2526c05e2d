"""The patch registry: `patches/<id>/patch.toml` plus payload, validated when it loads."""

from __future__ import annotations

import functools
import hashlib
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeVar, cast, get_args

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchset._fs import sha256_hex
from patchset.errors import PayloadError, RegistryError, UnknownPatchError
from patchset.kernel.capability import parse_scope
from patchset.kernel.pycompile import compile_error
from patchset.kernel.sites import ACTIONS, WHEN_KEYS, Action, Alternative, Site, SiteProbe
from patchset.kernel.touches import defines, module_files, parse_touch
from patchset.registry.diffs import FileDiff, parse_diff
from patchset.registry.paths import check_relpath
from patchset.registry.toml import Table, did_you_mean, key_line, load_toml

Kind = Literal["diff", "runtime", "python"]
When = Literal["build", "startup"]
KINDS: tuple[Kind, ...] = get_args(Kind)
WHENS: tuple[When, ...] = get_args(When)
UpstreamState = Literal["open", "merged", "closed", "superseded", "unsubmitted"]
STATES: tuple[UpstreamState, ...] = get_args(UpstreamState)
PATCH_FILE = "patch.toml"
DEFAULT_PAYLOAD: dict[str, str] = {
    "diff": "patch.diff",
    "runtime": "sites.toml",
    "python": "plugin.py",
}
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}[a-z0-9]$")
_PR = re.compile(r"^[\w.-]+/[\w.-]+#\d+$")


@dataclass(frozen=True)
class Probe:
    """How to recognise the upstream fix in a release's files."""

    file: str
    contains: tuple[str, ...] = ()  # every string must occur
    regex: str | None = None
    any: tuple[str, ...] = ()  # at least one must occur (when given)

    def matches(self, text: str | None) -> bool:
        if text is None:
            return False
        return SiteProbe(self.contains, self.any, self.regex).matches(text)

    def describe(self) -> str:
        return f"{self.file} contains {SiteProbe(self.contains, self.any, self.regex).describe()}"


@dataclass(frozen=True)
class Upstream:
    state: UpstreamState
    pr: str | None = None
    superseded_by: str | None = None
    superseded_in: str | None = None  # the first release carrying the superseding change
    probe: Probe | None = None
    note: str | None = None
    commit: str | None = None  # the upstream fix's commit, for the git ancestry signal


@dataclass(frozen=True)
class Hardware:
    # over "major.minor", e.g. ">=12.0"; evaluated by `patchset.kernel.capability.in_scope`
    compute_capability: SpecifierSet | None = None
    note: str | None = None


@dataclass(frozen=True)
class Variant:
    """One payload of a patch and the releases it is meant for."""

    name: str  # the payload file name, e.g. "patch.diff" or "v0.21.diff"
    vllm: SpecifierSet
    sha256: str
    diffs: tuple[FileDiff, ...] = ()  # for kind "diff"
    sites: tuple[Site, ...] = ()  # for kind "runtime"
    base: str | None = None  # the release the payload was written against (refresh's base)

    @property
    def files(self) -> tuple[str, ...]:
        seen = [d.path for d in self.diffs] + [s.file for s in self.sites]
        return tuple(dict.fromkeys(seen))


@dataclass(frozen=True)
class Patch:
    id: str
    title: str
    description: str
    kind: Kind
    revision: int
    vllm: SpecifierSet
    apply: When
    targets: tuple[str, ...]
    upstream: Upstream
    hardware: Hardware
    origin: str
    credit: tuple[str, ...]
    variants: tuple[Variant, ...]
    folder: Path
    digest: str = field(default="")  # sha256 over patch.toml and every payload
    requires: tuple[str, ...] = ()  # patches applied before this one (a stacked series)
    conflicts: tuple[str, ...] = ()  # patches never applied together with this one
    x: Mapping[str, object] = field(default_factory=dict, compare=False)  # [x]: free-form
    # kind "python": the names it rebinds at run time, "module:attribute" (vllm.envs:is_set)
    touches: tuple[str, ...] = ()

    def in_range(self, version: str) -> bool:
        """Inside the declared range and inside one of the variants' ranges.

        A refresh widens the declared range past releases it never checked (a gap between
        two variants); a release in such a gap has no payload meant for it, so it is out of
        range rather than a failure of the newest payload.
        """
        release = Version(version)
        return self.vllm.contains(release, prereleases=True) and any(
            v.vllm.contains(release, prereleases=True) for v in self.variants
        )

    def to_dict(self) -> dict[str, object]:
        """The JSON form `patchset list` and `show` print."""
        up = self.upstream
        return {
            "id": self.id,
            "title": self.title,
            "description": self.description.strip(),
            "kind": self.kind,
            "revision": self.revision,
            "vllm": str(self.vllm),
            "apply": self.apply,
            "targets": list(self.targets),
            "touches": list(self.touches),
            "upstream": {
                "pr": up.pr,
                "state": up.state,
                "superseded_by": up.superseded_by,
                "superseded_in": up.superseded_in,
                "probe": up.probe.describe() if up.probe else None,
                "note": up.note,
            },
            "hardware": {
                "compute_capability": (
                    str(self.hardware.compute_capability)
                    if self.hardware.compute_capability
                    else None
                ),
                "note": self.hardware.note,
            },
            "origin": self.origin,
            "credit": list(self.credit),
            "variants": [
                {
                    "payload": v.name,
                    "vllm": str(v.vllm),
                    "base": v.base,
                    "sha256": v.sha256,
                    "files": list(v.files),
                }
                for v in self.variants
            ],
            "requires": list(self.requires),
            "conflicts": list(self.conflicts),
            "x": dict(self.x),
            "digest": self.digest,
        }

    def variant_for(self, version: str | None) -> Variant | None:
        """The payload variant meant for `version`; the newest-listed first one if unknown."""
        if version is None:
            return self.variants[0]
        for variant in self.variants:
            if variant.vllm.contains(Version(version), prereleases=True):
                return variant
        return None


@dataclass(frozen=True)
class Registry:
    root: Path
    patches: tuple[Patch, ...]
    digest: str  # "sha256:<hex>" over every patch's metadata and payload
    # With tolerant loading: each patch folder that did not load, and why (its first problem).
    problems: Mapping[str, RegistryError] = field(default_factory=dict, compare=False)

    @property
    def short_digest(self) -> str:
        return self.digest.removeprefix("sha256:")[:12]

    def get(self, patch_id: str) -> Patch:
        for patch in self.patches:
            if patch.id == patch_id:
                return patch
        if patch_id in self.problems:  # asked for by id: its problem, not a skip
            raise self.problems[patch_id]
        ids = [p.id for p in self.patches]
        raise UnknownPatchError(
            f"no patch {patch_id!r} in {self.root}{did_you_mean(patch_id, ids)}"
        )

    def select(self, ids: list[str] | tuple[str, ...] | None) -> tuple[Patch, ...]:
        if not ids:
            return self.patches
        return tuple(self.get(i) for i in dict.fromkeys(ids))


def load_registry(root: Path | str, *, tolerant: bool = False) -> Registry:
    """Load and validate every patch under `root`. The first problem raises RegistryError;
    with `tolerant`, each patch that does not load is left out and its problem kept in
    `Registry.problems` (asking for it by id raises it)."""
    root = Path(root)
    if not root.is_dir():
        raise RegistryError("registry folder does not exist", path=root)
    patches = []
    problems: dict[str, RegistryError] = {}
    for folder in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith(".")):
        try:
            _inside(folder, root, "the registry folder")
            if not (folder / PATCH_FILE).is_file():
                raise RegistryError(f"no {PATCH_FILE} in this patch folder", path=folder)
            patches.append(load_patch(folder))
        except RegistryError as exc:
            if not tolerant:
                raise
            problems[folder.name] = exc
    for patch_id, problem in check_relations(patches, set(problems)).items():
        if not tolerant:
            raise problem
        problems[patch_id] = problem
        patches = [p for p in patches if p.id != patch_id]
    whole = hashlib.sha256()
    for patch in patches:
        whole.update(f"{patch.id}\0{patch.digest}\0".encode())
    return Registry(
        root=root,
        patches=tuple(patches),
        digest=f"sha256:{whole.hexdigest()}",
        problems=problems,
    )


def check_relations(patches: list[Patch], invalid: set[str]) -> dict[str, RegistryError]:
    """`requires` and `conflicts` name patches that exist, and `requires` has no cycle; a
    patch requiring one that did not load is itself not usable."""
    by_id = {p.id: p for p in patches}
    bad: dict[str, RegistryError] = {}
    for patch in patches:
        for key, ids in (("requires", patch.requires), ("conflicts", patch.conflicts)):
            for other in ids:
                file = patch.folder / PATCH_FILE
                if other == patch.id:
                    bad[patch.id] = RegistryError(f"{key}: names the patch itself", path=file)
                elif other in invalid and key == "requires":
                    bad[patch.id] = RegistryError(
                        f"{key}: {other!r} does not load (see its own problem)", path=file
                    )
                elif other not in by_id and other not in invalid:
                    hint = did_you_mean(other, by_id)
                    bad[patch.id] = RegistryError(f"{key}: no patch {other!r}{hint}", path=file)
    for patch in patches:
        cycle = _cycle(patch, by_id)
        if cycle and patch.id not in bad:
            bad[patch.id] = RegistryError(
                f"requires: a cycle: {' -> '.join(cycle)}", path=patch.folder / PATCH_FILE
            )
    return bad


def _cycle(start: Patch, by_id: Mapping[str, Patch]) -> list[str] | None:
    """The first `requires` cycle through `start`, as ids, or None."""

    def walk(patch: Patch, path: list[str]) -> list[str] | None:
        for other in patch.requires:
            if other == start.id:
                return [*path, other]
            if other in by_id and other not in path:
                found = walk(by_id[other], [*path, other])
                if found:
                    return found
        return None

    return walk(start, [start.id])


T = TypeVar("T")


class _Problems:
    """Where the patch loader keeps going: a failed step's problem kept (`collect`, for
    `validate`) and a stand-in value returned, or raised at once (every other command)."""

    def __init__(self, *, collect: bool) -> None:
        self.collect = collect
        self.errors: list[RegistryError] = []

    def add(self, error: RegistryError) -> None:
        if not self.collect:
            raise error
        self.errors.append(error)

    def step(self, read: Callable[[], T], default: T) -> T:
        try:
            return read()
        except RegistryError as exc:
            self.add(exc)
            return default

    def finish(self, table: Table) -> None:
        """The table's unknown keys, each a problem."""
        for unknown in table.unknown():
            self.add(unknown)

    def since(self, mark: int) -> bool:
        """Whether a problem was kept after `mark` (a `len(errors)` taken before)."""
        return len(self.errors) > mark


def load_patch(folder: Path) -> Patch:
    """The patch in `folder`; its first problem raises RegistryError (`patch_problems` lists
    every one)."""
    patch = _load_patch(folder, _Problems(collect=False))
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
    problems = _Problems(collect=True)
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


def _load_patch(folder: Path, problems: _Problems) -> Patch | None:
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
    upstream = step(lambda: _upstream(top, problems), None)
    hardware = step(lambda: _hardware(top, problems), None)
    origin = step(lambda: top.req_str("origin"), "")
    credit: tuple[str, ...] = step(lambda: top.str_list("credit"), ())
    requires: tuple[str, ...] = step(lambda: _ids(top, "requires"), ())
    conflicts: tuple[str, ...] = step(lambda: _ids(top, "conflicts"), ())
    x: Mapping[str, object] = step(lambda: top.free_table("x"), {})
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


def _ids(top: Table, key: str) -> tuple[str, ...]:
    ids = top.str_list(key, required=False)
    for other in ids:
        if not _ID.match(other):
            raise top.error(f"{other!r} is not a patch id", key)
    return tuple(dict.fromkeys(ids))


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


def _inside(path: Path, folder: Path, what: str) -> None:
    """A symlink may not lead a patch folder, its patch.toml or a payload out of `folder`
    (`payload = "../x"` is refused; a link must not get round that)."""
    if not path.is_symlink():
        return
    real, base = path.resolve(), folder.resolve()
    if real != base and base not in real.parents:
        raise RegistryError(f"a symlink leading out of {what} ({real})", path=path)


def _relpath(table: Table, key: str, value: str) -> None:
    try:
        check_relpath(value, file=table.file)
    except RegistryError as exc:
        raise table.error(str(exc).removeprefix(f"{table.file}: "), key) from None


def _variants(
    top: Table,
    folder: Path,
    kind: Kind,
    vllm: SpecifierSet,
    digest: hashlib._Hash,
    *,
    problems: _Problems,
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
    problems: _Problems,
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
        return Variant(name, spec, sha, diffs=parse_diff(text, file=path), base=base)
    if kind == "python":
        _check_plugin(text, path)
        return Variant(name, spec, sha, base=base)
    sites = _load_sites(path, problems)
    return None if sites is None else Variant(name, spec, sha, sites=sites, base=base)


def _check_plugin(text: str, path: Path) -> None:
    """A python patch's module: it compiles and defines ``apply``, the function vLLM calls."""
    if not path.name.endswith(".py"):
        raise PayloadError("a python patch's payload is a .py module", path=path)
    problem = compile_error(text, path.name)
    if problem is not None:
        raise PayloadError(problem.describe(), path=path)
    if not defines(text, "apply"):
        raise PayloadError("defines no apply() for vLLM's plugin hook to call", path=path)


def load_sites(path: Path) -> tuple[Site, ...]:
    """The sites of a `sites.toml`; its first problem raises RegistryError."""
    sites = _load_sites(path, _Problems(collect=False))
    assert sites is not None  # without collecting, a problem raised
    return sites


def _load_sites(path: Path, problems: _Problems) -> tuple[Site, ...] | None:
    """The sites of a `sites.toml`; when `problems` collects (`validate`), every problem of
    every site is kept there and None returned."""
    mark = len(problems.errors)
    step = problems.step
    top = Table(load_toml(path), file=path)
    sites = []
    names: set[str] = set()
    for table in top.tables("site", required=True):
        site = _site(table, names, problems)
        if site is not None:
            sites.append(site)
    problems.finish(top)
    markers = [s.marker for s in sites]
    if len(set(markers)) != len(markers):
        step(lambda: _raise(top.error("every site needs its own marker", "site")), None)
    if problems.since(mark):
        return None
    return tuple(sites)


def _raise(error: RegistryError) -> None:
    raise error


def _site(table: Table, names: set[str], problems: _Problems) -> Site | None:
    """One `[[site]]` (None when it has a problem: each is kept in `problems`)."""
    mark = len(problems.errors)
    step = problems.step
    name = step(lambda: table.req_str("name"), "")
    if name and name in names:
        problems.add(table.error(f"site name {name!r} is used twice", "name"))
    names.add(name)
    file = step(lambda: table.req_str("file"), "")
    if file:
        step(lambda: _relpath(table, "file", file), None)
    anchor = step(lambda: table.req_str("anchor"), "")
    action = step(lambda: cast(Action, table.choice("action", ACTIONS)), None)
    text = step(lambda: table.req_str("text"), "")
    marker = step(lambda: table.req_str("marker"), "")
    optional = step(lambda: table.flag("optional", default=False), False)
    after = step(lambda: _after(table, name), None)
    no_alternatives: tuple[Alternative, ...] = ()
    alternatives = step(lambda: _alternatives(table, name), no_alternatives)
    probe = step(lambda: _site_probe(table, name), None)
    always: tuple[tuple[str, tuple[str, ...]], ...] = ()
    when = step(lambda: _when(table, name), always)
    site = Site(
        name=name,
        file=file,
        anchor=anchor,
        action=action or ACTIONS[0],
        text=text,
        marker=marker,
        optional=optional,
        after=after,
        alternatives=alternatives,
        probe=probe,
        when=when,
    )
    if anchor and not site.anchor_lines:
        problems.add(table.error("must hold at least one non-blank line", "anchor"))
    if "\n" in marker:
        problems.add(table.error("must be one line", "marker"))
    problems.finish(table)
    return None if problems.since(mark) else site


def _after(table: Table, name: str) -> str | None:
    value = table.opt_str("after", required=False)
    if value is not None and not value.strip():
        raise table.error(f"site {name!r}: must hold at least one non-blank line", "after")
    return value


def _alternatives(table: Table, name: str) -> tuple[Alternative, ...]:
    found = []
    for alt in table.tables("alternatives"):
        anchor = alt.req_str("anchor")
        text = alt.opt_str("text", required=False)
        after = _after(alt, name)
        alt.finish()
        found.append(Alternative(anchor=anchor, text=text, after=after))
    return tuple(found)


def _probe_strings(table: Table, name: str) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """`contains`, `any` and `regex` of a probe; at least one of them, none empty."""
    contains = table.str_list("contains", required=False)
    any_of = table.str_list("any", required=False)
    regex = table.opt_str("regex", required=False)
    for key, values in (("contains", contains), ("any", any_of)):
        if any(not v for v in values):
            raise table.error(f"{name}: an empty string matches every file", key)
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise table.error(f"not a valid regular expression: {exc}", "regex") from None
    if not contains and not any_of and regex is None:
        raise table.error(f"{name}: give 'contains', 'any' or 'regex' (none may be empty)")
    return contains, any_of, regex


def _site_probe(table: Table, name: str) -> SiteProbe | None:
    probe = table.table("probe", required=False)
    if probe is None:
        return None
    contains, any_of, regex = _probe_strings(probe, f"site {name!r}")
    probe.finish()
    return SiteProbe(contains, any_of, regex)


def _when(table: Table, name: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    when = table.table("when", required=False)
    if when is None:
        return ()
    conditions = []
    for key in when.names():
        if key not in WHEN_KEYS:
            raise when.error(
                f"site {name!r}: unknown condition; one of {', '.join(WHEN_KEYS)}"
                f"{did_you_mean(key, WHEN_KEYS)}",
                key,
            )
        values = when.str_list(key)
        conditions.append((key, tuple(v.lower() for v in values)))
    when.finish()
    return tuple(conditions)


def _upstream(top: Table, problems: _Problems) -> Upstream | None:
    """`[upstream]` (None when it has a problem: each is kept in `problems`)."""
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
    )


def _pr(table: Table, key: str, *, required: bool) -> str | None:
    value = table.opt_str(key, required=required)
    if value is not None and not _PR.match(value):
        raise table.error(f"{value!r}: expected owner/repo#number", key)
    return value


def _probe(upstream: Table, problems: _Problems) -> Probe | None:
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
    strings = step(lambda: _probe_strings(probe_table, "upstream.probe"), None)
    problems.finish(probe_table)
    if problems.since(mark) or file is None or strings is None:
        return None
    contains, any_of, regex = strings
    return Probe(file, contains, regex, any_of)


def _hardware(top: Table, problems: _Problems) -> Hardware | None:
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
