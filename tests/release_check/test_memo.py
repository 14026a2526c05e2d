"""The check's memo (release_check/memo.py): a row comes back field for field, a key met
again in the same check is not read twice, a row of an older format is never misread, and a
hit still follows the patch's content and the release's bytes."""

from __future__ import annotations

import ast
import dataclasses
import hashlib
import hmac
import json
import sqlite3
import textwrap
import zlib
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from patchset.engine import evaluate
from patchset.kernel import pycompile, touches
from patchset.registry import Patch, load_registry
from patchset.release_check import CheckResult, check_tree
from patchset.release_check.memo import FORMAT, Memo
from patchset.release_check.report import Signals
from patchset.sources.base import MemoryTree, ReleaseInfo
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

TARGET = "vllm/mod.py"


def _tree(version: str, body: str = BODY) -> MemoryTree:
    return MemoryTree(ReleaseInfo(version, "memory"), {TARGET: body.encode()})


def _patches(registry: Path) -> tuple[Patch, ...]:
    return load_registry(registry).patches


def _seal(folder: Path, *fields: str) -> str:
    """A row's seal as the memo's docstring describes it: an HMAC over its fields, keyed by
    the memo's own secret (a writer who can read it can seal)."""
    key = (folder / ".seal-key").read_bytes()
    return hmac.new(key, "\0".join(fields).encode(), hashlib.sha256).hexdigest()


def test_a_result_comes_back_from_the_memo_field_for_field() -> None:
    """Every field set to a value other than its default: the row (through JSON, as it is
    stored) gives the same result back, and `at` only changes the release and the range."""
    result = CheckResult(
        vllm="0.20.0",
        patch="p",
        revision=3,
        variant="v0.20.diff",
        verdict="partial",
        in_range=True,
        detail="hunk #2 fails",
        signals=Signals(forward="partial", reverse=False, probe=True, ancestry=False),
        disagreement="both fit",
        locations=("vllm/mod.py: hunk #1 applies", "vllm/mod.py: hunk #2 fails"),
        moved_to=("vllm/sub/mod.py",),
        shifted=True,
        failing_hunks=(("vllm/mod.py", 2),),
        failing_sites=("s1",),
        missing=("vllm/gone.py",),
    )
    row = json.loads(json.dumps(result.to_memo()))
    assert isinstance(row, list) and "0.20.0" not in row  # the release is the reader's
    template = CheckResult.from_memo(row)
    assert template.at("0.20.0", in_range=True) == result
    other = template.at("0.21.0", in_range=False)
    assert other == dataclasses.replace(result, vllm="0.21.0", in_range=False)
    assert template.at("0.20.0", in_range=True).to_dict() == result.to_dict()
    assert (other.vllm, template.vllm) == ("0.21.0", "")  # the template is not changed
    # made without __init__: nothing may hang on it running
    assert not hasattr(CheckResult, "__post_init__")


def test_a_key_met_again_in_a_later_release_is_not_read_again(tmp_path: Path) -> None:
    add_patch(tmp_path / "patches", "pat", diff=MOD_DIFF, targets=[TARGET])
    patches = _patches(tmp_path / "patches")
    with Memo(tmp_path / "memo") as made:
        check_tree(patches, _tree("0.19.0"), "0.19.0", memo=made)
    memo = Memo(tmp_path / "memo")
    (first,) = check_tree(patches, _tree("0.19.0"), "0.19.0", memo=memo)
    assert memo.hits == 1
    db = sqlite3.connect(memo.path)
    with db:
        db.execute("DELETE FROM results")
    db.close()
    # The same bytes in the next release: the same key, answered from the row already read.
    (again,) = check_tree(patches, _tree("0.20.0"), "0.20.0", memo=memo)
    assert (memo.hits, memo.misses) == (2, 0)
    assert again == dataclasses.replace(first, vllm="0.20.0")
    # Other bytes: another key, evaluated (what was read does not answer for it).
    changed = BODY.replace("line 11\n", "line 11 patched\n")
    (moved,) = check_tree(patches, _tree("0.21.0", changed), "0.21.0", memo=memo)
    assert (memo.hits, memo.misses) == (2, 1)
    assert (first.verdict, moved.verdict) == ("needed", "upstream")


def test_a_hit_follows_the_patch_content_and_the_release_bytes(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    folder = add_patch(registry, "pat", diff=MOD_DIFF, targets=[TARGET])
    memo = Memo(tmp_path / "memo")
    (r,) = check_tree(_patches(registry), _tree("0.19.0"), "0.19.0", memo=memo)
    assert (r.verdict, memo.misses) == ("needed", 1)
    (r,) = check_tree(_patches(registry), _tree("0.19.0"), "0.19.0", memo=memo)
    assert (r.verdict, memo.hits) == ("needed", 1)
    # The payload changes (its context no longer in the file): the patch is evaluated again.
    (folder / "patch.diff").write_text(MOD_DIFF.replace(" line 12\n", " line twelve\n"))
    (r,) = check_tree(_patches(registry), _tree("0.19.0"), "0.19.0", memo=memo)
    assert (r.verdict, memo.hits, memo.misses) == ("conflict", 1, 2)
    # One byte of the release's file changes: evaluated again.
    (r,) = check_tree(_patches(registry), _tree("0.19.0", BODY + "\n"), "0.19.0", memo=memo)
    assert (memo.hits, memo.misses) == (1, 3)


def _checked_with_forged_row(
    tmp_path: Path, forge: Callable[[CheckResult, str], str]
) -> tuple[CheckResult, CheckResult, Memo, str]:
    """One patch checked into a fresh memo, its row's value replaced by `forge(result, value)`
    under a valid seal, then checked again: the first result, the second, the memo and the
    value first written."""
    add_patch(tmp_path / "patches", "pat", diff=MOD_DIFF, targets=[TARGET])
    patches = _patches(tmp_path / "patches")
    with Memo(tmp_path / "memo") as made:
        (first,) = check_tree(patches, _tree("0.19.0"), "0.19.0", memo=made)
    memo = Memo(tmp_path / "memo")
    db = sqlite3.connect(memo.path)
    with db:
        ((key, value),) = db.execute("SELECT key, value FROM results").fetchall()
        forged = forge(first, value)
        db.execute(
            "UPDATE results SET value = ?, seal = ?", (forged, _seal(memo.path.parent, key, forged))
        )
    db.close()
    (again,) = check_tree(patches, _tree("0.19.0"), "0.19.0", memo=memo)
    return first, again, memo, value


def _format_2(first: CheckResult, _value: str) -> str:
    fields = {**first.to_dict(), "shifted": False, "failing_hunks": [], "missing": []}
    return json.dumps({**fields, "verdict": "upstream", "failing_sites": []}, sort_keys=True)


def test_a_row_of_the_older_format_is_dropped_not_misread(tmp_path: Path) -> None:
    """A row holding a result as format 2 wrote it (a JSON object), even under the current
    key and with a valid seal, is no row of this format: dropped and computed again."""
    first, again, memo, value = _checked_with_forged_row(tmp_path, _format_2)
    assert (memo.hits, memo.misses) == (0, 1)
    assert again == first
    db = sqlite3.connect(memo.path)
    assert db.execute("SELECT value FROM results").fetchall() == [(value,)]  # written again
    db.close()


def test_the_memo_file_of_an_older_format_is_not_read(tmp_path: Path) -> None:
    """Each format has its own file: an older one left in the folder is neither opened nor
    changed, and the check's results are computed."""
    add_patch(tmp_path / "patches", "pat", diff=MOD_DIFF, targets=[TARGET])
    folder = tmp_path / "memo"
    folder.mkdir()
    older = folder / f"check-{FORMAT - 1}.sqlite"
    older.write_bytes(b"not a database of this format")
    memo = Memo(folder)
    assert memo.path.name == f"check-{FORMAT}.sqlite"
    (r,) = check_tree(_patches(tmp_path / "patches"), _tree("0.19.0"), "0.19.0", memo=memo)
    assert (r.verdict, memo.hits, memo.misses) == ("needed", 0, 1)
    assert older.read_bytes() == b"not a database of this format"


@pytest.mark.parametrize(
    "rewrite",
    [
        lambda row: row[:-1],  # a field short
        lambda row: [*row, []],  # a field too many
        lambda row: [*row[:5], [["applies"], None, None, None], *row[6:]],  # signals not plain
        lambda row: [*row[:5], ["applies", None, None, None, None], *row[6:]],  # five signals
        lambda row: [*row[:10], [["vllm/mod.py"]], *row[11:]],  # a failing hunk without its number
        lambda row: {"verdict": "upstream"},
        lambda row: "upstream",
    ],
)
def test_a_sealed_row_that_is_no_result_is_dropped(tmp_path: Path, rewrite: Any) -> None:
    """A row whose seal fits but whose value is not a result's row (a field short or too
    many, signals that are not four plain values, a hunk without its number, not a list)
    is dropped and the result computed again, never half-read."""
    first, again, memo, _ = _checked_with_forged_row(
        tmp_path, lambda _, value: json.dumps(rewrite(json.loads(value)))
    )
    assert (memo.hits, memo.misses) == (0, 1) and again == first


def test_a_releases_digests_are_one_row_added_to_and_sealed(tmp_path: Path) -> None:
    """A release's file digests are kept in one row: a second check's files are added to the
    first's (neither lost), and a row rewritten (its seal no longer fits) or not a mapping of
    texts is dropped, the digests taken again."""
    memo = Memo(tmp_path / "memo")
    assert memo.digests("r1") == {}
    memo.put_digests("r1", {"vllm/a.py": "aa", "vllm/gone.py": "-"})
    memo.put_digests("r1", {"vllm/b.py": "bb"})
    memo.put_digests("r2", {"vllm/a.py": "a2"})
    with Memo(tmp_path / "memo") as other:
        assert other.digests("r1") == {
            "vllm/a.py": "aa",
            "vllm/gone.py": "-",
            "vllm/b.py": "bb",
        }
    db = sqlite3.connect(memo.path)
    with db:
        db.execute("UPDATE releases SET digests = ? WHERE release = 'r1'", ('{"vllm/a.py":"xx"}',))
        forged = json.dumps({"vllm/a.py": 1})
        db.execute(
            "UPDATE releases SET digests = ?, seal = ? WHERE release = 'r2'",
            (forged, _seal(memo.path.parent, "r2", forged)),
        )
    db.close()
    again = Memo(tmp_path / "memo")
    assert (again.digests("r1"), again.digests("r2")) == ({}, {})
    db = sqlite3.connect(again.path)
    assert db.execute("SELECT count(*) FROM releases").fetchone() == (0,)  # both dropped
    db.close()


def test_the_code_that_decides_a_verdict_keys_the_memo() -> None:
    """Every module whose answer a verdict depends on (the hunks, the sites and the `when`
    they are served under, the compile check and its units, a python patch's names, the
    engine, the decision table)
    is among those whose code starts a fresh memo when it changes, and each of them exists."""
    from patchset.release_check import memo

    root = Path(memo.__file__).resolve().parent.parent
    deciders = memo._DECIDERS
    for rel in (
        "kernel/pycompile.py",
        "kernel/pyunits.py",
        "kernel/served.py",
        "kernel/touches.py",
    ):
        assert rel in deciders
    assert all((root / rel).is_file() for rel in deciders), deciders


PY_TARGET = "vllm/model.py"
PY_BODY = "".join(f"def f{n}(x):\n    return x + {n}\n" for n in range(40))
PY_DIFF = """\
    --- a/vllm/model.py
    +++ b/vllm/model.py
    @@ -5,3 +5,3 @@
     def f2(x):
    -    return x + 2
    +    return x + {new}
     def f3(x):
    """


def _checked_counting(
    registry: Path, memo: Memo, body: str, worker: tuple[ModuleType, str]
) -> tuple[CheckResult, int]:
    """The registry checked against one release whose `PY_TARGET` is `body`, nothing worked
    out beforehand: its result, and how many times `worker` (a module and the name of its
    function that works a fact out of a source) was called on the release's file."""
    evaluate.clear_caches()  # the compiled sources, the modules' names, the touches' answers
    module, name = worker
    real = getattr(module, name)
    calls: list[object] = []

    def counted(source: bytes | str) -> Any:
        if source == body.encode():  # not the patched file, nor a plugin the loader reads
            calls.append(source)
        return real(source)

    setattr(module, name, counted)
    try:
        tree = MemoryTree(ReleaseInfo("0.19.0", "memory"), {PY_TARGET: body.encode()})
        (result,) = check_tree(_patches(registry), tree, "0.19.0", memo=memo)
    finally:
        setattr(module, name, real)
        memo.close()  # its facts written (a later use opens it again)
    return result, len(calls)


def _python_check(registry: Path, memo: Memo, new: str) -> tuple[CheckResult, int]:
    """The patch's payload set to make f2 return `new`, checked against `PY_BODY`: its
    result, and how many times the release's file was compiled (once, unless the memo held
    what compiling it told)."""
    (registry / "pat" / "patch.diff").write_text(textwrap.dedent(PY_DIFF.format(new=new)))
    return _checked_counting(registry, memo, PY_BODY, (pycompile, "_compile_known"))


def test_what_compiling_a_release_file_told_is_kept_with_the_results(tmp_path: Path) -> None:
    """The release's file is compiled once in any number of runs: its facts (where its defs
    start and end...) are a sealed row of the memo, read by the next check that edits it (a
    patch's payload edited: its result computed again, the release's file not compiled).
    A row rewritten, or sealed but no such facts, is dropped, the file compiled again, and
    the result is the same."""
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=PY_DIFF.format(new="20"), targets=[PY_TARGET])
    first, compiled = _python_check(registry, Memo(tmp_path / "memo"), "20")
    assert (first.verdict, compiled) == ("needed", 1)
    memo = Memo(tmp_path / "memo")
    edited, compiled = _python_check(registry, memo, "21")
    assert (edited.verdict, memo.misses, compiled) == ("needed", 1, 0)
    broken, compiled = _python_check(registry, Memo(tmp_path / "memo"), "(")  # kept: not compiled
    assert (broken.verdict, compiled) == ("conflict", 0)
    assert "would not compile after the edit" in broken.detail
    upgraded = Memo(tmp_path / "memo")  # another deciding code, the same code working facts out
    upgraded.code = "another"
    upgraded._base = hashlib.sha256(b"another")
    again, compiled = _python_check(registry, upgraded, "21")
    assert (again, upgraded.misses, compiled) == (edited, 1, 0)  # computed, not compiled

    db = sqlite3.connect(Memo(tmp_path / "memo").path)
    ((key, value),) = db.execute("SELECT key, value FROM facts").fetchall()
    text = zlib.decompress(value).decode()  # the fact's JSON, compressed
    assert json.loads(text)[:2] == [None, None]  # it compiles
    rewritten = text.replace("[", "[ ", 1)
    for forged, seal, new in [  # each with a payload not checked yet (no result kept)
        (rewritten, "0" * 64, "22"),  # rewritten: the seal does not fit
        ("[1, 2]", _seal(tmp_path / "memo", key, "[1, 2]"), "23"),  # sealed, not facts
    ]:
        with db:
            db.execute(
                "UPDATE facts SET value = ?, seal = ?", (zlib.compress(forged.encode()), seal)
            )
        again, compiled = _python_check(registry, Memo(tmp_path / "memo"), new)
        assert (again.verdict, compiled) == ("needed", 1)
        assert db.execute("SELECT value FROM facts").fetchall() == [(value,)]  # written again
    db.close()


HOOK_TOML = """id = "hook"
title = "Wrap vllm.model.Model.forward"
description = "Wraps forward."
kind = "python"
revision = 1
vllm = ">=0.1"
apply = "startup"
targets = ["vllm/model.py"]
touches = ["vllm.model:Model.{name}"]
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""
HOOK_MODULE = "import os\n\n\nclass Model:\n" + "".join(
    f"    def m{n}(self):\n        return {n}\n\n" for n in range(40)
)


def _hook_check(registry: Path, memo: Memo, name: str) -> tuple[CheckResult, int]:
    """The python patch set to touch `Model.<name>`, checked against `HOOK_MODULE`: its
    result, and how many times the release's module was read for the names it binds."""
    (registry / "hook" / "patch.toml").write_text(HOOK_TOML.format(name=name))
    return _checked_counting(registry, memo, HOOK_MODULE, (touches, "_module_scope_made"))


def test_the_names_a_release_module_binds_are_kept_with_the_results(tmp_path: Path) -> None:
    """A python patch's names are looked up in the release's module, whose names (a class's
    too) are worked out once in any number of runs: kept in the memo and read by the next
    check (the patch edited: its result computed again, the module not read again). A row
    that is no such names is not believed: worked out again, and written again."""
    registry = tmp_path / "patches"
    (registry / "hook").mkdir(parents=True)
    (registry / "hook" / "plugin.py").write_text("def apply():\n    pass\n")
    first, made = _hook_check(registry, Memo(tmp_path / "memo"), "m3")
    assert (first.verdict, made) == ("needed", 1)
    memo = Memo(tmp_path / "memo")
    edited, made = _hook_check(registry, memo, "m39")
    assert (edited.verdict, memo.misses, made) == ("needed", 1, 0)
    gone, made = _hook_check(registry, Memo(tmp_path / "memo"), "m40")
    assert (gone.verdict, made) == ("missing-target", 0)
    db = sqlite3.connect(Memo(tmp_path / "memo").path)
    ((key, value),) = db.execute("SELECT key, value FROM facts").fetchall()
    assert set(json.loads(zlib.decompress(value))) == {"os", "Model"}
    forged = json.dumps({"os": None, "Model": ["m41"]})  # sealed, not names
    with db:
        db.execute(
            "UPDATE facts SET value = ?, seal = ?",
            (zlib.compress(forged.encode()), _seal(tmp_path / "memo", key, forged)),
        )
    again, made = _hook_check(registry, Memo(tmp_path / "memo"), "m41")
    assert (again.verdict, made) == ("missing-target", 1)
    assert db.execute("SELECT value FROM facts").fetchall() == [(value,)]
    db.close()


def _kernel_imports(rel: str, root: Path) -> set[str]:
    """The kernel modules `rel` (a kernel module, "kernel/x.py") imports, as "kernel/y.py"."""
    tree = ast.parse((root / rel).read_text())
    found: set[str] = set()
    for node in ast.walk(tree):
        if not isinstance(node, ast.ImportFrom):
            continue
        inside = node.level == 1 or node.module in {"patchset.kernel", None}
        if node.level == 1 and node.module:
            found.add(f"kernel/{node.module}.py")
        elif node.module and node.module.startswith("patchset.kernel."):
            found.add(f"kernel/{node.module.rsplit('.', 1)[1]}.py")
        elif inside:
            found.update(f"kernel/{a.name}.py" for a in node.names)
    return {m for m in found if (root / m).is_file()}


@pytest.mark.parametrize("listed", ["_DECIDERS", "_FACT_MAKERS"])
def test_the_modules_that_key_the_memo_hold_the_kernel_modules_they_import(listed: str) -> None:
    """A kernel module imported (transitively) by one whose code keys the memo's results or
    its facts is among them: a change to it starts a fresh memo (or fresh facts)."""
    from patchset.release_check import memo

    root = Path(memo.__file__).resolve().parent.parent
    modules = set(getattr(memo, listed))
    todo = [m for m in modules if m.startswith("kernel/")]
    seen = set(todo)
    while todo:
        for imported in _kernel_imports(todo.pop(), root):
            if imported not in seen:
                seen.add(imported)
                todo.append(imported)
    assert seen <= modules, sorted(seen - modules)
