"""An import is whole-or-nothing and exclusive (issue 37: E5 E6 E7 E15 E19): killed at each
rename of its swap, raced by an `add`, on a full disk, over a patch folder holding the user's
own files; and a refused registry write leaves no temp file."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from patchset.errors import ExitCode, RegistryError
from patchset.registry import load_registry
from patchset.registry.write import RegistryChange
from tests.helpers import import_fixtures as fx
from tests.helpers.cli import cli, run_cli
from tests.helpers.hardening import changed, full_disk_under, snapshot
from tests.helpers.synthetic import MOD_DIFF, OTHER_DIFF, add_patch

REPO = Path(__file__).resolve().parent.parent
FAULTRUN = REPO / "tests" / "helpers" / "faultrun.py"
NORMAL = 1  # the fixture's import: some of its entries are not imported (attention)


def _faultrun(*args: str | Path, env: dict[str, str]) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, str(FAULTRUN), *map(str, args)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, **env},
    )


def _project(root: Path) -> Path:
    """A registry holding one patch of the user's own."""
    registry = root / "p" / "patches"
    add_patch(registry, "mine", diff=MOD_DIFF, targets=["vllm/mod.py"])
    return registry


def _ids(registry: Path) -> set[str]:
    return {p.name for p in registry.iterdir() if p.is_dir() and not p.name.startswith(".")}


def _leftovers(registry: Path) -> list[str]:
    return sorted(
        p.name
        for p in registry.parent.iterdir()
        if p.name.startswith(
            (".patchset-import-", f".{registry.name}.old", f".{registry.name}.swap")
        )
    )


def test_import_killed_at_each_rename_keeps_the_users_patch(tmp_path: Path) -> None:
    """E5: kill -9 at every rename of the import (and right after each): the registry is
    the old one, the new one, or a swap the next writer finishes; the next import ends with
    the user's patch and the collection's, and nothing left beside it."""
    checkout = fx.genesis(tmp_path / "g")
    reference = _project(tmp_path / "ref")
    trace = tmp_path / "trace"
    args = ("--registry", reference, "import", "genesis", checkout)
    done = _faultrun(*args, env={"FAULT_TRACE": str(trace)})
    _, err = done.communicate(timeout=120)
    assert done.returncode == NORMAL, err
    imported = _ids(reference)
    assert "mine" in imported and len(imported) > 1
    steps = [int(n) for n, name in (line.split() for line in trace.read_text().splitlines())
             if name in ("rename", "replace")]  # fmt: skip
    picked = sorted({s for step in steps for s in (step - 1, step, step + 1) if s > 0})
    assert len(steps) >= 2
    bad = []
    for step in picked:
        registry = _project(tmp_path / f"k{step}")
        killed = _faultrun("--registry", registry, "import", "genesis", checkout,
                           env={"FAULT_KILL_AT": str(step)})  # fmt: skip
        killed.communicate(timeout=120)
        if registry.is_dir():
            left = (
                "new"
                if _ids(registry) == imported
                else "old"
                if _ids(registry) == {"mine"}
                else "?"
            )
        else:
            swap = registry.with_name(".patches.swap")
            left = (
                "swap" if swap.exists() and registry.with_name(".patches.old").is_dir() else "gone"
            )
        again = cli("--registry", registry, "import", "genesis", checkout)
        ok = killed.returncode == -9 and left in ("old", "new", "swap")
        ok = ok and again.code == NORMAL and _ids(registry) == imported and not _leftovers(registry)
        ok = ok and cli("--registry", registry, "validate").code == 0
        if not ok:
            bad.append((step, killed.returncode, left, again.code, again.err[-300:]))
    assert not bad, bad


def test_an_add_during_an_import_is_not_lost(tmp_path: Path) -> None:
    """E6: an `add` started while an import holds the registry (paused mid-copy) waits for
    it, and its patch is in the registry after both (on the main it said `added` and the
    import's swap dropped it)."""
    checkout = fx.genesis(tmp_path / "g")
    registry = _project(tmp_path)
    diff = tmp_path / "fix.diff"
    diff.write_text(OTHER_DIFF)
    importing = _faultrun("--registry", registry, "import", "genesis", checkout,
                          env={"FAULT_SLEEP_AT": "3", "FAULT_SLEEP": "3"})  # fmt: skip
    assert importing.stderr is not None
    assert importing.stderr.readline().strip() == "faultrun: sleeping"
    adding = run_cli("--registry", registry, "add", "new-fix", "--diff", diff, "--no-check",
                     "--title", "a fix", timeout=120)  # fmt: skip
    _, err = importing.communicate(timeout=120)
    assert importing.returncode == NORMAL, err
    ids = _ids(registry)
    assert "mine" in ids and "genesis-g1" in ids
    # its staging folder was carried into the import's copy: it finished into the new one
    assert adding.returncode == 0, adding.stderr
    assert "new-fix" in ids, adding.stdout
    assert cli("--registry", registry, "validate").code == 0


def test_a_reimport_keeps_the_users_files_in_a_patch_folder(tmp_path: Path) -> None:
    """E7: files the import did not write (NOTES.md, research/bench.csv) survive an update of
    that patch, and are named."""
    registry = _project(tmp_path)
    assert (
        cli("--registry", registry, "import", "genesis", fx.genesis(tmp_path / "g1")).code == NORMAL
    )
    folder = registry / "genesis-g1"
    (folder / "NOTES.md").write_text("my notes\n")
    (folder / "research").mkdir()
    (folder / "research" / "bench.csv").write_text("a,b\n1,2\n")
    checkout = fx.genesis(tmp_path / "g2", new_text="y = x + 3")
    again = cli("--registry", registry, "import", "genesis", checkout, "--format", "json")
    assert again.code == NORMAL, again.err
    assert "genesis-g1" in again.out and "updated" in again.out
    assert (folder / "NOTES.md").read_text() == "my notes\n"
    assert (folder / "research" / "bench.csv").read_text() == "a,b\n1,2\n"
    assert "NOTES.md (not the import's: kept)" in again.out
    assert "research/ (not the import's: kept)" in again.out


def test_an_import_on_a_full_disk_is_one_line_exit_2(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E19: the disk fills while the import copies or writes: one line, exit 2, the
    registry as it was, no staging copy left."""
    registry = _project(tmp_path)
    checkout = fx.genesis(tmp_path / "g")
    before = snapshot(registry)
    full_disk_under(monkeypatch, registry.parent, skip=1)
    got = cli("--registry", registry, "import", "genesis", checkout)
    monkeypatch.undo()
    assert got.code == ExitCode.BAD_INPUT, got.err
    assert got.err.count("\n") == 1 and "Traceback" not in got.err
    assert "the disk is full" in got.err and "nothing was imported" in got.err
    assert changed(before, snapshot(registry)) == []
    assert not _leftovers(registry)


def test_a_refused_registry_write_leaves_no_temp_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """E15: the rename of a staged patch.toml refused (a file the system will not replace):
    one error, nothing changed, and no `.patch.toml.*.tmp` beside it."""
    registry = _project(tmp_path)
    before = snapshot(registry)
    real = os.replace

    def refuse(src: object, dst: object, *a: object, **k: object) -> None:
        if str(dst).endswith("patch.toml") and str(src).endswith(".tmp"):
            raise PermissionError(1, "Operation not permitted", str(dst))
        real(src, dst, *a, **k)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "replace", refuse)
    change = RegistryChange(load_registry(registry))
    change.edit_toml(load_registry(registry).get("mine"), lambda doc: doc.update(title="new"))
    with pytest.raises(RegistryError, match="nothing was changed"):
        change.commit()
    monkeypatch.undo()
    assert changed(before, snapshot(registry)) == []
    assert [p.name for p in (registry / "mine").iterdir() if p.name.endswith(".tmp")] == []


def test_a_second_writer_waits_for_the_lock(tmp_path: Path) -> None:
    """E6: `remove` while another process holds the registry's lock waits for it."""
    registry = _project(tmp_path)
    holder = subprocess.Popen(
        [sys.executable, "-c",
         "import sys, time; from pathlib import Path\n"
         "from patchset.registry.lock import registry_lock\n"
         "with registry_lock(Path(sys.argv[1])):\n"
         "    print('held', flush=True); time.sleep(2)\n", str(registry)],
        cwd=REPO, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
    started = time.monotonic()
    got = cli("--registry", registry, "remove", "mine")
    waited = time.monotonic() - started
    holder.communicate(timeout=30)
    assert got.code == 0, got.err
    assert waited > 1.0  # it waited for the holder, not written beside it
    assert "mine" not in _ids(registry)
