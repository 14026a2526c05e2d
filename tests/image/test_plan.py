"""The one planner (issue 35.2): a definition with several problems gets every refusal at
once, from `check --build` (exit 1) and from `runtime export` (nothing written), each with
its fix; `--switches all` plans that set too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.errors import BuildError, ExitCode
from patchset.image.export import export_runtime
from patchset.image.plan import plan, switch_sets
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.folder import FolderSource
from tests.helpers.cli import cli
from tests.helpers.synthetic import BODY, MOD_DIFF, PATCH_TOML, add_keys, add_patch, make_tree

OTHER_ELEVEN = MOD_DIFF.replace("+line 11 patched", "+line 11 changed otherwise")
LOW = MOD_DIFF.replace("@@ -9,5 +9,5 @@", "@@ -1,5 +1,5 @@")
LOW = LOW.replace(" line 9\n line 10\n-line 11\n+line 11 patched\n line 12\n line 13\n", "")
LOW += " line 1\n line 2\n-line 3\n+line 3 low\n line 4\n line 5\n"
# written on top of LOW without saying so: it applies only once LOW is in
ON_LOW = (
    "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -3,2 +3,2 @@\n-line 3 low\n+line 3 lower\n line 4\n"
)


def python_patch(root: Path, patch_id: str, touch: str) -> None:
    folder = root / patch_id
    folder.mkdir(parents=True)
    head = PATCH_TOML.format(
        id=patch_id, kind="python", vllm=">=0.1", when="startup", targets='["vllm/mod.py"]'
    )
    (folder / "patch.toml").write_text(
        head.replace("[upstream]", f'touches = ["{touch}"]\n\n[upstream]')
    )
    (folder / "plugin.py").write_text("def apply():\n    pass\n")


@pytest.fixture
def problems(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(registry, definition, release): a definition with five problems."""
    root = tmp_path / "patches"
    add_patch(root, "a-fix", diff=MOD_DIFF, targets=["vllm/mod.py"], when="startup")
    add_patch(root, "b-same", diff=OTHER_ELEVEN, targets=["vllm/mod.py"], when="startup")
    add_patch(root, "c-needs", diff=MOD_DIFF.replace("mod", "other"), targets=["vllm/other.py"])
    add_keys(root, "c-needs", 'requires = ["z-unlisted"]')
    add_patch(root, "z-unlisted", diff=LOW, targets=["vllm/mod.py"], when="startup")
    python_patch(root, "d-python", "vllm.mod:no_such_name")
    switched = '\n[switch]\nenv = "PS_LOW"\ndefault = false\n'
    add_patch(root, "e-low", diff=LOW, targets=["vllm/mod.py"], when="startup", tail=switched)
    add_patch(root, "f-on-low", diff=ON_LOW, targets=["vllm/mod.py"], when="startup")
    add_keys(root, "f-on-low", 'requires = ["e-low"]')
    release = make_tree(
        tmp_path / "release", {"vllm/mod.py": BODY, "vllm/other.py": BODY}, version="0.20.0"
    )
    builds = tmp_path / "builds"
    builds.mkdir()
    listed = ["a-fix", "b-same", "c-needs", "d-python", "e-low", "f-on-low"]
    (builds / "0.20.0.toml").write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "vllm/vllm-openai:v0.20.0-cu130"\n'
        'repository = "r"\ntags = ["t"]\n'
        f"patches = {json.dumps(listed)}\n\n[serve]\nargs = []\n"
    )
    return root, builds / "0.20.0.toml", release


def test_the_planner_lists_every_refusal_at_once(problems: tuple[Path, Path, Path]) -> None:
    root, definition_path, release = problems
    definition, registry = load_definition(definition_path), load_registry(root)
    with FolderSource(release).open("0.20.0") as tree:
        planned = plan(
            definition,
            registry,
            lambda wanted: {rel: tree.read(rel) for rel in wanted},
            sets=switch_sets(definition, registry, ["all"]),
        )
    lines = [r.line() for r in planned.refusals]
    assert any(x.startswith("c-needs requires z-unlisted") and "add z-unlisted" in x for x in lines)
    assert any(x.startswith("d-python touches names") and "no_such_name" in x for x in lines)
    assert any(
        x.startswith("b-same changes the same lines as a-fix") and 'requires = ["a-fix"]' in x
        for x in lines
    )
    assert any(x.startswith("b-same does not apply on what a-fix leave") for x in lines)
    # e-low is off by default; with it on (`all`) f-on-low stacks fine on it: no refusal
    assert not any(x.startswith(("e-low", "f-on-low", "a-fix")) for x in lines), lines
    assert len(planned.refusals) == 4, lines


def test_check_build_exits_1_listing_every_refusal(problems: tuple[Path, Path, Path]) -> None:
    root, definition_path, release = problems
    where = ("--registry", root, "--builds", definition_path.parent)
    done = cli(*where, "check", "--build", definition_path, "--source", f"folder:{release}")
    assert done.code == ExitCode.ATTENTION, done.out + done.err
    refused = [x for x in done.out.splitlines() if ": refused: " in x]
    assert len(refused) == 4, done.out
    assert "4 refusals `runtime export` would make" in done.out
    as_json = cli(
        *where, "check", "--build", definition_path, "--source", f"folder:{release}",
        "--format", "json",
    )  # fmt: skip
    data = json.loads(as_json.out)
    assert len(data["definitions"][0]["plan"]["refusals"]) == 4
    assert data["exit_code"] == 1


def test_export_refuses_with_every_refusal_and_writes_nothing(
    problems: tuple[Path, Path, Path], tmp_path: Path
) -> None:
    root, definition_path, release = problems
    with pytest.raises(BuildError) as refused:
        export_runtime(
            load_definition(definition_path),
            load_registry(root),
            tmp_path / "bundle",
            source=FolderSource(release),
        )
    message = str(refused.value)
    assert "4 refusal(s) for vLLM 0.20.0, all of them" in message
    for n, patch_id in enumerate(("c-needs", "d-python", "b-same"), 1):
        assert f"[{n}] {patch_id} " in message
    assert not (tmp_path / "bundle").exists()


def test_a_switch_set_refused_only_when_it_is_on(tmp_path: Path) -> None:
    """f-on-low is written on top of e-low without saying so: fine by default (e-low on),
    refused with e-low switched off, and only for that set."""
    root = tmp_path / "patches"
    switched = '\n[switch]\nenv = "PS_LOW"\ndefault = true\n'
    add_patch(root, "e-low", diff=LOW, targets=["vllm/mod.py"], when="startup", tail=switched)
    add_patch(root, "f-on-low", diff=ON_LOW, targets=["vllm/mod.py"], when="startup")
    release = make_tree(tmp_path / "release", {"vllm/mod.py": BODY}, version="0.20.0")
    (tmp_path / "builds").mkdir()
    path = tmp_path / "builds" / "0.20.0.toml"
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["e-low", "f-on-low"]\n\n[serve]\nargs = []\n'
    )
    definition, registry = load_definition(path), load_registry(root)
    with FolderSource(release).open("0.20.0") as tree:
        read = lambda wanted: {rel: tree.read(rel) for rel in wanted}  # noqa: E731
        fine = plan(definition, registry, read)
        off = plan(definition, registry, read, sets=switch_sets(definition, registry, ["PS_LOW=0"]))
    assert fine.refusals == ()
    assert [r.patch for r in off.refusals] == ["f-on-low"]
    assert off.refusals[0].sets == ("PS_LOW=0",)
    assert "does not apply on the release's files" in off.refusals[0].problem
    with pytest.raises(BuildError, match="PS_NOPE=1"):
        switch_sets(definition, registry, ["PS_NOPE=1"])


def test_runtime_export_switches_plans_that_set(tmp_path: Path) -> None:
    """`runtime export --switches PS_LOW=0`: refused in one line naming the set; without it,
    the default set exports."""
    root = tmp_path / "patches"
    switched = '\n[switch]\nenv = "PS_LOW"\ndefault = true\n'
    add_patch(root, "e-low", diff=LOW, targets=["vllm/mod.py"], when="startup", tail=switched)
    add_patch(root, "f-on-low", diff=ON_LOW, targets=["vllm/mod.py"], when="startup")
    release = make_tree(tmp_path / "release", {"vllm/mod.py": BODY}, version="0.20.0")
    (tmp_path / "builds").mkdir()
    path = tmp_path / "builds" / "0.20.0.toml"
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["e-low", "f-on-low"]\n\n[serve]\nargs = []\n'
    )
    where = ("--registry", root, "--builds", tmp_path / "builds")
    source = ("--source", f"folder:{release}")
    done = cli(*where, "runtime", "export", tmp_path / "b1", *source, "--switches", "PS_LOW=0")
    assert done.code == ExitCode.ATTENTION, done.out + done.err
    assert "[1] f-on-low does not apply" in done.err and "(switches: PS_LOW=0)" in done.err
    assert len(done.err.strip().splitlines()) == 1 and not (tmp_path / "b1").exists()
    fine = cli(*where, "runtime", "export", tmp_path / "b2", *source)
    assert fine.code == ExitCode.OK, fine.out + fine.err


def test_validate_build_lists_every_refusal_as_check_build(
    problems: tuple[Path, Path, Path],
) -> None:
    """`validate --build FILE`: the same planner as `check --build`, the same four refusals
    each with its fix, exit 1; JSON carries the plan; a definition without refusals exits 0."""
    root, definition_path, release = problems
    where = ("--registry", root, "--builds", definition_path.parent)
    source = ("--source", f"folder:{release}")
    done = cli(*where, "validate", "--build", definition_path, *source, "--switches", "all")
    assert done.code == ExitCode.ATTENTION, done.out + done.err
    refused = [x for x in done.out.splitlines() if x.startswith("0.20.0.toml: refused: ")]
    assert len(refused) == 4 and all("; fix: " in x for x in refused), done.out
    assert "4 refusals `runtime export` would make (switches: defaults, all)" in done.out
    as_json = cli(*where, "validate", "--build", definition_path, *source, "--format", "json")
    assert as_json.code == ExitCode.ATTENTION, as_json.out + as_json.err
    data = json.loads(as_json.out)
    assert data["valid"] is True and data["refusals"] == 4
    assert [r["patch"] for r in data["plans"][0]["refusals"]][:2] == ["c-needs", "d-python"]
    assert all(r["fix"] for r in data["plans"][0]["refusals"])
    fine_path = definition_path.parent / "fine.toml"
    fine_path.write_text(
        definition_path.read_text().replace(
            json.dumps(["a-fix", "b-same", "c-needs", "d-python", "e-low", "f-on-low"]),
            json.dumps(["a-fix", "e-low", "f-on-low"]),
        )
    )
    fine = cli(*where, "validate", "--build", fine_path, *source)
    assert fine.code == ExitCode.OK, fine.out + fine.err
    assert "0 refusals `runtime export` would make (switches: defaults)" in fine.out
    plain = cli(*where, "validate", "--format", "json")
    assert plain.code == ExitCode.OK and "plans" not in json.loads(plain.out)


def test_a_leaf_nobody_decides_for_a_built_in_patch_is_refused(tmp_path: Path) -> None:
    """A build patch built into an image is in whatever the start finds: its `[applies]`
    leaves must be known at build. The GPU's and an open model leaf are refused (each with
    its fix) for `build` and by `check`/`validate`'s plan, never for `runtime export` (whose
    start decides every leaf); leaves the serve arguments decide, and startup patches, pass."""
    root = tmp_path / "patches"
    other = {f"vllm/f{n}.py": BODY for n in range(5)}
    gated = {
        "b-gpu": ("build", '[applies]\ncompute_capability = ">=12.0"\n'),
        "b-arch": ("build", '[applies]\narchitecture = "qwen3*"\n'),
        "b-quant": ("build", '[applies]\nquantization = "gptq"\n'),
        "b-tools": ("build", '[applies]\ntool_call_parser = "hermes"\n'),
        "s-gpu": ("startup", '[applies]\ncompute_capability = ">=12.0"\n'),
    }
    for n, (patch_id, (when, applies)) in enumerate(gated.items()):
        diff = MOD_DIFF.replace("mod", f"f{n}")
        add_patch(root, patch_id, diff=diff, targets=[f"vllm/f{n}.py"], when=when, tail=applies)
    release = make_tree(tmp_path / "release", other, version="0.20.0")
    (tmp_path / "builds").mkdir()
    path = tmp_path / "builds" / "0.20.0.toml"
    args = ["--model", "m", "--quantization", "gptq", "--tool-call-parser", "hermes"]
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        f"patches = {json.dumps(list(gated))}\n\n[serve]\nargs = {json.dumps(args)}\n"
    )
    definition, registry = load_definition(path), load_registry(root)
    with FolderSource(release).open("0.20.0") as tree:
        read = lambda wanted: {rel: tree.read(rel) for rel in wanted}  # noqa: E731
        planned = plan(definition, registry, read)
        exported = plan(definition, registry, read, delivery="stock")
    assert exported.refusals == ()
    by = {r.patch: r for r in planned.refusals}
    assert sorted(by) == ["b-arch", "b-gpu"], [r.line() for r in planned.refusals]
    assert "compute_capability = '>=12.0' cannot be known at build" in by["b-gpu"].problem
    assert by["b-gpu"].fix.startswith('make it a startup patch (apply = "startup")')
    assert "architecture = 'qwen3*'" in by["b-arch"].problem
    assert "decide architecture in the definition's [serve] args" in by["b-arch"].fix
    where = ("--registry", root, "--builds", tmp_path / "builds")
    done = cli(*where, "validate", "--build", path, "--source", f"folder:{release}")
    assert done.code == ExitCode.ATTENTION, done.out + done.err
    assert "2 refusals `runtime export` would make" in done.out
    fine = cli(*where, "runtime", "export", tmp_path / "b", "--source", f"folder:{release}")
    assert fine.code == ExitCode.OK, fine.out + fine.err


def test_the_start_reads_the_parsers_from_the_serve_arguments() -> None:
    """`tool_call_parser` / `reasoning_parser` leaves are decided by the serve arguments
    (they read as vLLM's default, none, only when not given)."""
    from patchset.kernel.predicates import Facts, evaluate, parse
    from patchset.kernel.served import served_from_args

    served = served_from_args(["m", "--tool-call-parser", "hermes", "--reasoning-parser=qwen3"])
    assert served["tool_call_parser"] == "hermes" and served["reasoning_parser"] == "qwen3"
    leaf = parse({"tool_call_parser": "hermes", "reasoning_parser": "qwen*"})
    assert evaluate(leaf, Facts(served=served)).value is True
    assert evaluate(leaf, Facts(served=served_from_args(["m"]))).value is False


def test_a_default_off_patch_that_does_not_apply_is_refused_as_export_refuses_it(
    tmp_path: Path,
) -> None:
    """The export puts every listed patch in (its run with every switch on): a patch off by
    default that does not apply on the release is refused by the planner too, unasked, and
    so by `check --build`/`validate --build`, naming the set `all`; export refuses it alike."""
    root = tmp_path / "patches"
    off = '\n[switch]\nenv = "PS_OFF"\ndefault = false\n'
    stale = MOD_DIFF.replace("mod", "other").replace("-line 11\n", "-line eleven\n")
    add_patch(root, "a-fix", diff=MOD_DIFF, targets=["vllm/mod.py"], when="startup")
    add_patch(root, "z-stale", diff=stale, targets=["vllm/other.py"], when="startup", tail=off)
    release = make_tree(
        tmp_path / "release", {"vllm/mod.py": BODY, "vllm/other.py": BODY}, version="0.20.0"
    )
    (tmp_path / "builds").mkdir()
    path = tmp_path / "builds" / "0.20.0.toml"
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["a-fix", "z-stale"]\n\n[serve]\nargs = []\n'
    )
    definition, registry = load_definition(path), load_registry(root)
    with FolderSource(release).open("0.20.0") as tree:
        planned = plan(definition, registry, lambda wanted: {r: tree.read(r) for r in wanted})
    assert [(r.patch, r.sets) for r in planned.refusals] == [("z-stale", ("all",))]
    assert "does not apply on the release's files" in planned.refusals[0].problem
    assert planned.sets == ("defaults",)
    with pytest.raises(BuildError, match="z-stale"):
        export_runtime(definition, registry, tmp_path / "b", source=FolderSource(release))


def test_a_runtime_patch_that_changes_nothing_is_refused_as_export_refuses_it(
    tmp_path: Path,
) -> None:
    """Every site of a runtime patch skipped (optional, anchor absent): export refuses it
    ("no site applies"), and so does the planner."""
    root = tmp_path / "patches"
    sites = (
        '[[site]]\nname = "s"\nfile = "vllm/mod.py"\naction = "insert-after"\n'
        'marker = "ps: gone"\nanchor = """\nno such line\n"""\ntext = """\nX = 1\n"""\n'
        "optional = true\n"
    )
    add_patch(root, "r-gone", sites=sites, targets=["vllm/mod.py"], when="startup")
    release = make_tree(tmp_path / "release", {"vllm/mod.py": BODY}, version="0.20.0")
    (tmp_path / "builds").mkdir()
    path = tmp_path / "builds" / "0.20.0.toml"
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["r-gone"]\n\n[serve]\nargs = []\n'
    )
    definition, registry = load_definition(path), load_registry(root)
    with FolderSource(release).open("0.20.0") as tree:
        planned = plan(definition, registry, lambda wanted: {r: tree.read(r) for r in wanted})
    assert [r.patch for r in planned.refusals] == ["r-gone"]
    assert "changes nothing on the release's files: no site applies" in planned.refusals[0].problem
    with pytest.raises(BuildError, match="r-gone"):
        export_runtime(definition, registry, tmp_path / "b", source=FolderSource(release))
