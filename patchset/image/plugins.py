"""The files that deliver `python` patches to vLLM: a distribution with entry points.

vLLM loads every ``vllm.general_plugins`` entry point in each of its processes
(`vllm.plugins.load_general_plugins`), found with `importlib.metadata`. patchset writes one
distribution, ``patchset-plugins``, holding the package ``patchset_plugins`` (the runner,
`patchset/image/runtime/plugins.py`), each patch's module as ``impl_<id>`` and a three-line
``entry_<id>`` whose ``apply`` is the entry point named after the patch id (so ``VLLM_PLUGINS``
selects patches by id). A built image installs it into vLLM's site folder; an exported runtime
carries it under ``plugins/``, which the entrypoint puts on ``PYTHONPATH``.
"""

from __future__ import annotations

import base64
import hashlib
from importlib import resources

from patchset.registry import Patch, Variant

DIST = "patchset_plugins"
DIST_VERSION = "1.0"
GROUP = "vllm.general_plugins"


def ident(patch_id: str) -> str:
    return patch_id.replace("-", "_")


def impl_module(patch_id: str) -> str:
    """The module name a python patch's code is imported under."""
    return f"{DIST}.impl_{ident(patch_id)}"


def _record_hash(data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"sha256={digest},{len(data)}"


def plugin_files(patches: list[tuple[Patch, Variant]]) -> dict[str, bytes]:
    """The files to put in a site folder, by relative path; empty without python patches."""
    if not patches:
        return {}
    runner = resources.files("patchset").joinpath("image", "runtime", "plugins.py")
    files: dict[str, bytes] = {f"{DIST}/__init__.py": runner.read_bytes()}
    entry_points = [f"[{GROUP}]"]
    for patch, variant in patches:
        name = ident(patch.id)
        files[f"{DIST}/impl_{name}.py"] = (patch.folder / variant.name).read_bytes()
        files[f"{DIST}/entry_{name}.py"] = (
            f'"""Entry point of the python patch {patch.id} r{patch.revision} (patchset)."""\n\n'
            f"from {DIST} import run\n\n\n"
            f"def apply() -> None:\n    run({patch.id!r}, {impl_module(patch.id)!r})\n"
        ).encode()
        entry_points.append(f"{patch.id} = {DIST}.entry_{name}:apply")
    info = f"{DIST}-{DIST_VERSION}.dist-info"
    files[f"{info}/METADATA"] = (
        f"Metadata-Version: 2.1\nName: patchset-plugins\nVersion: {DIST_VERSION}\n"
        "Summary: patchset's python patches for vLLM, run by its plugin hook\n"
    ).encode()
    files[f"{info}/entry_points.txt"] = ("\n".join(entry_points) + "\n").encode()
    files[f"{info}/top_level.txt"] = f"{DIST}\n".encode()
    files[f"{info}/INSTALLER"] = b"patchset\n"
    record = [f"{path},{_record_hash(data)}" for path, data in sorted(files.items())]
    files[f"{info}/RECORD"] = ("\n".join([*record, f"{info}/RECORD,,"]) + "\n").encode()
    return files
