"""patchset's `python` patches as vLLM plugins: run by vLLM's `vllm.general_plugins` hook.

This file ships as the package ``patchset_plugins`` (its ``__init__.py``), beside one small
module per patch, ``patchset_plugins.entry_<id>``, whose ``apply`` is the entry point vLLM
loads in every one of its processes (API server, engine core, workers started with spawn).
Standard library only. In each process a patch runs at most once; it runs when the container's
start-up selected it (``PATCHSET_ACTIVE_PLUGINS``, set by the entrypoint), or, without the
entrypoint, unless ``PATCHSET_DISABLE`` / ``PATCHSET_ONLY`` leave it out. vLLM's own
``VLLM_PLUGINS`` filter acts before any of this: a patch left out there is never loaded.

A patch whose ``apply()`` raises (anything short of KeyboardInterrupt, ``sys.exit()``
included: it would end vLLM's process with its status) prints one line on stderr; with
``PATCHSET_ON_FAILURE=warn`` vLLM goes on without it, otherwise the process exits with
status 9.
"""

from __future__ import annotations

import importlib
import os
import sys

_done: set[str] = set()
# kernel/startup.START_REFUSED: this package runs in vLLM's processes without the kernel
# beside it, so the status is written here too (tests/image hold the two equal)
START_REFUSED = 9


def _listed(name: str) -> set[str] | None:
    raw = os.environ.get(name)
    if raw is None:
        return None
    return {part.strip() for part in raw.split(",") if part.strip()}


def selected(patch_id: str) -> bool:
    """Whether this process should run `patch_id`."""
    active = _listed("PATCHSET_ACTIVE_PLUGINS")
    if active is not None:
        return patch_id in active
    only = _listed("PATCHSET_ONLY")
    return patch_id not in (_listed("PATCHSET_DISABLE") or set()) and (
        only is None or patch_id in only
    )


def run(patch_id: str, module: str) -> None:
    """Import the patch's module and call its ``apply()``, once per process."""
    if patch_id in _done:
        return
    _done.add(patch_id)
    if not selected(patch_id):
        return
    try:
        importlib.import_module(module).apply()
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # sys.exit() too: it would end vLLM's process as if done
        print(
            f"patchset: plugin {patch_id} failed in pid {os.getpid()}:"
            f" {type(exc).__name__}: {exc}".replace("\n", " "),
            file=sys.stderr,
            flush=True,
        )
        if os.environ.get("PATCHSET_ON_FAILURE", "fail") != "warn":
            raise SystemExit(START_REFUSED) from None
        return
    print(f"patchset: plugin {patch_id} applied in pid {os.getpid()}", file=sys.stderr, flush=True)
