"""The boundary a collection's code runs behind: bubblewrap's Linux namespaces.

A collection's code (a club-3090 anchor script under `--run-scripts`) runs as a separate
process confined by the operating system, never trusted to confine itself:

- `bwrap` with new user, mount, pid, network, ipc, uts (and cgroup) namespaces, all
  capabilities dropped, uid/gid 65534 inside, `--die-with-parent`, `--new-session` (no
  terminal to push keys into), `--clearenv` (only the variables given here);
- its root is an empty folder of the parent's (the *box*) with read-only binds of `/usr`, the
  `/bin`, `/lib*` links and the interpreter's prefix; its own `/proc` (it sees only its own
  processes: no `/proc/<parent>/environ`, no `cwd` link into the project) and a minimal
  `/dev`; no `/home`, no `/etc`, no host `/tmp`; the scratch tree is the one folder bound
  writable, at its own path;
- no network (loopback only, in its own namespace: nothing of the host's 127.0.0.1);
- limits set before `bwrap` starts (RLIMIT_AS, RLIMIT_NPROC, RLIMIT_FSIZE, no core files),
  its output read by the parent up to `OUTPUT_CAP` bytes (the rest is dropped, unread
  into memory), killed whole at the time bound: `bwrap`'s pid namespace ends with its init,
  so a forked, `setsid` child dies with the script.

What it writes outside the scratch tree lands in the box, which the parent lists afterwards:
that report comes from outside the sandbox, so the script cannot silence it. Without a
working `bwrap` the code is not run at all (`SandboxError`, one line saying what to
install).
"""

from __future__ import annotations

import os
import resource
import selectors
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from patchset.errors import ExitCode, PatchsetError

OUTPUT_CAP = 1 << 20  # bytes of a script's output kept (the rest is read and dropped)
MEMORY = 1 << 30  # RLIMIT_AS of the sandbox
PROCESSES = 64  # RLIMIT_NPROC (not enforced by Linux for root: the pid namespace bounds it)
FILE_SIZE = 64 << 20  # RLIMIT_FSIZE: the largest file it may write
NOBODY = 65534
_LINKS = ("/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
_probed: dict[str, str] = {}  # bwrap's path -> "" (works) or why not


class SandboxError(PatchsetError):
    """No working bubblewrap: a collection's code is not run unconfined."""

    exit_code = ExitCode.UNAVAILABLE


@dataclass
class SandboxRun:
    code: int | None  # None: stopped at the time bound
    output: bytes  # at most OUTPUT_CAP bytes of stdout+stderr, then its last lines
    report: bytes  # what the launcher wrote on its report descriptor (capped too)
    outside: list[str] = field(default_factory=list)  # paths written outside the tree
    dropped: int = 0  # bytes of output over the cap


def _bwrap() -> str | None:
    return shutil.which("bwrap")


def require() -> str:
    """The path of a `bwrap` that works here, else `SandboxError`."""
    path = _bwrap()
    if path is None:
        raise SandboxError(
            "--run-scripts runs the collection's code only inside a sandbox: install"
            " bubblewrap (the `bwrap` command; Debian: apt-get install bubblewrap)"
        )
    if path not in _probed:
        _probed[path] = _probe(path)
    if _probed[path]:
        raise SandboxError(
            f"--run-scripts: bubblewrap ({path}) cannot make a sandbox here: {_probed[path]}"
        )
    return path


def _probe(path: str) -> str:
    import tempfile  # noqa: PLC0415 - only the first run

    with tempfile.TemporaryDirectory(prefix="patchset-probe-") as tmp:
        tree, box = Path(tmp) / "tree", Path(tmp) / "box"
        tree.mkdir()
        box.mkdir()
        try:
            got = run(
                [interpreter(), "-c", "pass"],
                tree=tree,
                box=box,
                cwd=tree,
                env={},
                timeout=30,
                bwrap=path,
            )
        except OSError as exc:
            return str(exc)
    if got.code == 0 and not got.outside:
        return ""
    said = [line for line in got.output.decode(errors="replace").splitlines() if line.strip()]
    return said[-1] if said else f"exit {got.code}"


def interpreter() -> str:
    """The interpreter a confined script runs with (its prefix is bound read-only)."""
    return os.path.realpath(sys.executable)


def _binds(tree: Path, box: Path) -> tuple[list[str], set[str]]:
    """bwrap's mount arguments, and the paths (in the sandbox) they make in the box."""
    args = ["--bind", str(box), "/", "--ro-bind", "/usr", "/usr"]
    made = {"/usr"}
    for link in map(Path, _LINKS):
        if link.is_symlink():
            args += ["--symlink", str(link.readlink()), str(link)]
            made.add(str(link))
        elif link.is_dir():
            args += ["--ro-bind", str(link), str(link)]
            made.add(str(link))
    for prefix in {os.path.realpath(sys.base_prefix), str(Path(interpreter()).parent)}:
        if prefix != "/usr" and not prefix.startswith("/usr/"):
            args += ["--ro-bind", prefix, prefix]
            made.add(prefix)
    args += ["--proc", "/proc", "--dev", "/dev", "--bind", str(tree), str(tree)]
    made |= {"/proc", "/dev", str(tree)}
    return args, made


def _limits() -> None:  # pragma: no cover - runs in the child before exec
    for what, value in (
        (resource.RLIMIT_AS, MEMORY),
        (resource.RLIMIT_NPROC, PROCESSES),
        (resource.RLIMIT_FSIZE, FILE_SIZE),
        (resource.RLIMIT_CORE, 0),
    ):
        resource.setrlimit(what, (value, value))


def run(
    argv: Sequence[str],
    *,
    tree: Path,
    box: Path,
    cwd: Path,
    env: Mapping[str, str],
    timeout: float,
    bwrap: str | None = None,
) -> SandboxRun:
    """Run `argv` confined (`tree` the one writable folder, `box` its empty root): its exit
    code (None when stopped at `timeout`), its capped output and the writes outside `tree`.
    `argv` may name `{report}`: the descriptor the parent reads the launcher's report on."""
    tool = bwrap or require()
    mounts, made = _binds(tree, box)
    report_r, report_w = os.pipe()
    argv = [a.replace("{report}", str(report_w)) for a in argv]
    setenv = [x for k, v in env.items() for x in ("--setenv", k, v)]
    command = [
        tool,
        "--unshare-all",
        "--unshare-user",
        "--uid",
        str(NOBODY),
        "--gid",
        str(NOBODY),
        "--hostname",
        "sandbox",
        "--cap-drop",
        "ALL",
        "--die-with-parent",
        "--new-session",
        "--clearenv",
        *setenv,
        *mounts,
        "--chdir",
        str(cwd),
        "--",
        *argv,
    ]
    try:
        proc = subprocess.Popen(
            command,
            cwd=tree,
            env={"PATH": "/usr/bin:/bin"},
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            pass_fds=(report_w,),
            start_new_session=True,
            preexec_fn=_limits,  # noqa: PLW1509 - only setrlimit, no locks taken
        )
    finally:
        os.close(report_w)
    assert proc.stdout is not None
    try:
        out, report, dropped, done = _read(
            proc.stdout.fileno(), report_r, time.monotonic() + timeout
        )
    finally:
        os.close(report_r)
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)  # bwrap dies: its namespace with it
        proc.wait()
        proc.stdout.close()
    outcome = SandboxRun(proc.returncode if done else None, out, report, dropped=dropped)
    outcome.outside = _written(box, made)
    return outcome


def _read(out_fd: int, report_fd: int, deadline: float) -> tuple[bytes, bytes, int, bool]:
    """Both pipes until they close (the sandbox ended) or the deadline: what was kept of each,
    the bytes dropped over the cap, and whether they closed in time."""
    kept = {out_fd: bytearray(), report_fd: bytearray()}
    tail = bytearray()
    dropped = 0
    with selectors.DefaultSelector() as sel:
        for fd in kept:
            sel.register(fd, selectors.EVENT_READ)
        while sel.get_map():
            left = deadline - time.monotonic()
            if left <= 0:
                return bytes(kept[out_fd]), bytes(kept[report_fd]), dropped, False
            for key, _ in sel.select(min(left, 1.0)):
                chunk = os.read(key.fd, 65536)
                if not chunk:
                    sel.unregister(key.fd)
                    continue
                room = max(OUTPUT_CAP - len(kept[key.fd]), 0)
                kept[key.fd] += chunk[:room]
                if len(chunk) > room and key.fd == out_fd:
                    dropped += len(chunk) - room
                    tail = (tail + chunk[room:])[-4096:]
    if dropped:
        kept[out_fd] += b"\n" + tail
    return bytes(kept[out_fd]), bytes(kept[report_fd]), dropped, True


def _written(box: Path, made: set[str]) -> list[str]:
    """What the sandboxed process left in its root: anything but the mount points bwrap made
    (and the folders leading to them)."""
    ancestors = {str(Path(p).parent) for m in made for p in [m, *map(str, Path(m).parents)]}
    keep = made | ancestors | {"/"}
    found: list[str] = []
    for here, dirs, files in os.walk(box):
        rel = "/" + os.path.relpath(here, box).removeprefix(".").lstrip("/")
        inner = os.path.normpath(rel)
        if inner in made:
            dirs[:] = []  # a mount point: below it was the bound folder
            continue
        if inner not in keep:
            found.append(inner)
            dirs[:] = []
            continue
        links = [d for d in dirs if (Path(here) / d).is_symlink()]
        for name in sorted([*files, *links]):
            path = str(Path(inner) / name)
            if path not in made:
                found.append(path)
    return sorted(found)
