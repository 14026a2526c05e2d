"""The releases Genesis says it runs on, as build definitions to plan.

Genesis names its pins in `KNOWN_GOOD_VLLM_PINS` (`sndr/engines/vllm/detection/guards.py`,
read statically): mostly nightly builds (`0.20.2rc1.dev93+g51f22dcfd`, `nightly-<sha>`),
a few final releases (`0.21.0`). Its successor adds `sndr/pins.yaml` (`current`, `rollback`,
`stable_release: v0.24.0`). A final release becomes one definition, `builds/genesis-X.Y.Z.toml`,
wanting every imported patch (Genesis's default-on ones preferred), each switch at Genesis's
default; whether the package index has it is seen when it is planned. A nightly pin is never
mapped to a release it is not: it is named, with how to check the patches against it.
"""

from __future__ import annotations

import contextlib
import re
from pathlib import Path

from packaging.version import InvalidVersion, Version

from patchset.importers.definitions import STOCK_CUDA, commit_of, final_release
from patchset.importers.genesis.registry import PINS_MODULE
from patchset.importers.model import Draft, Plan
from patchset.importers.pystatic import Package, Unresolved

PINS_YAML = "sndr/pins.yaml"
_PIN_LINE = re.compile(r"^(current|rollback|stable_release):\s*['\"]?([^'\"\s#]+)", re.M)


def pins(folder: Path, package: Package) -> list[str]:
    """Every pin Genesis names, in its order (guards first, then pins.yaml)."""
    found: list[str] = []
    scope = package.scope(PINS_MODULE)
    with contextlib.suppress(Unresolved):
        value = scope.name_value("KNOWN_GOOD_VLLM_PINS", 0) if scope is not None else ()
        if isinstance(value, list | tuple):
            found += [str(v) for v in value]
    path = folder / PINS_YAML
    if path.is_file() and not path.is_symlink():
        with contextlib.suppress(OSError, UnicodeDecodeError):
            found += [m.group(2) for m in _PIN_LINE.finditer(path.read_text()[:65536])]
    return list(dict.fromkeys(found))


def plans(folder: Path, package: Package, drafts: list[Draft]) -> tuple[list[Plan], list[str]]:
    """A plan per final release Genesis pins, and a line per nightly build it pins."""
    named = pins(folder, package)
    finals = sorted({v for p in named if (v := final_release(p)) is not None}, key=_key)
    preferred = [d.id for d in drafts if _default_on(d)] + [
        d.id for d in drafts if not _default_on(d)
    ]
    out = []
    for version in finals:
        header = (
            f"Genesis runs on vLLM {version} (a pin of its own): every imported patch that fits"
            " it, each switch at Genesis's default.\nThe pin does not name the image's CUDA:"
            f" {STOCK_CUDA} is assumed; set cuda if it differs."
        )
        data: dict[str, object] = {
            "vllm": version,
            "cuda": STOCK_CUDA,
            "base": f"vllm/vllm-openai:v{version}",
            "repository": "genesis/vllm",
            "tags": ["{vllm}", "{vllm}-ps{registry}"],
            "serve": {"args": []},
        }
        out.append(Plan(f"genesis-{version}.toml", version, tuple(preferred), data, header))
    return out, _nightly_lines(named)


def _nightly_lines(named: list[str]) -> list[str]:
    """One line per vLLM commit Genesis pins as a nightly (its spellings together)."""
    by_commit: dict[str, list[str]] = {}
    other: list[str] = []
    for pin in named:
        if final_release(pin) is not None:
            continue
        commit = commit_of(pin)
        if commit is None:
            other.append(pin)
            continue
        key = next((c for c in by_commit if c.startswith(commit) or commit.startswith(c)), commit)
        by_commit.setdefault(key, []).append(pin)
        if len(commit) > len(key):
            by_commit[commit] = by_commit.pop(key)
    lines = []
    for commit, spelled in by_commit.items():
        lines.append(
            f"Genesis pin {spelled[0]}"
            + (f" (also {', '.join(spelled[1:])})" if len(spelled) > 1 else "")
            + f": a nightly build (vLLM commit {commit}) the package index does not have: no"
            f" definition written; check the patches on it with `patchset check --source"
            f" git:PATH@{commit}` (a vLLM clone) or `--source image:REF` (an image holding it)"
        )
    lines.extend(
        f"Genesis pin {pin}: a pre-release the import does not map to a final release: no"
        " definition written; check it with `--source git:PATH@REF` or `--source image:REF`"
        for pin in other
    )
    return lines


def _default_on(draft: Draft) -> bool:
    switch = draft.meta.get("switch")
    return isinstance(switch, dict) and bool(switch.get("default"))


def _key(version: str) -> Version:
    try:
        return Version(version)
    except InvalidVersion:
        return Version("0")
