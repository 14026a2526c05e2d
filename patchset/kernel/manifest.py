"""The image manifest: the contract between the host (`patchset build`, `runtime export`,
`inspect`, `verify`) and the entrypoint in the image, read and written here only.

Frozen dataclasses, written as JSON by `Manifest.dumps` and read back by `Manifest.loads`,
which checks every field's type as it reads: a manifest that is not one (damaged, edited,
nested too deep) is a `ManifestError` with one line naming the key, never a traceback. The
entrypoint's `--verify` report (`StartReport`) lives here for the same reason: the image
writes it, the host reads it.

Standard library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Literal, cast

from .checks import Check
from .hunks import Hunk
from .predicates import Node, PredicateError
from .predicates import parse as parse_predicate
from .sites import Site
from .tree import relpath_problem

SCHEMA = "patchset.manifest/2"
OLD_SCHEMAS = ("patchset.manifest/1",)  # read: their targets are each file's first `before`
KINDS = ("diff", "runtime", "python")
APPLY = ("build", "startup")
DELIVERIES = ("image", "stock")
MAX_DEPTH = 64  # JSON nesting: a manifest nests 6 deep; 100,000 would exhaust the stack


class ManifestError(ValueError):
    """The manifest cannot be used; the message is one line."""


@dataclass(frozen=True)
class FileDigests:
    """A file's sha256 before and after its patch ("": no file, one created or deleted)."""

    before: str
    after: str


@dataclass(frozen=True)
class Base:
    name: str
    id: str | None = None
    digest: str | None = None


@dataclass(frozen=True)
class PatchEntry:
    """One patch in the manifest: identity, provenance, and what the entrypoint needs."""

    id: str
    revision: int
    kind: Literal["diff", "runtime", "python"]
    apply: Literal["build", "startup"]
    variant: str
    payload_sha256: str
    verdict: str
    files: Mapping[str, FileDigests]
    upstream: str | None = None
    upstream_state: str | None = None
    compute_capability: str | None = None
    requires: tuple[str, ...] = ()  # applied before this one; skipped when one is not in
    touches: tuple[str, ...] = ()  # python
    module: str | None = None  # python: its implementation module in the plugin distribution
    hunks: Mapping[str, tuple[Hunk, ...]] = field(default_factory=dict)  # diff
    executable: tuple[str, ...] = ()  # diff: files it creates 755
    sites: tuple[Site, ...] = ()  # runtime
    switch: str | None = None  # the variable that turns it on or off at start
    switch_default: bool = True  # on while it is unset (in this image; the definition's say)
    applies: Node | None = None  # the predicate left for the start to decide
    policy: str | None = None  # fail | warn; None: PATCHSET_ON_FAILURE
    policy_env: str | None = None  # a variable overriding `policy`
    requires_modules: tuple[str, ...] = ()  # imported at start before it counts as applied
    verify: tuple[Check, ...] = ()  # run after the start applied it, before vllm serve
    edits_sha256: str = ""  # of its hunks or sites as exported ("": a schema 1 manifest)

    def edits_digest(self) -> str:
        """The sha256 of what it edits (hunks, sites, files, executable), as the start reads
        them: checked against `edits_sha256`, so an edited manifest is refused."""
        data = {
            "files": {rel: asdict(d) for rel, d in sorted(self.files.items())},
            "hunks": {rel: [h.to_json() for h in hs] for rel, hs in sorted(self.hunks.items())},
            "sites": [asdict(site) for site in self.sites],
            "executable": list(self.executable),
        }
        text = json.dumps(data, sort_keys=True, separators=(",", ":"), default=str)
        return hashlib.sha256(text.encode()).hexdigest()

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "revision": self.revision,
            "kind": self.kind,
            "apply": self.apply,
            "variant": self.variant,
            "payload_sha256": self.payload_sha256,
            "upstream": self.upstream,
            "upstream_state": self.upstream_state,
            "verdict": self.verdict,
            "compute_capability": self.compute_capability,
            "files": {rel: asdict(d) for rel, d in self.files.items()},
            "requires": list(self.requires),
        }
        if self.kind == "python":
            out["touches"] = list(self.touches)
            out["module"] = self.module
        elif self.kind == "diff":
            out["hunks"] = {rel: [h.to_json() for h in hs] for rel, hs in self.hunks.items()}
            out["executable"] = list(self.executable)
        else:
            out["sites"] = [asdict(site) for site in self.sites]
        out |= {
            "switch": None
            if self.switch is None
            else {"env": self.switch, "default": self.switch_default},
            "applies": None if self.applies is None else self.applies.to_data(),
            "failure": {"policy": self.policy, "env": self.policy_env},
            "requires_modules": list(self.requires_modules),
            "verify": [asdict(c) for c in self.verify],
            "edits_sha256": self.edits_sha256 or self.edits_digest(),
        }
        return out

    def summary(self, keys: Sequence[str]) -> dict[str, Any]:
        """The fields `keys` of its JSON: what a label or a report lists of it."""
        data = self.to_json()
        return {key: data[key] for key in keys}

    @classmethod
    def from_json(cls, data: object, where: str) -> PatchEntry:
        r = _Reader(data, where)
        kind = r.choice("kind", KINDS)
        for key in ("files", "hunks"):
            for rel in r.table(key, required=key == "files").data:
                _path(rel, f"{where}.{key}")
        for rel in r.texts("executable"):
            _path(rel, f"{where}.executable")
        files = {
            rel: FileDigests(d.text("before"), d.text("after"))
            for rel, d in r.table("files").tables()
        }
        hunks: dict[str, tuple[Hunk, ...]] = {}
        sites: tuple[Site, ...] = ()
        if kind == "diff":
            hunks = {rel: _hunks(v, f"{where}.hunks.{rel}") for rel, v in r.table("hunks").items()}
        if set(hunks) - set(files):
            raise ManifestError(f"{where}.hunks: {sorted(set(hunks) - set(files))[0]} not in files")
        if kind == "runtime":
            sites = tuple(_site(s, f"{where}.sites[{n}]") for n, s in enumerate(r.seq("sites")))
        switch = r.table("switch", required=False) if r.data.get("switch") is not None else None
        failure = r.table("failure", required=False)
        policy = failure.opt_text("policy")
        if policy not in (None, "fail", "warn"):
            raise ManifestError(f"{where}.failure.policy: fail or warn expected")
        applies = None
        if r.data.get("applies") is not None:
            try:
                applies = parse_predicate(r.data["applies"], f"{where}.applies")
            except PredicateError as exc:
                raise ManifestError(str(exc)) from None
        return cls(
            switch=None if switch is None else switch.text("env"),
            switch_default=True if switch is None else switch.flag("default"),
            applies=applies,
            policy=policy,
            policy_env=failure.opt_text("env"),
            requires_modules=r.texts("requires_modules"),
            verify=tuple(_check(c, f"{where}.verify[{n}]") for n, c in enumerate(r.seq("verify"))),
            id=r.text("id"),
            revision=r.integer("revision"),
            kind=cast(Literal["diff", "runtime", "python"], kind),
            apply=cast(Literal["build", "startup"], r.choice("apply", APPLY)),
            variant=r.text("variant"),
            payload_sha256=r.text("payload_sha256"),
            verdict=r.text("verdict", ""),
            files=files,
            upstream=r.opt_text("upstream"),
            upstream_state=r.opt_text("upstream_state"),
            compute_capability=r.opt_text("compute_capability"),
            requires=r.texts("requires"),
            touches=r.texts("touches"),
            module=r.opt_text("module"),
            hunks=hunks,
            executable=r.texts("executable"),
            sites=sites,
            edits_sha256=r.text("edits_sha256", ""),
        )


@dataclass(frozen=True)
class Manifest:
    delivery: Literal["image", "stock"]
    registry: str
    vllm: str
    base: Base
    patches: tuple[PatchEntry, ...]
    vllm_root: str | None = None  # None: found at start by the image's own python3
    serve_args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    release_files: str | None = None  # stock: where the release's files were read from
    # the plugin distribution's files (python patches), relpath -> sha256: under plugins/ in
    # a bundle, in vLLM's site folder in a built image; the start checks every one
    plugins: Mapping[str, str] = field(default_factory=dict)
    # support packages: their files (relpath under the runtime folder -> sha256), checked at
    # start, and the entries (relative to it) put on the import path of vLLM's processes
    support: Mapping[str, str] = field(default_factory=dict)
    support_paths: tuple[str, ...] = ()
    # each target file's sha256 before the start applies anything ("": no file): the
    # release's own file in a bundle, the file as built in an image. The start checks each
    # file once against it, then applies the patches that are on (kernel/stack.py)
    targets: Mapping[str, str] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        base: dict[str, Any] = {"name": self.base.name}
        if self.delivery == "image":
            base |= {"id": self.base.id, "digest": self.base.digest}
        out: dict[str, Any] = {
            "schema": SCHEMA,
            "delivery": self.delivery,
            "registry": self.registry,
            "vllm": self.vllm,
            "vllm_root": self.vllm_root,
            "base": base,
        }
        if self.release_files is not None:
            out["release_files"] = self.release_files
        out |= {
            "serve_args": list(self.serve_args),
            "env": dict(self.env),
            "plugins": dict(self.plugins),
            "support": dict(self.support),
            "support_paths": list(self.support_paths),
            "targets": dict(self.targets),
            "patches": [p.to_json() for p in self.patches],
        }
        return out

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=1) + "\n"

    @classmethod
    def from_json(cls, data: object) -> Manifest:
        r = _Reader(data, "manifest")
        schema = r.text("schema", "")
        if schema != SCHEMA and schema not in OLD_SCHEMAS:
            raise ManifestError(f"not a patchset manifest (schema {SCHEMA})")
        b = r.table("base")
        patches = tuple(
            PatchEntry.from_json(p, f"patches[{n}]") for n, p in enumerate(r.seq("patches"))
        )
        _check_series(patches)
        delivery = cast(Literal["image", "stock"], r.choice("delivery", DELIVERIES))
        targets = _old_targets(patches, delivery)  # schema 1, and what a schema 2 one omits
        for rel, want in (r.str_map("targets") if schema == SCHEMA else {}).items():
            _path(rel, "manifest.targets")
            targets[rel] = want
        return cls(
            targets=targets,
            delivery=delivery,
            registry=r.text("registry"),
            vllm=r.text("vllm"),
            base=Base(b.text("name"), b.opt_text("id"), b.opt_text("digest")),
            patches=patches,
            vllm_root=r.opt_text("vllm_root"),
            serve_args=r.texts("serve_args"),
            env=r.str_map("env"),
            release_files=r.opt_text("release_files"),
            plugins=_plugin_files(r.str_map("plugins")),
            support=_plugin_files(r.str_map("support")),
            support_paths=tuple(
                _plain(p, "manifest.support_paths") for p in r.texts("support_paths")
            ),
        )

    @classmethod
    def loads(cls, text: str | bytes) -> Manifest:
        try:
            data = json.loads(text)
        except RecursionError:
            raise ManifestError("nested too deeply to be a manifest") from None
        except ValueError as exc:
            raise ManifestError(f"not JSON ({exc})") from None
        if _depth(data) > MAX_DEPTH:
            raise ManifestError("nested too deeply to be a manifest")
        return cls.from_json(data)


@dataclass(frozen=True)
class StartOutcome:
    """One line of a start: a patch (or "gpu", "write") and what became of it."""

    patch: str
    apply: str
    state: str
    ok: bool = True

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class StartReport:
    """What `entrypoint.py --verify` prints (one JSON line) and `patchset verify` reads."""

    ok: bool
    registry: str | None
    error: str | None
    results: tuple[StartOutcome, ...]
    on: tuple[str, ...] = ()  # the patches on at this start, sorted (they decide the bytes)
    on_digest: str = ""  # the short sha256 of that set

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": self.ok,
            "registry": self.registry,
            "error": self.error,
            "on": list(self.on),
            "on_digest": self.on_digest,
            "results": [r.to_json() for r in self.results],
        }

    @property
    def failed(self) -> tuple[StartOutcome, ...]:
        return tuple(r for r in self.results if not r.ok)

    @classmethod
    def loads(cls, text: str) -> StartReport:
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise ManifestError("the verify report is not JSON") from None
        r = _Reader(data, "report")
        rows = [_Reader(item, f"results[{n}]") for n, item in enumerate(r.seq("results"))]
        results = [StartOutcome(o.text("patch"), o.text("apply"), o.text("state"), o.flag("ok"))
                   for o in rows]  # fmt: skip
        return cls(
            r.flag("ok"),
            r.opt_text("registry"),
            r.opt_text("error"),
            tuple(results),
            r.texts("on"),
            r.text("on_digest", ""),
        )


def _old_targets(patches: Sequence[PatchEntry], delivery: str) -> dict[str, str]:
    """A schema 1 manifest's targets (and a schema 2 one's defaults): each file's `before`
    at the first patch listing it (its chain began at the release's file), in an image the
    `after` of its last build patch (the file as built)."""
    targets: dict[str, str] = {}
    for patch in patches:
        if patch.kind == "python":
            continue
        for rel, digests in patch.files.items():
            targets.setdefault(rel, digests.before)
            if delivery == "image" and patch.apply == "build":
                targets[rel] = digests.after
    return targets


def _check_series(patches: Sequence[PatchEntry]) -> None:
    """Each id once; every `requires` names a patch of the manifest; no cycle."""
    ids = [p.id for p in patches]
    if len(set(ids)) != len(ids):
        raise ManifestError(f"patches: {next(i for i in ids if ids.count(i) > 1)} twice")
    needs = {p.id: p.requires for p in patches}
    for patch in patches:
        unknown = [r for r in patch.requires if r not in needs]
        if unknown:
            raise ManifestError(f"{patch.id}: requires {unknown[0]}, not in this manifest")
    state: dict[str, int] = {}  # 1: on the path being walked, 2: done
    for start in ids:
        stack = [(start, iter(needs[start]))]
        state.setdefault(start, 1)
        while stack:
            node, rest = stack[-1]
            nxt = next(rest, None)
            if nxt is None:
                state[node] = 2
                stack.pop()
            elif state.get(nxt) == 1:
                cycle = [n for n, _ in stack][[n for n, _ in stack].index(nxt) :]
                raise ManifestError(f"requires go in a circle: {' -> '.join([*cycle, nxt])}")
            elif nxt not in state:
                state[nxt] = 1
                stack.append((nxt, iter(needs[nxt])))


def _depth(data: object) -> int:
    """How deep `data` nests, walked without recursion."""
    deepest, stack = 0, [(data, 1)]
    while stack:
        item, level = stack.pop()
        deepest = max(deepest, level)
        if deepest > MAX_DEPTH:
            return deepest
        if isinstance(item, dict):
            stack += [(v, level + 1) for v in item.values()]
        elif isinstance(item, list):
            stack += [(v, level + 1) for v in item]
    return deepest


def _hunks(data: object, where: str) -> tuple[Hunk, ...]:
    if not isinstance(data, list):
        raise ManifestError(f"{where}: a list of hunks expected")
    out = []
    for n, item in enumerate(data):
        r = _Reader(item, f"{where}[{n}]")
        lines = []
        for line in r.seq("lines"):
            ok = isinstance(line, list) and len(line) == 2 and line[0] in (" ", "-", "+")
            if not ok or not isinstance(line[1], str):
                raise ManifestError(f"{where}[{n}].lines: [tag, text] pairs expected")
            lines.append((line[0], line[1]))
        out.append(
            Hunk(
                index=r.integer("index"),
                old_start=r.integer("old_start"),
                new_start=r.integer("new_start"),
                lines=tuple(lines),
                section=r.text("section", ""),
                old_eof_newline=r.flag("old_eof_newline"),
                new_eof_newline=r.flag("new_eof_newline"),
            )
        )
    return tuple(out)


def _plugin_files(files: dict[str, str]) -> dict[str, str]:
    for rel in files:
        _plain(rel, "manifest.plugins")
    return files


def _plain(rel: str, where: str) -> str:
    problem = relpath_problem(f"vllm/{rel}")  # the same rule, whatever the top folder
    if problem is not None:
        raise ManifestError(f"{where}: {rel!r}: {problem}")
    return rel


def _check(data: object, where: str) -> Check:
    r = _Reader(data, where)
    timeout = r.data.get("timeout", 10.0)
    if not isinstance(timeout, (int, float)) or isinstance(timeout, bool) or timeout <= 0:
        raise ManifestError(f"{where}.timeout: a positive number expected")
    check = Check(
        r.opt_text("attribute"),
        r.opt_text("file"),
        r.opt_text("contains"),
        r.opt_text("module"),
        r.opt_text("expr"),
        float(timeout),
    )
    if not (
        check.attribute
        or (check.file and check.contains is not None)
        or (check.module and check.expr)
    ):
        raise ManifestError(f"{where}: attribute, file + contains, or module + expr expected")
    return check


def _path(rel: str, where: str) -> None:
    problem = relpath_problem(rel)
    if problem is not None:
        raise ManifestError(f"{where}: {rel!r}: {problem}")


def _site(data: object, where: str) -> Site:
    r = _Reader(data, where)
    for key in ("name", "file", "anchor", "action", "text", "marker"):
        r.text(key)
    _path(r.text("file"), f"{where}.file")
    try:
        return Site.from_dict(cast(Mapping[str, Any], data))
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ManifestError(f"{where}: not a site ({type(exc).__name__}: {exc})") from None


_MISSING = object()


class _Reader:
    """A JSON object read key by key, each value's type checked, errors naming the key."""

    def __init__(self, data: object, where: str) -> None:
        if not isinstance(data, dict):
            raise ManifestError(f"{where}: an object expected, not {type(data).__name__}")
        self.data: dict[str, Any] = data
        self.where = where

    def _get(self, key: str, default: object) -> Any:
        value = self.data.get(key, default)
        if value is _MISSING:
            raise ManifestError(f"{self.where}.{key}: missing")
        return value

    def _bad(self, key: str, what: str) -> ManifestError:
        return ManifestError(f"{self.where}.{key}: {what} expected")

    def text(self, key: str, default: object = _MISSING) -> str:
        value = self._get(key, default)
        if not isinstance(value, str):
            raise self._bad(key, "a string")
        return value

    def opt_text(self, key: str) -> str | None:
        value = self._get(key, None)
        if value is not None and not isinstance(value, str):
            raise self._bad(key, "a string or null")
        return value

    def integer(self, key: str) -> int:
        value = self._get(key, _MISSING)
        if not isinstance(value, int) or isinstance(value, bool):
            raise self._bad(key, "an integer")
        return value

    def flag(self, key: str) -> bool:
        value = self._get(key, _MISSING)
        if not isinstance(value, bool):
            raise self._bad(key, "true or false")
        return value

    def choice(self, key: str, allowed: Sequence[str]) -> str:
        value = self.text(key)
        if value not in allowed:
            raise self._bad(key, " or ".join(allowed))
        return value

    def seq(self, key: str) -> list[Any]:
        value = self._get(key, [])
        if not isinstance(value, list):
            raise self._bad(key, "a list")
        return value

    def texts(self, key: str) -> tuple[str, ...]:
        value = self.seq(key)
        if not all(isinstance(v, str) for v in value):
            raise self._bad(key, "a list of strings")
        return tuple(value)

    def table(self, key: str, *, required: bool = True) -> _Reader:
        return _Reader(self._get(key, _MISSING if required else {}), f"{self.where}.{key}")

    def items(self) -> list[tuple[str, Any]]:
        return list(self.data.items())

    def tables(self) -> list[tuple[str, _Reader]]:
        return [(k, _Reader(v, f"{self.where}.{k}")) for k, v in self.data.items()]

    def str_map(self, key: str) -> dict[str, str]:
        value = self.table(key, required=False).data
        if not all(isinstance(v, str) for v in value.values()):
            raise self._bad(key, "an object of strings")
        return dict(value)


__all__ = [
    "SCHEMA",
    "Base",
    "Check",
    "FileDigests",
    "Manifest",
    "ManifestError",
    "PatchEntry",
    "StartOutcome",
    "StartReport",
]
