"""Order and overlap: `requires` (a stacked series applied in its own order, never the
alphabet's, and checked on top of what it requires), `conflicts`, two patches changing the
same lines refused before any write; tolerant loading and the `[x]` table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.cli.main import main
from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode, RegistryError
from patchset.registry import load_registry
from patchset.release_check import check_tree
from patchset.sources.base import MemoryTree, ReleaseInfo
from tests.helpers.releases import tree_digest
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    ON_TOP,
    OTHER,
    OTHER_FIX,
    add_keys,
    add_patch,
    make_tree,
)

ELSEWHERE = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -1,4 +1,4 @@
 line 1
-line 2
+line 2 patched
 line 3
 line 4
"""


@pytest.fixture
def series(tmp_path: Path) -> Path:
    """'a-second' requires 'z-first': the alphabet would put them the wrong way round."""
    root = tmp_path / "patches"
    add_patch(root, "z-first", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "a-second", diff=ON_TOP, targets=["vllm/mod.py"])
    add_keys(root, "a-second", 'requires = ["z-first"]')
    return root


def test_a_series_applies_in_its_order_and_reverts_backwards(tmp_path: Path, series: Path) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    registry = load_registry(series)
    assert registry.get("a-second").requires == ("z-first",)
    report = apply(registry, tree)
    assert [(r.patch, r.outcome) for r in report.results] == [
        ("z-first", "applied"),
        ("a-second", "applied"),
    ]
    assert report.written and report.exit_code == ExitCode.OK
    text = (tree / "vllm/mod.py").read_text()
    assert "line 11 patched\nline 12 patched too\n" in text
    back = revert(registry, tree)
    assert [(r.patch, r.outcome) for r in back.results] == [
        ("a-second", "reverted"),
        ("z-first", "reverted"),
    ]
    assert (tree / "vllm/mod.py").read_text() == BODY


def test_asking_for_the_top_brings_what_it_requires(tmp_path: Path, series: Path) -> None:
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    report = apply(load_registry(series), tree, patches=["a-second"])
    assert [r.patch for r in report.results] == ["z-first", "a-second"]
    assert report.written
    # reverting the bottom takes what is stacked on it out first; the top alone, only it
    back = revert(load_registry(series), tree, patches=["z-first"], dry_run=True)
    assert [r.patch for r in back.results] == ["a-second", "z-first"]
    top = revert(load_registry(series), tree, patches=["a-second"])
    assert [(r.patch, r.outcome) for r in top.results] == [("a-second", "reverted")]
    assert "line 11 patched\nline 12\n" in (tree / "vllm/mod.py").read_text()


def test_a_patch_requiring_a_skipped_one_is_skipped(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "z-first", diff=MOD_DIFF, targets=["vllm/mod.py"], vllm=">=0.20")
    add_patch(root, "a-second", diff=ON_TOP, targets=["vllm/mod.py"])
    add_keys(root, "a-second", 'requires = ["z-first"]')
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY}, version="0.19.1")
    report = apply(load_registry(root), tree)
    outcomes = {r.patch: (r.outcome, r.details[0]) for r in report.results}
    assert outcomes["a-second"] == ("skipped", "requires z-first, skipped here")
    assert outcomes["z-first"][0] == "skipped"
    assert report.exit_code == ExitCode.OK and not report.written


def test_check_reads_a_stacked_patch_on_top_of_what_it_requires(series: Path) -> None:
    registry = load_registry(series)
    tree = MemoryTree(ReleaseInfo("0.19.1", "memory"), {"vllm/mod.py": BODY.encode()})
    stacked = {
        r.patch: r.verdict for r in check_tree(registry.patches, tree, "0.19.1", registry=registry)
    }
    assert stacked == {"a-second": "needed", "z-first": "needed"}
    alone = {r.patch: r.verdict for r in check_tree(registry.patches, tree, "0.19.1")}
    assert alone["a-second"] == "conflict"  # what check said before requires existed


def test_same_edit_twice_is_refused_naming_both(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "fix-one", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "fix-two", diff=MOD_DIFF, targets=["vllm/mod.py"])  # the same edit
    add_patch(root, "fix-far", diff=ELSEWHERE, targets=["vllm/mod.py"])  # same file, apart
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    before = tree_digest(tree)
    report = apply(load_registry(root), tree)
    outcomes = {r.patch: r.outcome for r in report.results}
    assert outcomes == {"fix-far": "blocked", "fix-one": "conflict", "fix-two": "conflict"}
    details = {r.patch: r.details[0] for r in report.results}
    assert "changes the same lines as fix-two (vllm/mod.py line 11)" in details["fix-one"]
    assert "changes the same lines as fix-one" in details["fix-two"]
    assert report.exit_code == ExitCode.ATTENTION and not report.written
    assert tree_digest(tree) == before
    # apart, on the same file: no refusal
    only = apply(load_registry(root), tree, patches=["fix-one", "fix-far"])
    assert only.written and "line 2 patched" in (tree / "vllm/mod.py").read_text()


def test_declared_conflicts_refuse_the_pair(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "fix-mod", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "fix-other", diff=OTHER_FIX, targets=["vllm/other.py"])
    add_keys(root, "fix-other", 'conflicts = ["fix-mod"]')
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.py": OTHER})
    report = apply(load_registry(root), tree)
    assert {r.patch: r.outcome for r in report.results} == {
        "fix-mod": "conflict",
        "fix-other": "conflict",
    }
    assert any("conflicts with fix-other" in d for d in report.results[0].details)
    assert not report.written
    assert apply(load_registry(root), tree, patches=["fix-other"]).written


def test_conflicts_hold_across_runs_read_from_the_tree(tmp_path: Path) -> None:
    """Issue 23 item 18: with fix-other in the tree, `apply --patch fix-mod` (declared to
    conflict) is refused, exit 1, nothing written (was: exit 0, both in the tree)."""
    root = tmp_path / "patches"
    add_patch(root, "fix-mod", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "fix-other", diff=OTHER_FIX, targets=["vllm/other.py"])
    add_keys(root, "fix-other", 'conflicts = ["fix-mod"]')
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.py": OTHER})
    registry = load_registry(root)
    assert apply(registry, tree, patches=["fix-other"]).written
    before = tree_digest(tree)
    report = apply(registry, tree, patches=["fix-mod"])
    (result,) = report.results
    assert result.outcome == "conflict" and report.exit_code == ExitCode.ATTENTION
    assert "conflicts with fix-other, which the tree holds" in result.details[0]
    assert not report.written and tree_digest(tree) == before
    # the other way round, declared on the other side: the same
    assert revert(registry, tree, patches=["fix-other"]).written
    assert apply(registry, tree, patches=["fix-mod"]).written
    (result,) = apply(registry, tree, patches=["fix-other"]).results
    assert result.outcome == "conflict" and "fix-mod, which the tree holds" in result.details[0]


def test_requires_and_conflicts_of_one_id_is_refused_on_load(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    add_patch(root, "fix-mod", diff=MOD_DIFF, targets=["vllm/mod.py"])
    add_patch(root, "fix-other", diff=OTHER_FIX, targets=["vllm/other.py"])
    add_keys(root, "fix-other", 'requires = ["fix-mod"]\nconflicts = ["fix-mod"]')
    with pytest.raises(RegistryError, match="conflicts: fix-mod is also in requires"):
        load_registry(root)


@pytest.mark.parametrize(
    ("key", "message"),
    [
        ('requires = ["nope-x"]', "requires: no patch 'nope-x'"),
        ('requires = ["z-first"]\nconflicts = ["zz-firstt"]', "conflicts: no patch 'zz-firstt'"),
        ('requires = ["a-second"]', "requires: names the patch itself"),
    ],
)
def test_bad_relations_are_refused_naming_the_file(
    series: Path, key: str, message: str, capsys: pytest.CaptureFixture[str]
) -> None:
    toml = series / "a-second" / "patch.toml"
    toml.write_text(toml.read_text().replace('requires = ["z-first"]', key))
    with pytest.raises(RegistryError, match=message) as caught:
        load_registry(series)
    assert str(toml) in str(caught.value)
    assert main(["--registry", str(series), "validate"]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert message in err and str(toml) in err


def test_a_requires_cycle(series: Path) -> None:
    add_keys(series, "z-first", 'requires = ["a-second"]')
    with pytest.raises(RegistryError, match="requires: a cycle: "):
        load_registry(series)


def test_validate_reports_every_patch_and_others_skip_with_a_warning(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "patches"
    add_patch(root, "good-one", diff=MOD_DIFF, targets=["vllm/mod.py"])
    bad_state = add_patch(root, "bad-state", diff=OTHER_FIX, targets=["vllm/other.py"])
    toml = bad_state / "patch.toml"
    toml.write_text(
        toml.read_text().replace('"unsubmitted"', '"opne"').replace("revision = 1", "revision = 0")
    )
    broken = add_patch(root, "half-written", diff=OTHER_FIX, targets=["vllm/other.py"])
    (broken / "patch.toml").write_text('id = "half-written"\ntitle = "x\n')  # bad TOML
    assert main(["--registry", str(root), "validate"]) == ExitCode.BAD_INPUT
    err = capsys.readouterr().err
    assert f"{toml}: revision: must be >= 1, got 0" in err  # every problem of the patch
    assert f"{toml}: upstream.state: 'opne' is not one of" in err
    assert f"{broken / 'patch.toml'}: not valid TOML" in err and "line 2" in err
    # other commands: the good patch works, the others are skipped with a warning
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY, "vllm/other.py": OTHER})
    code = main(["--registry", str(root), "apply", "--target", str(tree), "--format", "json"])
    captured = capsys.readouterr()
    assert code == ExitCode.OK
    assert [r["patch"] for r in json.loads(captured.out)["results"]] == ["good-one"]
    assert "warning: skipped patch 'bad-state'" in captured.err
    assert "warning: skipped patch 'half-written'" in captured.err
    # asked for by id: its own problem, as an error
    code = main(["--registry", str(root), "show", "bad-state"])
    assert code == ExitCode.BAD_INPUT
    assert "bad-state/patch.toml: revision: must be >= 1" in capsys.readouterr().err


def test_x_table_is_free_form_and_kept_by_writes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "patches"
    notes = (
        '\n[x]\n# our own notes\nload_bearing = ["qwen3-27b compose"]\n'
        'drop_when = "upstream ships #36325"\nevidence = { run = 12, tokens_s = 99.7 }\n'
    )
    folder = add_patch(root, "mod-fix", diff=MOD_DIFF, targets=["vllm/mod.py"], tail=notes)
    toml = folder / "patch.toml"
    patch = load_registry(root).get("mod-fix")
    assert patch.x["drop_when"] == "upstream ships #36325"
    assert patch.x["evidence"] == {"run": 12, "tokens_s": 99.7}
    diff = tmp_path / "new.diff"
    diff.write_text(MOD_DIFF.replace("line 11 patched", "line 11 patched again"))
    assert (
        main(["--registry", str(root), "update", "mod-fix", "--diff", str(diff), "--no-check"]) == 0
    )
    text = toml.read_text()
    assert "# our own notes" in text and 'drop_when = "upstream ships #36325"' in text
    assert load_registry(root).get("mod-fix").revision == 2


def _fake_smi(folder: Path, body: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    smi = folder / "nvidia-smi"
    smi.write_text(f"#!/bin/sh\n{body}\n")
    smi.chmod(0o755)


def test_the_gpu_comes_from_nvidia_smi(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A stand-in nvidia-smi (a real program on PATH) answering as an RTX 5090 would: an
    unqualified apply takes the sm_12x patch; a failing one means no GPU."""
    from patchset.adapters import gpu

    root = tmp_path / "patches"
    add_patch(root, "sm12x-only", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = root / "sm12x-only" / "patch.toml"
    toml.write_text(toml.read_text() + '\n[hardware]\ncompute_capability = ">=12.0"\n')
    tree = make_tree(tmp_path / "t", {"vllm/mod.py": BODY})
    bin_dir = tmp_path / "bin"
    monkeypatch.setenv("PATH", f"{bin_dir}:/usr/bin:/bin")
    _fake_smi(bin_dir, 'echo "12.0"')
    assert gpu.compute_capability() == (12, 0)
    report = apply(load_registry(root), tree, dry_run=True)
    assert report.compute_capability == "12.0"
    assert [r.outcome for r in report.results] == ["applied"]
    _fake_smi(bin_dir, 'echo "NVIDIA-SMI has failed" >&2; exit 9')
    assert gpu.compute_capability() is None
    report = apply(load_registry(root), tree, dry_run=True)
    assert [r.outcome for r in report.results] == ["skipped"]
    assert "no GPU found" in report.results[0].details[0]


def test_validate_reports_every_semantic_problem_of_a_patch_with_its_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Three problems only the loader sees (the JSON Schema has no word on them): an id that is
    not the folder's, a range that is not PEP 440, a compute capability no GPU has; and a key
    nobody knows. Each is reported, with its key and line; other commands still read the
    patch's first problem only, and the other patches load."""
    root = tmp_path / "patches"
    add_patch(root, "good-one", diff=MOD_DIFF, targets=["vllm/mod.py"])
    folder = add_patch(root, "three-bad", diff=OTHER_FIX, targets=["vllm/other.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text()
        .replace('id = "three-bad"', 'id = "three-bda"')
        .replace('vllm = ">=0.1"', 'vllm = "=>0.1"')
        .replace("[upstream]", '[hardware]\ncompute_capability = "===12.0"\n\n[upstream]')
        .replace("origin =", 'titel = "typo"\norigin =')
    )
    lines = toml.read_text().splitlines()

    def line_of(start: str) -> int:
        return next(i for i, text in enumerate(lines, start=1) if text.startswith(start))

    assert main(["--registry", str(root), "validate", "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    found = {p["key"]: (p["line"], p["problem"]) for p in report["problems"]}
    assert set(found) == {"id", "vllm", "hardware.compute_capability", "titel"}, found
    assert found["id"] == (
        line_of("id ="),
        f"{toml}: id: 'three-bda' differs from the folder name 'three-bad'",
    )
    assert found["vllm"][0] == line_of("vllm =")
    assert "'=>0.1' is not a PEP 440 version specifier" in found["vllm"][1]
    assert found["hardware.compute_capability"][0] == line_of("compute_capability =")
    assert found["titel"] == (
        line_of("titel ="),
        f"{toml}: titel: unknown key (did you mean 'title'?)",
    )
    assert report["patches"] == 1 and not report["valid"]
    assert main(["--registry", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert f"{toml}: id: 'three-bda' differs from the folder name 'three-bad' (line 1)" in err
    assert err.count("patchset: error: ") == 4, err
    # other commands: the first problem, as before
    with pytest.raises(RegistryError, match="id: 'three-bda' differs") as caught:
        load_registry(root)
    assert "three-bad/patch.toml" in str(caught.value)
    assert [p.id for p in load_registry(root, tolerant=True).patches] == ["good-one"]


TWO_SITES = """\
[[site]]
name = "first"
file = "vllm/mod.py"
anchor = "line 3"
action = "insert-after"
text = "# one"
marker = "# ps:first"
probe = { contains = [""] }
colour = "red"

[[site]]
name = "second"
file = "/abs/mod.py"
anchor = "line 5"
action = "insert-before"
text = "# two"
marker = "# ps:second"
"""


def test_validate_reports_every_problem_inside_a_table_and_a_sites_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Problems in one sub-table (`[upstream]`, its `probe`, `[hardware]`) and in one
    `sites.toml` (two in one site, one in another) are each reported with their key and
    line, not only the first; other commands still stop at the first."""
    root = tmp_path / "patches"
    folder = add_patch(root, "many", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text().replace(
            "[upstream]",
            '[hardware]\ncompute_capability = "===12.0"\nnotes = "x"\n\n[upstream]\n'
            'commit = "not-a-sha"\nsuperseded_in = "soon"\nstat = "open"',
        )
    )
    sites = add_patch(root, "sites", sites=TWO_SITES, targets=["vllm/mod.py"])
    assert main(["--registry", str(root), "validate", "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    keys = {(p["patch"], p["key"]): p["line"] for p in report["problems"]}
    lines = toml.read_text().splitlines()
    assert {k for p, k in keys if p == "many"} == {
        "hardware.compute_capability",
        "hardware.notes",
        "upstream.commit",
        "upstream.superseded_in",
        "upstream.stat",
    }, keys
    assert lines[keys[("many", "upstream.commit")] - 1].startswith("commit =")
    assert lines[keys[("many", "hardware.notes")] - 1].startswith("notes =")
    site_lines = (sites / "sites.toml").read_text().splitlines()
    assert {k for p, k in keys if p == "sites"} == {
        "site[0].probe.contains",
        "site[0].colour",
        "site[1].file",
    }, keys
    assert site_lines[keys[("sites", "site[0].colour")] - 1].startswith("colour =")
    assert site_lines[keys[("sites", "site[1].file")] - 1].startswith('file = "/abs')
    with pytest.raises(RegistryError, match="superseded_in"):  # the first, as it loads
        load_registry(root)


def test_validate_reports_every_problem_of_each_variant(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two `[[variants]]`, each with its own problems (a range that is not PEP 440 and an
    unknown key in one, a missing payload file in the other): all of them are reported."""
    root = tmp_path / "patches"
    variants = (
        '\n[[variants]]\npayload = "patch.diff"\nvllm = "=>0.1"\nbse = "0.1"\n'
        '\n[[variants]]\npayload = "gone.diff"\nvllm = ">=0.2"\n'
    )
    add_patch(root, "variants", diff=MOD_DIFF, targets=["vllm/mod.py"], tail=variants)
    assert main(["--registry", str(root), "validate", "--format", "json"]) == 2
    report = json.loads(capsys.readouterr().out)
    keys = {p["key"] for p in report["problems"]}
    assert keys == {"variants[0].vllm", "variants[0].bse", "variants[1].payload"}, report


def test_validate_says_each_unknown_key_once_in_text_and_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Two unknown keys: two problems (the loader's, with lines), in the order of their lines;
    the JSON Schema's line naming both at once is not added, in text as in JSON."""
    root = tmp_path / "patches"
    folder = add_patch(root, "typos", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text().replace("[upstream]", 'titel = "a"\ndescriptoin = "b"\n\n[upstream]')
    )
    assert main(["--registry", str(root), "validate", "--format", "json"]) == 2
    problems = json.loads(capsys.readouterr().out)["problems"]
    assert [p["key"] for p in problems] == ["titel", "descriptoin"], problems
    assert problems[0]["line"] < problems[1]["line"]
    assert main(["--registry", str(root), "validate"]) == 2
    err = capsys.readouterr().err
    assert err.count("patchset: error: ") == 2 and "JSON Schema" not in err, err
