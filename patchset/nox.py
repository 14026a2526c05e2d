"""`build-<name>` nox sessions for a project's own `builds/*.toml`, for its noxfile.

Another project that keeps its patches with patchset gets one session per build definition::

    # noxfile.py
    import patchset.nox

    patchset.nox.build_sessions("builds")  # nox -s build-0.19.1 [-- --push]

Each session runs `patchset build builds/<name>.toml` with the arguments after `--`
(`--push`, `--tag REF`, `--no-cache`). By default it runs in nox's own environment, where
patchset is installed (`python=False`); give `install=` (a requirement, a wheel path or a git
URL) to run it in a fresh virtualenv instead. A definition that does not parse is still
listed: `patchset build` then reports the error with the file and line.

This module imports only the standard library and nox, so patchset's own noxfile loads it by
path before patchset is installed.
"""

from __future__ import annotations

import tomllib
from collections.abc import Sequence
from pathlib import Path


def build_targets(folder: Path | str) -> list[str]:
    """The names of the build definitions in `folder` (`builds/0.19.1.toml` -> `0.19.1`)."""
    path = Path(folder)
    names = []
    for item in sorted(path.glob("*.toml")) if path.is_dir() else []:
        try:
            with item.open("rb") as fh:
                tomllib.load(fh)
        except (tomllib.TOMLDecodeError, OSError):
            pass  # still listed: `patchset build` reports the error with the file and line
        names.append(item.stem)
    return names


def build_sessions(
    folder: Path | str = "builds",
    *,
    install: str | Sequence[str] | None = None,
    registry: Path | str | None = None,
) -> list[str]:
    """Register a `build-<name>` nox session per `folder/*.toml`; returns their names.

    `install`: what to install into a fresh virtualenv per session (e.g. `"."` in patchset's
    own repository, or a wheel path or a git URL); None runs in nox's environment.
    `registry`: passed as `--registry` (default: patchset's usual lookup from the working
    folder, i.e. `[tool.patchset]` in the nearest pyproject.toml)."""
    import nox  # noqa: PLC0415  (nox is the caller's; patchset does not depend on it)

    root = Path(folder)
    specs = [install] if isinstance(install, str) else list(install or ())
    names = []
    for name in build_targets(root):
        definition = root / f"{name}.toml"

        def build(session: nox.Session, definition: Path = definition) -> None:
            if specs:
                session.install(*specs)
            where = ["--registry", str(registry)] if registry is not None else []
            session.run("patchset", *where, "build", str(definition), *session.posargs)

        build.__doc__ = (
            f"Build, verify, label and tag the patched image of {definition}."
            " Arguments after -- go to `patchset build`: --push, --tag REF, --no-cache."
        )
        session_name = f"build-{name}"
        nox.session(name=session_name, python=None if specs else False)(build)
        names.append(session_name)
    return names
