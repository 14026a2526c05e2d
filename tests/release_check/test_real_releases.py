"""Both real patches against real vLLM releases from the package index (sha256-checked, cached).

0.19.1 is the release the TMA diff was written against; 0.17.0 is the one its author tested;
0.20.0 is where upstream took another route (FLA_USE_TMA) and the TurboQuant backend appears.
"""

from __future__ import annotations

import ast
import py_compile
from pathlib import Path

import pytest

from patchset.engine.apply import apply
from patchset.errors import ExitCode
from patchset.registry import load_registry
from tests.helpers.releases import materialize, tree_digest

pytestmark = pytest.mark.network

REGISTRY = load_registry(Path(__file__).parents[2] / "patches")
TMA = REGISTRY.get("fla-tma-sm12x")
TOLIST = REGISTRY.get("tolist-cudagraph")
UTILS = TMA.targets[0]
TQ = TOLIST.targets[0]


def tma_condition(source: str) -> str:
    """The right-hand side of the module-level `is_tma_supported` assignment."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.Assign) and any(
            isinstance(t, ast.Name) and t.id == "is_tma_supported" for t in node.targets
        ):
            return ast.unparse(node.value)
    raise AssertionError("no is_tma_supported assignment")


@pytest.mark.parametrize("version", ["0.17.0", "0.19.1"])
def test_tma_patch_on_its_releases(tmp_path: Path, version: str) -> None:
    tree = materialize(version, tmp_path, [UTILS])
    report = apply(REGISTRY, tree, patches=["fla-tma-sm12x"])
    assert report.vllm == version
    assert [r.outcome for r in report.results] == ["applied"]
    assert report.exit_code == ExitCode.OK and report.written
    py_compile.compile(str(tree / UTILS), doraise=True)
    condition = tma_condition((tree / UTILS).read_text())
    assert "9 <= torch.cuda.get_device_capability(0)[0] < 12" in condition
    before = tree_digest(tree)
    again = apply(REGISTRY, tree, patches=["fla-tma-sm12x"])
    assert [r.outcome for r in again.results] == ["already-applied"]
    assert again.exit_code == ExitCode.OK  # ends present; --strict keeps 6
    strict = apply(REGISTRY, tree, patches=["fla-tma-sm12x"], strict=True)
    assert strict.exit_code == ExitCode.ALREADY_APPLIED
    assert tree_digest(tree) == before


def test_tma_patch_does_not_fit_020_and_changes_nothing(tmp_path: Path) -> None:
    tree = materialize("0.20.0", tmp_path, [UTILS])
    before = tree_digest(tree)
    # 0.20.0 holds the upstream fix (FLA_USE_TMA): the probe wins and nothing is written
    report = apply(REGISTRY, tree, patches=["fla-tma-sm12x"], ignore_range=True)
    (result,) = report.results
    assert result.outcome == "upstream"
    assert report.exit_code == ExitCode.UPSTREAM
    assert tree_digest(tree) == before
    # forced past the probe, the diff itself does not fit: a conflict, still nothing written
    forced = apply(REGISTRY, tree, patches=["fla-tma-sm12x"], ignore_range=True, force=True)
    (result,) = forced.results
    assert result.outcome == "conflict"
    assert any("FLA_USE_TMA" in line for line in result.details)  # the nearest lines shown
    assert forced.exit_code == ExitCode.ATTENTION
    assert tree_digest(tree) == before
    in_range = apply(REGISTRY, tree, patches=["fla-tma-sm12x"])
    assert [r.outcome for r in in_range.results] == ["out-of-range"]
    assert tree_digest(tree) == before


def test_tolist_patch_on_020(tmp_path: Path) -> None:
    tree = materialize("0.20.0", tmp_path, [TQ])
    original = (tree / TQ).read_text()
    report = apply(REGISTRY, tree, patches=["tolist-cudagraph"])
    assert [r.outcome for r in report.results] == ["applied"], report.to_dict()
    text = (tree / TQ).read_text()
    py_compile.compile(str(tree / TQ), doraise=True)
    assert text.count("torch.cuda.is_current_stream_capturing()") == 2
    assert text.count("# patchset: tolist-cudagraph site") == 2
    module = ast.parse(text)
    prefill = next(
        n
        for n in ast.walk(module)
        if isinstance(n, ast.FunctionDef) and n.name == "_prefill_attention"
    )
    first, guard = prefill.body[0], prefill.body[1]
    assert ast.unparse(first) == "N, Hq, D = query.shape"
    assert isinstance(guard, ast.If)
    assert "is_current_stream_capturing" in ast.unparse(guard.test)
    # the original sync is kept for the non-capturing path
    assert "prefill_max_seq = max(attn_metadata.seq_lens[num_decodes:].tolist())" in text
    again = apply(REGISTRY, tree, patches=["tolist-cudagraph"])
    assert [r.outcome for r in again.results] == ["already-applied"]
    assert (tree / TQ).read_text() == text
    from patchset.engine.apply import revert

    assert revert(REGISTRY, tree, patches=["tolist-cudagraph"]).written
    assert (tree / TQ).read_text() == original


def test_tolist_target_missing_on_0191(tmp_path: Path) -> None:
    tree = materialize("0.19.1", tmp_path, [TQ, UTILS])
    before = tree_digest(tree)
    report = apply(REGISTRY, tree, patches=["tolist-cudagraph"], ignore_range=True)
    assert [r.outcome for r in report.results] == ["missing-target"]
    assert report.exit_code == ExitCode.MISSING_TARGET
    assert tree_digest(tree) == before


def test_tolist_partial_on_021_writes_nothing(tmp_path: Path) -> None:
    tree = materialize("0.21.0", tmp_path, [TQ])
    before = tree_digest(tree)
    # 0.21.0 removed both syncs upstream: the probe says so and nothing is written
    report = apply(REGISTRY, tree, patches=["tolist-cudagraph"], ignore_range=True)
    assert [r.outcome for r in report.results] == ["upstream"]
    assert report.exit_code == ExitCode.UPSTREAM
    assert tree_digest(tree) == before
    # forced past the probe: one site fits, one does not, so the whole patch is refused as
    # partial (apply keeps evaluate's word since the outcome vocabulary was made one; exit 1)
    report = apply(REGISTRY, tree, patches=["tolist-cudagraph"], ignore_range=True, force=True)
    (result,) = report.results
    assert result.outcome == "partial"
    assert report.exit_code == ExitCode.ATTENTION
    assert any("a-forward-prefill-max-seq: anchor-not-found" in d for d in result.details)
    assert any("b-prefill-attention-capture: applies" in d for d in result.details)
    assert tree_digest(tree) == before
