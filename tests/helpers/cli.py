"""One way for tests to run the command line: `run_cli` in a subprocess (end to end: the
interpreter's start, signals, stdout closing) and `cli` in this process (fast)."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path

from patchset.cli import main as cli_main

REPO = Path(__file__).resolve().parents[2]
TIMEOUT = 300  # seconds; a hung command fails its test instead of the whole run


def environment(env: Mapping[str, str | None] | None) -> dict[str, str]:
    """This process's environment with `env` on top (a None value takes a variable out), and
    the repository on PYTHONPATH so the subprocess imports this checkout."""
    merged = {**os.environ, "PYTHONPATH": str(REPO)}
    for key, value in (env or {}).items():
        if value is None:
            merged.pop(key, None)
        else:
            merged[key] = value
    return merged


def command(*args: str | Path) -> list[str]:
    """The argument list of `python -m patchset ARGS` with this interpreter (for a Popen of
    a test's own: a pipe closed early, a terminal, a signal)."""
    return [sys.executable, "-m", "patchset", *map(str, args)]


def run_cli(
    *args: str | Path,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
    timeout: float = TIMEOUT,
    stdin: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """`python -m patchset ARGS` in a subprocess, in the repository unless `cwd`; `env` goes
    on top of this process's environment (a None value takes a variable out). Output that is
    not UTF-8 (a hostile input echoed) is read with replacement characters."""
    return subprocess.run(
        command(*args),
        cwd=REPO if cwd is None else cwd,
        env=environment(env),
        input=stdin,
        capture_output=True,
        text=True,
        errors="replace",
        check=False,
        timeout=timeout,
    )


def run_cli_bytes(
    *args: str | Path, env: Mapping[str, str | None] | None = None, timeout: float = TIMEOUT
) -> subprocess.CompletedProcess[bytes]:
    """`run_cli` with the output kept as bytes (what a terminal would be sent)."""
    return subprocess.run(
        command(*args),
        cwd=REPO,
        env=environment(env),
        capture_output=True,
        check=False,
        timeout=timeout,
    )


def nox_sessions(cwd: Path, *args: str) -> set[str]:
    """The sessions `nox --list ARGS` lists in `cwd` (this checkout importable), after
    checking it exits 0."""
    proc = subprocess.run(
        [sys.executable, "-m", "nox", "--list", *args],
        cwd=cwd,
        env=environment(None),
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert proc.returncode == 0, proc.stderr
    return {line.split()[1] for line in proc.stdout.splitlines() if line[:2] in ("* ", "- ")}


@dataclass(frozen=True)
class Result:
    """What an in-process run ended with."""

    code: int
    out: str
    err: str

    @property
    def returncode(self) -> int:  # the name a CompletedProcess gives it
        return self.code

    @property
    def stdout(self) -> str:
        return self.out

    @property
    def stderr(self) -> str:
        return self.err


@contextlib.contextmanager
def _inside(cwd: Path | str | None, env: Mapping[str, str | None] | None) -> Iterator[None]:
    """The working folder and environment variables of one run, put back after it."""
    before_cwd = Path.cwd()
    before_env = dict(os.environ)
    try:
        if cwd is not None:
            os.chdir(cwd)
        for key, value in (env or {}).items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        os.chdir(before_cwd)
        os.environ.clear()
        os.environ.update(before_env)


def cli(
    *args: str | Path,
    cwd: Path | str | None = None,
    env: Mapping[str, str | None] | None = None,
) -> Result:
    """`patchset ARGS` through `main()` in this process, stdout and stderr captured; `env`
    goes on top of the environment for the run (None takes a variable out; all put back)."""
    out, err = io.StringIO(), io.StringIO()
    with _inside(cwd, env), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli_main.main([str(a) for a in args])
        except SystemExit as exc:  # --help, --version and usage errors exit through argparse
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 2)
    return Result(code, out.getvalue(), err.getvalue())
