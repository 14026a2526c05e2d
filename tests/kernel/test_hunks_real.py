"""End-of-file appends from vLLM's own history (real releases from the index), placed by
patchset and by `git apply --check` on the very same files."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from patchset.registry import load_registry
from patchset.release_check import check
from patchset.sources.package_index import IndexSource
from tests.helpers.synthetic import add_patch

pytestmark = pytest.mark.network

# (file, release the append was made against, the next release that holds it, a later release
# where upstream has added code after the appended lines)
APPENDS = [
    ("vllm/v1/kv_offload/cpu/policies/base.py", "0.21.0", "0.22.0", "0.24.0"),
    ("vllm/env_override.py", "0.22.1", "0.23.0", "0.24.0"),
]


def _read(source: IndexSource, version: str, rel: str) -> bytes:
    with source.open(version) as tree:
        data = tree.read(rel)
    assert data is not None
    return data


def _git_diff(tmp: Path, rel: str, old: bytes, new: bytes) -> str:
    for side, data in (("a", old), ("b", new)):
        path = tmp / side / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
    out = subprocess.run(
        ["git", "diff", "--no-index", f"a/{rel}", f"b/{rel}"],
        cwd=tmp,
        capture_output=True,
        text=True,
        check=False,
    ).stdout
    return out.replace(f"a/a/{rel}", f"a/{rel}").replace(f"b/b/{rel}", f"b/{rel}")


def _git_fits(tmp: Path, rel: str, data: bytes, diff: str, *, reverse: bool) -> bool:
    tree = tmp / "tree"
    (tree / rel).parent.mkdir(parents=True, exist_ok=True)
    (tree / rel).write_bytes(data)
    (tmp / "p.diff").write_text(diff)
    extra = ["--reverse"] if reverse else []
    done = subprocess.run(
        ["git", "apply", "--check", *extra, str(tmp / "p.diff")],
        cwd=tree,
        capture_output=True,
        check=False,
    )
    return done.returncode == 0


@pytest.mark.parametrize(("rel", "base", "after", "later"), APPENDS)
def test_real_end_of_file_append(
    tmp_path: Path, rel: str, base: str, after: str, later: str
) -> None:
    source = IndexSource()
    files = {v: _read(source, v, rel) for v in (base, after, later)}
    diff = _git_diff(tmp_path, rel, files[base], files[after])
    hunks = diff.split("\n@@")[1:]
    assert len(hunks) == 1 and hunks[0].rstrip("\n").splitlines()[-1].startswith("+")
    registry = tmp_path / "patches"
    add_patch(registry, "eof-append", diff=diff, targets=[rel], vllm=f">={base}")
    report = check(load_registry(registry), [base, after, later], source=source, use_memo=False)
    verdict = {v: report.result(v, "eof-append") for v in (base, after, later)}
    git = {
        v: (
            _git_fits(tmp_path / v, rel, files[v], diff, reverse=False),
            _git_fits(tmp_path / v, rel, files[v], diff, reverse=True),
        )
        for v in (base, after, later)
    }
    # The release it was made against: only forward fits, for git and for patchset.
    assert git[base] == (True, False)
    assert (verdict[base].verdict, verdict[base].signals.reverse) == ("needed", False)
    # The next release holds the appended lines at the end: only the reverse fits. (Placed
    # anywhere, the forward used to fit too, and apply wrote a second copy.)
    assert git[after] == (False, True)
    assert (verdict[after].verdict, verdict[after].signals.forward) == (
        "upstream",
        "already-applied",
    )
    assert verdict[after].disagreement is None
    # Later, code follows the appended lines: git finds neither direction; patchset says
    # upstream and reports the disagreement (docs/check.md, decision table row 8).
    assert git[later] == (False, False)
    why = verdict[later].disagreement
    assert verdict[later].verdict == "upstream"
    assert why is not None and "git apply -R --check fails" in why
