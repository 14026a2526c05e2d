"""The apply engine on small synthetic trees: offsets, fuzz, idempotency, atomicity, safety."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from patchset.engine import transaction
from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode, TargetError
from patchset.registry import load_registry
from tests.helpers.releases import tree_digest
from tests.helpers.synthetic import BODY, MOD_DIFF, OTHER, OTHER_FIX, add_patch, make_tree

DIFF = MOD_DIFF


@pytest.fixture
def registry_dir(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    add_patch(root, "mod-fix", diff=DIFF, targets=["vllm/mod.py"])
    return root


def test_apply_then_reapply_is_a_noop(tmp_path: Path, registry_dir: Path) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    registry = load_registry(registry_dir)
    report = apply(registry, tree)
    assert report.exit_code == ExitCode.OK and report.written
    assert "line 11 patched\n" in (tree / "vllm/mod.py").read_text()
    before = tree_digest(tree)
    again = apply(registry, tree)
    assert [r.outcome for r in again.results] == ["already-applied"]
    assert again.exit_code == ExitCode.OK and not again.written  # ends present: like patch -N
    assert apply(registry, tree, strict=True).exit_code == ExitCode.ALREADY_APPLIED
    assert tree_digest(tree) == before
    back = revert(registry, tree)
    assert [r.outcome for r in back.results] == ["reverted"]
    assert (tree / "vllm/mod.py").read_text() == BODY
    assert revert(registry, tree).exit_code == ExitCode.OK
    assert revert(registry, tree, strict=True).exit_code == ExitCode.ALREADY_APPLIED


def test_offset_is_a_warning_not_clean(tmp_path: Path, registry_dir: Path) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": "extra\nextra\n" + BODY})
    report = apply(load_registry(registry_dir), tree, dry_run=True)
    (result,) = report.results
    assert result.outcome == "applied"
    assert any("offset +2" in w for w in result.warnings)
    assert report.exit_code == ExitCode.OK  # shown as a warning; --strict keeps 7
    assert not report.written
    strict = apply(load_registry(registry_dir), tree, dry_run=True, strict=True)
    assert strict.exit_code == ExitCode.APPLIED_WITH_WARNINGS


def test_fuzz_only_when_allowed(tmp_path: Path, registry_dir: Path) -> None:
    text = BODY.replace("line 13\n", "line thirteen\n")
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": text})
    registry = load_registry(registry_dir)
    strict = apply(registry, tree)
    assert [r.outcome for r in strict.results] == ["conflict"]
    assert (tree / "vllm/mod.py").read_text() == text
    fuzzy = apply(registry, tree, max_fuzz=1)
    assert [r.outcome for r in fuzzy.results] == ["applied"]
    assert any("fuzz 1" in w for w in fuzzy.results[0].warnings)


def test_conflict_names_hunk_and_nearest_lines(tmp_path: Path, registry_dir: Path) -> None:
    text = BODY.replace("line 11\n", "line eleven\n")
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": text})
    report = apply(load_registry(registry_dir), tree)
    (result,) = report.results
    assert result.outcome == "conflict" and report.exit_code == ExitCode.ATTENTION
    assert any("hunk #1 does not match; nearest lines 9-13" in d for d in result.details)
    assert any("line eleven" in d for d in result.details)


def test_all_or_nothing_across_patches(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "a-good", diff=DIFF, targets=["vllm/mod.py"])
    add_patch(
        root,
        "b-bad",
        diff="--- a/vllm/other.py\n+++ b/vllm/other.py\n@@ -1,1 +1,1 @@\n-nothing like it\n+x\n",
        targets=["vllm/other.py"],
    )
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.py": "hello\n"})
    before = tree_digest(tree)
    report = apply(load_registry(root), tree)
    assert [r.outcome for r in report.results] == ["blocked", "conflict"]  # nothing written
    assert not report.written
    assert tree_digest(tree) == before


def test_target_missing(tmp_path: Path, registry_dir: Path) -> None:
    tree = make_tree(tmp_path / "t", {})
    report = apply(load_registry(registry_dir), tree)
    assert [r.outcome for r in report.results] == ["missing-target"]
    assert report.exit_code == ExitCode.MISSING_TARGET


def test_out_of_range(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "mod-fix", diff=DIFF, targets=["vllm/mod.py"], vllm=">=0.20")
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY}, version="0.19.1")
    registry = load_registry(root)
    report = apply(registry, tree, patches=["mod-fix"])  # asked for by id: refused
    assert [r.outcome for r in report.results] == ["out-of-range"]
    assert report.exit_code == ExitCode.OUT_OF_RANGE
    assert (tree / "vllm/mod.py").read_text() == BODY
    assert apply(registry, tree, ignore_range=True).written


def test_crlf_and_no_newline_at_eof(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    diff = (
        "--- a/vllm/crlf.py\n+++ b/vllm/crlf.py\n@@ -1,2 +1,2 @@\n a\n-b\n+c\n"
        "\\ No newline at end of file\n"
    )
    add_patch(root, "crlf-fix", diff=diff, targets=["vllm/crlf.py"])
    tree = make_tree(tmp_path / "t", {"vllm/crlf.py": "a\r\nb"})
    assert apply(load_registry(root), tree).written
    assert (tree / "vllm/crlf.py").read_bytes() == b"a\r\nc"


SITES = """\
[[site]]
name = "one"
file = "vllm/run.py"
action = "replace"
marker = "patchset: synthetic one"
anchor = "x = compute(y).tolist()"
text = '''
if capturing():
    x = 0
else:
    x = compute(y).tolist()
'''

[[site]]
name = "two"
file = "vllm/run.py"
action = "insert-after"
marker = "patchset: synthetic two"
anchor = "def body(self):"
text = "guard()"
"""
RUN = "class A:\n    def body(self):\n        x = compute(y).tolist()\n        return x\n"


def test_runtime_sites_apply_once(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "rt-sites", sites=SITES, targets=["vllm/run.py"], when="startup")
    tree = make_tree(tmp_path / "t", {"vllm/run.py": RUN})
    registry = load_registry(root)
    report = apply(registry, tree)
    assert report.written
    text = (tree / "vllm/run.py").read_text()
    compile(text, "run.py", "exec")
    assert "        # patchset: synthetic one\n        if capturing():\n" in text
    assert "    def body(self):\n        # patchset: synthetic two\n        guard()\n" in text
    assert apply(registry, tree).results[0].outcome == "already-applied"
    assert revert(registry, tree).written
    assert (tree / "vllm/run.py").read_text() == RUN


def test_runtime_anchor_twice_or_absent(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "rt-sites", sites=SITES, targets=["vllm/run.py"], when="startup")
    registry = load_registry(root)
    twice = make_tree(tmp_path / "t", {"vllm/run.py": RUN + RUN})
    (result,) = apply(registry, twice).results
    assert result.outcome == "conflict"
    assert any("ambiguous" in d for d in result.details)
    drifted = make_tree(tmp_path / "u", {"vllm/run.py": RUN.replace(".tolist()", ".cpu()")})
    report = apply(registry, drifted)
    (result,) = report.results
    # One site fits and the other's anchor is gone: `partial`, as check says (was: conflict).
    assert result.outcome == "partial" and report.exit_code == 1 and not report.written
    assert any("anchor-not-found" in d and "nearest" in d for d in result.details)
    assert (drifted / "vllm/run.py").read_text() == RUN.replace(".tolist()", ".cpu()")


def test_symlink_out_of_target_is_refused(tmp_path: Path, registry_dir: Path) -> None:
    outside = tmp_path / "outside.py"
    outside.write_text(BODY)
    tree = make_tree(tmp_path / "t", {})
    (tree / "vllm" / "mod.py").symlink_to(outside)
    with pytest.raises(TargetError, match="leads outside the target"):
        apply(load_registry(registry_dir), tree)
    assert outside.read_text() == BODY


def test_no_vllm_package(tmp_path: Path, registry_dir: Path) -> None:
    with pytest.raises(TargetError, match="no vllm/ package"):
        apply(load_registry(registry_dir), tmp_path)


def test_read_only_file_changes_nothing(tmp_path: Path, registry_dir: Path) -> None:
    """A read-only bind mount is what users hit; root ignores modes, so use an immutable file."""
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    target = tree / "vllm" / "mod.py"
    if os.geteuid() == 0:
        if os.system(f"chattr +i {target} 2>/dev/null") != 0:  # noqa: S605 - fixed argument
            pytest.fail("chattr +i is needed to make a file read-only for root")
    else:
        target.chmod(0o444)
    try:
        with pytest.raises(TargetError, match="not writable"):
            apply(load_registry(registry_dir), tree)
        assert target.read_text() == BODY
        assert not (tree / transaction.JOURNAL).exists()
    finally:
        os.system(f"chattr -i {target} 2>/dev/null")  # noqa: S605 - fixed argument


def test_journal_rolls_back_an_interrupted_write(tmp_path: Path, registry_dir: Path) -> None:
    """A process killed after the journal was written but before it was removed."""
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    journal = tree / transaction.JOURNAL
    journal.mkdir()
    (journal / "0.orig").write_text(BODY)
    entry = {"path": "vllm/mod.py", "backup": "0.orig", "existed": True}
    (journal / "index.json").write_text(json.dumps([entry]))
    (tree / "vllm/mod.py").write_text("half written")
    report = apply(load_registry(registry_dir), tree, dry_run=False)
    assert report.recovered == ("vllm/mod.py",)
    assert report.written
    assert "line 11 patched" in (tree / "vllm/mod.py").read_text()
    assert not journal.exists()


def _scoped(registry: Path, patch_id: str, scope: str) -> None:
    toml = registry / patch_id / "patch.toml"
    toml.write_text(toml.read_text() + f'\n[hardware]\ncompute_capability = "{scope}"\n')


def test_unqualified_apply_selects_what_fits(tmp_path: Path) -> None:
    """A registry for several pins and GPUs: a plain apply takes the patches whose range holds
    the tree's release and whose hardware scope holds the GPU; the others are skipped."""
    root = tmp_path / "patches"
    add_patch(root, "a-old-pin", diff=DIFF, targets=["vllm/mod.py"], vllm="<0.19")
    add_patch(root, "b-sm12x", diff=OTHER_FIX, targets=["vllm/other.py"])
    _scoped(root, "b-sm12x", ">=12.0")
    add_patch(root, "c-fits", diff=DIFF, targets=["vllm/mod.py"])
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.py": OTHER})
    registry = load_registry(root)
    ampere = apply(registry, tree, compute_capability=(8, 6), dry_run=True)
    outcomes = {r.patch: r.outcome for r in ampere.results}
    assert outcomes == {"a-old-pin": "skipped", "b-sm12x": "skipped", "c-fits": "applied"}
    assert ampere.exit_code == ExitCode.OK
    skipped = {r.patch: r.details[0] for r in ampere.results if r.outcome == "skipped"}
    assert "outside this patch's range <0.19" in skipped["a-old-pin"]
    assert "compute capability 8.6" in skipped["b-sm12x"]
    assert ampere.compute_capability == "8.6"
    nogpu = apply(registry, tree, compute_capability=None, dry_run=True)
    assert {r.patch: r.outcome for r in nogpu.results}["b-sm12x"] == "skipped"
    blackwell = apply(registry, tree, compute_capability=(12, 0))
    outcomes = {r.patch: r.outcome for r in blackwell.results}
    assert outcomes == {"a-old-pin": "skipped", "b-sm12x": "applied", "c-fits": "applied"}
    assert blackwell.written and "beta_patched" in (tree / "vllm/other.py").read_text()
    # --patch means exactly those: the hardware scope is named, not enforced (a build host
    # has no GPU); the range still is.
    asked = apply(registry, tree, patches=["b-sm12x"], compute_capability=(8, 6), dry_run=True)
    assert [r.outcome for r in asked.results] == ["already-applied"]
    assert any("asked for by id: compute capability 8.6" in d for d in asked.results[0].details)
    old = apply(registry, tree, patches=["a-old-pin"], dry_run=True)
    assert [r.outcome for r in old.results] == ["out-of-range"]
    assert old.exit_code == ExitCode.OUT_OF_RANGE
    back = revert(registry, tree)
    assert {r.patch: r.outcome for r in back.results} == {
        "a-old-pin": "skipped",
        "b-sm12x": "reverted",
        "c-fits": "reverted",
    }
    assert (tree / "vllm/other.py").read_text() == OTHER


def _count_evaluations(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from patchset.engine import apply as engine_apply

    seen: list[str] = []
    real = getattr(engine_apply, "evaluate")  # noqa: B009 - not exported: the engine's own

    def counted(patch, *args, **kwargs):  # type: ignore[no-untyped-def]
        seen.append(patch.id)
        return real(patch, *args, **kwargs)

    monkeypatch.setattr(engine_apply, "evaluate", counted)
    return seen


def test_the_plan_is_made_once_when_the_tree_stays_as_read(
    tmp_path: Path, registry_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    seen = _count_evaluations(monkeypatch)
    report = apply(load_registry(registry_dir), tree)
    assert report.written and "line 11 patched\n" in (tree / "vllm/mod.py").read_text()
    assert seen == ["mod-fix"]  # not planned again under the lock: nothing it read changed


def test_a_file_changed_before_the_lock_is_planned_again(
    tmp_path: Path, registry_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another run writes the patch between this run's plan and its lock: the plan is made
    again under the lock, finds the patch there and writes nothing."""
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    patched = make_tree(tmp_path / "p", {"vllm/mod.py": BODY})
    apply(load_registry(registry_dir), patched)
    real_locked = transaction.locked

    def other_run_first(root: Path, **kwargs: float | None):  # type: ignore[no-untyped-def]
        (tree / "vllm/mod.py").write_bytes((patched / "vllm/mod.py").read_bytes())
        return real_locked(root, **kwargs)

    monkeypatch.setattr(transaction, "locked", other_run_first)
    seen = _count_evaluations(monkeypatch)
    report = apply(load_registry(registry_dir), tree)
    assert seen == ["mod-fix", "mod-fix"]
    assert [r.outcome for r in report.results] == ["already-applied"] and not report.written
    assert (tree / "vllm/mod.py").read_bytes() == (patched / "vllm/mod.py").read_bytes()
