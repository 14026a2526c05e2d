"""Whether a patch applies here: `[applies]` predicates, per-patch switches, installed versions.

Standard library only: the image entrypoint runs this module at container start, as `check`
and `apply` run it on a host. One parser (`parse`) and one evaluator (`evaluate`), so a
predicate that loads also runs.

A predicate is a node: a table holding exactly one of ``all = [node, ...]``, ``any = [node,
...]`` (neither empty) or ``not = node``, or else one or more leaf keys (several leaves in one
table: all of them). Leaves:

- served configuration, a glob or a list of globs (fnmatch, compared lowercase):
  ``quantization``, ``kv_cache_dtype``, ``kv_cache_family`` (the first word of
  ``kv_cache_dtype`` before ``_``: fp8, turboquant, auto), ``speculative``, ``architecture``,
  ``model_type``, ``model``, ``dtype``, ``tool_call_parser``, ``reasoning_parser``
  (``architecture`` and ``model_type`` may hold several names, comma-joined: some matches);
- hardware: ``compute_capability`` (the scope grammar of `patchset.kernel.capability`, held
  by every GPU), ``gpu_name`` (globs, some GPU matches), ``gpu_count`` (a specifier over an
  integer, e.g. ">=2");
- installed versions, a PEP 440 style specifier (``>=2.9``, ``==2.9.*``, ``~=12.8``):
  ``torch``, ``triton``, ``cuda``, ``driver``, ``python``.

Evaluation is three-valued (Kleene): True, False, or None for Unknown, with the leaves that
could not be known. A fact is unknown when `Facts` does not hold it (None, or a version not in
`versions`); with a served configuration given, a key it leaves out reads as vLLM's default
(`SERVED_DEFAULTS`: ``auto`` for the dtypes, nothing for quantization, speculative and the
parsers), except ``architecture``, ``model_type`` and ``model``, which stay unknown, and the
keys `Facts.unknown_served` names (those the model's config decides, when it was not read).
"""

from __future__ import annotations

import fnmatch
import os
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from .capability import Capability, in_scope, parse_scope
from .specifiers import parse_specifier, satisfies, version_key

SERVED_LEAVES: tuple[str, ...] = (
    "quantization",
    "kv_cache_dtype",
    "kv_cache_family",
    "speculative",
    "architecture",
    "model_type",
    "model",
    "dtype",
    "tool_call_parser",
    "reasoning_parser",
)
HARDWARE_LEAVES: tuple[str, ...] = ("compute_capability", "gpu_name", "gpu_count")
VERSION_LEAVES: tuple[str, ...] = ("torch", "triton", "cuda", "driver", "python")
LEAVES: tuple[str, ...] = (*SERVED_LEAVES, *HARDWARE_LEAVES, *VERSION_LEAVES)
COMBINATORS: tuple[str, ...] = ("all", "any", "not")
# What a served key left out of a known configuration means (vLLM's defaults).
SERVED_DEFAULTS: Mapping[str, str] = {
    "quantization": "",
    "kv_cache_dtype": "auto",
    "speculative": "",
    "dtype": "auto",
    "tool_call_parser": "",
    "reasoning_parser": "",
}
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
TRUTHY: tuple[str, ...] = ("1", "true", "yes", "on")
FALSY: tuple[str, ...] = ("0", "false", "no", "off")


class PredicateError(ValueError):
    """A predicate that cannot be evaluated; `where` is the key path inside it."""

    def __init__(self, message: str, where: str) -> None:
        self.message = message
        self.where = where
        super().__init__(f"{where}: {message}")


# -- the tree --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Leaf:
    key: str  # one of LEAVES
    values: tuple[str, ...]  # served and gpu_name: globs (lowercase); else one specifier

    def to_data(self) -> object:
        if self.key in SERVED_LEAVES or self.key == "gpu_name":
            return list(self.values) if len(self.values) != 1 else self.values[0]
        return self.values[0]

    def describe(self) -> str:
        shown = self.values[0] if len(self.values) == 1 else list(self.values)
        return f"{self.key} = {shown!r}"


@dataclass(frozen=True)
class Node:
    """`all` of `nodes` (also a table of several leaves), `any` of them, or `not` the one."""

    op: str  # "all" | "any" | "not" | "leaf"
    nodes: tuple[Node, ...] = ()
    leaf: Leaf | None = None

    def to_data(self) -> dict[str, object]:
        """The table form (TOML and JSON) it was read from, for the image manifest."""
        if self.op == "leaf":
            assert self.leaf is not None
            return {self.leaf.key: self.leaf.to_data()}
        if self.op == "not":
            return {"not": self.nodes[0].to_data()}
        return {self.op: [n.to_data() for n in self.nodes]}

    def describe(self) -> str:
        if self.op == "leaf":
            assert self.leaf is not None
            return self.leaf.describe()
        if self.op == "not":
            return f"not ({self.nodes[0].describe()})"
        return f"{self.op}(" + ", ".join(n.describe() for n in self.nodes) + ")"

    def leaves(self) -> tuple[Leaf, ...]:
        if self.leaf is not None:
            return (self.leaf,)
        return tuple(leaf for node in self.nodes for leaf in node.leaves())


def parse(data: object, where: str = "applies") -> Node:
    """A predicate node from its TOML/JSON table; PredicateError naming the key path (e.g.
    ``applies.all[1].not.torch``) for an unknown key, a wrong type or an empty list."""
    if not isinstance(data, Mapping):
        raise PredicateError(f"expected a table, got {_type(data)}", where)
    keys = [str(k) for k in data]
    if not keys:
        raise PredicateError("an empty table: give all, any, not or a leaf key", where)
    ops = [k for k in keys if k in COMBINATORS]
    if ops and len(keys) > 1:
        raise PredicateError(
            f"{ops[0]!r} goes alone in its table (found also"
            f" {', '.join(k for k in keys if k != ops[0])})",
            where,
        )
    if ops:
        op = ops[0]
        value = data[op]
        if op == "not":
            return Node("not", (parse(value, f"{where}.not"),))
        if not isinstance(value, list):
            raise PredicateError(f"expected a list of tables, got {_type(value)}", f"{where}.{op}")
        if not value:
            raise PredicateError("an empty list: give at least one node", f"{where}.{op}")
        return Node(op, tuple(parse(v, f"{where}.{op}[{i}]") for i, v in enumerate(value)))
    leaves = tuple(Node("leaf", leaf=_leaf(k, data[k], f"{where}.{k}")) for k in keys)
    return leaves[0] if len(leaves) == 1 else Node("all", leaves)


def _leaf(key: str, value: object, where: str) -> Leaf:
    if key not in LEAVES:
        close = _close(key, (*COMBINATORS, *LEAVES))
        raise PredicateError(
            f"unknown key; one of all, any, not, {', '.join(LEAVES)}{close}", where
        )
    if key in SERVED_LEAVES or key == "gpu_name":
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list) or not values:
            raise PredicateError(
                f"expected a string or a non-empty list of strings, got {_type(value)}", where
            )
        for item in values:
            if not isinstance(item, str) or not item:
                raise PredicateError(f"expected non-empty strings, got {_type(item)}", where)
        return Leaf(key, tuple(v.lower() for v in values))
    if not isinstance(value, str):
        raise PredicateError(
            f"expected a specifier string (e.g. '>=2.9'), got {_type(value)}", where
        )
    try:
        if key == "compute_capability":
            parse_scope(value)
        else:
            parse_specifier(value)
    except ValueError as exc:
        raise PredicateError(str(exc), where) from None
    return Leaf(key, (value,))


def _type(value: object) -> str:
    names = {str: "a string", bool: "a boolean", int: "an integer", float: "a number"}
    names.update({list: "a list", dict: "a table"})
    return names.get(type(value), type(value).__name__)


def _close(word: str, choices: Iterable[str]) -> str:
    import difflib  # noqa: PLC0415 - only for a mistyped key

    found = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f"; did you mean {found[0]!r}?" if found else ""


# -- facts and evaluation --------------------------------------------------------------------


@dataclass(frozen=True)
class Facts:
    """What is known where a predicate is evaluated; None (or a version left out of
    `versions`) is unknown. `compute_capability` holds every GPU's ((): no GPU)."""

    served: Mapping[str, str] | None = None
    compute_capability: tuple[Capability, ...] | None = None
    gpu_names: tuple[str, ...] | None = None
    versions: Mapping[str, str] = field(default_factory=dict)
    # served keys that read as unknown (not as vLLM's default) when `served` leaves them out:
    # those the model's config decides and nobody read (`patchset.kernel.modelconfig`)
    unknown_served: frozenset[str] = frozenset()

    def gpu_count(self) -> int | None:
        if self.gpu_names is not None:
            return len(self.gpu_names)
        if self.compute_capability is not None:
            return len(self.compute_capability)
        return None


@dataclass(frozen=True)
class Verdict:
    """True, False or None (unknown), and the leaves that could not be known."""

    value: bool | None
    unknown: tuple[str, ...] = ()

    def describe_unknown(self) -> str:
        return "; ".join(self.unknown)


def evaluate(node: Node | None, facts: Facts) -> Verdict:
    """`node` over `facts`, three-valued (None: no predicate, True)."""
    if node is None:
        return Verdict(True)
    unknown: list[str] = []
    value = _eval(node, facts, unknown)
    return Verdict(value, tuple(dict.fromkeys(unknown)))


def _eval(node: Node, facts: Facts, unknown: list[str]) -> bool | None:
    if node.op == "leaf":
        assert node.leaf is not None
        value = _leaf_value(node.leaf, facts)
        if value is None:
            unknown.append(node.leaf.describe())
        return value
    if node.op == "not":
        inner = _eval(node.nodes[0], facts, unknown)
        return None if inner is None else not inner
    values = [_eval(n, facts, unknown) for n in node.nodes]
    if node.op == "all":
        if False in values:
            return False
        return None if None in values else True
    if True in values:
        return True
    return None if None in values else False


def served_value(key: str, served: Mapping[str, str]) -> str | None:
    """The served configuration's value of `key` (None: not known)."""
    if key == "kv_cache_family":
        if "kv_cache_family" in served:
            return served["kv_cache_family"].lower()
        dtype = served_value("kv_cache_dtype", served)
        return None if dtype is None else dtype.split("_", 1)[0]
    if key in served:
        return served[key].lower()
    return SERVED_DEFAULTS.get(key)


def _leaf_value(leaf: Leaf, facts: Facts) -> bool | None:
    key = leaf.key
    if key in SERVED_LEAVES:
        if facts.served is None or (key in facts.unknown_served and key not in facts.served):
            return None
        value = served_value(key, facts.served)
        if value is None:
            return None
        several = key in ("architecture", "model_type")
        pieces = [p.strip() for p in value.split(",")] if several else [value]
        return any(fnmatch.fnmatchcase(p, glob) for p in pieces for glob in leaf.values)
    if key == "compute_capability":
        caps = facts.compute_capability
        if caps is None:
            return None
        return bool(caps) and all(in_scope(leaf.values[0], c) for c in caps)
    if key == "gpu_name":
        if facts.gpu_names is None:
            return None
        return any(
            fnmatch.fnmatchcase(name.lower(), glob)
            for name in facts.gpu_names
            for glob in leaf.values
        )
    if key == "gpu_count":
        count = facts.gpu_count()
        return None if count is None else satisfies(str(count), leaf.values[0])
    version = facts.versions.get(key)
    if version is None:
        return None
    if not version:  # known to be absent (e.g. no torch installed): no specifier holds
        return False
    try:
        return satisfies(version, leaf.values[0])
    except ValueError:
        return None  # a version string nobody can compare: unknown, and so named


# -- switches --------------------------------------------------------------------------------


def switch_word(text: str | None) -> bool | None:
    """An environment variable's value as a switch: True for 1/true/yes/on, False for
    0/false/no/off (any case, blanks around ignored), None when unset or empty; ValueError
    for anything else."""
    if text is None or not text.strip():
        return None
    word = text.strip().lower()
    if word in TRUTHY:
        return True
    if word in FALSY:
        return False
    raise ValueError(f"{text!r} is not a switch value: use {'/'.join(TRUTHY)} or {'/'.join(FALSY)}")


def switch_on(env: str, default: bool, environ: Mapping[str, str] | None = None) -> bool:
    """Whether the switch `env` is on (its default when unset); ValueError naming the
    variable for a value that is no switch word."""
    source = os.environ if environ is None else environ
    try:
        value = switch_word(source.get(env))
    except ValueError as exc:
        raise ValueError(f"{env}={source.get(env)!r}: {exc}") from None
    return default if value is None else value


def switch_line(env: str, *, on: bool = True) -> str:
    """The line that sets the switch (``GENESIS_ENABLE_PN351=1``)."""
    return f"{env}={'1' if on else '0'}"


# -- installed versions ----------------------------------------------------------------------


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def installed_versions(
    site_packages: Path | str, names: Iterable[str] = ("torch", "triton")
) -> dict[str, str]:
    """The versions of `names` installed in `site_packages`, read from each ``*.dist-info``'s
    METADATA (``Name:``, ``Version:``), never imported. A name not found is absent from the
    result (unknown); an unreadable METADATA is skipped."""
    wanted = {_canonical(n): n for n in names}
    found: dict[str, str] = {}
    try:
        entries = sorted(Path(site_packages).glob("*.dist-info"))
    except OSError:
        return found
    for folder in entries:
        head = folder.name[: -len(".dist-info")].split("-", 1)[0]
        if _canonical(head) not in wanted:
            continue
        meta = _metadata(folder / "METADATA")
        name, version = meta.get("name"), meta.get("version")
        if name and version and _canonical(name) in wanted:
            found.setdefault(wanted[_canonical(name)], version)
    return found


# The CUDA runtime's own distributions, newest first: their version is the runtime's.
CUDA_RUNTIMES = ("nvidia-cuda-runtime-cu13", "nvidia-cuda-runtime-cu12", "nvidia-cuda-runtime")
_TORCH_CUDA = re.compile(r"\+cu(\d+)(\d)$")  # torch's local version: 2.9.0+cu128


def cuda_version(site_packages: Path | str) -> str | None:
    """The CUDA runtime installed in `site_packages`, from dist-info only (nothing imported):
    see `cuda_of`."""
    return cuda_of(installed_versions(site_packages, ("torch", *CUDA_RUNTIMES)))


def cuda_of(versions: Mapping[str, str]) -> str | None:
    """The CUDA runtime from `installed_versions` of torch and `CUDA_RUNTIMES`: the version of
    NVIDIA's runtime distribution (``12.8.90``), else the CUDA of torch's local version
    (``2.9.0+cu128``: ``12.8``); None when neither says."""
    runtime = next((versions[n] for n in CUDA_RUNTIMES if versions.get(n)), None)
    if runtime is not None:
        return runtime
    tagged = _TORCH_CUDA.search(versions.get("torch", ""))
    return f"{tagged[1]}.{tagged[2]}" if tagged else None


def _metadata(path: Path) -> dict[str, str]:
    """`Name` and `Version` of a METADATA file's header (lowercase keys)."""
    fields: dict[str, str] = {}
    try:
        with path.open(encoding="utf-8", errors="replace") as handle:
            for _ in range(200):  # the header comes first; never read a whole long file
                line = handle.readline()
                if not line or not line.strip():
                    break
                key, sep, value = line.partition(":")
                if sep and key.lower() in ("name", "version"):
                    fields.setdefault(key.lower(), value.strip())
    except OSError:
        return {}
    return fields


__all__ = [
    "COMBINATORS",
    "CUDA_RUNTIMES",
    "ENV_NAME",
    "FALSY",
    "HARDWARE_LEAVES",
    "LEAVES",
    "SERVED_DEFAULTS",
    "SERVED_LEAVES",
    "TRUTHY",
    "VERSION_LEAVES",
    "Facts",
    "Leaf",
    "Node",
    "PredicateError",
    "Verdict",
    "cuda_of",
    "cuda_version",
    "evaluate",
    "installed_versions",
    "parse",
    "parse_specifier",
    "satisfies",
    "served_value",
    "switch_line",
    "switch_on",
    "switch_word",
    "version_key",
]
