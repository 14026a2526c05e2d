"""Faults: a process killed between any two file-system steps of an apply or a revert, an
index that cannot be reached, two checks sharing one cache, two applies on one tree.

Kills use tests/helpers/faultrun.py (SIGKILL after step N of a real `patchset` process); the
next run must find the tree untouched or fully patched, or roll it back from the journal, and leave
nothing behind. Cut-short and corrupted downloads are tested in tests/adapters/test_net.py and
tests/sources/test_index_source.py (counted in docs/reliability.md through
tests/helpers/reliability.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import pytest
import tomlkit

from patchset.engine import transaction
from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode, RegistryError, SourceError
from patchset.registry import load_registry
from patchset.registry.write import RegistryChange
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index.cache import Cache
from tests.helpers.cli import cli as cli_in_process
from tests.helpers.fake_index import FakeIndex, Reply, wheel_name
from tests.helpers.hardening import (
    LOCK,
    REPO,
    Snapshot,
    changed,
    cli,
    error_line,
    full_disk_under,
    small_disk,
    snapshot,
)
from tests.helpers.reliability import FAULT, REUSED, record
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    OTHER,
    OTHER_DIFF,
    OTHER_FIX,
    add_patch,
    make_tree,
)

FAULTRUN = Path(__file__).parent / "helpers" / "faultrun.py"

FILES = {
    "vllm/mod.py": BODY,
    "vllm/other.py": OTHER,
    "vllm/sub/third.py": "one\r\ntwo\r\nthree\r\n",
    "vllm/run.py": "def body(self):\n    x = compute(y).tolist()\n    return x\n",
}
DIFF = (
    MOD_DIFF
    + OTHER_FIX
    + """\
--- a/vllm/sub/third.py
+++ b/vllm/sub/third.py
@@ -1,3 +1,4 @@
 one
 two
+two_and_a_half
 three
--- /dev/null
+++ b/vllm/sub/created.py
@@ -0,0 +1,2 @@
+created = True
+by = "the diff"
"""
)
SITES = """\
[[site]]
name = "guard"
file = "vllm/run.py"
action = "insert-after"
marker = "patchset: faults guard"
anchor = "def body(self):"
text = "guard()"
"""


@dataclass(frozen=True)
class World:
    registry: Path
    untouched: Snapshot  # the tree before any apply
    patched: Snapshot  # ... after a clean one


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> World:
    """A registry of two patches over five files (one created), and the two states a tree may
    be in: untouched and fully patched (from a clean apply)."""
    root = tmp_path_factory.mktemp("world")
    registry = root / "patches"
    targets = ["vllm/mod.py", "vllm/other.py", "vllm/sub/third.py", "vllm/sub/created.py"]
    add_patch(registry, "multi-file", diff=DIFF, targets=targets)
    add_patch(registry, "run-guard", sites=SITES, targets=["vllm/run.py"], when="startup")
    tree = make_tree(root / "clean", FILES)
    untouched = snapshot(tree)
    assert apply(load_registry(registry), tree).exit_code == ExitCode.OK
    return World(registry, untouched, snapshot(tree, ignore=(LOCK,)))


def faultrun(
    *args: str, env: dict[str, str], timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    """A `patchset` run killed (or counted) at a file-system step, with a cache folder of its
    own: the steps a run takes must not depend on what an earlier run left in the cache (the
    registry's parsed-TOML file is written by the first run on a registry only). Its temporary
    folder (TMPDIR) is its own too, removed afterwards: a run killed inside a
    `tempfile.TemporaryDirectory` (refresh's scratch git repository) cannot remove it."""
    with tempfile.TemporaryDirectory(prefix="faultrun-") as scratch:
        cache, tmp = Path(scratch) / "cache", Path(scratch) / "tmp"
        cache.mkdir()
        tmp.mkdir()
        return subprocess.run(
            [sys.executable, str(FAULTRUN), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
            env={**os.environ, "PATCHSET_CACHE_DIR": str(cache), "TMPDIR": str(tmp), **env},
        )


def count_steps(world: World, tmp: Path, operation: str) -> int:
    tree = make_tree(tmp / f"count-{operation}", FILES)
    if operation == "revert":
        apply(load_registry(world.registry), tree)
    steps = tmp / f"steps-{operation}"
    done = faultrun(
        "--registry", str(world.registry), operation, "--target", str(tree),
        env={"FAULT_STEPS": str(steps)},
    )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    return int(steps.read_text())


def state_of(tree: Path, world: World) -> str:
    now = snapshot(tree, ignore=(LOCK,))
    if now == world.untouched:
        return "untouched"
    if now == world.patched:
        return "patched"
    if os.path.lexists(tree / transaction.JOURNAL):
        return "journal"
    return "broken: " + ", ".join(changed(world.untouched, now))


def kill_once(world: World, tmp: Path, operation: str, step: int) -> tuple[str, bool]:
    """Kill `operation` after `step`; then roll forward (apply) and back (revert) from copies
    of what it left. The state it left, and whether both next runs ended where they should."""
    tree = make_tree(tmp / "tree", FILES)
    if operation == "revert":
        apply(load_registry(world.registry), tree)
    outside = tmp / "outside.py"
    outside.write_text("do not touch\n")
    proc = faultrun(
        "--registry", str(world.registry), operation, "--target", str(tree),
        env={"FAULT_KILL_AT": str(step)},
    )  # fmt: skip
    assert proc.returncode == -9, f"step {step} was not reached: {proc.stdout}{proc.stderr}"
    left = state_of(tree, world)
    ok = not left.startswith("broken") and outside.read_text() == "do not touch\n"
    for next_run, goal in ((apply, world.patched), (revert, world.untouched)):
        copy = tmp / f"next-{next_run.__name__}"
        shutil.copytree(tree, copy, symlinks=True)
        next_run(load_registry(world.registry), copy)
        ends = snapshot(copy, ignore=(LOCK,))
        ok = ok and ends == goal and not os.path.lexists(copy / transaction.JOURNAL)
    return left, ok


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_killed_at_every_step(world: World, tmp_path: Path, operation: str) -> None:
    """SIGKILL after each file-system step of a five-file apply (or revert) in turn."""
    total = count_steps(world, tmp_path, operation)
    assert total > 10  # temp files, journal, renames, read-back, clean-up

    def one(step: int) -> tuple[int, str, bool]:
        left, ok = kill_once(world, tmp_path / f"kill-{step}", operation, step)
        record(FAULT, f"SIGKILL mid-{operation}, then apply or revert", f"step {step}", intact=ok)
        return step, left, ok

    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(one, range(1, total + 1)))
    bad = [(step, left) for step, left, ok in outcomes if not ok]
    assert not bad, f"not recovered cleanly after these kills: {bad}"
    states = {left for _, left, _ in outcomes}
    assert "journal" in states  # the kills did land between two renames


def test_killed_while_rolling_back(world: World, tmp_path: Path) -> None:
    """A run that recovers from a journal is killed too; the run after it still recovers."""
    total = count_steps(world, tmp_path, "apply")
    failures = []
    for first in (total // 2, total - 3):
        for second in range(1, 8):
            tmp = tmp_path / f"{first}-{second}"
            tree = make_tree(tmp / "tree", FILES)
            killed = faultrun(
                "--registry", str(world.registry), "apply", "--target", str(tree),
                env={"FAULT_KILL_AT": str(first)},
            )  # fmt: skip
            assert killed.returncode == -9
            assert state_of(tree, world) == "journal"
            again = faultrun(
                "--registry", str(world.registry), "revert", "--target", str(tree),
                env={"FAULT_KILL_AT": str(second)},
            )  # fmt: skip
            final = revert(load_registry(world.registry), tree)
            ok = snapshot(tree, ignore=(LOCK,)) == world.untouched
            ok = ok and not os.path.lexists(tree / transaction.JOURNAL)
            record(FAULT, "SIGKILL during a roll-back", f"{first}/{second}", intact=ok)
            if not ok:
                failures.append((first, second, again.returncode, final.to_dict()))
    assert not failures


def test_cli_reports_the_roll_back(world: World, tmp_path: Path) -> None:
    tree = make_tree(tmp_path / "tree", FILES)
    killed = faultrun(
        "--registry", str(world.registry), "apply", "--target", str(tree),
        env={"FAULT_KILL_AT": str(count_steps(world, tmp_path, "apply") // 2)},
    )  # fmt: skip
    assert killed.returncode == -9 and state_of(tree, world) == "journal"
    dry = cli("--registry", str(world.registry), "apply", "--target", str(tree), "--dry-run")
    assert state_of(tree, world) == "journal", "a dry run must not write"
    assert "interrupted" in dry.stdout
    proc = cli("--registry", str(world.registry), "apply", "--target", str(tree))
    assert proc.returncode == ExitCode.OK, proc.stdout + proc.stderr
    assert "rolled back" in proc.stdout and "from an interrupted earlier run" in proc.stdout
    assert state_of(tree, world) == "patched"


# -- two applies on one tree ---------------------------------------------------------------


def _wait_for(path: Path, timeout: float = 20) -> None:
    deadline = time.monotonic() + timeout
    while not os.path.lexists(path):
        assert time.monotonic() < deadline, f"{path} never appeared"
        time.sleep(0.02)


@pytest.fixture
def slow_first_apply(world: World, tmp_path: Path) -> Iterator[tuple[Path, subprocess.Popen[str]]]:
    """An apply that holds the tree's lock for 8 s after its first rename (half-written)."""
    tree = make_tree(tmp_path / "tree", FILES)
    steps = count_steps(world, tmp_path, "apply")
    args = ["--registry", str(world.registry), "apply", "--target", str(tree)]
    env = {**os.environ, "FAULT_SLEEP_AT": str(steps // 2), "FAULT_SLEEP": "8"}  # a loaded machine
    first = subprocess.Popen(
        [sys.executable, str(FAULTRUN), *args],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    assert first.stderr is not None
    assert first.stderr.readline() == "faultrun: sleeping\n"  # the lock is held, mid-write
    assert state_of(tree, world) == "journal"
    yield tree, first
    first.kill()
    first.communicate()


def test_second_apply_waits_and_finds_it_applied(
    world: World, slow_first_apply: tuple[Path, subprocess.Popen[str]]
) -> None:
    tree, first = slow_first_apply
    second = cli(
        "--registry",
        str(world.registry),
        "apply",
        "--strict",  # the distinct "already applied" code
        "--target",
        str(tree),
        "--format",
        "json",
    )
    out, err = first.communicate(timeout=60)
    ok = first.returncode == ExitCode.OK and second.returncode == ExitCode.ALREADY_APPLIED
    ok = ok and state_of(tree, world) == "patched"
    record(FAULT, "two applies on one tree", "the second waits", intact=ok)
    assert first.returncode == ExitCode.OK, out + err
    assert second.returncode == ExitCode.ALREADY_APPLIED, second.stdout + second.stderr
    outcomes = [r["outcome"] for r in json.loads(second.stdout)["results"]]
    assert outcomes == ["already-applied", "already-applied"]
    assert state_of(tree, world) == "patched"


def test_second_apply_refuses_after_its_timeout(
    world: World, slow_first_apply: tuple[Path, subprocess.Popen[str]]
) -> None:
    tree, first = slow_first_apply
    second = faultrun(
        "--registry", str(world.registry), "apply", "--target", str(tree),
        env={"FAULT_LOCK_TIMEOUT": "0.5"},
    )  # fmt: skip
    out, err = first.communicate(timeout=60)
    ok = first.returncode == ExitCode.OK and second.returncode == ExitCode.UNAVAILABLE
    ok = ok and state_of(tree, world) == "patched"
    record(FAULT, "two applies on one tree", "the second refuses", intact=ok)
    assert second.returncode == ExitCode.UNAVAILABLE
    assert "another patchset process holds .patchset.lock" in error_line(second)
    assert first.returncode == ExitCode.OK, out + err
    assert state_of(tree, world) == "patched"


def test_a_conflict_read_mid_write_is_looked_at_again(world: World, tmp_path: Path) -> None:
    """A run that read the tree while another was renaming (after its own journal check, so
    it saw no journal) sees half the files patched: a conflict. It must wait for the writer's
    lock and look again before saying so."""
    tree = make_tree(tmp_path / "tree", FILES)
    patched = make_tree(tmp_path / "patched", FILES)
    apply(load_registry(world.registry), patched)
    shutil.copyfile(patched / "vllm/mod.py", tree / "vllm/mod.py")  # the first rename landed
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(tree), str(patched)],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert writer.stdout is not None and writer.stdout.readline() == "locked\n"
    report = apply(load_registry(world.registry), tree)
    writer.communicate(timeout=30)
    ok = [r.outcome for r in report.results] == ["already-applied", "already-applied"]
    record(FAULT, "two applies on one tree", "a conflict read mid-write", intact=ok)
    assert ok, report.to_dict()
    assert state_of(tree, world) == "patched"


# The other writer: holds the tree lock, finishes its renames a moment later, lets go.
_WRITER = """
import shutil, sys, time
from pathlib import Path
from filelock import FileLock
tree, patched = Path(sys.argv[1]), Path(sys.argv[2])
with FileLock(str(tree / ".patchset.lock")):
    print("locked", flush=True)
    time.sleep(1)
    for rel in ("vllm/other.py", "vllm/sub/third.py", "vllm/sub/created.py", "vllm/run.py"):
        shutil.copyfile(patched / rel, tree / rel)
"""


# -- the index -------------------------------------------------------------------------------


def _closed_port_url() -> str:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    return f"http://127.0.0.1:{port}/simple/"


def _real_files(cache: Cache) -> dict[str, dict[str, bytes]]:
    """The files the real patches touch, from the real releases in the cache when it has
    them (it does once the network tests ran); small stand-ins otherwise."""
    wanted = {
        "0.19.1": "vllm/model_executor/layers/fla/ops/utils.py",
        "0.20.0": "vllm/v1/attention/backends/turboquant_attn.py",
    }
    files: dict[str, dict[str, bytes]] = {}
    for version, rel in wanted.items():
        data = None
        offline = IndexSource(cache=cache, offline=True)
        with contextlib.suppress(SourceError), offline.open(version) as tree:  # else a stand-in
            data = tree.read(rel)
        files[version] = {rel: data or b"is_tma_supported = True\n"}
    return files


def _check_json(env: dict[str, str], url: str, *extra: str) -> subprocess.CompletedProcess[str]:
    return cli(
        "check", "--vllm", "0.19.1", "--vllm", "0.20.0", "--index-url", url, "--format", "json",
        *extra, env=env,
    )  # fmt: skip


def test_unreachable_index_then_offline(
    fake_index: FakeIndex, tmp_path: Path, release_cache: Cache
) -> None:
    for version, files in _real_files(release_cache).items():
        fake_index.add_release(version, files)
    env = {"PATCHSET_CACHE_DIR": str(tmp_path / "cache")}
    dead = _check_json(env, _closed_port_url())
    line = error_line(dead)
    ok_dead = dead.returncode == ExitCode.UNAVAILABLE and "tried 4 times" in line
    assert ok_dead, dead.stderr
    assert "--offline" in line
    online = _check_json(env, fake_index.index_url)
    assert online.returncode in (0, 1), online.stderr
    offline = _check_json(env, _closed_port_url(), "--offline")
    same = offline.returncode == online.returncode and _results(offline) == _results(online)
    record(FAULT, "index unreachable", "retries, one line; --offline from the cache", intact=same)
    assert same, offline.stderr


def _results(proc: subprocess.CompletedProcess[str]) -> list[tuple[str, str, str]]:
    report = json.loads(proc.stdout)
    return [(r["vllm"], r["patch"], r["verdict"]) for r in report["results"]]


def test_two_checks_share_one_cache(
    fake_index: FakeIndex, tmp_path: Path, release_cache: Cache
) -> None:
    """Three `patchset check` processes start together on an empty cache; each wheel is
    served slowly, so they meet at the cache's locks."""
    for version, files in _real_files(release_cache).items():
        fake_index.add_release(version, files)
        wheel = fake_index.wheels[version]
        fake_index.server.route(fake_index.wheel_path(version), Reply(200, wheel, delay=0.5))
    cache_dir = tmp_path / "cache"
    env = {"PATCHSET_CACHE_DIR": str(cache_dir)}
    with ThreadPoolExecutor(max_workers=3) as pool:
        runs = list(pool.map(lambda _: _check_json(env, fake_index.index_url), range(3)))
    cache = Cache(cache_dir)
    sound = all(_sound_release(cache, v, fake_index) for v in ("0.19.1", "0.20.0"))
    leftovers = [p.name for p in cache_dir.rglob("*") if p.name.endswith((".tmp", ".part"))]
    # The central directory is read by one process (the tail: a suffix range); the others
    # wait for its lock and take the manifest it wrote.
    once = all(
        sum(r.startswith("bytes=-") for r in fake_index.server.ranges(fake_index.wheel_path(v)))
        == 1
        for v in ("0.19.1", "0.20.0")
    )
    agree = len({(r.returncode, json.dumps(_results(r))) for r in runs}) == 1
    ok = sound and not leftovers and agree and all(r.returncode in (0, 1) for r in runs)
    record(FAULT, "three checks, one cache", "started together", intact=ok)
    assert all(r.returncode in (0, 1) for r in runs), [r.stderr for r in runs]
    assert agree, [r.stdout for r in runs]
    assert sound and not leftovers, leftovers
    assert once, "each wheel's directory is read by one process; the others wait for its lock"


def _sound_release(cache: Cache, version: str, index: FakeIndex) -> bool:
    """The cached manifest is the served wheel's, and every member it names that is cached
    holds the bytes RECORD gives."""
    manifest = cache.load_manifest(wheel_name(version))
    if manifest is None or manifest.sha256 != hashlib.sha256(index.wheels[version]).hexdigest():
        return False
    cached = [e[0] for e in manifest.members.values() if cache.has_blob(e[0])]
    return bool(cached) and all(cache.read_blob(sha) is not None for sha in cached)


def test_reused_fault_tests_still_exist() -> None:
    """docs/reliability.md counts these tests by name: a rename must not drop them quietly."""
    for nodeid in REUSED:
        path, _, name = nodeid.partition("::")
        *classes, function = name.split("::")  # a test in a class: Class::test
        text = (REPO / path).read_text()
        assert all(f"class {c}" in text for c in classes) and f"def {function}(" in text, nodeid


# -- ownership: root patching a user's tree ----------------------------------------------------

NEW_PACKAGE = """\
--- /dev/null
+++ b/vllm/newpkg/inner/__init__.py
@@ -0,0 +1 @@
+created = True
"""
USER = (1000, 1000)


def _owners(tree: Path) -> dict[str, tuple[int, int]]:
    found = {".": (tree.lstat().st_uid, tree.lstat().st_gid)}
    for path in tree.rglob("*"):
        info = path.lstat()
        found[path.relative_to(tree).as_posix()] = (info.st_uid, info.st_gid)
    return found


def _user_tree(root: Path) -> tuple[Path, Path]:
    registry = root / "patches"
    add_patch(registry, "edit", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(registry, "new-package", diff=NEW_PACKAGE, targets=["vllm/newpkg/inner/__init__.py"])
    tree = make_tree(root / "tree", {"vllm/mod.py": BODY})
    (tree / "vllm/mod.py").chmod(0o640)
    (tree / "vllm").chmod(0o750)
    for path in [tree, *tree.rglob("*")]:
        os.chown(path, *USER)
    return registry, tree


@pytest.mark.skipif(os.geteuid() != 0, reason="only root can give files away")
def test_root_keeps_the_owner_and_mode_of_a_users_tree(tmp_path: Path) -> None:
    """Run as root on a tree a user owns (a venv): every file patchset writes, the new
    folders, the lock file and what a revert or a roll-back gives back stay the user's."""
    registry, tree = _user_tree(tmp_path)
    before = snapshot(tree)
    args = ("--registry", str(registry))
    done = cli(*args, "apply", "--target", str(tree))
    owners_applied = _owners(tree)
    modes = {
        rel: snapshot(tree)[rel].split()[1]
        for rel in ("vllm/mod.py", "vllm/newpkg", "vllm/newpkg/inner/__init__.py")
    }
    back = cli(*args, "revert", "--target", str(tree))
    owners_reverted = _owners(tree)
    restored = snapshot(tree, ignore=(LOCK,)) == before
    total = count_user_steps(registry, tmp_path)
    killed_tree = _user_tree(tmp_path / "killed")[1]
    killed = faultrun(
        *args, "apply", "--target", str(killed_tree), env={"FAULT_KILL_AT": str(total - 2)}
    )
    rolled = cli(*args, "revert", "--target", str(killed_tree))
    owners_rolled = _owners(killed_tree)
    ok = done.returncode == back.returncode == rolled.returncode == 0 and restored
    ok = ok and all(o == USER for o in (*owners_applied.values(), *owners_reverted.values()))
    ok = ok and all(o == USER for o in owners_rolled.values())
    record(FAULT, "ownership kept", "root on a user's tree: apply, revert, roll-back", intact=ok)
    assert done.returncode == 0 and back.returncode == 0, done.stderr + back.stderr
    assert killed.returncode == -9 and rolled.returncode == 0, rolled.stderr
    assert {k: v for k, v in owners_applied.items() if v != USER} == {}
    assert {k: v for k, v in owners_reverted.items() if v != USER} == {}
    assert {k: v for k, v in owners_rolled.items() if v != USER} == {}
    assert modes == {
        "vllm/mod.py": "640",
        "vllm/newpkg": "750",
        "vllm/newpkg/inner/__init__.py": "640",
    }
    assert restored, changed(before, snapshot(tree, ignore=(LOCK,)))


def count_user_steps(registry: Path, tmp: Path) -> int:
    tree = _user_tree(tmp / "count")[1]
    steps = tmp / "steps"
    done = faultrun(
        "--registry", str(registry), "apply", "--target", str(tree),
        env={"FAULT_STEPS": str(steps)},
    )  # fmt: skip
    assert done.returncode == ExitCode.OK, done.stdout + done.stderr
    return int(steps.read_text())


# -- kills during registry writes: add and refresh --finish ----------------------------------


def _registry_state(registry: Path, before: Snapshot, after: Snapshot) -> str:
    """ "before", "after" or "broken: ...". Hidden leftovers aside (a staging folder of
    `add`, the temp file of a write killed before its rename): the loader skips them."""
    now = {k: v for k, v in snapshot(registry).items() if not _leftover(k)}
    if now == before:
        return "before"
    if now == after:
        return "after"
    extra = {k: v for k, v in now.items() if k not in before}
    if all(now.get(k) == v for k, v in before.items()) and extra.items() <= after.items():
        return "new files only"  # written before the patch.toml naming them: unused yet
    return "broken: " + ", ".join(changed(after, now))


def _leftover(rel: str) -> bool:
    name = rel.rsplit("/", 1)[-1]
    return rel.startswith(".add-") or (name.startswith(".") and name.endswith(".tmp"))


def test_add_killed_at_every_step(tmp_path: Path) -> None:
    """`patchset add` killed after each file-system step: the registry holds the new patch
    whole or not at all, and the same add run again ends with it whole."""
    diff = tmp_path / "fix.diff"
    diff.write_text(MOD_DIFF + OTHER_DIFF)
    args = ("add", "new-fix", "--diff", str(diff), "--no-check", "--title", "a fix")

    def fresh(name: str) -> Path:
        registry = tmp_path / name / "patches"
        add_patch(registry, "multi-file", diff=DIFF, targets=["vllm/mod.py", "vllm/other.py",
                  "vllm/sub/third.py", "vllm/sub/created.py"])  # fmt: skip
        return registry

    reference = fresh("reference")
    before = snapshot(reference)
    steps = tmp_path / "steps"
    done = faultrun("--registry", str(reference), *args, env={"FAULT_STEPS": str(steps)})
    assert done.returncode == 0, done.stderr
    after = snapshot(reference)
    total = int(steps.read_text())
    assert total >= 4
    bad = []
    for step in range(1, total + 1):
        registry = fresh(f"kill-{step}")
        killed = faultrun("--registry", str(registry), *args, env={"FAULT_KILL_AT": str(step)})
        left = _registry_state(registry, before, after)
        again = cli("--registry", str(registry), *args)
        ends = _registry_state(registry, before, after)
        loads = cli("--registry", str(registry), "validate").returncode == 0
        ok = killed.returncode == -9 and not left.startswith("broken") and loads
        ok = ok and ends == "after" and again.returncode in (0, 2)
        ok = ok and (again.returncode == 0) == (left == "before")
        record(FAULT, "SIGKILL mid-add, then add again", f"step {step}", intact=ok)
        if not ok:
            bad.append((step, killed.returncode, left, again.returncode, again.stderr[-200:]))
    assert not bad, bad


@pytest.mark.network
def test_refresh_finish_killed_at_every_step(tmp_path: Path) -> None:
    """`patchset refresh --finish` killed after each file-system step: the registry is as it
    was (and the work folder still there, so --finish can run again) or the new variant is
    written whole; the next --finish ends with it written."""
    from tests.refresh.test_refresh import drop_probe, take_ours

    utils = "vllm/model_executor/layers/fla/ops/utils.py"
    seed = tmp_path / "seed"
    shutil.copytree(REPO / "patches", seed / "patches")
    drop_probe(seed / "patches" / "fla-tma-sm12x" / "patch.toml")
    started = cli(
        "--registry", str(seed / "patches"), "refresh", "fla-tma-sm12x", "--vllm", "0.20.0"
    )
    assert started.returncode == 1, started.stdout + started.stderr  # a conflict to resolve
    work = seed / ".patchset-refresh" / "fla-tma-sm12x" / utils
    work.write_text(take_ours(work.read_text()).replace('== "1"', '== "2"'))
    args = ("refresh", "fla-tma-sm12x", "--finish")

    def fresh(name: str) -> Path:
        shutil.copytree(seed, tmp_path / name, symlinks=True)
        return tmp_path / name / "patches"

    reference = fresh("reference")
    before = snapshot(reference)
    steps = tmp_path / "steps"
    done = faultrun("--registry", str(reference), *args, env={"FAULT_STEPS": str(steps)})
    assert done.returncode == 0, done.stdout + done.stderr
    after = snapshot(reference)
    total = int(steps.read_text())
    # The first steps are the merge's git work in a scratch folder; the registry is written
    # after them (probe, temp files, renames), then the work folder removed: every step of
    # the second half, and a few of the first.

    def one(step: int) -> tuple[int, int, str, str]:
        registry = fresh(f"kill-{step}")
        killed = faultrun("--registry", str(registry), *args, env={"FAULT_KILL_AT": str(step)})
        left = _registry_state(registry, before, after)
        if left != "after":
            again = cli("--registry", str(registry), *args)
            assert "Traceback" not in again.stderr, again.stderr
        ends = _registry_state(registry, before, after)
        loads = cli("--registry", str(registry), "validate").returncode == 0
        ok = killed.returncode == -9 and not left.startswith("broken") and loads
        ok = ok and ends == "after"
        record(FAULT, "SIGKILL mid-refresh --finish, then --finish", f"step {step}", intact=ok)
        return step, killed.returncode, left, "" if ok else ends

    chosen = sorted({1, total // 4, *range(total // 2, total + 1)})
    with ThreadPoolExecutor(max_workers=3) as pool:
        outcomes = list(pool.map(one, chosen))
    bad = [o for o in outcomes if o[3] or o[1] != -9 or o[2].startswith("broken")]
    assert not bad, bad


@pytest.mark.parametrize("extra", [(), ("--verify-full",)], ids=["ranges", "whole downloads"])
def test_check_races_cache_prune(
    fake_index: FakeIndex, tmp_path: Path, extra: tuple[str, ...]
) -> None:
    """Three `patchset check` runs on a cold cache while `patchset cache prune` (everything
    older than 0 s) and `cache clear` run again and again: every check gives the verdicts a
    check on its own gives, none fails or prints a traceback, and the cache is left sound.
    Each wheel read by ranges, or (`--verify-full`) downloaded whole and read."""
    files = {"vllm/model_executor/layers/fla/ops/utils.py": b"is_tma_supported = True\n"}
    for version in ("0.19.1", "0.20.0"):
        fake_index.add_release(version, files)
        for path, data in (
            (fake_index.sdist_path(version), fake_index.sdists[version]),
            (fake_index.wheel_path(version), fake_index.wheels[version]),
        ):  # slow answers: the checks are still reading when the cache is pruned
            fake_index.server.route(path, Reply(200, data, delay=0.3))
    url = fake_index.index_url
    alone = _check_json({"PATCHSET_CACHE_DIR": str(tmp_path / "alone")}, url, *extra)
    assert alone.returncode in (0, 1), alone.stderr
    env = {"PATCHSET_CACHE_DIR": str(tmp_path / "shared")}
    done = threading.Event()
    maintenance: list[subprocess.CompletedProcess[str]] = []

    def maintain() -> None:
        while not done.is_set():
            actions = (("prune", "--older-than", "0s"), ("clear",))
            maintenance.extend(cli("cache", *action, env=env) for action in actions)

    keeper = threading.Thread(target=maintain)
    keeper.start()
    try:
        with ThreadPoolExecutor(max_workers=3) as pool:
            runs = list(pool.map(lambda _: _check_json(env, url, *extra), range(3)))
    finally:
        done.set()
        keeper.join(timeout=120)
    again = _check_json(env, url, *extra)  # after the race: the cache still serves
    failed = [(p.returncode, p.stderr[-300:]) for p in [*runs, again] if not p.stdout]
    assert not failed, failed  # a run that printed no report: its exit code and last words
    same = all(_results(r) == _results(alone) and r.returncode == alone.returncode for r in runs)
    same = same and _results(again) == _results(alone)
    clean = all("Traceback" not in p.stderr for p in [*runs, *maintenance, again])
    maintained = all(p.returncode == 0 for p in maintenance) and len(maintenance) >= 2
    print(f"{len(maintenance)} cache prunes and clears during the checks")
    ok = same and clean and maintained
    record(FAULT, "check racing cache prune", f"{len(maintenance)} prunes and clears", intact=ok)
    assert clean, [p.stderr for p in [*runs, *maintenance] if "Traceback" in p.stderr][:1]
    assert same, [(r.returncode, r.stderr[-300:]) for r in runs]
    assert maintained, [p.stderr for p in maintenance if p.returncode]


# -- a full disk under the registry (issue 23 item 9; the disk: tests/hardening.full_disk_under)


def _two_patch_project(tmp_path: Path) -> tuple[Path, Path]:
    tree = make_tree(tmp_path / "tree", {"vllm/mod.py": BODY, "vllm/other.py": OTHER})
    registry = tmp_path / "patches"
    add_patch(registry, "mod-edit", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(registry, "other-edit", diff=OTHER_FIX, targets=["vllm/other.py"])
    return registry, tree


@pytest.mark.parametrize("skip", [0, 1], ids=["first file", "second file"])
def test_a_full_disk_under_the_registry_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skip: int
) -> None:
    """`check --suggest-ranges --write` of two ranges, the disk full at the first or the
    second file: one line, exit 2, the registry byte for byte as it was, no temp file."""
    registry, tree = _two_patch_project(tmp_path)
    before = snapshot(registry)
    full_disk_under(monkeypatch, registry, skip=skip)
    argv = ("check", "--registry", registry, "--source", f"folder:{tree}")
    proc = cli_in_process(*argv, "--suggest-ranges", "--write")
    err = proc.err.strip().splitlines()
    ok = proc.code == ExitCode.BAD_INPUT and snapshot(registry) == before
    record(FAULT, "full disk under the registry", f"check --write, {skip + 1}", intact=ok)
    assert proc.code == ExitCode.BAD_INPUT, proc.err
    assert len(err) == 1 and "Traceback" not in proc.err, proc.err
    assert "the disk is full (No space left on device); nothing was changed" in err[0]
    assert changed(before, snapshot(registry)) == []
    monkeypatch.undo()  # space again: the same command writes both ranges
    done = cli_in_process(*argv, "--suggest-ranges", "--write")
    assert done.code == ExitCode.OK, done.err
    assert done.out.count("range written:") == 2


def test_a_roll_back_on_a_full_disk_writes_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A change that would not load, with the disk full once its files are in: the roll-back
    only renames (the replaced file kept under a second name), so it needs no space."""
    registry, _ = _two_patch_project(tmp_path)
    before = snapshot(registry)
    loaded = load_registry(registry)
    patch = loaded.get("mod-edit")
    change = RegistryChange(loaded)
    change.add_file(patch, "v9.diff", b"not a diff\n")

    def edit(doc: tomlkit.TOMLDocument) -> None:
        doc["payload"] = "v9.diff"

    change.edit_toml(patch, edit)
    full_disk_under(monkeypatch, registry, skip=2)  # both files staged, then the disk is full
    with pytest.raises(RegistryError, match=r"would not load .* nothing was changed"):
        change.commit()
    ok = snapshot(registry) == before
    record(FAULT, "full disk under the registry", "roll-back on a full disk", intact=ok)
    assert changed(before, snapshot(registry)) == []


# -- a full disk under the registry while `add`, `update` or `remove` writes (item 9) --------

FULL = "the disk is full (No space left on device)"
NEW_DIFF = MOD_DIFF.replace("line 11 patched", "line 11 added")
EDITED = BODY.replace("line 11\n", "line 11 edited\n")


@dataclass(frozen=True)
class _Project:
    registry: Path
    release: Path  # vLLM 0.19.1 as a folder
    diff: Path  # a new diff of vllm/mod.py, outside the registry
    edited: Path  # the release with one line of vllm/mod.py edited


def _project(tmp_path: Path) -> _Project:
    registry, release = _two_patch_project(tmp_path)
    diff = tmp_path / "new.diff"
    diff.write_text(NEW_DIFF)
    edited = make_tree(tmp_path / "edited", {"vllm/mod.py": EDITED, "vllm/other.py": OTHER})
    return _Project(registry, release, diff, edited)


ADDS = {  # the command, what is written when the disk fills, and the files written before it
    "patch.diff": (("--diff", "{diff}", "--vllm", "0.19.1", "--source", "folder:{release}"), 0),
    "patch.toml": (("--diff", "{diff}", "--vllm", "0.19.1", "--source", "folder:{release}"), 1),
    "patch.toml, its checked range": (
        ("--diff", "{diff}", "--vllm", "0.19.1", "--source", "folder:{release}"),
        2,
    ),
    "sites.toml": (
        ("--runtime", "--from-tree", "{edited}", "--vllm", "0.19.1", "--source", "{release}"),
        0,
    ),
    # the one writer of patch folders writes the payload first and patch.toml last
    "a skeleton's patch.toml": (("--runtime",), 1),
    "a skeleton's sites.toml": (("--runtime",), 0),
    "a skeleton's plugin.py": (("--python",), 0),
}


def _error_lines(err: str) -> list[str]:
    """The one error line of a run (progress lines aside), no traceback."""
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.startswith("patchset:")]
    assert len(lines) == 1, err
    return lines


def _argv(project: _Project, words: tuple[str, ...]) -> list[str]:
    places = {"diff": project.diff, "release": project.release, "edited": project.edited}
    return [word.format(**places) for word in words]


@pytest.mark.parametrize("written", ADDS)
def test_a_full_disk_under_add_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, written: str
) -> None:
    """`add` (a diff, a runtime patch from an edited tree, the two skeletons) meeting a full
    disk at each file of its staging folder: one line naming the patch's file, exit 2, no
    staging folder left, the registry byte for byte as it was; with space again the same
    command adds the patch (was exit 70 with a traceback-free "internal error")."""
    project = _project(tmp_path)
    words, skip = ADDS[written]
    argv = ["--registry", str(project.registry), "add", "new-edit", *_argv(project, words)]
    before = snapshot(project.registry)
    full_disk_under(monkeypatch, project.registry, skip=skip)
    proc = cli_in_process(*argv)
    err = _error_lines(proc.err)
    ok = proc.code == ExitCode.BAD_INPUT and snapshot(project.registry) == before
    record(FAULT, "full disk under the registry", f"add, {written}", intact=ok)
    assert proc.code == ExitCode.BAD_INPUT, proc.err
    name = written.rsplit(" ", 1)[-1] if written.startswith("a skeleton") else written
    assert f"new-edit/{name.split(',')[0]}: {FULL}; nothing was added" in err[0], err[0]
    assert changed(before, snapshot(project.registry)) == []
    monkeypatch.undo()
    done = cli_in_process(*argv)
    assert done.code == ExitCode.OK, done.err
    assert (project.registry / "new-edit" / "patch.toml").is_file()


def test_a_full_disk_for_adds_staging_folder_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """No room even for the staging folder's entry: one line, exit 2, nothing added."""
    project = _project(tmp_path)
    before = snapshot(project.registry)
    full_disk_under(monkeypatch, project.registry, folders=True)
    proc = cli_in_process("--registry", project.registry, "add", "new-edit", "--runtime")
    ok = proc.code == ExitCode.BAD_INPUT and snapshot(project.registry) == before
    record(FAULT, "full disk under the registry", "add, its staging folder", intact=ok)
    assert proc.code == ExitCode.BAD_INPUT, proc.err
    _error_lines(proc.err)
    assert f"{FULL}; nothing was added" in proc.err
    assert changed(before, snapshot(project.registry)) == []


@pytest.mark.parametrize("skip", [0, 1], ids=["payload", "patch.toml"])
def test_a_full_disk_under_update_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, skip: int
) -> None:
    """`update ID --diff` meeting a full disk at its new payload or at patch.toml: one line,
    exit 2, the registry as it was (neither file replaced, no temp file); then it updates."""
    project = _project(tmp_path)
    argv = ("--registry", project.registry, "update", "mod-edit", "--diff", project.diff)
    before = snapshot(project.registry)
    full_disk_under(monkeypatch, project.registry, skip=skip)
    proc = cli_in_process(*argv, "--no-check")
    ok = proc.code == ExitCode.BAD_INPUT and snapshot(project.registry) == before
    record(FAULT, "full disk under the registry", f"update, {skip + 1}", intact=ok)
    assert proc.code == ExitCode.BAD_INPUT, proc.err
    _error_lines(proc.err)
    assert f"{FULL}; nothing was changed" in proc.err
    assert changed(before, snapshot(project.registry)) == []
    monkeypatch.undo()
    done = cli_in_process(*argv, "--no-check")
    assert done.code == ExitCode.OK, done.err
    assert "line 11 added" in (project.registry / "mod-edit" / "patch.diff").read_text()


def test_remove_on_a_full_disk_is_one_line_or_done(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`remove` writes no file (it renames the folder aside, then deletes it): with no block
    free for file data it removes the patch; with none for a folder entry either, one line,
    exit 2, nothing removed."""
    project = _project(tmp_path)
    argv = ("--registry", project.registry, "remove", "mod-edit")
    before = snapshot(project.registry)
    full_disk_under(monkeypatch, project.registry, folders=True)
    proc = cli_in_process(*argv)
    ok = proc.code == ExitCode.BAD_INPUT and snapshot(project.registry) == before
    record(FAULT, "full disk under the registry", "remove, no folder entry", intact=ok)
    assert proc.code == ExitCode.BAD_INPUT, proc.err
    _error_lines(proc.err)
    assert "cannot remove it (No space left on device); nothing was removed" in proc.err
    assert changed(before, snapshot(project.registry)) == []
    monkeypatch.undo()
    full_disk_under(monkeypatch, project.registry)  # files only: remove needs none
    done = cli_in_process(*argv)
    assert done.code == ExitCode.OK, done.err
    assert not (project.registry / "mod-edit").exists()
    assert sorted(p.name for p in project.registry.iterdir()) == ["other-edit"]


def test_add_on_a_real_full_file_system_is_one_line_exit_2(tmp_path: Path) -> None:
    """The same on a real file system that fills up (a 1 MB tmpfs, mounted where that is
    permitted: root; skipped with the reason elsewhere): a 2 MB diff does not fit, and the
    add says so in one line, exit 2, leaving the small disk as it was."""
    with small_disk(tmp_path / "disk") as disk:
        registry = disk / "patches"
        shutil.copytree(_project(tmp_path / "project").registry, registry)
        big = tmp_path / "big.diff"
        added = "".join(f"+x{i} = 'a line of a big new module'\n" for i in range(60_000))
        big.write_text(f"--- /dev/null\n+++ b/vllm/big.py\n@@ -0,0 +1,60000 @@\n{added}")
        assert big.stat().st_size > 2_000_000
        before = snapshot(registry)
        proc = cli_in_process("--registry", registry, "add", "big", "--diff", big, "--no-check")
        ok = proc.code == ExitCode.BAD_INPUT and snapshot(registry) == before
        record(FAULT, "full disk under the registry", "add, a real 1 MB file system", intact=ok)
        assert proc.code == ExitCode.BAD_INPUT, proc.err
        _error_lines(proc.err)
        assert f"big/patch.diff: {FULL}; nothing was added" in proc.err
        assert changed(before, snapshot(registry)) == []
        assert not any(p.name.startswith(".add-") for p in registry.iterdir())
