"""Run patchset as another user (uid 1000) from a checkout anywhere.

The other user may not read the checkout (a clone under /root, mode 0700) nor the virtualenv
in it (nox's ``.nox/``), so patchset and the distributions it needs are copied once per run
into a folder anyone can read (``/tmp/<run id>-readable-*``, removed with the run), and the
base interpreter runs them from there.
"""

from __future__ import annotations

import functools
import importlib.metadata
import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.infra.run import run_id

REPO = Path(__file__).resolve().parents[2]
UID = 1000


def _requirements(name: str) -> dict[str, importlib.metadata.Distribution]:
    """`name`'s distribution and those it needs (no extras), by canonical name."""
    found: dict[str, importlib.metadata.Distribution] = {}
    todo = [name]
    while todo:
        wanted = canonicalize_name(todo.pop())
        if wanted in found:
            continue
        try:
            dist = importlib.metadata.distribution(wanted)
        except importlib.metadata.PackageNotFoundError:
            continue
        found[wanted] = dist
        for line in dist.requires or []:
            requirement = Requirement(line)
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                todo.append(requirement.name)
    return found


@functools.cache
def readable_site() -> Path:
    """A folder any user reads holding this checkout's patchset and its dependencies."""
    site = Path(tempfile.mkdtemp(prefix=f"{run_id()}-readable-"))
    site.chmod(0o755)
    shutil.copytree(
        REPO / "patchset", site / "patchset", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name, dist in _requirements("patchset").items():
        if name == "patchset":
            continue  # copied from the checkout above (installed, it may be another one)
        for file in dist.files or []:
            if ".." in file.parts or "__pycache__" in file.parts:
                continue  # its console scripts, its byte code
            source = Path(str(dist.locate_file(file)))
            if source.is_file():
                target = site / file
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source, target)
    for folder in [site, *(p for p in site.rglob("*") if p.is_dir())]:
        folder.chmod(0o755)
    return site


_AS_OTHER = ["setpriv", "--reuid", str(UID), "--regid", str(UID), "--clear-groups"]


@functools.cache
def _base_python() -> str:
    """The base interpreter, once it is known to start as uid 1000; the test is skipped,
    saying why, where it does not (a Python built with a shared libpython under root's own
    folders, as pyenv's 3.12 and 3.13 are here, finds no library as another user)."""
    python = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    probe = subprocess.run(
        [*_AS_OTHER, python, "-s", "-c", "pass"],
        cwd="/",
        env={"PATH": "/usr/local/bin:/usr/bin:/bin"},
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    if probe.returncode != 0:
        said = (probe.stderr.strip().splitlines() or ["no message"])[-1]
        pytest.skip(f"{python} does not start as uid {UID} here: {said}")
    return python


def patchset_as_other_user(
    args: Sequence[str], *, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """`python -m patchset ARGS` as uid 1000 (setpriv), from :func:`readable_site`."""
    site = readable_site()
    python = _base_python()
    env = {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": str(site),  # read-only for that user: nothing of root's is read
        "PYTHONPATH": str(site),
        "PYTHONDONTWRITEBYTECODE": "1",
        "LANG": os.environ.get("LANG", "C.UTF-8"),
    }
    return subprocess.run(
        [*_AS_OTHER, python, "-s", "-m", "patchset", *args],
        cwd=site,
        env=env,
        capture_output=True,
        text=True,
        check=False,
        timeout=timeout,
    )
