"""Trust: patch payloads and target trees are data, never run; apply touches only the files
its payload names.

Every place a hostile registry or tree could hide code holds Python that would create a
sentinel file if anything ran it; every command is run; no sentinel may appear.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.sources.package_index import IndexSource
from patchset.sources.package_index.cache import Cache
from tests.helpers.hardening import LOCK, REPO, changed, cli, snapshot
from tests.helpers.reliability import HOSTILE, record
from tests.helpers.synthetic import BODY, make_tree


def _code(sentinels: Path, name: str) -> str:
    """One line of Python that leaves `sentinels/name` behind if it is ever run."""
    return f"__import__('pathlib').Path({str(sentinels / name)!r}).write_text('ran')"


def hostile_registry(root: Path, sentinels: Path) -> Path:
    """Code in the metadata, in the payloads, and in files Python would run if imported."""
    registry = root / "patches"
    diff_dir, sites_dir = registry / "diff-code", registry / "sites-code"
    diff_dir.mkdir(parents=True)
    sites_dir.mkdir()
    for folder in (registry, diff_dir, sites_dir):
        for name in ("__init__.py", "conftest.py", "setup.py", "sitecustomize.py", "noxfile.py"):
            (folder / name).write_text(_code(sentinels, f"{folder.name}-{name}") + "\n")
        (folder / "evil.pth").write_text(f"import os; {_code(sentinels, folder.name + '.pth')}\n")
    meta = """\
id = "{id}"
title = "{code}"
description = '''
{code}
exec("{code}")
'''
kind = "{kind}"
revision = 1
vllm = ">=0.1"
apply = "build"
targets = ["vllm/mod.py"]
origin = "{code}"
credit = ["{code}"]

[upstream]
state = "unsubmitted"
note = "{code}"

[upstream.probe]
file = "vllm/mod.py"
regex = "(?=x)"
"""
    escaped = _code(sentinels, "metadata").replace("\\", "\\\\").replace('"', '\\"')
    for folder, kind in ((diff_dir, "diff"), (sites_dir, "runtime")):
        (folder / "patch.toml").write_text(meta.format(id=folder.name, kind=kind, code=escaped))
    (diff_dir / "patch.diff").write_text(
        "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -9,3 +9,3 @@\n line 9\n"
        f"-line 10\n+{_code(sentinels, 'diff-payload')}\n line 11\n"
    )
    (sites_dir / "sites.toml").write_text(
        '[[site]]\nname = "code"\nfile = "vllm/mod.py"\naction = "insert-after"\n'
        'marker = "patchset: trust"\nanchor = "line 15"\n'
        f"text = '''\n{_code(sentinels, 'site-payload')}\n'''\n"
    )
    return registry


def hostile_tree(root: Path, sentinels: Path) -> Path:
    """A target whose own package code would leave sentinels if patchset imported it."""
    tree = make_tree(root, {"vllm/mod.py": BODY})
    (tree / "vllm" / "__init__.py").write_text(_code(sentinels, "vllm-init") + "\n")
    (tree / "vllm" / "_version.py").write_text(
        f"{_code(sentinels, 'vllm-version')}\n__version__ = version = '0.19.1'\n"
    )
    return tree


def test_payloads_and_trees_are_never_run(tmp_path: Path) -> None:
    sentinels = tmp_path / "sentinels"
    sentinels.mkdir()
    registry = hostile_registry(tmp_path, sentinels)
    tree = hostile_tree(tmp_path / "tree", sentinels)
    base = ("--registry", str(registry))
    commands = [
        ("list",),
        ("show", "diff-code"),
        ("show", "sites-code"),
        ("validate",),
        ("apply", "--target", str(tree), "--dry-run"),
        ("apply", "--target", str(tree)),
        ("apply", "--strict", "--target", str(tree)),
        ("check", "--source", str(tree)),
        ("check", "--source", f"folder:{tree}", "--format", "json"),
        ("revert", "--target", str(tree)),
    ]
    codes = [cli(*base, *args).returncode for args in commands]
    # No --target: the tree is found on the import path (as an installed vllm is), unimported.
    found = cli(*base, "apply", "--dry-run", env={"PYTHONPATH": str(tree)})
    ran = sorted(p.name for p in sentinels.iterdir())
    record(HOSTILE, "trust: code in payloads and trees", "every command", intact=not ran)
    assert not ran, f"something ran code from the registry or the tree: {ran}"
    assert codes[:6] == [0, 0, 0, 0, 0, 0], codes
    assert codes[6] == ExitCode.ALREADY_APPLIED
    assert codes[7:9] == [ExitCode.OK, ExitCode.OK], codes  # both needed, in range
    assert codes[9] == ExitCode.OK
    assert found.returncode == ExitCode.OK, found.stdout + found.stderr
    assert str(tree) in found.stdout.replace("\n", "")


def _real_tree(cache: Cache, version: str, dest: Path) -> Path:
    """Every Python file of a real release's vllm/, from its wheel (through the cache)."""
    with IndexSource(cache=cache).open(version) as tree:
        names = [p for p in tree.paths() if p.endswith(".py")]
        for name, data in tree.read_many(names).items():
            assert data is not None
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            (dest / name).write_bytes(data)
    return dest


@pytest.mark.network
@pytest.mark.parametrize(
    ("version", "patch", "files"),
    [
        ("0.19.1", "fla-tma-sm12x", ["vllm/model_executor/layers/fla/ops/utils.py"]),
        ("0.20.0", "tolist-cudagraph", ["vllm/v1/attention/backends/turboquant_attn.py"]),
    ],
)
def test_apply_touches_only_the_files_its_payload_names(
    tmp_path: Path, release_cache: Cache, version: str, patch: str, files: list[str]
) -> None:
    """A whole real release tree (some 2,000 files), snapshotted before and after."""
    tree = _real_tree(release_cache, version, tmp_path / "tree")
    registry = load_registry(REPO / "patches")
    before = snapshot(tree)
    times = {p: p.stat().st_mtime_ns for p in tree.rglob("*") if p.is_file()}
    report = apply(registry, tree, patches=[patch])
    after = snapshot(tree, ignore=(LOCK,))
    touched = changed(before, after)
    kept_times = all(
        p.stat().st_mtime_ns == t
        for p, t in times.items()
        if p.relative_to(tree).as_posix() not in files
    )
    back = revert(registry, tree, patches=[patch])
    restored = snapshot(tree, ignore=(LOCK,)) == before
    ok = touched == files and kept_times and restored
    record(HOSTILE, "trust: a real release tree", f"{patch} on {version}", intact=ok)
    assert report.written and back.written
    assert touched == files, touched
    assert kept_times, "a file the payload does not name was rewritten"
    assert restored
