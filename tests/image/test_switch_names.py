"""Switch names checked (issue 35.4): `[switch] aliases` in the registry, the bundle's
switches.json, every switch-prefixed variable at start reported (alias mapped, a registry
patch not in the bundle, unknown with the nearest name), switch values refused in one line;
`runtime export --compose FILE` carrying a user's environment, image pin and command."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from patchset.errors import RegistryError
from patchset.kernel.switchnames import Names, prefix_of
from patchset.registry import load_registry
from tests.helpers.cli import cli
from tests.helpers.synthetic import (
    add_patch,
    definition_text,
    make_tree,
    run_entrypoint,
    stand_in_vllm,
)
from tests.image.test_model_gates import START, START_DIFF, TWO_DIFF, states

P64 = "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING"
P61C = "GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT"
PN56 = "GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK"
SWITCH = '\n[switch]\nenv = "{env}"\ndefault = {default}\n{more}'


def registry_of(tmp_path: Path) -> Path:
    """p64 (off by default, two aliases), p67 (on by default), p5 (not in the definition)."""
    registry = tmp_path / "patches"
    add_patch(registry, "p64", diff=START_DIFF, targets=["vllm/start.py"], when="startup",
              tail=SWITCH.format(env="GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING",
                                 default="false",
                                 more=f'aliases = ["{P61C}", "{PN56}"]\n'))  # fmt: skip
    add_patch(registry, "p67", diff=TWO_DIFF, targets=["vllm/two.py"], when="startup",
              tail=SWITCH.format(env="GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL", default="true",
                                 more=""))  # fmt: skip
    add_patch(registry, "gp5", diff=TWO_DIFF, targets=["vllm/two.py"], when="startup",
              tail=SWITCH.format(env="GENESIS_ENABLE_P5_KV_LAYOUT", default="true",
                                 more=""))  # fmt: skip
    return registry


def exported(tmp_path: Path, *more: str | Path) -> tuple[Path, Path, Any]:
    registry = registry_of(tmp_path)
    release = make_tree(tmp_path / "release", {"vllm/start.py": START, "vllm/two.py": START},
                        version="0.20.0")  # fmt: skip
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "0.20.0.toml").write_text(definition_text("0.20.0", ["p64", "p67"]))
    bundle = tmp_path / "bundle"
    result = cli("runtime", "export", bundle, "--build", builds / "0.20.0.toml",
                 "--registry", registry, "--source", release, *more,
                 "--format", "json")  # fmt: skip
    return bundle, release, result


def test_aliases_load_and_clash(tmp_path: Path) -> None:
    registry = registry_of(tmp_path)
    p64 = load_registry(registry).get("p64")
    assert p64.switch is not None
    assert p64.switch.aliases == (
        "GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT",
        "GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK",
    )
    toml = registry / "p67" / "patch.toml"
    toml.write_text(toml.read_text() + f'aliases = ["{PN56}"]\n')
    with pytest.raises(RegistryError, match=rf"switch\.aliases: {PN56} is already the switch"):
        load_registry(registry)
    toml.write_text(
        toml.read_text().replace("PN56_QWEN3CODER_XML_FALLBACK", "P67_TQ_MULTI_QUERY_KERNEL")
    )
    with pytest.raises(RegistryError, match="not an alias of it"):
        load_registry(registry)
    toml.write_text(
        toml.read_text().replace(
            'aliases = ["GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"]', 'aliases = ["9X"]'
        )
    )
    with pytest.raises(RegistryError, match="'9X' is not an environment variable name"):
        load_registry(registry)


def test_prefixes() -> None:
    assert prefix_of("GENESIS_ENABLE_P64_X") == "GENESIS_ENABLE_"
    assert prefix_of("SNDR_ENABLE_PN8") == "SNDR_ENABLE_"
    assert prefix_of("MYSWITCH_ON") == "MYSWITCH_"
    assert prefix_of("VLLM_USE_DEEP_GEMM") is None  # vLLM's namespace is never ours
    assert prefix_of("ALONE") is None


def test_export_records_the_registrys_other_names(tmp_path: Path) -> None:
    bundle, _, result = exported(tmp_path)
    assert result.code == 0, result.err
    names = Names.loads((bundle / "switches.json").read_bytes())
    assert names.prefixes == ("GENESIS_ENABLE_",)
    assert names.aliases["GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT"] == (
        "GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING"
    )
    assert names.registry == {"GENESIS_ENABLE_P5_KV_LAYOUT": ("gp5", "not listed in 0.20.0.toml")}


def test_start_reports_alias_registry_and_unknown(tmp_path: Path) -> None:
    bundle, _, result = exported(tmp_path)
    assert result.code == 0, result.err
    site = make_tree(tmp_path / "site", {"vllm/start.py": START, "vllm/two.py": START},
                     version="0.20.0")  # fmt: skip
    (site / "vllm-0.20.0.dist-info").mkdir()
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.20.0\n")
    bin_dir = stand_in_vllm(tmp_path / "bin")
    env = {
        "GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT": "1",  # an alias of p64's switch
        "GENESIS_ENABLE_P5_KV_LAYOUT": "1",  # gp5: in the registry, not in this definition
        "GENESIS_ENABLE_P46_QWEN3CODER_MTP_STREAMING": "1",  # a typo
        "GENESIS_P67_NUM_KV_SPLITS": "48",  # a tunable: no switch prefix, not judged
    }
    done = run_entrypoint(bundle, site, bin_dir, **env)
    assert done.returncode == 0, done.stderr
    # p64 (off by default) on by its alias
    assert states(done.stdout, ("p64", "p67")) == {"p64": "applied", "p67": "applied"}
    said = [x for x in done.stderr.splitlines() if x.startswith("patchset: switch ")]
    assert said == [
        "patchset: switch GENESIS_ENABLE_P46_QWEN3CODER_MTP_STREAMING=1: names no switch of this"
        " bundle's registry; nearest: GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING",
        "patchset: switch GENESIS_ENABLE_P5_KV_LAYOUT: the switch of gp5, not in this bundle"
        " (not listed in 0.20.0.toml)",
        "patchset: switch GENESIS_ENABLE_P61C_QWEN3CODER_DEFERRED_COMMIT: an alias of"
        " GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING, the switch of p64 (mapped)",
    ], done.stderr
    # a value that is no switch word, on an alias: refused in one line, nothing written
    bad = run_entrypoint(bundle, site, bin_dir,
                         GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK="maybe")  # fmt: skip
    assert bad.returncode == 9
    assert "GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK='maybe' is not a switch value" in bad.stderr
    both = run_entrypoint(bundle, site, bin_dir,
                          GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK="1",
                          GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING="0")  # fmt: skip
    assert both.returncode == 9 and "set the same switch both ways" in both.stderr


COMPOSE = """\
x-common: &common
  NCCL_P2P_DISABLE: '1'
services:
  vllm-server:
    image: vllm/vllm-openai:v0.20.0
    restart: unless-stopped
    command: --model Org/Qwen3-Mini --port 8001
    environment:
      <<: *common
      VLLM_USE_DEEP_GEMM: '0'
      GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING: '1'
      GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL: '0'
      GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK: '1'
      GENESIS_ENABLE_P5_KV_LAYOUT: '1'
      GENESIS_ENABLE_P99_NOTHING: '1'
  other:
    image: redis:7
"""


def test_compose_carried_over(tmp_path: Path) -> None:
    (tmp_path / "mine.yml").write_text(COMPOSE)
    bundle, _, result = exported(tmp_path, "--compose", tmp_path / "mine.yml")
    assert result.code == 0, result.err
    report = json.loads(result.out)
    assert report["compose_in"] == [
        "mapped: GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING: the switch of p64: p64 on",
        "mapped: GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL: the switch of p67: p67 off",
        "alias: GENESIS_ENABLE_PN56_QWEN3CODER_XML_FALLBACK: an alias of"
        " GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING, the switch of p64 (mapped): p64 on",
        "not in this bundle: GENESIS_ENABLE_P5_KV_LAYOUT: the switch of gp5, not in this bundle"
        " (not listed in 0.20.0.toml)",
        "unknown: GENESIS_ENABLE_P99_NOTHING=1: names no switch of this bundle's registry;"
        " nearest: GENESIS_ENABLE_P5_KV_LAYOUT",
    ]
    service = yaml.safe_load((bundle / "compose.yaml").read_text())["services"]["vllm"]
    assert service["image"] == "vllm/vllm-openai:v0.20.0"
    assert service["command"] == ["--model", "Org/Qwen3-Mini", "--port", "8001"]
    env = service["environment"]
    assert env["NCCL_P2P_DISABLE"] == "1" and env["VLLM_USE_DEEP_GEMM"] == "0"  # merged key
    assert env["GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL"] == "0"
    text = (bundle / "compose.yaml").read_text()
    assert "# GENESIS_ENABLE_P67_TQ_MULTI_QUERY_KERNEL" not in text  # the user's line stands
    # the list form, KEY alone (from the shell) and a digest pin
    listed = COMPOSE.replace("    environment:\n      <<: *common\n", "    environment:\n")
    listed = listed.replace(
        "image: vllm/vllm-openai:v0.20.0", "image: vllm/vllm-openai@sha256:" + "a" * 64
    )
    listed = listed.replace(": '1'\n", "=1\n").replace(": '0'\n", "=0\n")
    listed = listed.replace("      VLLM_USE", "      - VLLM_USE").replace(
        "      GENESIS", "      - GENESIS"
    )
    listed = listed.replace(
        "- GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING=1",
        "- GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING",
    )
    (tmp_path / "list.yml").write_text(listed)
    bundle2 = tmp_path / "bundle2"
    again = cli("runtime", "export", bundle2, "--build", tmp_path / "builds" / "0.20.0.toml",
                "--registry", tmp_path / "patches", "--source", tmp_path / "release",
                "--compose", tmp_path / "list.yml", "--format", "json")  # fmt: skip
    assert again.code == 0, again.err
    lines = json.loads(again.out)["compose_in"]
    assert lines[0].endswith("the switch of p64: its value comes from the shell"), lines
    service = yaml.safe_load((bundle2 / "compose.yaml").read_text())["services"]["vllm"]
    assert service["environment"]["GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING"] is None
    assert service["image"].endswith("a" * 64)


@pytest.mark.parametrize(
    ("text", "said"),
    [
        ("services: [a\n", "not YAML (line 2)"),
        ("just text\n", "not a compose file: no services: table"),
        ("services:\n  a:\n    environment:\n      - 1\n", "environment[0]: expected KEY=VALUE"),
        ("services:\n  a:\n    environment:\n      9X: '1'\n", "'9X' is not a variable name"),
        (
            "services:\n  a:\n    environment:\n      A: {b: 1}\n",
            "A: expected a string, got a dict",
        ),
        ("services:\n  a:\n    image: vllm/vllm-openai:v0.19.1\n", "is vLLM 0.19.1"),
        (
            "services:\n  a:\n    environment:\n      GENESIS_ENABLE_P5_KV_LAYOUT: '1'\n"
            "      GENESIS_ENABLE_P64_QWEN3CODER_MTP_STREAMING: perhaps\n",
            "is not a switch value",
        ),
        ("services:\n  a: {image: x}\n  b: {image: y}\n", "holds 2 services (a, b)"),
        ("a: &a [*a]\n", "not a compose file"),
        ("\xff", "not a compose file"),
    ],
)
def test_bad_compose_is_one_line(tmp_path: Path, text: str, said: str) -> None:
    (tmp_path / "bad.yml").write_text(text)
    bundle, _, result = exported(tmp_path, "--compose", tmp_path / "bad.yml")
    assert result.code == 2, result.err
    errors = [x for x in result.err.splitlines() if x.startswith("patchset: error:")]
    assert len(errors) == 1 and said in errors[0] and errors[0] == result.err.splitlines()[-1]
    assert "bad.yml" in result.err and "Traceback" not in result.err
    assert not bundle.exists()


@pytest.mark.docker
@pytest.mark.network
def test_stand_in_reports_alias_and_unknown(tmp_path: Path, docker_client: Any) -> None:
    """On the stand-in of the stock image (vLLM 0.20.0's own files): an alias turns its patch
    on and is said mapped; a mistyped name is said unknown with the nearest name."""
    from patchset.image.export import export_runtime
    from patchset.registry.builds import load_definition
    from tests.image.test_model_gates import QWEN_SITE
    from tests.image.test_runtime_export import run_stock
    from tests.infra.standin import build_standin_base

    image = build_standin_base(docker_client, "0.20.0")
    registry = tmp_path / "patches"
    add_patch(registry, "p64", targets=["vllm/logger.py"], when="startup", vllm=">=0.20.0",
              sites=QWEN_SITE.replace("qwen-site", "p64"),
              tail=SWITCH.format(env="GENESIS_ENABLE_P64", default="false",
                                 more='aliases = ["GENESIS_ENABLE_P61C"]\n'))  # fmt: skip
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "0.20.0.toml").write_text(definition_text("0.20.0", ["p64"]))
    bundle = tmp_path / "bundle"
    export_runtime(load_definition(builds / "0.20.0.toml"), load_registry(registry), bundle)
    env = {"PATCHSET_COMPUTE_CAPABILITY": "none", "GENESIS_ENABLE_P61C": "on",
           "GENESIS_ENABLE_P46": "1"}  # fmt: skip
    status, out, _ = run_stock(docker_client, image, bundle, "--prove", env=env)
    assert status == 0, out
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert {r["patch"]: r["state"] for r in report["results"]}["p64 r1"] == "applied", out
    assert (
        "patchset: switch GENESIS_ENABLE_P61C: an alias of GENESIS_ENABLE_P64, the switch of p64"
        " (mapped)" in out
    )
    assert (
        "patchset: switch GENESIS_ENABLE_P46=1: names no switch of this bundle's registry;"
        " nearest: GENESIS_ENABLE_P64" in out
    )
