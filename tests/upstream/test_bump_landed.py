"""Issue 36 item 1: a bump never turns an upstream fix into a deletion. A real git clone with
v0.19.1 and v0.20.0: a diff patch whose added lines landed in 0.20.0 (with more code around
them, so neither direction of the diff fits) is dropped, its hunk named, not refreshed; a
runtime patch whose best new anchor holds a line upstream added is refused as a refresh,
the line named; a bump where every patch is upstream writes nothing and exits 0; a cell
never empty, never over 200 characters; bad targets (a 5,000-digit version, a pre-release
without --pre) one line, exit 2; and `--write` never overwrites a file made meanwhile."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from patchset.errors import ExitCode, UsageError
from patchset.refresh import refresh
from patchset.registry import load_registry
from patchset.release_check.landed import unexpected_deletions
from patchset.sources.git import GitSource
from patchset.upstream.bump import EVIDENCE_CHARS, bump
from tests.helpers import gitrepos
from tests.helpers.cli import run_cli
from tests.helpers.schemas import assert_matches
from tests.helpers.synthetic import BODY, add_patch

DEFINITION = """\
# built on the vLLM 0.19.1 image
vllm = "0.19.1"
cuda = "cu130"
base = "vllm/vllm-openai:v0.19.1-cu130"
repository = "team/vllm-openai"
tags = ["{{vllm}}-{{cuda}}"]
patches = [{patches}]

[serve]
args = ["--max-model-len", "4096"]
"""

LANDED_DIFF = """\
--- a/vllm/landed.py
+++ b/vllm/landed.py
@@ -9,5 +9,6 @@
 line 9
 line 10
-line 11
+line 11 fixed by the patch
+guard = getattr(config, "guard", None)
 line 12
 line 13
"""

KEEP_DIFF = LANDED_DIFF.replace("landed.py", "keep.py")

# The patch rewrites a three-line anchor; 0.20.0 dropped its last line and added one of its
# own after the second (the genesis-pn24 shape): the best new window holds upstream's line.
SPEC = """\
def load(hf_config):
    speculative = hf_config.speculative_config
    draft = speculative.draft_model_config
    num_tokens = speculative.num_speculative_tokens
    return draft
"""
SPEC_NEW = """\
def load(hf_config):
    speculative = hf_config.speculative_config
    draft = speculative.draft_model_config
    eagle_config = getattr(hf_config, "eagle_config", None)
    if eagle_config is not None:
        use(eagle_config)
    return draft
"""
SITES = '''\
[[site]]
name = "a"
file = "vllm/spec.py"
action = "replace"
marker = "patchset: eagle site a"
anchor = """
speculative = hf_config.speculative_config
draft = speculative.draft_model_config
num_tokens = speculative.num_speculative_tokens
"""
text = """
speculative = hf_config.speculative_config
draft = speculative.draft_model_config or speculative.fallback
num_tokens = speculative.num_speculative_tokens
"""
'''


@pytest.fixture
def project(tmp_path: Path) -> Path:
    clone = tmp_path / "vllm"
    clone.mkdir()
    gitrepos.git(clone, "init", "-q")
    marked = BODY + "# condense() reordered indices\n"
    files = {
        "vllm/landed.py": BODY,
        "vllm/keep.py": BODY,
        "vllm/spec.py": SPEC,
        "vllm/marked.py": marked,
    }
    gitrepos.commit(clone, {"vllm/__init__.py": "", **files}, "v0.19.1")
    upstream = BODY.replace(
        "line 11\n",
        'line 11 fixed by the patch\nupstream = True\nguard = getattr(config, "guard", None)\n',
    ).replace("line 12\n", "line 12 and upstream's own change\n")
    gitrepos.commit(clone, {"vllm/landed.py": upstream, "vllm/spec.py": SPEC_NEW}, "v0.20.0")
    gitrepos.git(clone, "tag", "v0.21.0rc1")
    patches = tmp_path / "patches"
    add_patch(patches, "landed", diff=LANDED_DIFF, targets=["vllm/landed.py"], vllm=">=0.19")
    add_patch(patches, "keep", diff=KEEP_DIFF, targets=["vllm/keep.py"], vllm=">=0.19")
    add_patch(patches, "eagle", sites=SITES, targets=["vllm/spec.py"], vllm=">=0.19")
    probe = '\n[upstream.probe]\nfile = "vllm/marked.py"\ncontains = ["condense() reordered"]\n'
    marked_diff = KEEP_DIFF.replace("keep.py", "marked.py")
    add_patch(
        patches, "marker", diff=marked_diff, targets=["vllm/marked.py"], vllm=">=0.19", tail=probe
    )
    (tmp_path / "builds").mkdir()
    return tmp_path


def definition(project: Path, *names: str) -> Path:
    path = project / "builds" / "0.19.1.toml"
    path.write_text(DEFINITION.format(patches=", ".join(f'"{n}"' for n in names)))
    return path


def cli(project: Path, *args: str) -> Any:
    where: list[str | Path] = ["--registry", project / "patches", "bump", *args]
    return run_cli(*where, "--source", f"git:{project / 'vllm'}", cwd=project)


def test_a_landed_fix_is_dropped_not_refreshed(project: Path) -> None:
    old = definition(project, "landed", "keep")
    registry = load_registry(project / "patches")
    calls: list[str] = []

    def counting(*args: Any, **kwargs: Any) -> Any:
        calls.append(args[1])
        return refresh(*args, **kwargs)

    report = bump(registry, old, "0.20.0", source=GitSource(project / "vllm"), refresher=counting)
    step = next(s for s in report.steps if s.patch == "landed")
    assert step.verdict in ("conflict", "partial")  # neither direction of the diff fits
    assert step.action == "dropped" and step.variant is None
    assert "vllm/landed.py#1" in step.evidence and "at line 11" in step.evidence
    assert calls == ["landed"]  # asked, and refused before any merge
    assert report.patches == ("keep",)
    assert sorted(p.name for p in (project / "patches" / "landed").iterdir()) == [
        "patch.diff",
        "patch.toml",
    ]
    assert_matches(report.to_dict(), "bump")


def test_refresh_itself_refuses_a_landed_change(project: Path) -> None:
    registry = load_registry(project / "patches")
    with pytest.raises(UsageError, match=r"already holds landed's change \(vllm/landed\.py#1"):
        refresh(registry, "landed", "0.20.0", source=GitSource(project / "vllm"))


def test_refresh_of_a_patch_with_no_hunk_left_is_one_line(project: Path) -> None:
    """Bad input: every hunk of the patch landed, so none is left to refresh."""
    before = sorted(p.name for p in (project / "patches" / "landed").iterdir())
    done = run_cli(
        "--registry",
        project / "patches",
        "refresh",
        "landed",
        "--vllm",
        "0.20.0",
        "--source",
        f"git:{project / 'vllm'}",
        cwd=project,
    )
    assert done.returncode == ExitCode.BAD_INPUT, done.stdout
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "already holds landed's change" in lines[0], lines
    assert sorted(p.name for p in (project / "patches" / "landed").iterdir()) == before


def test_a_refresh_deleting_upstream_lines_is_hand_work(project: Path) -> None:
    """The genesis-pn24 shape: the anchor's best new window holds upstream's new line; the
    site replaces its anchor, so the variant would delete that line."""
    old = definition(project, "eagle", "keep")
    registry = load_registry(project / "patches")
    report = bump(registry, old, "0.20.0", source=GitSource(project / "vllm"), write=True)
    step = next(s for s in report.steps if s.patch == "eagle")
    assert step.action == "hand-work", step
    assert "eagle_config = getattr(hf_config, " in step.evidence
    assert "vllm/spec.py:4" in step.evidence
    assert not (project / "patches" / "eagle" / "v0.20.0.sites.toml").exists()
    assert len(step.evidence) <= EVIDENCE_CHARS and step.details[0].startswith("the refreshed")


def test_every_patch_upstream_writes_nothing_and_exits_0(project: Path) -> None:
    old = definition(project, "landed")
    for fmt in ("table", "json", "markdown"):
        done = cli(project, str(old), "--to", "0.20.0", "--write", "--format", fmt)
        assert done.returncode == 0, done.stderr
        assert sorted(p.name for p in (project / "builds").iterdir()) == ["0.19.1.toml"]
        if fmt == "json":
            data = json.loads(done.stdout)
            assert_matches(data, "bump")
            assert data["stock"] and data["complete"] and data["written"] == []
        else:
            assert "every patch is upstream in 0.20.0: serve the stock image" in done.stdout
    assert "line 1 names 0.19.1: '# built on the vLLM 0.19.1 image'" in done.stdout


def test_a_probe_alone_is_not_enough_to_drop(project: Path) -> None:
    """The probe's string is in 0.20.0 (and was in 0.19.1), the patch still applies and its
    change is absent: not dropped on the probe's word, left for a person."""
    old = definition(project, "marker", "keep")
    report = bump(
        load_registry(project / "patches"), old, "0.20.0", source=GitSource(project / "vllm")
    )
    step = next(s for s in report.steps if s.patch == "marker")
    assert (step.verdict, step.action) == ("upstream", "hand-work")
    assert "'condense() reordered'" in step.details[0] and "vllm/marked.py#1" in step.details[0]
    assert not report.complete


def test_cells_are_one_line_never_empty(project: Path) -> None:
    old = definition(project, "landed", "keep", "eagle")
    report = bump(
        load_registry(project / "patches"), old, "0.20.0", source=GitSource(project / "vllm")
    )
    for step in report.steps:
        assert step.evidence and "\n" not in step.evidence, step
        assert len(step.evidence) <= EVIDENCE_CHARS
        assert "unresolved in unresolved" not in step.evidence
    keep = next(s for s in report.steps if s.patch == "keep")
    assert "vllm/keep.py: hunk #1 applies at line 9" in keep.evidence


def test_bad_targets_are_one_line(project: Path) -> None:
    old = definition(project, "keep")
    for to, words in [
        ("9" * 5000, "is not a version"),
        ("0.21.0rc1", "is a pre-release: add --pre"),
        ("0.22.0", "has no such release"),
    ]:
        done = cli(project, str(old), "--to", to, "--write")
        assert done.returncode == ExitCode.BAD_INPUT, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and words in done.stderr
        assert len(done.stderr) < 300
    assert sorted(p.name for p in (project / "builds").iterdir()) == ["0.19.1.toml"]


def test_write_never_overwrites_a_file_made_meanwhile(project: Path) -> None:
    """E17: the target is made exclusively (a hard link), not replaced."""
    old = definition(project, "keep", "eagle")
    target = project / "builds" / "0.20.0.toml"

    def racing(*args: Any, **kwargs: Any) -> Any:
        target.write_text("# someone else's\n")
        return refresh(*args, **kwargs)

    with pytest.raises(UsageError, match="made while the bump ran"):
        bump(
            load_registry(project / "patches"),
            old,
            "0.20.0",
            source=GitSource(project / "vllm"),
            write=True,
            refresher=racing,
        )
    assert target.read_text() == "# someone else's\n"
    assert sorted(p.name for p in (project / "builds").iterdir()) == ["0.19.1.toml", "0.20.0.toml"]


def test_landed_and_deletions_unit() -> None:
    registry_free = unexpected_deletions(
        {"line 11"},
        {"vllm/a.py": b"x = 1\nline 11\nkeep_me = True\n"},
        {"vllm/a.py": b"x = 1\nline 11 patched\n"},
    )
    assert registry_free == ["vllm/a.py:3 'keep_me = True'"]
    broken = unexpected_deletions({"x = 1"}, {"vllm/a.py": b"x = 1\n"}, {"vllm/a.py": b"x = (\n"})
    assert broken == ["vllm/a.py no longer compiles (line 1: '(' was never closed)"]
