"""Text that is not patchset's own, through every command that prints it.

Titles, descriptions, site names, markers, target lines and paths come from a registry, a
target tree or the network. They must be printed as text: rich markup (`[/THINK]`, `[/]`,
`[bold]`), emoji codes and terminal escape sequences have no effect, control characters are
shown escaped, and a title like `[bugfix] ...` keeps its brackets. Real vLLM 0.19.1 code holds
`` `[/THINK]` `` (`vllm/reasoning/mistral_reasoning_parser.py`); a hunk that nearly fits there
prints it among the nearest lines.
"""

from __future__ import annotations

import json
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.helpers.hardening import LOCK, cli, snapshot
from tests.helpers.releases import materialize
from tests.helpers.reliability import HOSTILE, record
from tests.helpers.synthetic import add_patch, make_tree

WIDE = {"COLUMNS": "400"}  # no wrapping inside the strings looked for
PARSER = "vllm/reasoning/mistral_reasoning_parser.py"
# Lines 19-31 of vllm/reasoning/mistral_reasoning_parser.py in vLLM 0.19.1, as they are (the
# network test below reads them from the real release instead).
THINK_LINES = '''\

class MistralReasoningParser(BaseThinkingReasoningParser):
    """
    Reasoning parser for Mistral models.

    The Mistral models uses `[THINK]`...`[/THINK]` tokens to denote reasoning
    text. This parser extracts the reasoning content from the model output.

    A valid reasoning trace should always start with a `[THINK]` token and end with
    a `[/THINK]` token.

    If `[THINK]` token is not generated, then this parser only returns content.
    """
'''
ESC = "\x1b[31m"  # turns a terminal red when printed raw
TITLE = "[bugfix] [/] [/THINK] [bold]loud[/bold] :thumbs_up: \\u001b[31mred\\u0007"
SHOWN_TITLE = "[bugfix] [/] [/THINK] [bold]loud[/bold] :thumbs_up: \\x1b[31mred\\x07"
SITES = """\
[[site]]
name = "s[/x]"
file = "vllm/plain.py"
action = "insert-after"
marker = "patchset: [/THINK] marker"
anchor = "def body(self):"
text = "guard()  # [/]"
"""


def _think_diff(lines: list[str], *, fits: bool) -> str:
    """A hunk over the `[/THINK]` docstring lines adding one line; when it must not fit, one
    context line is changed so the run prints the nearest lines of the real file."""
    context = list(lines[5:10])
    if not fits:
        context[2] = "    a line that is not there [/]"
    body = "".join(f" {line}\n" for line in context[:3])
    body += "+    An added line about `[/THINK]` [/] [bold]x\n"
    body += "".join(f" {line}\n" for line in context[3:])
    header = f"--- a/{PARSER}\n+++ b/{PARSER}\n@@ -6,5 +6,6 @@\n"
    return header + body


@dataclass(frozen=True)
class World:
    registry: Path
    target: Path


def _world(root: Path, think: str, *, fits: bool) -> World:
    registry = root / "patches"
    lines = think.splitlines()
    folder = add_patch(registry, "think-doc", diff=_think_diff(lines, fits=fits), targets=[PARSER])
    meta = folder / "patch.toml"
    text = meta.read_text().replace('title = "synthetic think-doc"', f'title = "{TITLE}"')
    text = text.replace('"a patch made by a test"', '"a description [/] with \\u001b[2J in it"')
    meta.write_text(text)
    add_patch(registry, "odd-site", sites=SITES, targets=["vllm/plain.py"], when="startup")
    files = {PARSER: think, "vllm/plain.py": "def body(self):\n    return 1\n"}
    return World(registry, make_tree(root / "target", files))


def _clean(proc: subprocess.CompletedProcess[str], *codes: int) -> bool:
    out = proc.stdout + proc.stderr
    return proc.returncode in codes and "Traceback" not in out and "\x1b" not in out


def _runs(world: World, *, fits: bool) -> dict[str, tuple[bool, subprocess.CompletedProcess[str]]]:
    reg = ("--registry", str(world.registry))
    target = ("--target", str(world.target))
    folder = f"folder:{world.target}"
    runs: dict[str, tuple[bool, subprocess.CompletedProcess[str]]] = {}

    def run(name: str, *args: str, codes: tuple[int, ...]) -> None:
        proc = cli(*reg, *args, env=WIDE)
        runs[name] = (_clean(proc, *codes), proc)

    run("list", "list", codes=(0,))
    run("show", "show", "think-doc", codes=(0,))
    run("show-site", "show", "odd-site", codes=(0,))
    run("validate", "validate", codes=(0,))
    check = ("check", "--source", folder, "--vllm", "0.19.1")
    run("check", *check, codes=(0, 1))
    run("check-markdown", *check, "--format", "markdown", codes=(0, 1))
    run("check-github", *check, "--format", "github", codes=(0, 1))
    run("apply-dry", "apply", *target, "--dry-run", codes=(0, 1))
    run("apply", "apply", *target, codes=(0, 1))
    if fits:
        run("revert", "revert", *target, codes=(0,))
    return runs


@pytest.mark.parametrize("fits", [True, False], ids=["fits", "nearly-fits"])
def test_hostile_text_is_printed_as_text(tmp_path: Path, fits: bool) -> None:
    world = _world(tmp_path, THINK_LINES, fits=fits)
    before = snapshot(world.target)
    runs = _runs(world, fits=fits)
    restored = snapshot(world.target, ignore=(LOCK,)) == before
    for name, (ok, _) in runs.items():
        record(HOSTILE, "printed text: markup, emoji, escapes", f"{name} ({fits=})", intact=ok)
    bad = {name: proc.stdout[-600:] + proc.stderr for name, (ok, proc) in runs.items() if not ok}
    assert not bad, bad
    assert restored
    listed, shown = runs["list"][1].stdout, runs["show"][1].stdout
    assert SHOWN_TITLE in shown, shown
    assert SHOWN_TITLE in listed
    assert "a description [/] with \\x1b[2J in it" in shown
    assert "[/THINK]" in shown  # the payload, printed as it is
    assert "s[/x]" in runs["show-site"][1].stdout
    apply_out = runs["apply"][1].stdout
    if fits:
        assert runs["apply"][1].returncode == 0, apply_out
        assert "s[/x]" in apply_out and "written" in apply_out
    else:
        assert runs["apply"][1].returncode == 1
        assert "`[/THINK]` token." in apply_out  # the nearest lines of the real file
        assert "nothing was written" in apply_out


def test_a_successful_apply_never_reads_as_a_crash(tmp_path: Path) -> None:
    """A site named `s[/x]` used to crash the table after the write: "conflict, nothing
    written" while the tree was patched."""
    world = _world(tmp_path, THINK_LINES, fits=True)
    proc = cli(
        "--registry", str(world.registry), "apply", "--target", str(world.target),
        "--patch", "odd-site",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "guard()  # [/]" in (world.target / "vllm/plain.py").read_text()
    assert "s[/x]" in proc.stdout


def test_control_characters_in_a_target_path_are_escaped(tmp_path: Path) -> None:
    world = _world(tmp_path / "w", THINK_LINES, fits=True)
    odd = tmp_path / f"t{ESC}[" / "]arget"  # the path holds `[/]`
    odd.parent.mkdir()
    world.target.rename(odd)
    proc = cli(
        "--registry", str(world.registry), "apply", "--target", str(odd), "--dry-run", env=WIDE
    )
    assert _clean(proc, 0), proc.stdout + proc.stderr
    assert "\\x1b[31m[/]arget" in proc.stdout


@pytest.mark.network
def test_real_think_lines_through_every_command(tmp_path: Path) -> None:
    """The same, with the lines read from the real vLLM 0.19.1 release."""
    real = materialize("0.19.1", tmp_path / "real", [PARSER])
    lines = (real / PARSER).read_text().splitlines()
    think = "\n".join(lines[18:31]) + "\n"
    assert "`[/THINK]` token." in think
    for fits in (True, False):
        world = _world(tmp_path / f"run-{fits}", think, fits=fits)
        runs = _runs(world, fits=fits)
        bad = {n: p.stdout[-600:] + p.stderr for n, (ok, p) in runs.items() if not ok}
        assert not bad, bad
    data = json.loads(
        cli("--registry", str(world.registry), "show", "think-doc", "--format", "json").stdout
    )
    assert data["title"] == TITLE.replace("\\u001b", "\x1b").replace("\\u0007", "\x07")
