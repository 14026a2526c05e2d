"""Switch names checked at start (standard library only: the image entrypoint runs it).

A bundle carries ``switches.json`` (written at export): the switch prefixes its registry uses
(``GENESIS_ENABLE_``, ``SNDR_ENABLE_``, ...: the first two words of each switch name), each
alias a collection defines for a switch, and the registry's other switch names with the patch
they belong to and why it is not in this bundle. At start every variable carrying such a prefix
that is no switch of the bundle gets one line: an alias (mapped: it switches its patch as the
switch itself does), a patch of the registry that is not in this bundle (and why), or unknown
(with the nearest name). A value that is no switch word is refused, as for a switch.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from collections.abc import Iterable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from .manifest import Manifest
from .predicates import FALSY, TRUTHY, switch_word
from .startup import StartInputError, policy_env

FILE = "switches.json"
SCHEMA = "patchset.switches/1"
MAX_BYTES = 8 * 1024 * 1024
# namespaces of other programs: a switch named in them never makes the whole namespace ours
FOREIGN = ("VLLM_", "CUDA_", "NCCL_", "PYTORCH_", "TORCH_", "HF_", "OMP_", "NVIDIA_", "TRITON_")
_WORD = re.compile(r"[A-Za-z0-9]+_")


def prefix_of(name: str) -> str | None:
    """The prefix a switch name shares with its collection's others: its first two words
    (``GENESIS_ENABLE_`` of ``GENESIS_ENABLE_P64_X``), or its first of a two-word name; None
    for a name of one word or in another program's namespace."""
    words = _WORD.findall(name)
    if not words or name.upper().startswith(FOREIGN):
        return None
    parts = name.split("_")
    if len(parts) >= 3 and all(parts[:2]):
        return f"{parts[0]}_{parts[1]}_"
    if len(parts) == 2 and all(parts):
        return f"{parts[0]}_"
    return None


def prefixes(names: Iterable[str]) -> list[str]:
    """The prefixes of `names` (`prefix_of`), sorted."""
    return sorted({p for n in names if (p := prefix_of(n)) is not None})


@dataclass(frozen=True)
class Names:
    """What ``switches.json`` holds: prefixes; alias -> the switch it stands for; the
    registry's other switch names -> (patch id, why it is not in the bundle)."""

    prefixes: tuple[str, ...] = ()
    aliases: dict[str, str] = field(default_factory=dict)
    registry: dict[str, tuple[str, str]] = field(default_factory=dict)

    def to_json(self) -> dict[str, object]:
        reasons = sorted({why for _, why in self.registry.values()})
        index = {why: i for i, why in enumerate(reasons)}
        return {
            "schema": SCHEMA,
            "prefixes": list(self.prefixes),
            "aliases": dict(sorted(self.aliases.items())),
            "reasons": reasons,
            "registry": {k: [i, index[w]] for k, (i, w) in sorted(self.registry.items())},
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=0, sort_keys=False) + "\n"

    @classmethod
    def loads(cls, text: str | bytes) -> Names:
        """ValueError (one line) for anything but what `dumps` writes."""
        try:
            data = json.loads(text)
        except (ValueError, RecursionError):
            raise ValueError("is not JSON") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise ValueError(f"is not a {SCHEMA} document")
        found_prefixes, aliases = data.get("prefixes"), data.get("aliases")
        reasons, registry = data.get("reasons"), data.get("registry")
        if not _strings(found_prefixes) or not _strings(reasons):
            raise ValueError("prefixes and reasons must be lists of strings")
        if not isinstance(aliases, dict) or not _strings(list(aliases.items()), pairs=True):
            raise ValueError("aliases must map names to names")
        if not isinstance(registry, dict) or not isinstance(reasons, list):
            raise ValueError("registry must be a table")  # noqa: TRY004 - one ValueError kind
        assert isinstance(found_prefixes, list)
        table: dict[str, tuple[str, str]] = {}
        for name, value in registry.items():
            ok = isinstance(value, list) and len(value) == 2 and isinstance(value[0], str)
            if not ok or not isinstance(value[1], int) or not 0 <= value[1] < len(reasons):
                raise ValueError(f"registry.{name}: expected [patch id, reason index]")
            table[name] = (value[0], reasons[value[1]])
        return cls(tuple(found_prefixes), dict(aliases), table)


def _strings(value: object, *, pairs: bool = False) -> bool:
    if not isinstance(value, list):
        return False
    if pairs:
        return all(isinstance(a, str) and isinstance(b, str) for a, b in value)
    return all(isinstance(v, str) for v in value)


def read(path: Path) -> Names | None:
    """``switches.json`` at `path`, None when the bundle has none; ValueError (one line,
    naming the file) when it is damaged."""
    try:
        with path.open("rb") as handle:
            data = handle.read(MAX_BYTES + 1)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise ValueError(f"{path}: {exc.strerror}") from None
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path} is larger than {MAX_BYTES // (1024 * 1024)} MiB")
    try:
        return Names.loads(data)
    except ValueError as exc:
        raise ValueError(f"{path} {exc}") from None


@dataclass(frozen=True)
class Verdict:
    """One variable's verdict: `kind` is switch (a switch of the bundle), alias (of
    `switch`), registry (a patch not in this bundle) or unknown; `line` says it."""

    name: str
    kind: str
    line: str
    switch: str | None = None  # the bundle's switch an alias stands for


def judge(
    name: str,
    value: str | None,
    names: Names,
    switches: Mapping[str, str],
) -> Verdict:
    """`name` (set to `value`; None: from the shell, not known here) against the bundle's
    `switches` (variable -> patch id) and `names`. A value that is no switch word is named in
    the line of a known name (ValueError from `check_start`, not here)."""
    if name in switches:
        return Verdict(name, "switch", f"{name}: the switch of {switches[name]}")
    target = names.aliases.get(name)
    if target is not None:
        if target in switches:
            return Verdict(
                name,
                "alias",
                f"{name}: an alias of {target}, the switch of {switches[target]} (mapped)",
                target,
            )
        held = names.registry.get(target)
        why = f"{held[0]}, which is not in this bundle ({held[1]})" if held else "no patch here"
        return Verdict(name, "registry", f"{name}: an alias of {target}, the switch of {why}")
    held = names.registry.get(name)
    if held is not None:
        return Verdict(
            name, "registry", f"{name}: the switch of {held[0]}, not in this bundle ({held[1]})"
        )
    choices = [*switches, *names.aliases, *names.registry]
    near = difflib.get_close_matches(name, choices, n=1, cutoff=0.6)
    hint = f"; nearest: {near[0]}" if near else ""
    shown = "" if value is None else f"={value}"
    return Verdict(
        name, "unknown", f"{name}{shown}: names no switch of this bundle's registry{hint}"
    )


def check_start(
    names: Names | None,
    switches: Mapping[str, str],
    environ: Mapping[str, str],
    known: Sequence[str] = (),
) -> tuple[list[str], dict[str, str]]:
    """The lines for every variable of `environ` carrying one of `names`' prefixes (or of
    the bundle's `switches`) that is no switch of the bundle, and the switches its aliases
    set (switch -> value: to be set where the switch itself is not). ValueError (one line)
    for an alias or switch whose value is no switch word, or an alias set beside its switch
    to another value. `known`: other names of the start's (policy variables, [env])."""
    names = names or Names()
    wanted = tuple(dict.fromkeys([*names.prefixes, *prefixes(switches)]))
    lines: list[str] = []
    mapped: dict[str, str] = {}
    for name in sorted(environ):
        if name in switches or name in known or not name.startswith(wanted) or not wanted:
            continue
        verdict = judge(name, environ[name], names, switches)
        if verdict.kind in ("alias", "registry"):
            _word(name, environ[name])
        if verdict.switch is not None:
            own = environ.get(verdict.switch)
            value = environ[name]
            if own is not None and own.strip() and _word(verdict.switch, own) != _word(name, value):
                raise ValueError(
                    f"{name}={value!r} and {verdict.switch}={own!r} set the same switch both"
                    " ways: keep one"
                )
            if switch_word(value) is not None and not (own or "").strip():
                mapped[verdict.switch] = value
        lines.append(verdict.line)
    return lines, mapped


def _word(name: str, value: str) -> bool | None:
    try:
        return switch_word(value)
    except ValueError:
        raise ValueError(
            f"{name}={value!r} is not a switch value: use {'/'.join(TRUTHY)} or {'/'.join(FALSY)}"
        ) from None


def at_start(path: Path, manifest: Manifest, environ: MutableMapping[str, str]) -> None:
    """The check of a container start: `manifest`'s switches (its `patches`' `switch`) and
    ``switches.json`` at `path`; each line said on stderr, the switches set by an alias put
    in `environ`; StartInputError (one line) for a value that is no switch word."""
    patches = manifest.patches
    switches = {p.switch: p.id for p in patches if p.switch}
    known = [*manifest.env, *(policy_env(p.id) for p in patches)]
    known += [p.policy_env for p in patches if p.policy_env]
    try:
        lines, mapped = check_start(read(path), switches, environ, known)
    except ValueError as exc:
        raise StartInputError(str(exc)) from None
    for line in lines:
        print(f"patchset: switch {line}", file=sys.stderr, flush=True)
    environ.update(mapped)


__all__ = [
    "FILE",
    "FOREIGN",
    "SCHEMA",
    "Names",
    "Verdict",
    "at_start",
    "check_start",
    "judge",
    "prefix_of",
    "prefixes",
    "read",
]
