"""Hidden files left by a killed write (`registry.leftovers`): `validate` removes the stale
ones and says so; a fresh one (a write that may be under way) and other dot files stay."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from patchset.cli.main import main
from patchset.registry import leftovers, load_registry
from tests.helpers.synthetic import MOD_DIFF, add_patch

KILLED_WRITE = textwrap.dedent(
    """
    import os, sys
    from pathlib import Path
    from patchset._fs import atomic_file
    from patchset.authoring.add import _staging

    target = Path(sys.argv[1])
    with _staging(target.parent.parent, "newpatch") as folder:
        (folder / "patch.toml").write_text("half")
        with atomic_file(target) as out:
            out.write(b"half-written")
            out.flush()
            os.kill(os.getpid(), 9)
    """
)


def _killed_write(target: Path) -> None:
    """A real process killed inside an `add` staging folder and an atomic write of `target`."""
    done = subprocess.run(
        [sys.executable, "-c", KILLED_WRITE, str(target)], check=False, timeout=60
    )
    assert done.returncode == -9


def _age(path: Path, seconds: float) -> None:
    then = time.time() - seconds
    os.utime(path, (then, then), follow_symlinks=False)


def test_validate_removes_what_a_killed_write_left(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "patches"
    folder = add_patch(registry, "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    before = toml.read_bytes()
    _killed_write(toml)
    left = leftovers.leftovers(registry)
    names = sorted(item.path.name for item in left)
    assert len(left) == 2, names
    assert names[0].startswith(".add-newpatch-") and names[1].startswith(".patch.toml.")
    assert toml.read_bytes() == before  # the atomic write never reached the file
    assert [p.id for p in load_registry(registry).patches] == ["pat"]  # skipped by the loader
    # A write still under way (young) and dot files of other shapes are not patchset's to take.
    (registry / ".keep").write_text("")
    (folder / ".notes.tmp").write_text("")
    assert main(["validate", "--registry", str(registry)]) == 0
    assert "removed" not in capsys.readouterr().out
    assert len(leftovers.leftovers(registry)) == 2
    for item in left:
        _age(item.path, leftovers.STALE_AFTER + 60)
    assert main(["validate", "--registry", str(registry)]) == 0
    out = capsys.readouterr().out
    for item in left:
        assert f"removed {item.path}: left by an interrupted write 11 minutes ago" in out
    assert leftovers.leftovers(registry) == []
    assert (registry / ".keep").exists() and (folder / ".notes.tmp").exists()
    assert toml.read_bytes() == before


def test_validate_json_lists_what_it_removed(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    registry = tmp_path / "patches"
    folder = add_patch(registry, "pat", diff=MOD_DIFF, targets=["vllm/mod.py"])
    stale = folder / ".patch.diff.abc_1234.tmp"
    stale.write_text("half")
    _age(stale, leftovers.STALE_AFTER + 1)
    outside = tmp_path / ".patch.diff.zzzz9999.tmp"  # beside the registry: not looked at
    outside.write_text("")
    link = folder / ".patch.toml.abcd1234.tmp"  # a symlink is never followed nor removed
    link.symlink_to(outside)
    _age(link, leftovers.STALE_AFTER + 1)
    assert main(["validate", "--registry", str(registry), "--format", "json"]) == 0
    assert json.loads(capsys.readouterr().out)["removed"] == [str(stale)]
    assert not stale.exists() and link.is_symlink() and outside.exists()
