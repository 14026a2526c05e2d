"""`patchset check` against real releases from the package index (sha256-checked, cached)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.release_check import check
from patchset.sources.folder import FolderSource
from tests.helpers.cli import run_cli
from tests.helpers.releases import materialize

pytestmark = pytest.mark.network
REPO = Path(__file__).parents[2]
REGISTRY = load_registry(REPO / "patches")


def test_verdicts_across_releases() -> None:
    report = check(REGISTRY, ["0.17.0", "0.19.1", "0.20.0", "0.21.0", "0.26.0"])
    tma, tolist = "fla-tma-sm12x", "tolist-cudagraph"
    # the releases the TMA diff was written for / tested on
    for version in ("0.17.0", "0.19.1"):
        r = report.result(version, tma)
        assert (r.verdict, r.in_range, r.signals.reverse) == ("needed", True, False)
    # 0.20.0: upstream took another route (FLA_USE_TMA): the diff conflicts, the probe matches
    r = report.result("0.20.0", tma)
    assert r.verdict == "upstream" and not r.in_range
    assert r.signals.forward == "conflict" and r.signals.probe is True
    assert "FLA_USE_TMA" in r.detail
    # 0.26.0: the file moved into vllm/third_party
    r = report.result("0.26.0", tma)
    assert r.verdict == "missing-target"
    assert r.moved_to == ("vllm/third_party/flash_linear_attention/ops/utils.py",)
    # the probe follows the move: the moved file holds upstream's FLA_USE_TMA opt-in
    assert r.signals.probe is True
    assert r.disagreement is not None and "moved file" in r.disagreement
    # the runtime patch: absent file before 0.20.0, needed in 0.20.0, upstream from 0.21.0
    assert report.result("0.19.1", tolist).verdict == "missing-target"
    assert report.result("0.20.0", tolist).verdict == "needed"
    r = report.result("0.21.0", tolist)
    assert r.verdict == "upstream" and r.signals.forward == "partial"
    assert r.disagreement is not None  # site B still matches: said, not hidden
    assert report.exit_code == ExitCode.OK
    assert report.suggested[tma] == (">=0.17.0,<0.20.0",)
    assert report.suggested[tolist] == (">=0.20.0,<0.21.0",)


def test_in_range_partial_is_attention(tmp_path: Path) -> None:
    """A release inside the declared range where a site drifted: exit 1, verdict partial."""
    materialize("0.21.0", tmp_path, ["vllm/v1/attention/backends/turboquant_attn.py"])
    version_file = tmp_path / "vllm" / "_version.py"
    version_file.write_text("__version__ = version = '0.20.5'\n")  # pretend: inside the range
    tq = tmp_path / "vllm/v1/attention/backends/turboquant_attn.py"
    text = tq.read_text().replace("query_start_loc_cpu.tolist()", "query_start_loc.cpu().tolist()")
    tq.write_text(text)  # the upstream probe no longer matches
    report = check(
        REGISTRY, ["0.20.5"], source=FolderSource(tmp_path), patches=["tolist-cudagraph"]
    )
    (r,) = report.results
    assert (r.verdict, r.in_range) == ("partial", True)
    assert "a-forward-prefill-max-seq: anchor-not-found" in r.detail
    assert report.exit_code == ExitCode.ATTENTION


def test_cli_json_schema_and_markdown() -> None:
    proc = run_cli("check", "--vllm", "0.19.1", "--vllm", "0.20.0", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert data["schema"] == "patchset.check/1"
    assert data["registry"] == REGISTRY.digest
    assert {(r["vllm"], r["patch"], r["verdict"], r["in_range"]) for r in data["results"]} == {
        ("0.19.1", "fla-tma-sm12x", "needed", True),
        ("0.19.1", "tolist-cudagraph", "missing-target", False),
        ("0.20.0", "fla-tma-sm12x", "upstream", False),
        ("0.20.0", "tolist-cudagraph", "needed", True),
    }
    assert all(isinstance(r["detail"], str) and r["detail"] for r in data["results"])
    md = run_cli("check", "--vllm", "0.19.1", "--format", "markdown").stdout
    assert "| `fla-tma-sm12x` r1 | needed |" in md


def test_cli_offline_from_cache() -> None:
    """Offline, from the cache only (an index that cannot answer): the same verdicts as
    online. The online run first, so the test does not lean on another one's cache."""
    online = run_cli("check", "--vllm", "0.19.1", "--format", "json")
    assert online.returncode == 0, online.stderr
    proc = run_cli(
        "check", "--vllm", "0.19.1", "--offline", "--index-url", "http://127.0.0.1:9/simple",
        "--format", "json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    verdicts = {(r["patch"], r["verdict"], r["in_range"]) for r in data["results"]}
    assert verdicts == {
        ("fla-tma-sm12x", "needed", True),
        ("tolist-cudagraph", "missing-target", False),
    }
    assert verdicts == {
        (r["patch"], r["verdict"], r["in_range"]) for r in json.loads(online.stdout)["results"]
    }
    assert data["registry"] == REGISTRY.digest


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (("--vllm", "banana"), 2, "'banana' is not a PEP 440 version"),
        (("--vllm", "0.19.99"), 3, "0.19.99"),
        (("--source", "git:/nonexistent/clone", "--vllm", "0.19.1"), 3, "/nonexistent/clone"),
    ],
)
def test_cli_bad_input(args: tuple[str, ...], code: int, message: str) -> None:
    proc = run_cli("check", *args)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0]


def test_cli_unreachable_index() -> None:
    proc = run_cli("check", "--vllm", "0.18.0", "--index-url", "http://127.0.0.1:9/simple")
    assert proc.returncode == 3
    assert "cannot reach the package index" in proc.stderr
    assert "Traceback" not in proc.stderr
