"""pick_wheel reads a wheel's platform tags from its file name as packaging's
`parse_wheel_filename` does (without importing packaging's tags), and prefers this machine's."""

from __future__ import annotations

import os

import pytest
from packaging.utils import InvalidWheelFilename, parse_wheel_filename

from patchset.sources.package_index.client import IndexFile, _wheel_platforms, pick_wheel

NAMES = [
    "vllm-0.20.0-cp38-abi3-manylinux_2_31_x86_64.whl",
    "vllm-0.20.0-cp38-abi3-manylinux_2_31_aarch64.whl",
    "vllm-0.20.0-cp38-abi3-manylinux1_x86_64.manylinux_2_5_x86_64.whl",
    "vllm-0.20.0-1-py3-none-any.whl",
    "vllm-0.20.0-1build-py3-none-any.whl",
    "vllm-0.20.0-py3-none-ANY.whl",
    "vllm-0.20.0rc1.dev5+g1234-py3-none-win_amd64.whl",
    "vllm-not.a.version-py3-none-any.whl",
    "vllm-0.20.0-py3-none.whl",
    "vllm-0.20.0-a-b-c-d-e.whl",
    "vllm-0.20.0--none-any.whl",
    "vllm-0.20.0.tar.gz",
]


@pytest.mark.parametrize("name", NAMES)
def test_platform_tags_are_packagings(name: str) -> None:
    try:
        expected: set[str] | None = {t.platform for t in parse_wheel_filename(name)[3]}
    except InvalidWheelFilename:
        expected = None
    assert _wheel_platforms(name) == expected


def _file(name: str) -> IndexFile:
    return IndexFile("0.20.0", name, "", "", 0, "wheel")


def test_this_machines_wheel_then_a_pure_one_then_any() -> None:
    machine = os.uname().machine
    other = "aarch64" if machine == "x86_64" else "x86_64"
    mine = _file(f"vllm-0.20.0-cp38-abi3-manylinux_2_31_{machine}.whl")
    theirs = _file(f"vllm-0.20.0-cp38-abi3-manylinux_2_31_{other}.whl")
    pure = _file("vllm-0.20.0-py3-none-any.whl")
    bad = _file("vllm-0.20.0-none-any.whl")
    assert pick_wheel([bad, theirs, pure, mine]) == mine
    assert pick_wheel([bad, theirs, pure]) == pure
    assert pick_wheel([bad, theirs]) == theirs
    assert pick_wheel([bad]) == bad
    assert pick_wheel([]) is None
