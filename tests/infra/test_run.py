"""A test run's own names (tests/infra/run.py): who is dead, what is removed, what is left."""

from __future__ import annotations

import contextlib
import io
import os
import secrets
import subprocess
import sys
import tarfile
from typing import Any

import docker.errors
import pytest

from tests.infra import run
from tests.infra.standin import INPUTS_LABEL, STANDIN_LABEL, _cached, standin_tag


def _dead_id() -> str:
    """The id of a run that has ended: a child's pid once it has exited."""
    child = subprocess.run(
        [sys.executable, "-c", "from tests.infra import run; print(run.start_run())"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
    )
    return child.stdout.strip()


def test_this_run_is_alive_and_owned_and_an_ended_one_is_dead() -> None:
    mine = run.run_id()
    assert mine == os.environ[run.ENV] and run.owns(mine) and not run.is_dead(mine)
    ended = _dead_id()
    assert ended != mine and run.is_dead(ended) and not run.owns(ended)
    assert run.image_repo("x").startswith(mine + "/") and run.object_name("y") == f"{mine}-y"


def test_names_of_no_run_or_of_another_host_are_never_dead() -> None:
    assert run.run_of("patchset-test/vllm-openai-standin:v0.19.1-cu130") is None  # old scheme
    assert run.run_of("vllm/vllm-openai:v0.19.1-cu130") is None
    mine = run.run_id()
    assert run.run_of(f"127.0.0.1:5000/{mine}/built:1") == mine  # pushed to a test registry
    other_host = "patchset-test-000000-1-1"  # a host digest this machine does not have
    assert not run.is_dead(other_host) or run._host() == "000000"
    assert not run.is_dead("patchset-test/whatever")


def _image(client: Any, repository: str, labels: dict[str, str] | None = None) -> str:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        payload = secrets.token_hex(8).encode()
        member = tarfile.TarInfo("x.txt")
        member.size = len(payload)
        archive.addfile(member, io.BytesIO(payload))
    changes = [f"LABEL {key}={value}" for key, value in (labels or {}).items()]
    client.api.import_image_from_data(
        buffer.getvalue(), repository=repository, tag="1", changes=changes
    )
    return str(client.images.get(f"{repository}:1").id)


@pytest.mark.docker
def test_a_dead_runs_leftovers_go_and_a_live_runs_stay(docker_client: Any) -> None:
    dead = _dead_id()
    theirs = f"{dead}/leftover"
    ours = run.image_repo(f"kept-{secrets.token_hex(3)}")
    _image(docker_client, theirs)
    _image(docker_client, ours)
    # built on it and never tagged (a build cut short): the dead run's too
    dockerfile = io.BytesIO(f"FROM {theirs}:1\nLABEL built=on-it\n".encode())
    child, _ = docker_client.images.build(fileobj=dockerfile, rm=True, network_mode="none")
    container = docker_client.containers.create(f"{theirs}:1", ["x"], name=f"{dead}-box")
    try:
        assert dead in run.dead_runs(docker_client)
        assert run.run_id() not in run.dead_runs(docker_client)
        removed = run.remove_run(docker_client, dead)
        assert f"image {theirs}:1" in removed and f"container {dead}-box" in removed
        for gone in (f"{theirs}:1", child.id):
            with pytest.raises(docker.errors.ImageNotFound):
                docker_client.images.get(gone)
        docker_client.images.get(f"{ours}:1")  # this run's: still there
    finally:
        with contextlib.suppress(docker.errors.NotFound):
            container.remove(force=True)
        for ref in (child.id, f"{theirs}:1", f"{ours}:1"):
            with contextlib.suppress(docker.errors.ImageNotFound):
                docker_client.api.remove_image(ref, force=True)


@pytest.mark.docker
def test_a_standin_is_found_by_its_tag_never_by_its_label(docker_client: Any) -> None:
    """An image carrying the stand-in's labels under another name (an image built on the
    stand-in inherits them) is not taken, nor tagged, for the stand-in."""
    other = run.image_repo(f"derived-{secrets.token_hex(3)}")
    inputs = secrets.token_hex(8)
    _image(docker_client, other, {STANDIN_LABEL: "x", INPUTS_LABEL: inputs})
    tag = standin_tag(f"9.9.{secrets.randbelow(1000)}")
    try:
        assert _cached(docker_client, tag, inputs) is None
        with pytest.raises(docker.errors.ImageNotFound):
            docker_client.images.get(tag)
    finally:
        docker_client.api.remove_image(f"{other}:1", force=True)
