"""`patchset bake`: a valid bake file whose contexts exist and build with a real engine on the
stand-in base, carrying the same labels and tags as `patchset build`."""

from __future__ import annotations

import json
import secrets
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from patchset.adapters import dockerengine
from patchset.cli.main import main
from patchset.errors import BuildError
from patchset.image.bake import bake, bake_data, contexts_folder, pinned_base, target_name
from patchset.image.build import build
from patchset.image.verify import verify_image
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from tests.helpers.releases import tree_digest
from tests.infra.docker_fixtures import StandinImage
from tests.infra.run import image_repo
from tests.infra.standin import built_repository, for_tests, standin_tag

REPO = Path(__file__).parents[2]
REGISTRY = load_registry(REPO / "patches")

# The part of the bake file format (docs.docker.com/build/bake/reference) patchset writes.
BAKE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["group", "target"],
    "additionalProperties": False,
    "properties": {
        "group": {
            "type": "object",
            "required": ["default"],
            "additionalProperties": {
                "type": "object",
                "required": ["targets"],
                "properties": {"targets": {"type": "array", "items": {"type": "string"}}},
            },
        },
        "target": {
            "type": "object",
            "propertyNames": {"pattern": "^[A-Za-z0-9_-]+$"},
            "additionalProperties": {
                "type": "object",
                "required": ["context", "dockerfile", "tags", "labels"],
                "additionalProperties": False,
                "properties": {
                    "context": {"type": "string"},
                    "dockerfile": {"type": "string"},
                    "tags": {"type": "array", "items": {"type": "string"}, "minItems": 1},
                    "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                },
            },
        },
    },
}


def builds_folder(tmp_path: Path, repository: str, **definitions: str) -> Path:
    """A builds/ folder: each keyword is a definition name, each value text to replace in
    builds/0.19.1.toml ('' for none)."""
    folder = tmp_path / "builds"
    folder.mkdir(parents=True)
    text = for_tests((REPO / "builds" / "0.19.1.toml").read_text())  # the stand-in's tag
    text = text.replace(f'"{built_repository()}"', f'"{repository}"')
    for name, change in definitions.items():
        old, _, new = change.partition("=>")
        (folder / f"{name}.toml").write_text(text.replace(old, new) if change else text)
    return folder


def test_target_names_and_data() -> None:
    d = load_definition(REPO / "builds" / "0.19.1.toml")
    assert target_name(d) == "build-0-19-1"
    info = dockerengine.ImageInfo("sha256:" + "1" * 64, ("vllm/vllm-openai@sha256:" + "a" * 64,))
    assert pinned_base(d, info) == f"vllm/vllm-openai:v0.19.1-cu130@sha256:{'a' * 64}"
    assert pinned_base(d, dockerengine.ImageInfo("sha256:" + "1" * 64, ())) == d.base
    assert contexts_folder(Path("out/docker-bake.json")) == Path("out/docker-bake.contexts")


def test_cli_refusals(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["--builds", str(empty), "bake"]) == 2
    assert "holds no build definition" in capsys.readouterr().err
    assert main(["bake", "--builds", str(REPO / "builds"), "--target", "0.19"]) == 2
    err = capsys.readouterr().err
    assert "no build target '0.19'" in err and "build-0-19-1" in err
    assert not (tmp_path / "docker-bake.json").exists()


@pytest.fixture
def repo_name(engine: dockerengine.Engine) -> Iterator[str]:
    name = image_repo(f"bake-{secrets.token_hex(4)}")
    yield name
    for image in engine.client.images.list(name=name):
        for tag in image.tags:
            engine.untag(tag)


@pytest.mark.docker
@pytest.mark.network
def test_bake_file_contexts_build_with_the_engine(
    tmp_path: Path,
    engine: dockerengine.Engine,
    standin_base: StandinImage,
    repo_name: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    builds = builds_folder(tmp_path, repo_name, **{"0.19.1": "", "0.19.1-slim": ""})
    (builds / "0.19.1-slim.toml").write_text(
        (builds / "0.19.1.toml").read_text().split("[env]")[0] + '[serve]\nargs = ["--x"]\n'
    )
    out = tmp_path / "ci"
    bake_file = str(out / "docker-bake.json")
    extra = f"{repo_name}:extra"
    args = ["--registry", str(REPO / "patches"), "--builds", str(builds), "bake", "-o", bake_file]
    code = main([*args, "--tag", extra, "--format", "json"])
    assert code == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    data = json.loads((out / "docker-bake.json").read_text())
    assert printed == data
    jsonschema.validate(data, BAKE_SCHEMA)
    assert data["group"]["default"]["targets"] == ["build-0-19-1-slim", "build-0-19-1"]
    assert sorted(p.name for p in out.iterdir()) == ["docker-bake.contexts", "docker-bake.json"]
    short = REGISTRY.short_digest
    for name, target in data["target"].items():
        context = out / target["context"]  # relative to the bake file's folder
        assert context.is_dir() and (context / target["dockerfile"]).is_file()
        dockerfile = (context / "Dockerfile").read_text()
        # the stand-in has no repo digest, so FROM names the base (a pulled one is pinned)
        assert dockerfile.startswith(f"FROM {standin_tag('0.19.1')}\n")
        assert (context / "runtime" / "manifest.json").is_file()
        assert (context / "files" / REGISTRY.get("fla-tma-sm12x").targets[0]).is_file()
        assert target["tags"] == [
            f"{repo_name}:0.19.1-cu130",
            f"{repo_name}:0.19.1-cu130-ps{short}",
            f"{repo_name}:extra",
        ], name
        # every context builds on the local engine, and the image passes verification
        image_id = engine.build(context, (), labels=target["labels"], network=False)
        try:
            assert verify_image(engine, image_id).ok
            labels = engine.inspect(image_id).labels
            assert {k: labels[k] for k in target["labels"]} == target["labels"]
        finally:
            engine.remove_image(image_id)
    # the same labels and tags as `patchset build` of the same definition
    built = build(load_definition(builds / "0.19.1.toml"), REGISTRY, engine=engine)
    baked = data["target"]["build-0-19-1"]
    built_labels = engine.inspect(built.image_id).labels
    assert {k: v for k, v in baked["labels"].items() if not k.endswith(".created")} == {
        k: built_labels[k] for k in baked["labels"] if not k.endswith(".created")
    }
    assert list(built.tags) == baked["tags"][:2]


@pytest.mark.docker
@pytest.mark.network
def test_a_failing_target_leaves_the_previous_bake(
    tmp_path: Path, engine: dockerengine.Engine, standin_base: StandinImage, repo_name: str
) -> None:
    builds = builds_folder(tmp_path, repo_name, **{"0.19.1": ""})
    output = tmp_path / "docker-bake.json"
    first = bake([load_definition(builds / "0.19.1.toml")], REGISTRY, output, engine=engine)
    assert first.data == json.loads(output.read_text())
    assert first.data == bake_data(first.targets, contexts="docker-bake.contexts")
    before = tree_digest(tmp_path)
    # a definition whose release is not the base's: found once the base is looked into
    wrong = builds_folder(
        tmp_path / "wrong",
        repo_name,
        **{"0.20.0": 'vllm = "0.19.1"=>vllm = "0.20.0"'},
    )
    text = (wrong / "0.20.0.toml").read_text().replace('"fla-tma-sm12x"', '"tolist-cudagraph"')
    (wrong / "0.20.0.toml").write_text(text)
    with pytest.raises(BuildError, match=r"holds vLLM 0\.19\.1"):
        bake(
            [load_definition(builds / "0.19.1.toml"), load_definition(wrong / "0.20.0.toml")],
            REGISTRY,
            output,
            engine=engine,
        )
    assert tree_digest(tmp_path / "docker-bake.contexts") == {
        k.removeprefix("docker-bake.contexts/"): v
        for k, v in before.items()
        if k.startswith("docker-bake.contexts/")
    }
    assert output.read_text() == json.dumps(first.data, indent=2) + "\n"
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".docker-bake")]
