"""The patch registry's types: a patch, its payload variants, and the registry holding them.

The loader that builds them from `patches/<id>/patch.toml` is `patchset.registry.load`.
"""

from __future__ import annotations

import functools
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal, get_args

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from patchset.errors import RegistryError, UnknownPatchError
from patchset.kernel.checks import Check
from patchset.kernel.predicates import Node, switch_on
from patchset.kernel.sites import Site, SiteProbe
from patchset.registry.diffs import FileDiff
from patchset.registry.ranges import placed
from patchset.registry.toml import did_you_mean

Kind = Literal["diff", "runtime", "python"]
When = Literal["build", "startup"]
KINDS: tuple[Kind, ...] = get_args(Kind)
WHENS: tuple[When, ...] = get_args(When)
UpstreamState = Literal["open", "merged", "closed", "superseded", "unsubmitted"]
STATES: tuple[UpstreamState, ...] = get_args(UpstreamState)
LifecycleState = Literal["experimental", "stable", "deprecated", "retired"]
LIFECYCLE_STATES: tuple[LifecycleState, ...] = get_args(LifecycleState)
Policy = Literal["fail", "warn"]
POLICIES: tuple[Policy, ...] = get_args(Policy)
PATCH_FILE = "patch.toml"
SUPPORT_FOLDER = "_support"  # patches/_support/<name>/support.toml; "_" is never a patch id
SUPPORT_FILE = "support.toml"


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
    # the line of `state` in patch.toml, recorded at load (what an annotation points at)
    state_line: int | None = field(default=None, compare=False)


@dataclass(frozen=True)
class Hardware:
    # over "major.minor", e.g. ">=12.0"; evaluated by `patchset.kernel.capability.in_scope`
    compute_capability: SpecifierSet | None = None
    note: str | None = None


@dataclass(frozen=True)
class Switch:
    """`[switch]`: the environment variable that turns the patch on or off, and whether it
    is on while the variable is unset."""

    env: str
    default: bool = True
    # other names the collection accepts for the same switch (Genesis's `env_flag_aliases`):
    # at start each turns the patch on or off as `env` does, and is reported as an alias
    aliases: tuple[str, ...] = ()

    @property
    def names(self) -> tuple[str, ...]:
        """`env` and its aliases."""
        return (self.env, *self.aliases)

    def line(self, *, on: bool = True) -> str:
        """The line that turns it on (or off): ``GENESIS_ENABLE_PN351=1``."""
        return f"{self.env}={'1' if on else '0'}"


@dataclass(frozen=True)
class Failure:
    """`[failure]`: what a failure of this patch does at container start (None: the global
    PATCHSET_ON_FAILURE), and a variable that overrides it."""

    policy: Policy | None = None
    env: str | None = None


@dataclass(frozen=True)
class Verify(Check):
    """One `[[verify]]`: proof the patch took effect, run after the start applied it.
    Exactly one kind: `attribute` (module:attribute must exist), `file` + `contains` (the
    file, relative to the folder holding vllm/, holds the text) or `module` + `expr` (an
    expression over the imported module `m` is true). Its fields and `describe` are the
    manifest's `Check`, which the image reads."""

    @property
    def kind(self) -> str:
        return "attribute" if self.attribute else "file" if self.file else "expr"

    def to_dict(self) -> dict[str, object]:
        found: dict[str, object] = {
            k: v
            for k, v in (
                ("attribute", self.attribute),
                ("file", self.file),
                ("contains", self.contains),
                ("module", self.module),
                ("expr", self.expr),
            )
            if v is not None
        }
        found["timeout"] = self.timeout
        return found


@dataclass(frozen=True)
class Lifecycle:
    """`[lifecycle]`: experimental, stable (the default), deprecated or retired; retired
    for releases after `retire_after`; `superseded_by` another patch of the registry."""

    state: LifecycleState = "stable"
    retire_after: str | None = None
    superseded_by: str | None = None

    def retired(self, release: str | None) -> bool:
        """Whether the patch is retired for `release` (None: not known, only the state)."""
        if self.state == "retired":
            return True
        if self.retire_after is None or release is None:
            return False
        return Version(release) > Version(self.retire_after)

    def describe(self, release: str | None = None) -> str:
        words: list[str] = ["retired" if self.retired(release) else self.state]
        if self.retire_after:
            words.append(f"retired after {self.retire_after}")
        if self.superseded_by:
            words.append(f"superseded by {self.superseded_by}")
        return ", ".join(words)


@dataclass(frozen=True)
class Provenance:
    """`[provenance]`: where an importer took the patch from."""

    collection: str | None = None
    repository: str | None = None
    commit: str | None = None
    file: str | None = None
    line: int | None = None


@dataclass(frozen=True)
class SupportPackage:
    """`patches/_support/<name>/support.toml`: Python packages patches import at run time,
    as a folder (`path`) or a pinned wheel or sdist (`file` + `sha256`) beside it."""

    name: str
    folder: Path  # the folder holding support.toml
    modules: tuple[str, ...]  # the top-level import names it provides
    path: str | None = None
    file: str | None = None
    sha256: str | None = None
    digest: str = ""  # sha256 over support.toml and what it carries

    @property
    def kind(self) -> Literal["folder", "wheel", "sdist"]:
        if self.path is not None:
            return "folder"
        return "wheel" if (self.file or "").endswith(".whl") else "sdist"

    @property
    def source(self) -> Path:
        """The folder on the import path, or the pinned file."""
        return self.folder / (self.path if self.path is not None else self.file or "")

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "kind": self.kind,
            "modules": list(self.modules),
            "path": self.path,
            "file": self.file,
            "sha256": self.sha256,
            "digest": self.digest,
        }


@dataclass(frozen=True)
class Variant:
    """One payload of a patch and the releases it is meant for."""

    name: str  # the payload file name, e.g. "patch.diff" or "v0.21.diff"
    vllm: SpecifierSet
    sha256: str
    diffs: tuple[FileDiff, ...] = ()  # for kind "diff"
    sites: tuple[Site, ...] = ()  # for kind "runtime"
    base: str | None = None  # the release the payload was written against (refresh's base)
    # Lines of the payload, recorded at load (what an annotation points at): a diff's file
    # headers (`--- `) by path and its hunks (`@@`) by (path, hunk number); each site's
    # `anchor` and `file` keys, in the order of `sites`.
    file_lines: Mapping[str, int] = field(default_factory=dict, compare=False)
    hunk_lines: Mapping[tuple[str, int], int] = field(default_factory=dict, compare=False)
    site_lines: tuple[tuple[int | None, int | None], ...] = field(default=(), compare=False)

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
    switch: Switch | None = None  # [switch]; None: always on (PATCHSET_DISABLE/ONLY aside)
    applies: Node | None = None  # [applies]: the predicate (kernel/predicates.py)
    failure: Failure = field(default_factory=Failure)
    requires_modules: tuple[str, ...] = ()  # modules a support package (or vLLM) provides
    verify: tuple[Verify, ...] = ()
    lifecycle: Lifecycle = field(default_factory=Lifecycle)
    provenance: Provenance | None = None

    @functools.cached_property
    def reads(self) -> tuple[str, ...]:
        """Every file a check of the patch reads, sorted: each variant's targets and the
        probe's file (worked out once per loaded patch, not once per release)."""
        files = {f for variant in self.variants for f in variant.files}
        if self.upstream.probe is not None:
            files.add(self.upstream.probe.file)
        return tuple(sorted(files))

    def modules_needed(self) -> tuple[str, ...]:
        """`requires_modules` of the patch and of every site of its variants."""
        found = list(self.requires_modules)
        for variant in self.variants:
            for site in variant.sites:
                found += site.requires_modules
        return tuple(dict.fromkeys(found))

    def switched_on(self, environ: Mapping[str, str]) -> bool:
        """Whether the switch is on in `environ` (no switch: on); ValueError, naming the
        variable, for a value that is no switch word."""
        if self.switch is None:
            return True
        return switch_on(self.switch.env, self.switch.default, environ)

    def in_range(self, version: str) -> bool:
        """Inside the declared range and inside one of the variants' ranges.

        A refresh widens the declared range past releases it never checked (a gap between
        two variants); a release in such a gap has no payload meant for it, so it is out of
        range rather than a failure of the newest payload.
        """
        return self.placed(version)[0]

    def gates(self) -> dict[str, object]:
        """What decides whether the patch runs besides its range (check's JSON `patches`):
        its switch and default, lifecycle and predicate."""
        return {
            "switch": (
                {"env": self.switch.env, "default": self.switch.default} if self.switch else None
            ),
            "lifecycle": {
                "state": self.lifecycle.state,
                "retire_after": self.lifecycle.retire_after,
                "superseded_by": self.lifecycle.superseded_by,
            },
            "applies": self.applies.to_data() if self.applies else None,
        }

    def gates_text(self) -> str | None:
        """The same as one line for tables (None when nothing beyond the defaults)."""
        parts = []
        if self.switch is not None:
            default = "on" if self.switch.default else "off"
            parts.append(f"switch {self.switch.env} (default {default})")
        if self.lifecycle != Lifecycle():
            parts.append(f"lifecycle {self.lifecycle.describe()}")
        if self.applies is not None:
            parts.append(f"applies {self.applies.describe()}")
        return "; ".join(parts) or None

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
            **self.gates(),
            "failure": {"policy": self.failure.policy, "env": self.failure.env},
            "requires_modules": list(self.modules_needed()),
            "verify": [v.to_dict() for v in self.verify],
            "provenance": asdict(self.provenance) if self.provenance else None,
            "x": dict(self.x),
            "digest": self.digest,
        }

    def variant_for(self, version: str | None) -> Variant | None:
        """The payload variant meant for `version`; the newest-listed first one if unknown."""
        if version is None:
            return self.variants[0]
        return self.placed(version)[1]

    @functools.cached_property
    def _ranges(self) -> tuple[str, ...]:
        """The declared range's text and each variant's, in order: what places a release."""
        return (str(self.vllm), *(str(v.vllm) for v in self.variants))

    def placed(self, version: str) -> tuple[bool, Variant | None]:
        """`in_range` and `variant_for` of a release together (a check asks both of every
        patch in every release), answered once per release for every patch of the same
        ranges (`ranges.placed`). InvalidVersion when `version` is none."""
        inside, meant = placed(self._ranges, version)
        return inside, self.variants[meant] if meant >= 0 else None


@dataclass(frozen=True)
class Registry:
    root: Path
    patches: tuple[Patch, ...]
    digest: str  # "sha256:<hex>" over every patch's metadata and payload
    # With tolerant loading: each patch folder that did not load, and why (its first problem);
    # a support package that did not load is keyed "_support/<name>".
    problems: Mapping[str, RegistryError] = field(default_factory=dict, compare=False)
    support: tuple[SupportPackage, ...] = ()  # patches/_support/*/support.toml

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
        file = patch.folder / PATCH_FILE
        both = sorted(set(patch.requires) & set(patch.conflicts))
        if both:
            bad[patch.id] = RegistryError(
                f"conflicts: {', '.join(both)} is also in requires (a patch cannot need and"
                " refuse the same patch)",
                path=file,
            )
        successor = patch.lifecycle.superseded_by
        if successor is not None and successor not in by_id and successor not in invalid:
            hint = did_you_mean(successor, by_id)
            bad[patch.id] = RegistryError(
                f"lifecycle.superseded_by: no patch {successor!r}{hint}", path=file
            )
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
