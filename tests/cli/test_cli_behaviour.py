"""The command line as a CI job meets it: global options anywhere, -q/-v, the internal-error
catch-all, a closed pipe, piped output never wrapped, did-you-mean, completion, --help."""

from __future__ import annotations

import json
import logging
import os
import pty
import select
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from filelock import FileLock

from patchset.cli import main as cli_main
from patchset.cli.commands import registry as registry_cmd
from patchset.errors import ExitCode
from patchset.registry import load_registry
from tests.helpers.cli import cli, command, run_cli
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch, make_tree

REPO = Path(__file__).parents[2]
PATCHES = str(REPO / "patches")


@pytest.mark.parametrize(
    "argv",
    [
        ["--registry", PATCHES, "validate", "--format", "json"],
        ["validate", "--registry", PATCHES, "--format", "json"],
        ["validate", "--format", "json", "--registry", PATCHES],
    ],
)
def test_global_options_before_or_after_the_command(
    argv: list[str],
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # ./patches does not exist here: only --registry can find it
    assert cli_main.main(argv) == 0
    assert json.loads(capsys.readouterr().out)["patches"] == 2


def test_a_registry_after_the_command_wins_over_one_before(tmp_path: Path) -> None:
    """Which registry was read, not only that one was: a one-patch copy against the real
    two-patch registry, each in both places."""
    one = tmp_path / "one"
    shutil.copytree(Path(PATCHES) / "fla-tma-sm12x", one / "fla-tma-sm12x")
    after = cli("--registry", one, "validate", "--registry", PATCHES, "--format", "json")
    assert after.code == 0, after.err
    assert json.loads(after.out)["patches"] == 2
    assert json.loads(after.out)["registry"] == load_registry(PATCHES).digest
    before = cli("--registry", PATCHES, "validate", "--registry", one, "--format", "json")
    assert before.code == 0, before.err
    assert json.loads(before.out)["patches"] == 1
    assert json.loads(before.out)["registry"] == load_registry(one).digest


def test_an_internal_error_has_its_own_exit_code_and_one_line(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    def broken(*_: object, **__: object) -> object:
        raise ValueError("unexpected\nstate")

    monkeypatch.setattr(registry_cmd, "load_registry", broken)
    monkeypatch.delenv("PATCHSET_DEBUG", raising=False)
    assert cli_main.main(["validate", "--registry", PATCHES]) == ExitCode.INTERNAL
    assert ExitCode.INTERNAL.value == 70
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith("patchset: error: internal error: ValueError: unexpected\\nstate")
    assert "--traceback" in err and "PATCHSET_DEBUG=1" in err

    assert cli_main.main(["validate", "--registry", PATCHES, "--traceback"]) == 70
    assert "Traceback (most recent call last)" in capsys.readouterr().err
    monkeypatch.setenv("PATCHSET_DEBUG", "1")
    assert cli_main.main(["validate", "--registry", PATCHES]) == 70
    assert "raise ValueError" in capsys.readouterr().err


def test_a_closed_pipe_is_quiet() -> None:
    proc = subprocess.Popen(
        command("completion", "bash"),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # like `| head -0`: the reader is gone before anything is written
    with proc.stderr:
        err = proc.stderr.read()
    assert proc.wait(timeout=60) == 141
    assert err == b""


def test_piped_output_is_never_wrapped() -> None:
    proc = run_cli("--registry", PATCHES, "validate", env={"COLUMNS": "40"})
    (line,) = proc.stdout.splitlines()
    assert line.endswith("2 patches valid; digest sha256:" + line.rsplit(":", 1)[1])
    assert len(line) > 80
    shown = run_cli("show", "fla-tma-sm12x", "--registry", PATCHES).stdout
    diff = (REPO / "patches" / "fla-tma-sm12x" / "patch.diff").read_text()
    assert diff.strip() in shown  # the payload exactly, long lines whole


def test_a_mistyped_command_gets_a_suggestion() -> None:
    proc = run_cli("chek", "--vllm", "0.20.0")
    assert proc.returncode == 2
    assert proc.stderr.strip().endswith("did you mean 'check'?")
    proc = run_cli("list", "--format", "jsno")
    assert proc.returncode == 2 and "did you mean 'json'?" in proc.stderr


def test_a_usage_error_under_format_github_is_an_annotation_too() -> None:
    proc = run_cli("check", "--vllm", "0.20.0", "--fuzz", "many", "--format", "github")
    assert proc.returncode == 2
    (line,) = proc.stdout.splitlines()
    assert line.startswith("::error title=patchset::patchset check: argument --fuzz: invalid int")
    assert "invalid int value: 'many'" in proc.stderr


def test_verbose_shows_info_lines_and_quiet_hides_warnings(
    capsys: pytest.CaptureFixture[str],
) -> None:
    log = logging.getLogger("patchset.adapters.net")
    cli_main.configure_logging(0, 0)
    log.info("retrying")
    log.warning("careful")
    assert capsys.readouterr().err == "patchset: warning: careful\n"
    cli_main.configure_logging(1, 0)
    log.info("retrying in 1.0s")
    assert capsys.readouterr().err == "patchset: retrying in 1.0s\n"
    cli_main.configure_logging(0, 1)
    log.warning("careful")
    assert capsys.readouterr().err == ""
    cli_main.reset_logging()
    assert logging.getLogger("patchset").propagate  # main() leaves logging as it found it


def test_every_command_help_names_exit_codes_and_an_example(
    capsys: pytest.CaptureFixture[str],
) -> None:
    parser = cli_main.build_parser()
    commands = next(a for a in parser._actions if a.dest == "command").choices
    assert commands is not None
    paths = [[name] for name in commands] + [["runtime", "export"]]
    for name in paths:
        with pytest.raises(SystemExit):
            cli_main.main([*name, "--help"])
        text = capsys.readouterr().out
        assert "exit codes:" in text, name
        assert "\nexample:\n  patchset " in text, name
        assert "--registry DIR" in text and "--verbose" in text, name


@pytest.mark.parametrize("shell", ["bash", "zsh"])
def test_completion_scripts_name_every_command(shell: str) -> None:
    proc = run_cli("completion", shell)
    assert proc.returncode == 0, proc.stderr
    for word in ("check", "validate", "apply", "refresh"):
        assert word in proc.stdout
    if shell == "bash":
        check = subprocess.run(["bash", "-n"], input=proc.stdout, text=True, check=False)
        assert check.returncode == 0


def _stderr_on_a_terminal(*args: str) -> tuple[int, bytes]:
    """Run patchset with stderr on a pseudo-terminal (stdout piped); what the terminal got."""
    master, slave = pty.openpty()
    with subprocess.Popen(
        command(*args),
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO), "TERM": "xterm", "COLUMNS": "80"},
        stdout=subprocess.PIPE,
        stderr=slave,
    ) as done:
        os.close(slave)
        assert done.stdout is not None
        done.stdout.read()
        code = done.wait(timeout=120)
    seen = b""
    while select.select([master], [], [], 0.5)[0]:
        try:
            chunk = os.read(master, 4096)
        except OSError:  # the other side closed (Linux)
            break
        if not chunk:
            break
        seen += chunk
    os.close(master)
    return code, seen


def test_quiet_hides_the_progress_bar_on_a_terminal(tmp_path: Path) -> None:
    add_patch(tmp_path / "patches", "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/mod.py": BODY})
    argv = ("--registry", str(tmp_path / "patches"), "check", "--source", str(tree))
    code, shown = _stderr_on_a_terminal(*argv)
    assert code == 0 and b"vllm releases" in shown  # the bar, drawn on the terminal
    code, shown = _stderr_on_a_terminal("-q", *argv)
    assert (code, shown) == (0, b"")
    code, shown = _stderr_on_a_terminal(*argv[:3], "-q", *argv[3:])  # -q after the command
    assert (code, shown) == (0, b"")


# -- signals (issue 23 item 20) ----------------------------------------------------------------


def _apply_waiting_on_the_lock(tmp_path: Path) -> tuple[subprocess.Popen[str], Path, FileLock]:
    """An apply in a subprocess, waiting for the tree's lock that this process holds."""
    from patchset.engine import transaction

    registry = tmp_path / "patches"
    add_patch(registry, "fix-mod", diff=MOD_DIFF, targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    lock = FileLock(str(tree / transaction.LOCK))
    lock.acquire()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "patchset",
            "--registry",
            str(registry),
            "apply",
            "--target",
            str(tree),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    return proc, tree, lock


@pytest.mark.parametrize(("sig", "code", "line"), [
    (15, 143, "patchset: terminated (SIGTERM); cleaned up"),
    (2, 130, "patchset: interrupted"),
])  # fmt: skip
def test_sigterm_and_sigint_clean_up_and_say_one_line(
    tmp_path: Path, sig: int, code: int, line: str
) -> None:
    import signal
    import time

    proc, tree, lock = _apply_waiting_on_the_lock(tmp_path)
    try:
        time.sleep(3)  # imported, planned, waiting for the lock
        assert proc.poll() is None
        proc.send_signal(signal.Signals(sig))
        _, err = proc.communicate(timeout=30)
    finally:
        lock.release()
    assert proc.returncode == code, err
    assert err.strip().splitlines() == [line] and "Traceback" not in err
    assert (tree / "vllm" / "mod.py").read_text() == BODY
    assert not (tree / ".patchset-journal").exists()


def test_ctrl_c_while_the_command_line_imports_is_one_line() -> None:
    """A KeyboardInterrupt before main() runs (the imports): one line, no traceback, and the
    process still ends by SIGINT (a shell sees 130)."""
    proc = subprocess.run(
        [sys.executable, "-c", "import patchset.cli.main\nraise KeyboardInterrupt"],
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, "PYTHONPATH": str(REPO)},
        timeout=60,
    )
    assert proc.stderr == "patchset: interrupted\n"
    assert proc.returncode in (-2, 130)


def test_import_patchset_is_cheap() -> None:
    """The public names are imported on first use, so the command line takes over Ctrl-C
    before the heavy imports; the API stays as it was."""
    code = (
        "import sys, patchset\n"
        "print(sorted(m for m in sys.modules if m.startswith('patchset')))\n"
        "print(patchset.apply.__module__, patchset.check.__module__, patchset.ExitCode.OK)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True,
        env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=60,
    )  # fmt: skip
    first, second = proc.stdout.splitlines()
    assert first == "['patchset']"
    assert second == "patchset.engine.apply patchset.release_check.run 0"


@pytest.mark.parametrize("argv", [[], ["-v"], ["-q", "--traceback"]])
def test_no_command_is_a_usage_error(argv: list[str]) -> None:
    """`patchset` alone (or with options only) says a command is needed: exit 2, no
    internal error (the `--format github` look-ahead once failed on an empty command line)."""
    result = cli(*argv)
    assert result.code == ExitCode.BAD_INPUT, result.err
    assert "the following arguments are required: COMMAND" in result.err
    assert "internal error" not in result.err
