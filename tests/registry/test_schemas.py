"""The public API and the JSON Schemas shipped in the package, checked against REAL outputs: a
check of real cached releases and a real image build on the stand-in base."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import get_args

import jsonschema
import pytest

import patchset
from patchset import schemas
from patchset.adapters.dockerengine import Engine
from patchset.adapters.forge import ForgeState
from patchset.registry.builds import load_definition
from patchset.registry.model import STATES
from patchset.release_check.pins import Role
from patchset.sources.package_index import IndexSource
from patchset.upstream import AuditStatus
from patchset.upstream.bump import BumpAction
from tests.helpers.cli import run_cli
from tests.helpers.schemas import assert_matches, undocumented
from tests.infra.docker_fixtures import StandinImage
from tests.infra.run import image_repo
from tests.infra.standin import built_repository, for_tests

REPO = Path(__file__).parents[2]
REGISTRY = patchset.load_registry(REPO / "patches")


def test_schemas_ship_in_the_package() -> None:
    for name in schemas.NAMES:
        assert (Path(schemas.__file__).parent / f"{name}.json").is_file()
        jsonschema.Draft202012Validator.check_schema(schemas.load(name))
    for name in schemas.REPORTS:
        assert schemas.load(name)["properties"]["schema"]["const"] == f"patchset.{name}/1"
    with pytest.raises(ValueError, match="no schema"):
        schemas.load("nope")


def test_the_public_api_imports_no_docker() -> None:
    code = (
        "import sys, patchset\n"
        "assert 'docker' not in sys.modules, 'docker imported'\n"
        "assert callable(patchset.check) and callable(patchset.apply)\n"
        "assert patchset.Registry.__name__ == 'Registry'\n"
        "build = patchset.build\n"
        "assert 'docker' in sys.modules and build.__module__ == 'patchset.image.build'\n"
        "assert all(hasattr(patchset, name) for name in patchset.__all__)\n"
        "from patchset.release_check import CheckReport\n"
        "assert patchset.check.__module__ == 'patchset.release_check.run'\n"
        "import importlib.util\n"
        "assert importlib.util.find_spec('patchset.check') is None,"
        " 'a module shadows the function'\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=False, cwd=REPO
    )
    assert proc.returncode == 0, proc.stderr


def test_undocumented_keys_are_caught() -> None:
    schema = schemas.load("check")
    assert undocumented({"schema": "x", "surprise": 1}, schema, schema) == [".surprise"]


@pytest.mark.network  # real releases, from the cache (downloaded once when it is empty)
def test_a_real_check_report_matches_its_schema() -> None:
    releases = ["0.19.1", "0.20.0", "0.21.0", "0.26.0"]  # needed, upstream, missing-target
    patchset.check(REGISTRY, releases, source=IndexSource())  # what the check reads, cached
    report = patchset.check(REGISTRY, releases, source=IndexSource(offline=True))
    data = json.loads(json.dumps(report.to_dict()))  # as a reader gets it
    assert {r["verdict"] for r in data["results"]} >= {"needed", "upstream", "missing-target"}
    assert any(r["disagreement"] for r in data["results"])  # nullable fields seen non-null
    assert_matches(data, "check")
    proc = run_cli("check", "--vllm", "0.21.0", "--offline", "--format=json")
    assert proc.returncode == 0, proc.stderr
    assert_matches(json.loads(proc.stdout), "check")


@pytest.mark.docker
@pytest.mark.network
def test_a_real_build_report_matches_its_schema(
    tmp_path: Path, standin_base: StandinImage, engine: Engine
) -> None:
    # the run's stand-in as its base, the run's repository for its tags (never the official
    # name: that image cannot be pulled here, and a machine holding it keeps its tag)
    text = for_tests((REPO / "builds" / "0.19.1.toml").read_text())
    assert f'base = "{standin_base.ref}"' in text, text
    definition_file = tmp_path / "0.19.1.toml"
    definition_file.write_text(text.replace(f'"{built_repository()}"', f'"{image_repo("schema")}"'))
    report = patchset.build(
        load_definition(definition_file), REGISTRY, output=tmp_path / "out", engine=engine
    )
    try:
        assert_matches(report.to_dict(), "build")
        assert_matches(json.loads((tmp_path / "out" / "report.json").read_text()), "build")
    finally:
        for tag in report.tags:
            engine.untag(tag)


def test_the_audit_bump_and_pin_enums_are_their_literals() -> None:
    """The enums of upstream.json, bump.json and check-builds.json are the code's Literals,
    and a pinned result is a check result with its role (no field the check's lacks)."""
    up = schemas.load("upstream")["$defs"]
    assert up["status"]["enum"] == list(get_args(AuditStatus))
    assert up["upstream_state"]["enum"] == list(STATES)
    assert up["finding"]["properties"]["forge"]["enum"] == list(get_args(ForgeState))
    step = schemas.load("bump")["$defs"]["step"]["properties"]
    assert step["action"]["enum"] == list(get_args(BumpAction))
    check = schemas.load("check")["$defs"]["result"]
    assert step["verdict"]["enum"] == check["properties"]["verdict"]["enum"]
    pinned = schemas.load("check-builds")["$defs"]["result"]
    assert pinned["properties"]["role"]["enum"] == list(get_args(Role))
    own = {"role", "attention"}
    assert {k: v for k, v in pinned["properties"].items() if k not in own} == check["properties"]
    assert [k for k in pinned["required"] if k not in own] == check["required"]
