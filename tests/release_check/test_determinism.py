"""The check's report does not depend on how it was computed: its JSON (and markdown) is the
same bytes for any `--jobs`, cold (an empty cache, the releases read from a package index),
with the files cached but no memo, and warm. A release's ``checked`` files are those the
verdicts rest on, with the sha256 its wheel's RECORD gives, however many of them a process
read: here a split check's child reads files the parent never opens (a python patch's named
modules among them), and a warm check reads none."""

from __future__ import annotations

import json
import shutil
import threading
from pathlib import Path

import pytest

from patchset.authoring.tree import unified
from patchset.release_check import parallel
from tests.helpers.cli import Result, cli
from tests.helpers.fake_index import FakeIndex
from tests.helpers.synthetic import add_patch
from tests.release_check.forks import Counted

VERSIONS = [f"0.4{i}.0" for i in range(6)]
PYTHON = """id = "pkg-hook"
title = "Wrap vllm.pkg.mod.fn"
description = "Wraps fn."
kind = "python"
revision = 1
vllm = ">=0.40.0"
apply = "startup"
targets = ["vllm/pkg/mod.py", "vllm/pkg/__init__.py"]
touches = ["vllm.pkg.mod:fn", "vllm.pkg:VALUE"]
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""


def _module(n: int, v: int) -> str:
    """A module whose second function's limit changes from the third release on (a conflict
    there) and whose first function holds the patch's edit from the fifth on (upstream)."""
    first = 4 if v >= 4 else 8
    second = 9 if v < 2 else 19
    return (
        "import os\n\n\n"
        f"def one_{n}(x):\n    return min(x, {first})\n\n\n"
        f"def two_{n}(x):\n    return min(x, {second})\n\n\n"
        f"def three_{n}(x):\n    return x  # module {n}\n"
    )


def _files(v: int) -> dict[str, bytes]:
    files = {f"vllm/m{n}.py": _module(n, v).encode() for n in range(6)}
    files["vllm/pkg/__init__.py"] = f"VALUE = {v}\n".encode()
    files["vllm/pkg/mod.py"] = b"def fn(x):\n    return x\n"
    if v >= 3:  # a module that turns up later beside the patched ones
        files["vllm/m9.py"] = b"x = 1\n"
    return files


EDITS = (("one", "min(x, 8)", "min(x, 4)"), ("two", "min(x, 9)", "min(x, 2)"))


def _registry(root: Path) -> Path:
    for n in range(6):
        file = f"vllm/m{n}.py"
        text = _module(n, 0)
        for part, old, new in EDITS:
            diff = unified(file, text, text.replace(old, new))
            add_patch(root, f"d{n}-{part}", diff=diff, targets=[file])
    folder = root / "pkg-hook"
    folder.mkdir()
    (folder / "patch.toml").write_text(PYTHON)
    (folder / "plugin.py").write_text("def apply():\n    import vllm.pkg.mod\n")
    return root


def _check(registry: Path, cache: Path, index: FakeIndex | None, *args: str) -> Result:
    where = ["--index-url", index.index_url] if index is not None else ["--offline"]
    argv = ["check", "--registry", str(registry), "--since", VERSIONS[0], *where, *args]
    return cli(*argv, env={"PATCHSET_CACHE_DIR": str(cache), "PATCHSET_JOBS": None})


def test_the_report_is_the_same_bytes_for_any_jobs_cold_or_warm(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    for v, version in enumerate(VERSIONS):
        fake_index.add_release(version, _files(v), wheel_only=True)
    registry = _registry(tmp_path / "patches")
    first = tmp_path / "cache-1"
    cold = _check(registry, first, fake_index, "--format", "json", "--jobs", "1")
    assert cold.code == 1, cold.err  # conflicts in range: attention
    cold_markdown = _check(registry, first, None, "--format", "markdown", "--jobs", "1").out
    fake_index.server.close()  # no thread left running: a check may fork
    assert threading.active_count() == 1, threading.enumerate()
    report = json.loads(cold.out)
    verdicts = {r["verdict"] for r in report["results"]}
    assert {"needed", "upstream", "conflict"} <= verdicts, verdicts
    checked = [c["path"] for c in report["releases"][0]["artifact"]["checked"]]
    # every file a verdict rests on, the python patch's named modules among them
    assert checked == sorted(
        [*(f"vllm/m{n}.py" for n in range(6)), "vllm/pkg/__init__.py", "vllm/pkg/mod.py"]
    ), checked

    second = tmp_path / "cache-2"  # the files cached, no memo: the check is split
    shutil.copytree(first, second)
    shutil.rmtree(second / "memo")
    monkeypatch.setattr(parallel, "Forked", Counted)
    Counted.made = 0
    split = _check(registry, second, None, "--format", "json", "--jobs", "2")
    assert Counted.made == 1  # one child forked: it read the files of its own group only
    assert split.out == cold.out
    warm_split = _check(registry, second, None, "--format", "json", "--jobs", "2")
    warm_one = _check(registry, first, None, "--format", "json", "--jobs", "1")
    assert warm_split.out == cold.out and warm_one.out == cold.out
    third = tmp_path / "cache-3"
    shutil.copytree(first, third)
    shutil.rmtree(third / "memo")
    markdown = _check(registry, third, None, "--format", "markdown", "--jobs", "2").out
    assert markdown == cold_markdown and "d0-one" in markdown
