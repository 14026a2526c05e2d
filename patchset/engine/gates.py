"""Whether each patch runs on this tree: its range, lifecycle, switch, hardware scope and
`[applies]` predicate, judged before anything is evaluated (`apply` without `--patch`).

The facts come from where `apply` runs: the served configuration given (`--served`), the GPUs
(`--compute-capability`, else nvidia-smi, which names the driver too) and the versions the
target's dist-infos say (torch, triton, the CUDA runtime), read without importing. A predicate
that cannot be known here is not a pass: the patch is skipped, naming the leaves that were
unknown.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from patchset.errors import UsageError
from patchset.kernel import gpus
from patchset.kernel.capability import Capability, in_scope
from patchset.kernel.predicates import CUDA_RUNTIMES, Facts, cuda_of, evaluate, installed_versions
from patchset.registry import Patch

DETECT: Literal["detect"] = "detect"  # find this machine's GPUs with nvidia-smi


@dataclass(frozen=True)
class Hardware:
    """The GPUs apply judges against: the first one's capability for `[hardware]` scopes,
    every one's (and their names) for `[applies]`, and the NVIDIA driver's version; None:
    not known."""

    capability: Capability | None
    capabilities: tuple[Capability, ...] | None
    names: tuple[str, ...] | None
    driver: str | None = None


def hardware(given: Capability | Literal["detect"] | None) -> Hardware:
    """`--compute-capability X.Y` (a GPU of that capability, name and driver unknown), `none`
    (known: no GPU), or what nvidia-smi lists (nothing listed: not known)."""
    if given == DETECT:
        found = gpus.query()
        if not found.gpus:
            return Hardware(None, None, None)
        caps = tuple(g.capability for g in found.gpus)
        return Hardware(caps[0], caps, tuple(g.name for g in found.gpus), found.driver)
    if given is None:
        return Hardware(None, (), ())
    assert not isinstance(given, str)
    return Hardware(given, (given,), None)


def facts(
    root: Path, served: Mapping[str, str] | None, gpu: Hardware, *, this_python: bool
) -> Facts:
    """What `[applies]` reads on this tree. `served` empty or None: not known."""
    read = installed_versions(root, ("torch", "triton", *CUDA_RUNTIMES))  # one scan
    versions = {k: v for k, v in read.items() if k in ("torch", "triton")}
    if (cuda := cuda_of(read)) is not None:
        versions["cuda"] = cuda
    if gpu.driver is not None:
        versions["driver"] = gpu.driver
    if this_python:  # the target is this interpreter's own vLLM
        versions["python"] = ".".join(map(str, sys.version_info[:3]))
    return Facts(
        served=dict(served) if served else None,
        compute_capability=gpu.capabilities,
        gpu_names=gpu.names,
        versions=versions,
    )


def switch_state(patch: Patch, environ: Mapping[str, str] | None) -> bool:
    """Whether the patch's switch is on; a value that is no switch word is bad input."""
    try:
        return patch.switched_on(os.environ if environ is None else environ)
    except ValueError as exc:
        raise UsageError(f"patch {patch.id}: {exc}") from None


def switch_text(patch: Patch) -> str:
    """Why a switched-off patch is out, with the line that turns it on."""
    assert patch.switch is not None
    default = "on" if patch.switch.default else "off"
    return (
        f"switched off by {patch.switch.env} (default {default}): {patch.switch.line()} turns it on"
    )


def allows(patch: Patch, capability: Capability | None) -> bool:
    """Whether the patch's `[hardware] compute_capability` holds this GPU (the one evaluator,
    shared with the image entrypoint)."""
    scope = patch.hardware.compute_capability
    return in_scope(str(scope) if scope is not None else None, capability)


def scope_text(patch: Patch, capability: Capability | None) -> str:
    scope = f"its hardware scope is compute_capability {patch.hardware.compute_capability}"
    if capability is None:
        return f"no GPU found (nvidia-smi) and {scope}; give --compute-capability X.Y"
    return f"compute capability {capability[0]}.{capability[1]} is outside it: {scope}"


def predicate_text(patch: Patch, known: Facts) -> str | None:
    """Why the patch's `[applies]` keeps it out here (None: it holds)."""
    verdict = evaluate(patch.applies, known)
    if verdict.value is True:
        return None
    assert patch.applies is not None
    if verdict.value is False:
        return f"[applies] does not hold here: {patch.applies.describe()}"
    return (
        f"[applies] cannot be known here: unknown {verdict.describe_unknown()} (give --served"
        " KEY=VALUE, --compute-capability X.Y, or a target whose dist-infos name the versions)"
    )


def skip_reason(
    patch: Patch,
    *,
    release: str | None,
    scoped: bool,
    capability: Capability | None,
    known: Facts,
    environ: Mapping[str, str] | None,
) -> str | None:
    """Why apply leaves the patch out of an unqualified run (None: it runs), first reason
    first: range, lifecycle, switch, hardware scope, predicate."""
    if release and not patch.in_range(release):
        return f"vLLM {release} is outside this patch's range {patch.vllm}"
    if patch.lifecycle.retired(release):
        return f"retired ({patch.lifecycle.describe(release)}): never applied"
    if not switch_state(patch, environ):
        return switch_text(patch)
    if scoped and not allows(patch, capability):
        return scope_text(patch, capability)
    return predicate_text(patch, known) if scoped else None


def asked_notes(
    patch: Patch,
    *,
    capability: Capability | None,
    known: Facts,
    environ: Mapping[str, str] | None,
) -> tuple[str, ...]:
    """A patch asked for by id runs whatever its switch, GPU or predicate say: the notes
    saying so where they would have kept it out."""
    notes = []
    if not switch_state(patch, environ):
        notes.append(f"asked for by id: {switch_text(patch)}")
    if not allows(patch, capability):
        notes.append(f"asked for by id: {scope_text(patch, capability)}")
    reason = predicate_text(patch, known)
    if reason is not None:
        notes.append(f"asked for by id: {reason}")
    return tuple(notes)
