"""Developer entry points: `nox -s tests`, `nox -s lint`, a `build-<version>` per builds/*.toml."""

from __future__ import annotations

import importlib.util
import shutil
import tempfile
from pathlib import Path
from types import ModuleType

import nox

nox.options.sessions = ["lint", "tests"]  # `nox -s dist` builds and checks the release files
nox.options.default_venv_backend = "venv"
ROOT = Path(__file__).parent
# What the sessions install, pinned: the versions CI last passed with (`nox -s constraints`).
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"


def _install(session: nox.Session, *args: str) -> None:
    """`session.install`, bound by `CONSTRAINTS`: a new release of a tool changes nothing
    until the file is bumped."""
    session.install("-c", str(CONSTRAINTS), *args)


@nox.session
def tests(session: nox.Session) -> None:
    """Provision Docker and a registry if missing, install patchset and test extras, run pytest."""
    session.run("bash", str(ROOT / "tests" / "infra" / "provision.sh"), external=True)
    _install(session, "-e", ".[test]")
    # pytest exits 5 when it collected nothing: that is a broken set-up, never a pass.
    session.run("pytest", *session.posargs, success_codes=[0])


NEWER_PYTHONS = ("3.12", "3.13")


@nox.session(name="tests-python", python=NEWER_PYTHONS)
def tests_python(session: nox.Session) -> None:
    """The suite but its Docker and network tests on a newer Python than `tests` runs
    (patchset supports 3.11 and later), `nox -s tests-python-3.13`: what a newer Python
    changed (pathlib's errors, sqlite's warnings) shows here. Arguments go to pytest."""
    _install(session, "-e", ".[test]")
    marks = "not docker and not network"
    session.run("pytest", "-m", marks, *session.posargs, success_codes=[0])


@nox.session(name="tests-twice", venv_backend="none")
def tests_twice(session: nox.Session) -> None:
    """The suite as on a fresh machine (.ci/run: an empty HOME and cache), twice in a row in
    this checkout, then once beside a second checkout's run (a git clone of HEAD) on the same
    Docker engine; each run's summary at the end (.ci/twice). Arguments go to pytest."""
    session.run("bash", str(ROOT / ".ci" / "twice"), *session.posargs, external=True)


@nox.session
def dist(session: nox.Session) -> None:
    """Build the sdist and wheel into dist/, check them (twine check), install the wheel into
    a fresh virtualenv and run its console script there."""
    out = ROOT / "dist"
    shutil.rmtree(out, ignore_errors=True)
    # the wheel alone: a checkout on PYTHONPATH (its egg-info) would pass for an installed
    # patchset, and pip would then not install the wheel
    session.env["PYTHONPATH"] = ""
    _install(session, "build", "twine")
    session.run("python", "-m", "build", "--outdir", str(out), str(ROOT))
    files = sorted(str(p) for p in out.iterdir())
    session.run("twine", "check", "--strict", *files)
    (wheel,) = out.glob("*.whl")
    with tempfile.TemporaryDirectory() as tmp:
        venv = Path(tmp) / "venv"
        session.run("python", "-m", "venv", str(venv))
        python = str(venv / "bin" / "python")
        session.run(python, "-m", "pip", "install", "-q", str(wheel), external=True)
        session.run(str(venv / "bin" / "patchset"), "--version", external=True)
        registry = str(ROOT / "patches")
        session.run(
            str(venv / "bin" / "patchset"), "validate", "--registry", registry, external=True
        )


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and mypy in strict mode."""
    _install(session, "-e", ".[test,lint]", "nox")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


@nox.session
def constraints(session: nox.Session) -> None:
    """Resolve patchset with its test and lint extras afresh (the newest releases each
    range allows) and write what was installed to `.ci/constraints.txt`, its header kept;
    then run the suite before committing it."""
    session.install("-e", ".[test,lint]", "nox")
    frozen = session.run("python", "-m", "pip", "freeze", "--exclude-editable", silent=True)
    assert isinstance(frozen, str)
    pins = [line for line in frozen.splitlines() if line and not line.startswith("patchset==")]
    header = [line for line in CONSTRAINTS.read_text().splitlines() if line.startswith("#")]
    CONSTRAINTS.write_text("\n".join([*header, *pins]) + "\n")
    session.log(f"{len(pins)} pins written to {CONSTRAINTS}")


def _patchset_nox() -> ModuleType:
    """patchset/nox.py (stdlib and nox only), loaded by path: patchset is not installed in
    nox's own environment (the tests session installs it into its virtualenv)."""
    spec = importlib.util.spec_from_file_location("_patchset_nox", ROOT / "patchset" / "nox.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# `build-<version>` per builds/*.toml, as another project gets them from `patchset.nox`.
_patchset_nox().build_sessions(ROOT / "builds", install=".")
