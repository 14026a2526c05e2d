"""The noxfile is the developers' entry point: its sessions come from builds/*.toml."""

from __future__ import annotations

from pathlib import Path

from tests.helpers.cli import nox_sessions

REPO = Path(__file__).parents[2]


def test_build_sessions_are_generated_from_builds() -> None:
    sessions = nox_sessions(REPO, "--noxfile", str(REPO / "noxfile.py"))
    expected = {f"build-{p.stem}" for p in (REPO / "builds").glob("*.toml")}
    assert {"build-0.19.1", "build-0.20.0"} <= expected
    assert expected | {"tests", "lint"} <= sessions
