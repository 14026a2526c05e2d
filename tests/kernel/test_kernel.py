"""The standard-library kernel's compute-capability scopes and vLLM locator, without an image."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from patchset.kernel import vllm
from patchset.kernel.capability import in_scope, parse_capability, parse_scope
from patchset.kernel.hunks import Hunk
from tests.sources.test_folder_source import make_folder


@pytest.mark.parametrize(
    ("scope", "capability", "expected"),
    [
        (None, None, True),
        ("", (9, 0), True),
        (">=12.0", None, False),
        (">=12.0", (12, 0), True),
        (">=12.0", (9, 0), False),
        (">=9.0,<12.0", (9, 0), True),
        (">=9.0,<12.0", (12, 0), False),
        (">=9.0, <12.0", (10, 3), True),
        (">12", (12, 0), False),
        (">12", (12, 1), True),
        ("==12", (12, 0), True),
        ("!=12.0", (12, 0), False),
        ("<=8.9", (8, 9), True),
        ("~=12.0", (12, 0), True),
        ("~=12.0", (12, 1), True),
        ("~=12.0", (13, 0), False),
        ("~=12.1", (12, 0), False),
        ("==12.*", (12, 1), True),
        ("==12.*", (10, 0), False),
        ("!=12.*", (12, 1), False),
        ("!=12.*", (9, 0), True),
    ],
)
def test_scopes(scope: str | None, capability: tuple[int, int] | None, expected: bool) -> None:
    assert in_scope(scope, capability) is expected


@pytest.mark.parametrize(
    ("scope", "message"),
    [
        ("===12.0", "is not a compute-capability clause"),
        (">=12.0.1", "is not a compute-capability clause"),
        (">=12.0a1", "is not a compute-capability clause"),
        ("sm_120", "is not a compute-capability clause"),
        (">=12.*", "'.*' goes with == or != only"),
        ("~=12", "'~=' needs major.minor"),
        (">=9.0,", "'' in '>=9.0,' is not a compute-capability clause"),
    ],
)
def test_scopes_that_cannot_run_are_refused(scope: str, message: str) -> None:
    with pytest.raises(ValueError, match=r"compute-capability|goes with|needs") as info:
        parse_scope(scope)
    assert message in str(info.value)
    assert "\n" not in str(info.value)


def test_capabilities() -> None:
    assert parse_capability("12.0") == (12, 0)
    assert parse_capability(" 9 ") == (9, 0)
    with pytest.raises(ValueError, match="not a compute capability"):
        parse_capability("sm_120")


def test_version_readers_in_order(tmp_path: Path) -> None:
    scm = "__version__ = version = '0.19.1'\n"
    root = make_folder(tmp_path / "a", {"vllm/_version.py": scm})
    assert vllm.read_version(root) == ("0.19.1", str(root / "vllm" / "_version.py"))
    meta = "Metadata-Version: 2.1\nName: vllm\nVersion: 0.19.1+cu130\n\nbody\n"
    root = make_folder(tmp_path / "b", {"vllm-0.19.1+cu130.dist-info/METADATA": meta})
    assert vllm.read_version(root) == ("0.19.1+cu130", str(root / "vllm-0.19.1+cu130.dist-info"))
    both = make_folder(
        tmp_path / "d", {"vllm/_version.py": scm, "vllm-0.19.1.dist-info/METADATA": meta}
    )
    assert vllm.read_version(both) == ("0.19.1", str(both / "vllm" / "_version.py"))
    found = vllm.read_version(make_folder(tmp_path / "vllm-0.17.0", {}))
    assert found is not None and found[0] == "0.17.0"
    assert vllm.read_version(make_folder(tmp_path / "c", {"vllm/_version.py": "x = 1\n"})) is None


def test_target_root_names_the_problem(tmp_path: Path) -> None:
    with pytest.raises(vllm.NotATargetError, match="does not exist") as info:
        vllm.target_root(tmp_path / "nope")
    assert info.value.path == tmp_path / "nope"
    (tmp_path / "vllm").mkdir()
    with pytest.raises(vllm.NotATargetError, match="pass its parent folder"):
        vllm.target_root(tmp_path / "vllm")
    root = make_folder(tmp_path / "ok", {})
    assert vllm.target_root(root) == root


def test_locate_script_runs_in_a_bare_python(tmp_path: Path) -> None:
    """The script sent into images, run by a python3 without site-packages (so no patchset),
    whose path starts with the current folder, as `python3 -c` does."""
    site = make_folder(tmp_path / "site", {"vllm/_version.py": "__version__ = '0.20.1'\n"})
    out = subprocess.run(
        [sys.executable, "-S", "-c", vllm.locate_script()],
        cwd=site,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    found = json.loads(out.strip().splitlines()[-1])
    assert Path(found["root"]).resolve() == site.resolve()
    assert found["folder"] == str((site / "vllm").resolve())
    assert found["version"] == "0.20.1"
    assert found["via"].endswith("_version.py")


def test_a_hunk_survives_the_manifest() -> None:
    """The image manifest's JSON form of a hunk reads back as the same hunk in the image."""
    hunk = Hunk(3, 10, 11, ((" ", "a"), ("-", "b"), ("+", "c")), "def f():", False, True)
    assert Hunk.from_json(json.loads(json.dumps(hunk.to_json()))) == hunk
