"""A user's own compose file, carried into `runtime export --compose FILE`: the vLLM service's
`environment:` (map or list form; ``KEY`` alone: from the shell, as compose reads it), its
image pin and its `command:`; each switch-like variable reported as mapped (a switch of the
bundle), alias, a patch of the registry not in the bundle, or unknown (with the nearest name).

Bad input is one line naming the file (exit 2): not YAML, not a compose file, no service to
take, a variable name or value compose would not take, an image for another vLLM release.
Anchors and merge keys are read as YAML reads them.
"""

from __future__ import annotations

import json
import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset.errors import UsageError
from patchset.kernel.manifest import PatchEntry
from patchset.kernel.predicates import ENV_NAME, switch_word
from patchset.kernel.switchnames import Names, judge, prefixes

MAX_BYTES = 1024 * 1024
_VERSION_TAG = re.compile(r"^v?(\d+\.\d+\.\d+(?:rc\d+|\.post\d+)?)(?:$|[-+])")


@dataclass(frozen=True)
class ComposeIn:
    """What is carried over from a user's compose file."""

    file: Path
    service: str
    image: str | None
    command: tuple[str, ...] | None
    environment: dict[str, str | None]  # None: `KEY` alone, from the shell


def read_compose(path: Path, vllm: str | None = None) -> ComposeIn:
    """`path` read as a compose file (its image pin checked against `vllm` when given);
    UsageError (one line, naming it) when it is not one."""
    data = _load(path)
    services = data.get("services") if isinstance(data, dict) else None
    if not isinstance(services, dict) or not services:
        raise UsageError("not a compose file: no services: table", path=path)
    name, service = _service(services, path)
    image = service.get("image")
    if image is not None and not isinstance(image, str):
        raise UsageError(f"services.{name}.image: expected a string", path=path)
    found = ComposeIn(
        file=path,
        service=name,
        image=image or None,
        command=_command(service.get("command"), f"services.{name}.command", path),
        environment=_environment(service.get("environment"), f"services.{name}.environment", path),
    )
    if vllm is not None:
        image_for("", vllm, found)
    return found


def _load(path: Path) -> Any:
    import yaml  # noqa: PLC0415 - only --compose reads YAML here

    try:
        with path.open("rb") as handle:
            raw = handle.read(MAX_BYTES + 1)
    except OSError as exc:
        raise UsageError(f"cannot read it: {exc.strerror}", path=path) from None
    if len(raw) > MAX_BYTES:
        raise UsageError("larger than 1 MiB: not a compose file", path=path)
    try:
        return yaml.safe_load(raw.decode("utf-8"))
    except UnicodeError:
        raise UsageError("not UTF-8 text", path=path) from None
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" (line {mark.line + 1})" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UsageError(f"not YAML{where}: {problem}", path=path) from None
    except RecursionError:
        raise UsageError("not YAML: nested too deep", path=path) from None


def _service(services: dict[Any, Any], path: Path) -> tuple[str, dict[str, Any]]:
    """The only service, else the one whose image names vLLM."""
    items = [(str(k), v) for k, v in services.items()]
    for name, value in items:
        if not isinstance(value, dict):
            raise UsageError(f"services.{name}: expected a table", path=path)
    if len(items) == 1:
        return items[0]
    vllm = [(n, v) for n, v in items if "vllm" in str(v.get("image", "")).lower()]
    if len(vllm) != 1:
        names = ", ".join(n for n, _ in items)
        raise UsageError(f"holds {len(items)} services ({names}) and not one vLLM image", path=path)
    return vllm[0]


def _command(value: object, where: str, path: Path) -> tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        try:
            return tuple(shlex.split(value))
        except ValueError as exc:
            raise UsageError(f"{where}: {exc}", path=path) from None
    if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
        return tuple(str(v) for v in value)
    raise UsageError(f"{where}: expected a string or a list of strings", path=path)


def _environment(value: object, where: str, path: Path) -> dict[str, str | None]:
    found: dict[str, str | None] = {}
    if value is None:
        return found
    if isinstance(value, list):
        pairs: list[tuple[object, object]] = []
        for n, item in enumerate(value):
            if not isinstance(item, str):
                raise UsageError(f"{where}[{n}]: expected KEY=VALUE or KEY", path=path)
            key, sep, given = item.partition("=")
            pairs.append((key, given if sep else None))
    elif isinstance(value, dict):
        pairs = list(value.items())
    else:
        raise UsageError(f"{where}: expected a table or a list", path=path)
    for name, text in pairs:
        if not isinstance(name, str) or not ENV_NAME.match(name):
            raise UsageError(f"{where}: {name!r} is not a variable name", path=path)
        found[name] = _value(text, f"{where}.{name}", path)
    return found


def _value(text: object, where: str, path: Path) -> str | None:
    if text is None or isinstance(text, str):
        return text
    if isinstance(text, bool):
        return "true" if text else "false"
    if isinstance(text, int | float):
        return str(text)
    raise UsageError(f"{where}: expected a string, got a {type(text).__name__}", path=path)


# -- carried into the export --------------------------------------------------------------


def image_for(base: str, vllm: str, carried: ComposeIn | None) -> str:
    """The image the exported service runs: the user's pin, unless its tag names another
    vLLM release (UsageError: the start would refuse it)."""
    if carried is None or carried.image is None:
        return base
    image = carried.image
    tag = "" if "@" in image else image.rsplit("/", 1)[-1].partition(":")[2]
    match = _VERSION_TAG.match(tag)
    if match and match[1] != vllm:
        raise UsageError(
            f"image {image} is vLLM {match[1]}, the definition's is {vllm}: the start would"
            " refuse it (export the definition of that release, or change the pin)",
            path=carried.file,
        )
    return image


def command_text(carried: ComposeIn | None) -> str:
    """The `command:` value (YAML flow list)."""
    return json.dumps(list(carried.command)) if carried and carried.command else "[]"


def environment(env: Mapping[str, str], carried: ComposeIn | None) -> dict[str, str | None]:
    """The definition's `[env]`, with the user's variables over it (theirs win)."""
    merged: dict[str, str | None] = dict(env)
    if carried is not None:
        merged.update(carried.environment)
    return merged


def judged(carried: ComposeIn, names: Names, entries: Sequence[PatchEntry]) -> list[str]:
    """One line per carried variable carrying a switch prefix of the registry (or of the
    bundle): mapped, alias, a patch not in the bundle, or unknown; UsageError for a switch
    or alias whose value is no switch word (the start would refuse it)."""
    switches = {e.switch: e.id for e in entries if e.switch}
    default = {e.switch: e.switch_default for e in entries if e.switch}
    wanted = tuple(dict.fromkeys([*names.prefixes, *prefixes(switches)]))
    lines: list[str] = []
    for key, value in carried.environment.items():
        if not wanted or not key.startswith(wanted):
            continue
        verdict = judge(key, value, names, switches)
        state = ""
        if verdict.kind in ("switch", "alias") and value is not None and "${" not in value:
            try:
                on = switch_word(value)
            except ValueError as exc:
                raise UsageError(f"{key}: {exc}", path=carried.file) from None
            switch = verdict.switch or key
            on = default[switch] if on is None else on
            state = f": {switches[switch]} {'on' if on else 'off'}"
        elif verdict.kind in ("switch", "alias"):
            state = ": its value comes from the shell"
        kind = {"switch": "mapped", "registry": "not in this bundle"}.get(verdict.kind)
        lines.append(f"{kind or verdict.kind}: {verdict.line}{state}")
    return lines


__all__ = [
    "ComposeIn",
    "command_text",
    "environment",
    "image_for",
    "judged",
    "read_compose",
]
