"""What a project imports or copies: action.yml and the example workflows checked against the
GitHub Actions schemas (vendored by check-jsonschema), and `patchset.nox` in another
project's noxfile."""

from __future__ import annotations

import json
from importlib import resources
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml

from tests.helpers.cli import nox_sessions

REPO = Path(__file__).parents[2]


def vendored(name: str) -> dict[str, Any]:
    text = (
        resources.files("check_jsonschema.builtin_schemas.vendor")
        .joinpath(f"{name}.json")
        .read_text(encoding="utf-8")
    )
    schema: dict[str, Any] = json.loads(text)
    return schema


def validate(path: Path, schema: str) -> dict[str, Any]:
    loaded: dict[Any, Any] = yaml.safe_load(path.read_text())
    # PyYAML reads `on:` as YAML 1.1's true; GitHub reads YAML 1.2
    data: dict[str, Any] = {("on" if key is True else key): value for key, value in loaded.items()}
    validator_cls = jsonschema.validators.validator_for(vendored(schema))
    errors = [e.message for e in validator_cls(vendored(schema)).iter_errors(data)]
    assert errors == [], f"{path.name}: {errors}"
    return data


def test_action_yml_is_a_valid_composite_action() -> None:
    action = validate(REPO / "action.yml", "github-actions")
    assert action["runs"]["using"] == "composite"
    assert set(action["inputs"]) == {"registry", "since", "format", "install"}
    assert set(action["outputs"]) == {"json", "exit-code"}
    script = "\n".join(step["run"] for step in action["runs"]["steps"])
    assert "${{" not in script  # inputs reach the scripts through env, never spliced in


@pytest.mark.parametrize("name", ["ci-example.yml", "ci-example-release.yml"])
def test_example_workflows_are_valid(name: str) -> None:
    workflow = validate(REPO / "docs" / name, "github-workflows")
    assert workflow["jobs"]


def test_release_workflow_publishes_with_trusted_publishing() -> None:
    workflow = validate(REPO / "docs" / "ci-example-release.yml", "github-workflows")
    dist = "\n".join(s.get("run", "") for s in workflow["jobs"]["dist"]["steps"])
    assert "nox -s dist" in dist
    publish = workflow["jobs"]["publish"]
    assert publish["permissions"] == {"id-token": "write"}
    assert any("gh-action-pypi-publish" in s.get("uses", "") for s in publish["steps"])


def test_another_projects_noxfile_gets_build_sessions(tmp_path: Path) -> None:
    (tmp_path / "builds").mkdir()
    for name in ("0.19.1", "broken"):
        (tmp_path / "builds" / f"{name}.toml").write_text(
            'vllm = "0.19.1"\n' if name[0] == "0" else "["
        )
    (tmp_path / "noxfile.py").write_text(
        "import patchset.nox\n\nNAMES = patchset.nox.build_sessions('builds')\n"
    )
    listed = nox_sessions(tmp_path)
    assert listed == {"build-0.19.1", "build-broken"}  # a broken one is listed, build says why
