"""A python patch's touched names resolved as Python's import system resolves them (issue
35.6): a module or a package (``vllm/config.py`` named, ``vllm/config/__init__.py`` there),
an attribute bound in either, a submodule of a package (``...schemes:compressed_tensors_w8a8_fp8``)
and a name inside that submodule; `check` and `runtime export` agree on every one, on the real
vLLM 0.20.0 files (the release cache)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.kernel.touches import resolve, touch_files
from tests.helpers.cli import cli
from tests.helpers.synthetic import definition_text

SCHEMES = "vllm.model_executor.layers.quantization.compressed_tensors.schemes"
SCHEMES_DIR = SCHEMES.replace(".", "/")


def test_resolve_on_files_in_memory() -> None:
    files = {
        "vllm/config/__init__.py": "from .model import ModelConfig\n",
        "vllm/config/model.py": "class ModelConfig:\n    def verify(self): ...\n",
        "vllm/envs.py": "def is_set(n): ...\n",
        "vllm/pkg/__init__.py": "",
        "vllm/pkg/sub/__init__.py": "X = 1\n",
    }
    read = files.get
    assert resolve("vllm.config:ModelConfig", read) == ("vllm/config/__init__.py", None)
    assert resolve("vllm.config:model.ModelConfig.verify", read) == ("vllm/config/model.py", None)
    assert resolve("vllm.config:model", read) == ("vllm/config/model.py", None)
    assert resolve("vllm.envs:is_set", read) == ("vllm/envs.py", None)
    assert resolve("vllm.pkg:sub.X", read) == ("vllm/pkg/sub/__init__.py", None)
    assert resolve("vllm.envs:gone", read) == (None, "vllm/envs.py: gone")
    assert resolve("vllm.envs:is_set.x", read) == (None, "vllm/envs.py: is_set.x")
    assert resolve("vllm.config:model.Nope", read) == (None, "vllm/config/model.py: Nope")
    assert resolve("vllm.nothere:x", read) == (None, "vllm/nothere.py")
    # a module file is never searched for submodules: only a package has them
    assert resolve("vllm.envs:sub", {**files, "vllm/envs/sub.py": ""}.get)[1] == "vllm/envs.py: sub"
    assert "vllm/config/model.py" in touch_files("vllm.config:model.ModelConfig")
    assert "vllm/v1/spec_decode/llm_base_proposer.py" in touch_files(
        "vllm.v1.spec_decode:llm_base_proposer"
    )


PATCH = """\
id = "touchy"
title = "touches a package and submodules"
description = "a test python patch"
kind = "python"
revision = 1
vllm = ">=0.20.0,<0.21.0"
apply = "startup"
targets = ["vllm/config.py", "{schemes}/__init__.py"]
touches = {touches}
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""


def project(tmp_path: Path, touches: list[str]) -> Path:
    folder = tmp_path / "patches" / "touchy"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(
        PATCH.format(schemes=SCHEMES_DIR, touches=json.dumps(touches))
    )
    (folder / "plugin.py").write_text("def apply():\n    pass\n")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.20.0.toml").write_text(definition_text("0.20.0", ["touchy"]))
    return tmp_path


GOOD = [
    "vllm.config:ModelConfig",  # the package vllm/config/__init__.py, where 0.19 had config.py
    f"{SCHEMES}:compressed_tensors_w8a8_fp8",  # a submodule of the package
    f"{SCHEMES}:compressed_tensors_w8a8_fp8.CompressedTensorsW8A8Fp8.create_weights",
    f"{SCHEMES}:CompressedTensorsW8A8Fp8",  # re-exported by the package
]


@pytest.mark.network
@pytest.mark.parametrize(
    ("touches", "verdict"),
    [
        (GOOD, "applies"),
        ([f"{SCHEMES}:compressed_tensors_w8a8_fp8"], "applies"),  # a submodule alone
        ([*GOOD, f"{SCHEMES}:compressed_tensors_w9a9"], "missing-target"),
        ([f"{SCHEMES}:compressed_tensors_w8a8_fp8.NoSuchClass"], "missing-target"),
    ],
)
def test_check_and_export_agree_on_a_real_release(
    tmp_path: Path, touches: list[str], verdict: str
) -> None:
    root = project(tmp_path, touches)
    checked = cli("check", "--vllm", "0.20.0", "--registry", root / "patches", "--format", "json")
    assert checked.code == (0 if verdict == "applies" else 1), checked.err
    data = json.loads(checked.out)
    states = [r["signals"]["forward"] for r in data["results"] if r["patch"] == "touchy"]
    assert states == [verdict], data["results"]
    exported = cli("runtime", "export", root / "bundle", "--build", root / "builds" / "0.20.0.toml",
                   "--registry", root / "patches", "--format", "json")  # fmt: skip
    if verdict == "applies":
        assert exported.code == 0, exported.err
        manifest = json.loads((root / "bundle" / "manifest.json").read_text())
        assert [p["id"] for p in manifest["patches"]] == ["touchy"]
    else:
        assert exported.code != 0 and "touchy" in exported.err, exported.err
        assert not (root / "bundle").exists()
