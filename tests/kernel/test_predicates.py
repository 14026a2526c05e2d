"""The kernel's predicate evaluator, switch words and dist-info version reader."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.kernel.predicates import (
    Facts,
    PredicateError,
    evaluate,
    installed_versions,
    parse,
    satisfies,
    switch_on,
    switch_word,
    version_key,
)

EXAMPLE = {
    "all": [
        {"architecture": ["Qwen3Next*", "*Mamba*"]},
        {"not": {"kv_cache_dtype": "fp8*"}},
        {"any": [{"compute_capability": ">=8.6,<9.0"}, {"gpu_name": "*5090*"}]},
        {"torch": ">=2.9"},
    ]
}
SERVED = {"architecture": "Qwen3NextForCausalLM", "kv_cache_dtype": "auto"}


def test_the_spec_example_true_false_and_unknown() -> None:
    node = parse(EXAMPLE)
    known = Facts(SERVED, ((8, 9),), ("NVIDIA RTX 4090",), {"torch": "2.9.0+cu130"})
    assert evaluate(node, known).value is True
    fp8 = Facts({**SERVED, "kv_cache_dtype": "fp8_e4m3"}, ((8, 9),), (), {"torch": "2.9.1"})
    assert evaluate(node, fp8).value is False
    # No GPU known and no torch version: unknown, and the leaves are named.
    verdict = evaluate(node, Facts(SERVED))
    assert verdict.value is None
    assert verdict.unknown == (
        "compute_capability = '>=8.6,<9.0'",
        "gpu_name = '*5090*'",
        "torch = '>=2.9'",
    )
    # A false leaf decides an `all` whatever the unknown ones (Kleene).
    other = Facts({"architecture": "LlamaForCausalLM"})
    assert evaluate(node, other).value is False
    # Nothing served known: the served leaves are unknown too.
    assert "architecture = ['qwen3next*', '*mamba*']" in evaluate(node, Facts()).unknown


def test_kleene_any_and_not() -> None:
    node = parse({"any": [{"torch": ">=2.9"}, {"python": ">=3.12"}]})
    assert evaluate(node, Facts(versions={"python": "3.12.3"})).value is True
    assert evaluate(node, Facts(versions={"python": "3.11.9"})).value is None
    assert evaluate(node, Facts(versions={"python": "3.11.9", "torch": "2.8.0"})).value is False
    assert evaluate(parse({"not": {"torch": ">=2.9"}}), Facts()).value is None
    assert evaluate(None, Facts()).value is True


def test_served_defaults_and_the_kv_cache_family() -> None:
    quantized = parse({"quantization": "gptq*"})
    assert evaluate(quantized, Facts({"model": "x"})).value is False  # known: no quantization
    assert evaluate(parse({"model": "x"}), Facts({"dtype": "auto"})).value is None
    family = parse({"kv_cache_family": "turboquant"})
    assert evaluate(family, Facts({"kv_cache_dtype": "turboquant_3bit"})).value is True
    assert evaluate(family, Facts({})).value is False  # auto
    several = parse({"dtype": "bfloat16", "speculative": "mtp"})  # two leaves: both
    assert evaluate(several, Facts({"dtype": "bfloat16", "speculative": "mtp"})).value is True
    assert evaluate(several, Facts({"dtype": "bfloat16"})).value is False


def test_hardware_leaves() -> None:
    two = Facts(compute_capability=((12, 0), (12, 0)), gpu_names=("RTX 5090", "RTX 5090"))
    assert evaluate(parse({"gpu_count": ">=2"}), two).value is True
    assert evaluate(parse({"gpu_name": ["*5090*"]}), two).value is True
    # every GPU must be in the scope; no GPU is in none
    mixed = Facts(compute_capability=((12, 0), (8, 9)))
    assert evaluate(parse({"compute_capability": ">=12.0"}), mixed).value is False
    assert (
        evaluate(parse({"compute_capability": ">=12.0"}), Facts(compute_capability=())).value
        is False
    )


@pytest.mark.parametrize(
    ("version", "spec", "holds"),
    [
        ("2.9.0+cu130", ">=2.9", True),
        ("2.10.0a0+git1234", ">=2.10", False),
        ("2.10.0a0", ">=2.9,<2.10", True),
        ("2.9.1", "==2.9.*", True),
        ("3.0", "==2.9.*", False),
        ("12.8.1", "~=12.8", True),
        ("13.0", "~=12.8", False),
        ("575.57.08", ">=570", True),
        ("2.9", "==2.9.0", True),
        ("3.4.0.post1", ">3.4.0", True),
    ],
)
def test_version_specifiers(version: str, spec: str, holds: bool) -> None:
    assert satisfies(version, spec) is holds


def test_versions_sort() -> None:
    order = ["2.9.0.dev1", "2.9.0a1", "2.9.0rc1", "2.9.0", "2.9.0.post1", "2.10.0"]
    assert sorted(order, key=version_key) == order


@pytest.mark.parametrize(
    ("data", "where", "message"),
    [
        ({"archtecture": "x"}, "applies.archtecture", "did you mean 'architecture'"),
        ({"any": []}, "applies.any", "an empty list"),
        ({"all": [{"torch": 2}]}, "applies.all[0].torch", "got an integer"),
        ({"all": {"torch": ">=2"}}, "applies.all", "expected a list of tables"),
        ({"not": {"torch": "banana"}}, "applies.not.torch", "not a version clause"),
        ({"any": [{"gpu_count": ">=x"}]}, "applies.any[0].gpu_count", "is not a version"),
        ({"compute_capability": "===12.0"}, "applies.compute_capability", "clause"),
        ({"all": [{"torch": ">=2"}], "torch": ">=2"}, "applies", "goes alone"),
        ({}, "applies", "an empty table"),
        ({"model": []}, "applies.model", "non-empty list"),
    ],
)
def test_bad_predicates_name_the_key_path(data: object, where: str, message: str) -> None:
    with pytest.raises(PredicateError, match=message) as caught:
        parse(data)
    assert caught.value.where == where


def test_the_tree_round_trips() -> None:
    node = parse(EXAMPLE)
    assert parse(node.to_data()) == node
    assert "not (kv_cache_dtype = 'fp8*')" in node.describe()


def test_switch_words() -> None:
    for word in ("1", "true", " YES ", "On"):
        assert switch_word(word) is True
    for word in ("0", "false", "no", "OFF "):
        assert switch_word(word) is False
    assert switch_word("") is None and switch_word("  ") is None and switch_word(None) is None
    with pytest.raises(ValueError, match="not a switch value"):
        switch_word("enabled")
    assert switch_on("X_ON", False, {"X_ON": "1"}) is True
    assert switch_on("X_ON", True, {}) is True
    with pytest.raises(ValueError, match="X_ON='2'"):
        switch_on("X_ON", True, {"X_ON": "2"})


def test_versions_read_from_dist_info_without_importing(tmp_path: Path) -> None:
    for folder, name, version in (
        ("torch-2.9.0+cu130.dist-info", "torch", "2.9.0+cu130"),
        ("triton-3.5.0.dist-info", "Triton", "3.5.0"),
        ("vllm-0.20.0.dist-info", "vllm", "0.20.0"),
    ):
        (tmp_path / folder).mkdir()
        meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n\nbody\n"
        (tmp_path / folder / "METADATA").write_text(meta)
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('imported')\n")
    assert installed_versions(tmp_path) == {"torch": "2.9.0+cu130", "triton": "3.5.0"}
    assert installed_versions(tmp_path / "none") == {}
