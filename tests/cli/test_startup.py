"""Start-up: the command line imports a command's module, and that module its library, only
when the command runs (docs/ci.md). Held by what a fresh interpreter has imported, not by a
timing: `import patchset.cli.main`, `patchset --version` and a `patchset check` of one folder
must leave the modules of other commands out of `sys.modules`."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.helpers.cli import REPO, cli, environment

# Run in a fresh interpreter: the argv after `-c` is the command line (none: import only).
PROBE = """
import contextlib, io, json, sys
import patchset.cli.main as cli_main
if sys.argv[1:]:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        try:
            cli_main.main(sys.argv[1:])
        except SystemExit:
            pass
print(json.dumps(sorted(sys.modules)))
"""

# What no command but its own needs: authoring (add, update), the forge (add, upstream), the
# importers, image builds and the Docker SDK, the audit and bump, refresh.
OTHERS = (
    "patchset.authoring",
    "patchset.adapters.forge",
    "patchset.importers",
    "patchset.image.build",
    "patchset.image.export",
    "docker",
    "patchset.upstream",
    "patchset.refresh",
    "patchset.cli.commands.add",
    "patchset.cli.commands.import_",
)


def imported(*argv: str, cwd: Path = REPO) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-c", PROBE, *argv],
        cwd=cwd,
        env=environment({"PATCHSET_CACHE_DIR": str(cwd / "cache")}),
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    return set(json.loads(done.stdout))


def test_importing_the_command_line_imports_no_command_and_no_library() -> None:
    found = imported()
    assert "patchset.cli.main" in found  # the probe did run
    heavy = ("patchset.registry", "patchset.release_check", "patchset.sources", "rich")
    for name in (*OTHERS, *heavy, "patchset.cli.commands.check"):
        assert name not in found, name


def test_version_builds_no_command_parser() -> None:
    found = imported("--version")
    assert not {m for m in found if m.startswith("patchset.cli.commands.")}
    assert "patchset.registry" not in found and "rich" not in found


def test_a_check_imports_what_it_uses_only(tmp_path: Path) -> None:
    tree = tmp_path / "tree" / "vllm"
    tree.mkdir(parents=True)
    (tree / "__init__.py").write_text("")
    argv = ("check", "--registry", str(REPO / "patches"), "--source", str(tree.parent))
    found = imported(*argv, "--source-version", "0.19.1", cwd=tmp_path)
    assert {"patchset.cli.commands.check", "patchset.release_check"} <= found  # it ran
    for name in OTHERS:
        assert not any(m == name or m.startswith(name + ".") for m in found), name
    assert "rich.progress" not in found  # no terminal: no progress bar to draw


@pytest.mark.parametrize("argv", [["--reg", "patches", "list"], ["-q", "--builds=b", "list"]])
def test_a_command_after_abbreviated_global_options_still_runs(argv: list[str]) -> None:
    """The command word is found past the global options; one it misses (an abbreviation)
    still parses, from the whole parser."""
    result = cli(*argv)
    assert result.code == 0, result.err
    assert "fla-tma-sm12x" in result.out
