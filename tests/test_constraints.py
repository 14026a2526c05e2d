"""The test and lint sessions install pinned versions (`.ci/constraints.txt`): every
dependency patchset, its `test` and its `lint` extras name is pinned there exactly, to a
version its range allows, and every session of the noxfile that installs goes through the
pins. A tool left out would float: its next release (a new lint rule, a new deprecation
warning under `filterwarnings = error`) could fail a run on a fresh machine that passed here.
"""

from __future__ import annotations

import ast
import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

ROOT = Path(__file__).resolve().parent.parent
CONSTRAINTS = ROOT / ".ci" / "constraints.txt"


def _pins() -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for line in CONSTRAINTS.read_text().splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        name, sep, version = line.partition("==")
        assert sep, f"{CONSTRAINTS.name}: {line!r} is not an exact pin (name==version)"
        pins[canonicalize_name(name)] = Version(version)
    return pins


def test_every_dependency_and_extra_is_pinned_in_range() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    wanted = [
        *project["dependencies"],
        *project["optional-dependencies"]["test"],
        *project["optional-dependencies"]["lint"],
    ]
    pins = _pins()
    for text in wanted:
        req = Requirement(text)
        name = canonicalize_name(req.name)
        assert name in pins, f"{req.name} is not pinned in {CONSTRAINTS.name}"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"{CONSTRAINTS.name} pins {req.name}=={pins[name]}, outside {req.specifier}"
        )


def test_noxfile_installs_only_through_the_pins() -> None:
    """Every `session.install` in the noxfile is the one in `_install` (which passes the
    constraints) or the `constraints` session's own fresh resolution."""
    tree = ast.parse((ROOT / "noxfile.py").read_text())
    direct = [
        function.name
        for function in ast.walk(tree)
        if isinstance(function, ast.FunctionDef)
        for node in ast.walk(function)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "install"
    ]
    assert sorted(direct) == ["_install", "constraints"]
