"""ImageSource on the stand-in of the official vLLM 0.19.1 image (a real engine)."""

from __future__ import annotations

import pytest

from patchset.adapters.dockerengine import Engine
from patchset.errors import DockerError, SourceError
from patchset.sources import parse_source
from patchset.sources.base import ReleaseSource, ReleaseTree
from patchset.sources.image import ImageSource
from tests.infra.docker_fixtures import StandinImage
from tests.infra.standin import rootfs_tag

FLA_UTILS = "vllm/model_executor/layers/fla/ops/utils.py"


@pytest.mark.docker
def test_finds_vllm_under_dist_packages_and_reads_its_files(
    engine: Engine, standin_base: StandinImage
) -> None:
    source: ReleaseSource = ImageSource(standin_base.ref, engine=engine)
    assert source.versions() == ["0.19.1"]
    with source.open("0.19.1") as tree:
        assert isinstance(tree, ReleaseTree)
        assert tree.info.version == "0.19.1"
        assert "/usr/local/lib/python3." in tree.info.origin
        assert "/dist-packages/vllm" in tree.info.origin
        assert tree.info.digest == standin_base.id
        assert b"is_tma_supported" in (tree.read(FLA_UTILS) or b"")
        paths = list(tree.paths())
        assert FLA_UTILS in paths
        assert all(path.startswith("vllm/") and path.endswith(".py") for path in paths)
        assert tree.read("vllm/no/such.py") is None


@pytest.mark.docker
def test_the_image_source_is_named_on_the_command_line(standin_base: StandinImage) -> None:
    source = parse_source(f"image:{standin_base.ref}")
    assert source.name == "image"
    assert source.versions() == ["0.19.1"]


@pytest.mark.docker
def test_another_version_is_refused(engine: Engine, standin_base: StandinImage) -> None:
    source = ImageSource(standin_base.ref, engine=engine)
    with (
        pytest.raises(SourceError, match=r"holds vllm 0\.19\.1, not 0\.20\.0"),
        source.open("0.20.0"),
    ):
        pass


@pytest.mark.docker
def test_an_image_without_vllm_says_so(engine: Engine, standin_base: StandinImage) -> None:
    source = ImageSource(rootfs_tag(), engine=engine)
    with pytest.raises(SourceError, match="has no vllm package on its python3's path"):
        source.versions()


@pytest.mark.docker
def test_an_image_that_cannot_be_had_says_so(engine: Engine) -> None:
    source = ImageSource("127.0.0.1:9/nothing/here:v1", engine=engine)
    with pytest.raises(
        DockerError, match=r"cannot pull 127.0.0.1:9/nothing/here:v1 from 127.0.0.1:9"
    ):
        source.versions()


def test_no_engine_is_one_clear_line(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    source = ImageSource("vllm/vllm-openai:v0.19.1-cu130")
    with pytest.raises(
        DockerError, match="cannot reach a Docker engine at unix:///nonexistent"
    ) as caught:
        source.versions()
    assert "\n" not in str(caught.value)
