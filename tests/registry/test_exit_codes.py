"""One exit-code table: `errors.MEANING`, the help texts and docs/exit-codes.md agree."""

from __future__ import annotations

import re

import pytest

from patchset.cli import options
from patchset.errors import MEANING, ExitCode
from tests.helpers.cli import REPO, cli

DOC = REPO / "docs" / "exit-codes.md"


def doc_rows() -> dict[int, str]:
    """docs/exit-codes.md's table: code -> name."""
    rows = re.findall(r"^\| (\d+) \| ([^|]+?) \|", DOC.read_text(), flags=re.MULTILINE)
    return {int(code): name for code, name in rows}


def test_every_code_has_a_meaning_and_a_row_in_the_docs() -> None:
    assert set(MEANING) == set(ExitCode)
    assert doc_rows() == {int(code): m.name for code, m in MEANING.items()}


def test_the_top_level_help_lists_every_code() -> None:
    out = cli("--help").out
    for code, meaning in MEANING.items():
        assert f"{int(code):>3}  {meaning.short}" in out, code
    assert " 8  a patch's upstream fix is in the tree" in out
    assert " 9  " in out


@pytest.mark.parametrize("command", sorted(options.COMMAND_HELP))
def test_each_command_lists_its_codes_from_the_table(command: str) -> None:
    out = cli(*command.split(), "--help").out
    listed = [int(n) for n in re.findall(r"^ *(\d+)  ", out.split("exit codes:")[1], re.M)]
    assert listed == [int(c) for c in options.command_codes(command)]
    for code in options.command_codes(command):
        assert MEANING[code].short in out


def test_apply_help_names_8_and_says_6_is_strict_only() -> None:
    out = cli("apply", "--help").out
    assert "    8  a patch's upstream fix is in the tree" in out
    assert "    6  --strict only" in out and "    7  --strict only" in out


def test_the_apply_schema_names_every_outcome() -> None:
    from typing import get_args

    from patchset import schemas
    from patchset.engine.results import Outcome

    results = schemas.load("apply")["properties"]["results"]["items"]["properties"]
    assert results["outcome"]["enum"] == list(get_args(Outcome))


def test_the_refused_start_is_one_status_everywhere() -> None:
    """The entrypoint (through kernel/startup.py) and the plugin runner, which runs in vLLM's
    processes without the kernel beside it and so writes the status itself, exit alike."""
    from patchset.image.runtime import plugins
    from patchset.kernel import startup

    assert startup.START_REFUSED == plugins.START_REFUSED == int(ExitCode.START_REFUSED) == 9
