"""Model gates decided by the served model's own config.json (issue 35.3): read at start from
the Hugging Face cache layout (HF_HOME, HF_HUB_CACHE, the snapshot `refs/main` names) or a
local model folder; `--hf-overrides` and `--quantization` win; bad configs leave the leaves
unknown with one line. The bundle's own entrypoint runs in a subprocess (its kernel copy), and
once on the stand-in image with the cache mounted as compose mounts it."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from patchset.kernel import modelconfig
from patchset.kernel.predicates import Facts, evaluate, parse
from tests.helpers.synthetic import (
    OTHER_DIFF,
    add_patch,
    definition_text,
    exported_bundle,
    run_entrypoint,
    stand_in_vllm,
)

QWEN = {
    "architectures": ["Qwen3ForCausalLM"],
    "model_type": "qwen3",
    "quantization_config": {"quant_method": "gptq", "bits": 4},
}
GEMMA = {  # a multimodal config: the language model's fields nest in text_config
    "architectures": ["Gemma3ForConditionalGeneration"],
    "model_type": "gemma3",
    "text_config": {"model_type": "gemma3_text"},
}
START = "a = 1\nb = 2\nc = 3\n"
START_DIFF = OTHER_DIFF.replace("other", "start").replace("alpha", "a = 1")
START_DIFF = START_DIFF.replace("-beta\n+beta patched", "-b = 2\n+b = 22").replace(
    " gamma", " c = 3"
)
TWO_DIFF = START_DIFF.replace("start.py", "two.py")


def hub_model(hub: Path, model: str, config: object, *, ref: bool = True) -> Path:
    """`model` in the Hugging Face cache layout under `hub`: the config a blob, the snapshot's
    file a relative link to it (as huggingface_hub writes them), refs/main naming it."""
    org, name = model.split("/")
    repo = hub / f"models--{org}--{name}"
    (repo / "blobs").mkdir(parents=True)
    blob = repo / "blobs" / "0123abcd"
    blob.write_text(config if isinstance(config, str) else json.dumps(config))
    snap = repo / "snapshots" / "c0ffee"
    snap.mkdir(parents=True)
    (snap / "config.json").symlink_to("../../blobs/0123abcd")
    if ref:
        (repo / "refs").mkdir()
        (repo / "refs" / "main").write_text("c0ffee")
    return snap


# -- the reader ------------------------------------------------------------------------------


def test_cache_layout_refs_main_and_text_config(tmp_path: Path) -> None:
    hub = tmp_path / "hf" / "hub"
    hub_model(hub, "Org/Qwen3-Mini", QWEN)
    # an older snapshot, newer on disk, that refs/main does not name: not read
    old = hub / "models--Org--Qwen3-Mini" / "snapshots" / "0ld"
    old.mkdir()
    (old / "config.json").write_text(json.dumps({"architectures": ["LlamaForCausalLM"]}))
    found = modelconfig.decide({"model": "org/qwen3-mini"}, ["--model", "Org/Qwen3-Mini"],
                               {"HF_HOME": str(tmp_path / "hf")})  # fmt: skip
    assert found.served["architecture"] == "qwen3forcausallm"
    assert found.served["model_type"] == "qwen3" and found.served["quantization"] == "gptq"
    assert found.unknown == frozenset() and found.source is not None
    assert found.source.endswith("snapshots/c0ffee/config.json")
    hub_model(tmp_path / "cache", "G/Gemma", GEMMA, ref=False)
    gemma = modelconfig.decide({}, ["G/Gemma"], {"HF_HUB_CACHE": str(tmp_path / "cache")})
    assert gemma.served["model_type"] == "gemma3,gemma3_text"
    assert gemma.served["quantization"] == ""  # not quantized: known, not unknown


def test_the_serve_arguments_win(tmp_path: Path) -> None:
    hub_model(tmp_path / "hub", "Org/Qwen3-Mini", QWEN)
    args = ["Org/Qwen3-Mini", "--quantization", "awq",
            "--hf-overrides", '{"architectures": ["MyArch"]}']  # fmt: skip
    from patchset.kernel.served import served_from_args

    served = served_from_args(args)
    found = modelconfig.decide(served, args, {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert found.served["architecture"] == "myarch" and found.served["quantization"] == "awq"
    assert found.served["model_type"] == "qwen3"  # the only one the arguments left open
    nothing = modelconfig.decide(served, args, {}, wanted=["architecture"])
    assert nothing.line is None  # nothing wanted that the arguments left open: never read


@pytest.mark.parametrize(
    ("config", "said"),
    [
        ("{not json", "is not JSON"),
        ('["a list"]', "is not a JSON object"),
        (json.dumps({"architectures": "Qwen3"}), "architectures is not a list of names"),
        (json.dumps({"quantization_config": {"bits": 4}}), "has no quant_method string"),
        ("[" * 100000 + "]" * 100000, "is not JSON"),
        (" " * (modelconfig.MAX_BYTES + 1) + "{}", "is larger than 4 MiB"),
        ("\udcff", "is not JSON"),
    ],
)
def test_bad_config_is_one_line_and_unknown(tmp_path: Path, config: str, said: str) -> None:
    org = tmp_path / "hub" / "models--O--M"
    if config == "\udcff":
        hub_model(tmp_path / "hub", "O/M", "")
        (org / "blobs" / "0123abcd").write_bytes(b"\xff\xfe{")
    else:
        hub_model(tmp_path / "hub", "O/M", config)
    found = modelconfig.decide({}, ["O/M"], {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert found.unknown == frozenset(modelconfig.MODEL_LEAVES)
    assert found.line is not None and "\n" not in found.line and said in found.line
    assert "--quantization" in found.line and "--hf-overrides" in found.line


def test_symlink_out_of_the_cache_is_not_read(tmp_path: Path) -> None:
    outside = tmp_path / "secret.json"
    outside.write_text(json.dumps(QWEN))
    snap = hub_model(tmp_path / "hub", "O/M", QWEN)
    (snap / "config.json").unlink()
    (snap / "config.json").symlink_to(outside)
    found = modelconfig.decide({}, ["O/M"], {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert found.unknown == frozenset(modelconfig.MODEL_LEAVES)
    assert found.line is not None and "is a link out of" in found.line


def test_local_folder_and_a_snapshot_named_directly(tmp_path: Path) -> None:
    local = tmp_path / "weights"
    local.mkdir()
    (local / "config.json").write_text(json.dumps(QWEN))
    assert modelconfig.decide({}, [str(local)], {}).served["architecture"] == "qwen3forcausallm"
    snap = hub_model(tmp_path / "hub", "O/M", GEMMA)  # a snapshot folder as --model
    found = modelconfig.decide({}, ["--model", str(snap)], {})
    assert found.served["architecture"] == "gemma3forconditionalgeneration", found.line
    missing = modelconfig.decide({}, ["Org/Absent"], {"HF_HUB_CACHE": str(tmp_path / "hub")})
    assert missing.line is not None and "not downloaded yet?" in missing.line


def test_export_keeps_what_the_start_decides() -> None:
    quant = parse({"quantization": "gptq*"})
    served = {"model": "m"}
    facts = Facts(served=served, unknown_served=modelconfig.undecided(served))
    assert evaluate(quant, facts).value is None  # left for the start, not false
    given = {"model": "m", "quantization": "awq"}
    facts = Facts(served=given, unknown_served=modelconfig.undecided(given))
    assert evaluate(quant, facts).value is False


# -- the bundle's own entrypoint -------------------------------------------------------------


def gated_bundle(tmp_path: Path, args: list[str]) -> tuple[Path, Path, Path]:
    registry = tmp_path / "patches"
    qwen = add_patch(registry, "qwen-only", diff=START_DIFF, targets=["vllm/start.py"],
                     when="startup", tail='\n[applies]\narchitecture = "qwen3*"\n')  # fmt: skip
    gptq = add_patch(registry, "gptq-only", diff=TWO_DIFF, targets=["vllm/two.py"],
                     when="startup", tail='\n[applies]\nquantization = "gptq*"\n')  # fmt: skip
    assert qwen.is_dir() and gptq.is_dir()
    definition = definition_text("0.20.0", ["qwen-only", "gptq-only"], args=args)
    files = {"vllm/start.py": START, "vllm/two.py": START}
    bundle, site = exported_bundle(tmp_path, registry, files, definition)
    ids = [p["id"] for p in json.loads((bundle / "manifest.json").read_text())["patches"]]
    assert ids == ["qwen-only", "gptq-only"]  # neither left out at export
    return bundle, site, stand_in_vllm(tmp_path / "bin")


def states(out: str, ids: tuple[str, ...] = ("qwen-only", "gptq-only")) -> dict[str, str]:
    """Each of `ids`' state on its start line."""
    found = {}
    for line in out.splitlines():
        for patch_id in ids:
            if line.startswith(f"patchset: {patch_id} r1 (startup): "):
                found[patch_id] = line.split("): ", 1)[1]
    return found


def test_start_reads_the_mounted_cache(tmp_path: Path) -> None:
    bundle, site, bin_dir = gated_bundle(tmp_path, ["--model", "Org/Qwen3-Mini"])
    done = run_entrypoint(bundle, site, bin_dir, HF_HOME=str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    got = states(done.stdout)
    assert got["qwen-only"].startswith("skipped (applies: unknown here: architecture"), got
    assert got["gptq-only"].startswith("skipped (applies: unknown here: quantization"), got
    said = [x for x in done.stderr.splitlines() if x.startswith("patchset: model config:")]
    assert len(said) == 1 and "not in the Hugging Face cache" in said[0]
    assert "--hf-overrides" in said[0] and "--quantization" in said[0]
    hub_model(tmp_path / "hf" / "hub", "Org/Qwen3-Mini", QWEN)
    done = run_entrypoint(bundle, site, bin_dir, HF_HOME=str(tmp_path / "hf"))
    assert done.returncode == 0, done.stderr
    assert states(done.stdout) == {"qwen-only": "applied", "gptq-only": "applied"}
    assert "architecture=qwen3forcausallm" in done.stderr and "quantization=gptq" in done.stderr
    assert "b = 22" in (site / "vllm" / "start.py").read_text()


def test_start_reads_a_local_model_and_arguments_win(tmp_path: Path) -> None:
    local = tmp_path / "models" / "qwen"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps(QWEN))
    bundle, site, bin_dir = gated_bundle(tmp_path, ["--model", str(local)])
    done = run_entrypoint(bundle, site, bin_dir, "--quantization", "awq")
    assert done.returncode == 0, done.stderr
    got = states(done.stdout)
    assert got["qwen-only"] == "applied"
    assert got["gptq-only"] == "skipped (applies: quantization = 'gptq*' is false here)"
    assert json.loads(done.stdout.splitlines()[-1])[-2:] == ["--quantization", "awq"]


# -- the stand-in image ----------------------------------------------------------------------


@pytest.mark.docker
@pytest.mark.network
def test_stand_in_reads_the_cache_compose_mounts(tmp_path: Path, docker_client: Any) -> None:
    """The stand-in of the stock image, the bundle read-only at /opt/patchset and a Hugging
    Face cache folder at /root/.cache/huggingface, as the exported compose.yaml mounts it."""
    from tests.image.test_runtime_export import run_stock
    from tests.infra.standin import build_standin_base

    image = build_standin_base(docker_client, "0.20.0")
    registry = tmp_path / "patches"
    folder = add_patch(registry, "qwen-site", targets=["vllm/logger.py"], when="startup",
                       vllm=">=0.20.0", sites=QWEN_SITE,
                       tail='\n[applies]\nmodel_type = "qwen3*"\n')  # fmt: skip
    assert folder.is_dir()
    builds = tmp_path / "builds"
    builds.mkdir()
    (builds / "0.20.0.toml").write_text(
        definition_text("0.20.0", ["qwen-site"], args=["--model", "Org/Qwen3-Mini"])
    )
    from patchset.image.export import export_runtime
    from patchset.registry import load_registry
    from patchset.registry.builds import load_definition

    bundle = tmp_path / "bundle"
    export_runtime(load_definition(builds / "0.20.0.toml"), load_registry(registry), bundle)
    cache = tmp_path / "huggingface"
    hub_model(cache / "hub", "Org/Qwen3-Mini", QWEN)
    env = {"PATCHSET_COMPUTE_CAPABILITY": "none"}
    status, out, _ = run_stock(docker_client, image, bundle, "--prove", env=env,
                               mounts={str(cache): "/root/.cache/huggingface"})  # fmt: skip
    assert status == 0, out
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    state = {r["patch"]: r["state"] for r in report["results"]}
    assert state["qwen-site r1"] == "applied", out
    assert "patchset: model config: /root/.cache/huggingface/hub/models--Org--Qwen3-Mini" in out
    status, out, _ = run_stock(docker_client, image, bundle, "--prove", env=env)
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    state = {r["patch"]: r["state"] for r in report["results"]}
    assert state["qwen-site r1"].startswith("skipped (applies: unknown here: model_type"), out
    # a local model folder given at start (its --model after the definition's wins)
    local = tmp_path / "models" / "qwen"
    local.mkdir(parents=True)
    (local / "config.json").write_text(json.dumps(QWEN))
    status, out, _ = run_stock(docker_client, image, bundle, "--prove", "--model", "/models/qwen",
                               env=env, mounts={str(local): "/models/qwen"})  # fmt: skip
    assert status == 0, out
    report = json.loads(next(x for x in out.splitlines() if x.startswith("{")))
    assert {r["patch"]: r["state"] for r in report["results"]}["qwen-site r1"] == "applied", out
    assert "patchset: model config: /models/qwen/config.json: model_type=qwen3" in out


QWEN_SITE = '''\
[[site]]
name = "s"
file = "vllm/logger.py"
action = "insert-after"
marker = "patchset: qwen-site"
anchor = """
import datetime
"""
text = """
PS_QWEN = 1
"""
'''
