"""What the served model's own ``config.json`` says (standard library only: the image
entrypoint runs it at container start).

vLLM learns the architecture, model type and quantization of the model it serves from the
model's ``config.json``; so does the start here, for the `[applies]` leaves that name them
(`MODEL_LEAVES`). The config is found as vLLM finds it: a local ``--model`` folder, or a hub
id's snapshot in the Hugging Face cache (``$HF_HUB_CACHE``, else ``$HF_HOME/hub``, else
``~/.cache/huggingface/hub``: ``models--ORG--NAME/snapshots/<rev>/config.json``, the snapshot
``refs/main`` (or ``--revision``) names when there is one). What the serve arguments say
(``--hf-overrides``, ``--quantization``) wins over the config. When no config can be read, the
leaves it would decide stay unknown and one line says what to set.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from .predicates import Facts

# The served keys the model's config decides when the serve arguments do not.
MODEL_LEAVES: tuple[str, ...] = ("architecture", "model_type", "quantization")
MAX_BYTES = 4 * 1024 * 1024  # a model's config.json is some kB; anything near this is not one
_NESTED = ("text_config", "language_config", "llm_config")  # multimodal configs nest the LM's


class ConfigError(ValueError):
    """A config.json that cannot be read as a model's config; the message is one line."""


@dataclass(frozen=True)
class ModelFacts:
    """The served configuration with what the model's config decided filled in; `unknown`:
    the model leaves nobody decided (read as unknown, not as vLLM's default); `line`: what
    the start says about it (None: nothing to say)."""

    served: dict[str, str]
    unknown: frozenset[str] = frozenset()
    line: str | None = None
    source: str | None = None  # the config.json read
    decided: dict[str, str] = field(default_factory=dict)

    def into(self, facts: Facts) -> Facts:
        """`facts` with this served configuration and its unknown model leaves."""
        return replace(facts, served=dict(self.served), unknown_served=self.unknown)


def undecided(served: Mapping[str, str]) -> frozenset[str]:
    """The model leaves the serve arguments leave to the model's config (at export: those a
    start decides, never a reason to leave a patch out)."""
    return frozenset(k for k in MODEL_LEAVES if k not in served)


def hub_caches(environ: Mapping[str, str]) -> list[Path]:
    """Where a hub id's snapshots are looked for, first found first."""
    found: list[Path] = []
    if environ.get("HF_HUB_CACHE"):
        found.append(Path(environ["HF_HUB_CACHE"]))
    if environ.get("HF_HOME"):
        found.append(Path(environ["HF_HOME"]) / "hub")
    cache = environ.get("XDG_CACHE_HOME") or str(Path(environ.get("HOME", "/root")) / ".cache")
    found.append(Path(cache) / "huggingface" / "hub")
    return list(dict.fromkeys(found))


def locate(
    model: str, environ: Mapping[str, str], revision: str | None = None
) -> tuple[Path, Path]:
    """The config.json of `model` and the folder it must stay inside; ConfigError (one
    line) when there is none."""
    local = Path(model).expanduser()
    if local.is_dir():
        real = local.resolve()
        if real.parent.name == "snapshots" and real.parent.parent.name.startswith("models--"):
            real = real.parent.parent  # a snapshot of the cache: its files link to ../../blobs
        return local / "config.json", real
    parts = model.split("/")
    if len(parts) != 2 or not all(parts) or any(p in (".", "..") for p in parts):
        raise ConfigError(f"{model!r} is neither a folder here nor a hub id (ORG/NAME)")
    caches = hub_caches(environ)
    for cache in caches:
        repo = cache / f"models--{parts[0]}--{parts[1]}"
        if repo.is_dir():
            return _snapshot(repo, revision) / "config.json", repo.resolve()
    where = ", ".join(str(c) for c in caches)
    raise ConfigError(f"{model} is not in the Hugging Face cache ({where}): not downloaded yet?")


def _snapshot(repo: Path, revision: str | None) -> Path:
    snapshots = repo / "snapshots"
    ref = repo / "refs" / (revision or "main")
    try:
        named = ref.read_text(encoding="ascii").strip() if ref.is_file() else ""
    except (OSError, UnicodeError):
        named = ""
    for name in (named, revision or ""):
        if name and "/" not in name and name not in (".", "..") and (snapshots / name).is_dir():
            return snapshots / name
    try:
        held = [p for p in snapshots.iterdir() if (p / "config.json").exists()]
    except OSError:
        held = []
    if not held:
        raise ConfigError(f"{repo} holds no snapshot with a config.json")
    return max(held, key=lambda p: (p.stat().st_mtime, p.name))  # the newest download


def read_config(path: Path, inside: Path) -> dict[str, object]:
    """`path` as a JSON object, read only when it resolves inside `inside`, is a regular file
    and at most MAX_BYTES; ConfigError (one line) otherwise."""
    try:
        real = path.resolve(strict=True)
    except (OSError, RuntimeError):
        raise ConfigError(f"{path}: no such file") from None
    if not real.is_relative_to(inside):
        raise ConfigError(f"{path} is a link out of {inside} (to {real}): not read")
    if not real.is_file():
        raise ConfigError(f"{path} is not a regular file")
    try:
        with real.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise ConfigError(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ConfigError(f"{path} is larger than {MAX_BYTES // (1024 * 1024)} MiB: not a config")
    try:
        config = json.loads(data.decode("utf-8"))
    except (UnicodeError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{path} is not JSON: {str(exc).splitlines()[0]}") from None
    if not isinstance(config, dict):
        raise ConfigError(f"{path} is not a JSON object")
    return config


def config_facts(config: Mapping[str, object], where: str = "config.json") -> dict[str, str]:
    """architecture (every name of ``architectures``, the nested text config's too,
    comma-joined), model_type (likewise) and quantization (``quantization_config.quant_method``,
    "" when the model is not quantized), lowercase; ConfigError for a field of the wrong
    type."""
    tables = [config, *(t for k in _NESTED if isinstance(t := config.get(k), dict))]
    archs: list[str] = []
    types: list[str] = []
    quant = ""
    for table in tables:
        value = table.get("architectures")
        if value is not None:
            if not isinstance(value, list) or not all(isinstance(a, str) and a for a in value):
                raise ConfigError(f"{where}: architectures is not a list of names")
            archs += value
        kind = table.get("model_type")
        if kind is not None:
            if not isinstance(kind, str):
                raise ConfigError(f"{where}: model_type is not a string")
            types.append(kind)
        qconf = table.get("quantization_config")
        if qconf is not None and not quant:
            method = qconf.get("quant_method") if isinstance(qconf, dict) else None
            if not isinstance(method, str) or not method:
                raise ConfigError(f"{where}: quantization_config has no quant_method string")
            quant = method
    facts = {"quantization": quant.lower()}
    if archs:
        facts["architecture"] = ",".join(dict.fromkeys(a.lower() for a in archs))
    if types:
        facts["model_type"] = ",".join(dict.fromkeys(t.lower() for t in types))
    return facts


def _arg(args: Sequence[str], *names: str) -> str | None:
    found = None
    for i, arg in enumerate(args):
        key, sep, value = arg.partition("=")
        if key in names:
            found = value if sep else (args[i + 1] if i + 1 < len(args) else None)
    return found


def served_model(args: Sequence[str]) -> str | None:
    """The model `vllm serve` serves: its first positional argument, or --model (as given)."""
    given = _arg(args, "--model")
    if given:
        return given
    if args and not args[0].startswith("-"):
        return args[0]
    return None


def decide(
    served: Mapping[str, str],
    args: Sequence[str],
    environ: Mapping[str, str],
    wanted: Iterable[str] = MODEL_LEAVES,
) -> ModelFacts:
    """`served` (from the serve arguments, which win) with what the model's config says of
    the model leaves in `wanted` that the arguments leave open. The config is only read when
    some such leaf is wanted."""
    have = dict(served)
    open_leaves = sorted(set(wanted) & undecided(served))
    if not open_leaves:
        return ModelFacts(have)
    model = served_model(args)
    try:
        if model is None:
            raise ConfigError("the serve arguments name no model")
        path, inside = locate(model, environ, _arg(args, "--revision"))
        config = read_config(path, inside)
        found = config_facts(config, str(path))
    except ConfigError as exc:
        flags = {"architecture": "--hf-overrides '{\"architectures\": [...]}'"}
        flags |= {"model_type": "--hf-overrides '{\"model_type\": ...}'"}
        flags["quantization"] = "--quantization"
        hint = " and ".join(dict.fromkeys(flags[k] for k in open_leaves))
        line = (
            f"model config: {exc}; {', '.join(open_leaves)} unknown here (the patches they"
            f" decide are skipped): give {hint}, or mount the model's folder or cache"
        )
        return ModelFacts(have, frozenset(open_leaves), line)
    decided = {k: found[k] for k in open_leaves if k in found}
    have.update(decided)
    left = frozenset(k for k in open_leaves if k not in found)
    shown = ", ".join(f"{k}={v or 'none'}" for k, v in decided.items())
    line = f"model config: {path}: {shown or 'says nothing of ' + ', '.join(open_leaves)}"
    return ModelFacts(have, left, line, str(path), decided)


def model_leaves(predicates: Iterable[object]) -> frozenset[str]:
    """The model leaves some of `predicates` (`Node`s, None for none) name."""
    names: set[str] = set()
    for node in predicates:
        leaves = getattr(node, "leaves", None)
        if leaves is not None:
            names |= {leaf.key for leaf in leaves() if leaf.key in MODEL_LEAVES}
    return frozenset(names)


def at_start(
    served: Mapping[str, str],
    args: Sequence[str],
    patches: Iterable[object],
    environ: Mapping[str, str] | None = None,
) -> ModelFacts:
    """`decide` for a container start: the model leaves the `patches`' predicates (their
    `applies`) name, this environment; its line said on stderr."""
    wanted = model_leaves(getattr(p, "applies", None) for p in patches)
    found = decide(served, args, os.environ if environ is None else environ, wanted)
    if found.line is not None:
        print(f"patchset: {found.line}", file=sys.stderr, flush=True)
    return found


__all__ = [
    "MAX_BYTES",
    "MODEL_LEAVES",
    "ConfigError",
    "ModelFacts",
    "at_start",
    "config_facts",
    "decide",
    "hub_caches",
    "locate",
    "model_leaves",
    "read_config",
    "served_model",
    "undecided",
]
