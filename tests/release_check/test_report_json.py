"""The check's JSON is written by `cli.output.dumps`: the same text `json.dumps(indent=2,
default=str)` writes, for every kind of value a report holds (and those it might)."""

from __future__ import annotations

import enum
import json
import random
from pathlib import PurePosixPath
from typing import Any

import pytest

from patchset.cli.output import dumps


class Color(enum.Enum):
    RED = "red"


class Level(enum.IntEnum):
    HIGH = 3


class Name(enum.StrEnum):
    A = "a"


ODD: list[Any] = [
    "",
    "plain",
    'quote " backslash \\ tab \t newline \n nul \x00 escape \x1b',
    "unicode é ✓ 𝄞 \ud800",
    0,
    -1,
    2**70,
    True,
    False,
    None,
    0.0,
    -0.0,
    1.5,
    1e300,
    1e-7,
    float("nan"),
    float("inf"),
    float("-inf"),
    (),
    [],
    {},
    (1, "two", [3.0]),
    {"nested": {"deeper": [{"k": [None, [], {}]}]}},
    Color.RED,
    Level.HIGH,
    Name.A,
    PurePosixPath("vllm/a.py"),
    {1, 2},
    b"bytes",
]


@pytest.mark.parametrize("value", ODD, ids=range(len(ODD)))
def test_each_kind_of_value_is_written_as_json_writes_it(value: object) -> None:
    for data in (value, [value, value], {"key": value, "other": [value]}):
        assert dumps(data) == json.dumps(data, indent=2, default=str)


def test_keys_that_are_not_strings_are_left_to_json() -> None:
    data: dict[str, dict[object, object]] = {"a": {1: "one", 2.5: None, False: [], None: {}}}
    assert dumps(data) == json.dumps(data, indent=2, default=str)


def random_value(rng: random.Random, depth: int) -> object:
    if depth > 4 or rng.random() < 0.4:
        return rng.choice(ODD[:18])
    if rng.random() < 0.5:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return {f"k{i}\n": random_value(rng, depth + 1) for i in range(rng.randrange(4))}


def test_random_documents_are_the_same_text() -> None:
    rng = random.Random(38)  # noqa: S311 - reproducible documents, not secrets
    for _ in range(300):
        data = random_value(rng, 0)
        assert dumps(data) == json.dumps(data, indent=2, default=str)
