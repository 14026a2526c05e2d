"""Developer entry points: `nox -s tests`, `nox -s lint`, a `build-<version>` per builds/*.toml."""

from __future__ import annotations

import tomllib
from pathlib import Path

import nox

nox.options.sessions = ["lint", "tests"]
nox.options.default_venv_backend = "venv"
ROOT = Path(__file__).parent


@nox.session
def tests(session: nox.Session) -> None:
    """Provision Docker and a registry if missing, install patchset and test extras, run pytest."""
    session.run("bash", str(ROOT / "tests" / "infra" / "provision.sh"), external=True)
    session.install("-e", ".[test]")
    # pytest exits 5 when it collected nothing: that is a broken set-up, never a pass.
    session.run("pytest", *session.posargs, success_codes=[0])


@nox.session
def lint(session: nox.Session) -> None:
    """ruff (lint and format check) and mypy in strict mode."""
    session.install("-e", ".[test,lint]", "nox")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")


def _build_targets() -> list[str]:
    folder = ROOT / "builds"
    names = []
    for path in sorted(folder.glob("*.toml")) if folder.is_dir() else []:
        try:
            with path.open("rb") as fh:
                tomllib.load(fh)
        except tomllib.TOMLDecodeError:
            pass  # still listed: `patchset build` reports the error with the file and line
        names.append(path.stem)
    return names


def _make_build_session(name: str) -> None:
    @nox.session(name=f"build-{name}")
    def build(session: nox.Session) -> None:
        """Build, verify, label and tag the patched image of builds/<name>.toml.

        Arguments after -- go to `patchset build`: --push, --tag REF, --no-cache.
        """
        session.install(".")
        session.run("patchset", "build", str(ROOT / "builds" / f"{name}.toml"), *session.posargs)

    del build


for _name in _build_targets():
    _make_build_session(_name)
