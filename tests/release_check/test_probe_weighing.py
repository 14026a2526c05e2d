"""Issue 36 item 2: markers are weighed before they are believed. A real git clone: a comment
the upstream probe looks for is in vLLM from 0.19.1 on, the fix itself lands in 0.21.0. On
0.19.1 (the release the patch was written against) the probe alone never reads `upstream`;
on 0.20.0, where the patch still applies and its change is absent, the probe's `upstream`
carries a disagreement naming the string and the hunk, in every format; `validate --probes`
names the patch, the string and the releases (exit 1); a probe string empty, of whitespace
only or over 10 KB is refused at load in one line."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.release_check import check
from patchset.release_check.probes import audit_probes
from patchset.release_check.verdicts import probe_matches_unfixed
from patchset.sources.git import GitSource
from tests.helpers import gitrepos
from tests.helpers.cli import run_cli
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

STRING = "condense() reordered indices"
PROBE = f"""
[upstream.probe]
file = "vllm/mod.py"
contains = ["{STRING}"]
"""
OLD = BODY + f"# {STRING}\n"


@pytest.fixture
def project(tmp_path: Path) -> Path:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    gitrepos.commit(clone, {"vllm/__init__.py": "", "vllm/mod.py": OLD}, "v0.19.1")
    gitrepos.commit(clone, {"vllm/other.py": "x = 1\n"}, "v0.20.0")
    fixed = OLD.replace("line 11\n", "line 11 patched\n")
    gitrepos.commit(clone, {"vllm/mod.py": fixed}, "v0.21.0")
    add_patch(
        tmp_path / "patches",
        "pn398",
        diff=MOD_DIFF,
        targets=["vllm/mod.py"],
        vllm=">=0.19.1",
        tail=PROBE,
    )
    return tmp_path


def test_the_check_weighs_the_probe(project: Path) -> None:
    registry = load_registry(project / "patches")
    source = GitSource(project / "vllm")
    report = check(registry, ["0.19.1", "0.20.0", "0.21.0"], source=source)
    base, later, fixed = (report.result(v, "pn398") for v in ("0.19.1", "0.20.0", "0.21.0"))
    assert base.verdict == "needed", base.detail  # the base never reads upstream by a probe
    assert "written against" in base.detail
    for r in (base, later):
        assert r.disagreement is not None and repr(STRING) in r.disagreement
        assert "vllm/mod.py#1 (line 9)" in r.disagreement
    assert later.verdict == "upstream", later  # the probe may see a fix made another way: said
    assert fixed.verdict == "upstream" and fixed.disagreement is None
    with source.open("0.19.1") as tree:
        assert probe_matches_unfixed(registry.get("pn398"), tree) == (STRING,)
    with source.open("0.21.0") as tree:
        assert probe_matches_unfixed(registry.get("pn398"), tree) == ()


def test_the_disagreement_is_in_every_format(project: Path) -> None:
    argv: list[str | Path] = [
        "--registry",
        project / "patches",
        "check",
        "--vllm",
        "0.19.1",
        "--vllm",
        "0.20.0",
    ]
    git = ["--source", f"git:{project / 'vllm'}"]
    for fmt in ("table", "json", "markdown", "github"):
        done = run_cli(*argv, "--format", fmt, *git, cwd=project)
        assert done.returncode in (0, 1), done.stderr
        out = done.stdout
        if fmt == "json":
            found = [r["disagreement"] for r in json.loads(out)["results"]]
            assert all(d and STRING in d for d in found), found
        else:
            assert STRING in out and "vllm/mod.py#1" in out, (fmt, out)


def test_validate_probes_names_patch_string_and_release(project: Path) -> None:
    registry = load_registry(project / "patches")
    found = audit_probes(registry, GitSource(project / "vllm"))
    assert [(f.patch, f.string, f.release) for f in found] == [
        ("pn398", STRING, "0.19.1"),
        ("pn398", STRING, "0.20.0"),
    ]
    argv: list[str | Path] = ["--registry", project / "patches", "validate", "--probes"]
    done = run_cli(*argv, "--source", f"git:{project / 'vllm'}", cwd=project)
    assert done.returncode == ExitCode.ATTENTION, done.stderr
    assert (
        f"pn398: its upstream probe string {STRING!r} is in vllm/mod.py of vllm 0.19.1, 0.20.0"
        in (done.stdout)
    )
    as_json = run_cli(*argv, "--format", "json", "--source", f"git:{project / 'vllm'}", cwd=project)
    data = json.loads(as_json.stdout)  # one document
    assert as_json.returncode == ExitCode.ATTENTION and data["valid"]
    assert data["probes_matching_unfixed_releases"] == 2
    assert {p["release"] for p in data["probes"]} == {"0.19.1", "0.20.0"}
    plain = run_cli("--registry", project / "patches", "validate", cwd=project)
    assert plain.returncode == 0, plain.stderr


@pytest.mark.parametrize(
    ("value", "words"),
    [
        ('""', "an empty string matches every file"),
        ('"   "', "whitespace only"),
        ('"' + "x" * (10 * 1024 + 1) + '"', "over 10 KB"),
    ],
)
def test_a_bad_probe_string_is_refused_at_load(project: Path, value: str, words: str) -> None:
    toml = project / "patches" / "pn398" / "patch.toml"
    toml.write_text(toml.read_text().replace(f'["{STRING}"]', f"[{value}]"))
    done = run_cli("--registry", project / "patches", "validate", cwd=project)
    assert done.returncode == ExitCode.BAD_INPUT
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and words in lines[0] and "patch.toml" in lines[0], lines
    assert len(lines[0]) < 400
