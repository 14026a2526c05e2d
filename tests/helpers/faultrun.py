"""Run the patchset command line with a fault injected: `python tests/helpers/faultrun.py ARGS...`.

Every call that changes the file system (os.replace, os.rename, os.unlink, os.rmdir, os.mkdir,
os.fsync, os.open with O_CREAT, shutil.copy2, shutil.rmtree) counts as one step, counted after
it returns. Environment:

- ``FAULT_KILL_AT=N``: SIGKILL this process right after step N (nothing is cleaned up, as when
  a machine loses power or the OOM killer strikes);
- ``FAULT_SLEEP_AT=N`` and ``FAULT_SLEEP=SECONDS``: sleep after step N instead (to hold the
  tree's lock while another process starts);
- ``FAULT_STEPS=FILE``: write the number of steps taken to FILE at exit;
- ``FAULT_LOCK_TIMEOUT=SECONDS``: how long to wait for another process's tree lock;
- ``FAULT_TRACE=FILE``: append each step's number and call name to FILE (to pick the steps
  that are renames).

Production code has no fault hooks: this script wraps the standard library around it.
"""

from __future__ import annotations

import atexit
import functools
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

_steps = [0]  # one counter for every wrapped call


def _after_each(func: Callable[..., Any], *, only_creating: bool = False) -> Callable[..., Any]:
    kill_at = int(os.environ.get("FAULT_KILL_AT", "0"))
    trace = os.environ.get("FAULT_TRACE")
    sleep_at = int(os.environ.get("FAULT_SLEEP_AT", "0"))
    pause = float(os.environ.get("FAULT_SLEEP", "0"))

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        result = func(*args, **kwargs)
        if only_creating and not (len(args) > 1 and args[1] & os.O_CREAT):
            return result
        _steps[0] += 1
        if trace:
            with open(trace, "a") as out:  # noqa: PTH123 - the real open, not wrapped
                out.write(f"{_steps[0]} {func.__name__}\n")
        if _steps[0] == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        if _steps[0] == sleep_at:
            sys.stderr.write("faultrun: sleeping\n")
            sys.stderr.flush()
            time.sleep(pause)
        return result

    return wrapper


def install() -> None:
    for name in ("replace", "rename", "unlink", "rmdir", "mkdir", "fsync"):
        setattr(os, name, _after_each(getattr(os, name)))
    os.open = _after_each(os.open, only_creating=True)
    shutil.copy2 = _after_each(shutil.copy2)
    shutil.rmtree = _after_each(shutil.rmtree)  # type: ignore[assignment]
    if steps_file := os.environ.get("FAULT_STEPS"):
        atexit.register(lambda: Path(steps_file).write_text(str(_steps[0])))


def main(argv: list[str]) -> int:
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    from patchset.cli.main import main as patchset_main
    from patchset.engine import transaction

    if timeout := os.environ.get("FAULT_LOCK_TIMEOUT"):
        transaction.LOCK_TIMEOUT = float(timeout)
    install()
    return patchset_main(argv)


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
