"""The NVIDIA driver and CUDA runtime versions `[applies]` reads: the driver from the one
nvidia-smi query (a fake nvidia-smi script on PATH answering what a real one prints), the CUDA
runtime from dist-info (a fake site-packages tree; torch is never imported)."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.engine import gates
from patchset.kernel import gpus, startup
from patchset.kernel.predicates import cuda_version, evaluate, parse

# Refuses any other question: the driver must come from the very query that lists the GPUs.
FAKE_SMI = """#!/bin/sh
echo "$*" >> "{calls}"
if [ "$1" != "--query-gpu=name,compute_cap,driver_version" ] \\
        || [ "$2" != "--format=csv,noheader" ]; then
    echo "fake nvidia-smi: unexpected arguments: $*" >&2; exit 2
fi
printf '%s\\n' {lines}
"""


def fake_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *lines: str) -> Path:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    calls = tmp_path / "calls"
    quoted = " ".join(f"'{line}'" for line in lines)
    (bin_dir / "nvidia-smi").write_text(FAKE_SMI.format(calls=calls, lines=quoted))
    (bin_dir / "nvidia-smi").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    return calls


def dist_info(site: Path, name: str, version: str) -> None:
    folder = site / f"{name.replace('-', '_')}-{version}.dist-info"
    folder.mkdir(parents=True)
    (folder / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n")


def test_driver_comes_from_the_one_query(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls = fake_smi(
        tmp_path,
        monkeypatch,
        "NVIDIA GeForce RTX 5090, 12.0, 575.57.08",
        "NVIDIA GeForce RTX 3090, 8.6, 575.57.08",
    )
    found = gpus.query()
    assert [g.capability for g in found.gpus] == [(12, 0), (8, 6)]
    assert [g.name for g in found.gpus] == ["NVIDIA GeForce RTX 5090", "NVIDIA GeForce RTX 3090"]
    assert found.driver == "575.57.08"
    detected = gpus.detect(None)
    assert detected.driver == "575.57.08" and detected.capabilities == [(12, 0), (8, 6)]
    assert len(calls.read_text().splitlines()) == 2  # one call per query, no second question


@pytest.mark.parametrize(
    ("line", "name", "driver"),
    [
        ("NVIDIA GeForce RTX 5090, 12.0, [N/A]", "NVIDIA GeForce RTX 5090", None),
        ("NVIDIA GeForce RTX 5090, 12.0", "NVIDIA GeForce RTX 5090", None),  # no driver field
        ("Some, GPU, 8.9, 580.1", "Some, GPU", "580.1"),  # a name holding commas
    ],
)
def test_a_line_without_a_driver_leaves_it_unknown(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, line: str, name: str, driver: str | None
) -> None:
    fake_smi(tmp_path, monkeypatch, line)
    found = gpus.query()
    assert [g.name for g in found.gpus] == [name] and found.driver == driver


def test_forced_capability_asks_no_nvidia_smi(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    calls = fake_smi(tmp_path, monkeypatch, "NVIDIA GeForce RTX 5090, 12.0, 575.57.08")
    assert gpus.detect("8.6") == ([(8, 6)], None, "8.6 (PATCHSET_COMPUTE_CAPABILITY)", None)
    assert not calls.exists()


def test_cuda_runtime_from_dist_info_never_imported(tmp_path: Path) -> None:
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise SystemExit('imported')\n")
    dist_info(tmp_path, "torch", "2.9.0+cu128")
    assert cuda_version(tmp_path) == "12.8"  # torch's local version, when no runtime wheel
    dist_info(tmp_path, "nvidia-cuda-runtime-cu12", "12.8.90")
    assert cuda_version(tmp_path) == "12.8.90"  # the runtime's own distribution wins
    other = tmp_path / "cu13"
    dist_info(other, "torch", "2.9.0+cu130")
    dist_info(other, "nvidia-cuda-runtime", "13.0.48")
    assert cuda_version(other) == "13.0.48"
    plain = tmp_path / "plain"
    dist_info(plain, "torch", "2.9.0")
    assert cuda_version(plain) is None  # nothing says: unknown
    assert cuda_version(tmp_path / "absent") is None


def test_start_facts_hold_driver_and_cuda(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The entrypoint's facts: the predicate on both versions holds with nothing set, and
    PATCHSET_CUDA_VERSION / PATCHSET_DRIVER_VERSION still win."""
    monkeypatch.delenv("PATCHSET_CUDA_VERSION", raising=False)
    monkeypatch.delenv("PATCHSET_DRIVER_VERSION", raising=False)
    dist_info(tmp_path, "nvidia-cuda-runtime-cu12", "12.8.90")
    calls = fake_smi(tmp_path, monkeypatch, "NVIDIA GeForce RTX 5090, 12.0, 575.57.08")
    caps, names, _how, driver = gpus.detect(None)
    known = startup.facts({}, caps, names, tmp_path, driver)
    assert known.versions["cuda"] == "12.8.90" and known.versions["driver"] == "575.57.08"
    wanted = parse({"all": [{"cuda": ">=12.8"}, {"driver": ">=570"}]})
    verdict = evaluate(wanted, known)
    assert verdict.value is True and not verdict.unknown
    monkeypatch.setenv("PATCHSET_DRIVER_VERSION", "550.1")
    assert evaluate(wanted, startup.facts({}, caps, names, tmp_path, driver)).value is False
    monkeypatch.delenv("PATCHSET_DRIVER_VERSION")
    empty = startup.facts({}, caps, names, tmp_path / "none", None)
    verdict = evaluate(wanted, empty)
    assert verdict.value is None and "cuda" in verdict.describe_unknown()
    assert len(calls.read_text().splitlines()) == 1


def test_host_apply_facts_hold_driver_and_cuda(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    dist_info(tmp_path, "torch", "2.9.0+cu130")
    fake_smi(tmp_path, monkeypatch, "NVIDIA GeForce RTX 5090, 12.0, 580.82.07")
    known = gates.facts(tmp_path, None, gates.hardware(gates.DETECT), this_python=False)
    assert known.versions["cuda"] == "13.0" and known.versions["driver"] == "580.82.07"
    forced = gates.facts(tmp_path, None, gates.hardware((12, 0)), this_python=False)
    assert "driver" not in forced.versions  # --compute-capability: nvidia-smi not asked
