"""The noxfile is the developers' entry point: its sessions come from builds/*.toml."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[2]


def test_build_sessions_are_generated_from_builds() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "--list", "--noxfile", str(REPO / "noxfile.py")],
        capture_output=True,
        text=True,
        check=False,
        cwd=REPO,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    sessions = {line.split()[1] for line in proc.stdout.splitlines() if line[:2] in ("* ", "- ")}
    expected = {f"build-{p.stem}" for p in (REPO / "builds").glob("*.toml")}
    assert {"build-0.19.1", "build-0.20.0"} <= expected
    assert expected | {"tests", "lint"} <= sessions
