"""`patchset._plain`: a result's fields as the JSON reports write them."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from patchset._plain import fields_dict, plain


@dataclass(frozen=True)
class Inner:
    name: str
    lines: tuple[int, ...]


@dataclass(frozen=True)
class Rounded:
    ratio: float

    def to_dict(self) -> dict[str, object]:
        return {"ratio": round(self.ratio, 2)}


@dataclass(frozen=True)
class Outer:
    where: Path
    inner: tuple[Inner, ...]
    rounded: Rounded
    pairs: tuple[tuple[str, int], ...] = ()
    table: dict[str, tuple[str, ...]] = field(default_factory=dict)
    hidden: str = "left out"


def test_fields_in_order_nested_and_json_ready() -> None:
    outer = Outer(
        Path("/a/b"),
        (Inner("x", (1, 2)),),
        Rounded(0.12345),
        (("f.py", 3),),
        {"k": ("v",)},
    )
    data = fields_dict(outer, skip=("hidden",))
    assert list(data) == ["where", "inner", "rounded", "pairs", "table"]
    assert data == {
        "where": "/a/b",
        "inner": [{"name": "x", "lines": [1, 2]}],
        "rounded": {"ratio": 0.12},  # an object's own to_dict wins
        "pairs": [["f.py", 3]],
        "table": {"k": ["v"]},
    }
    json.dumps(data)  # nothing left that JSON cannot write


def test_plain_leaves_scalars_as_they_are() -> None:
    assert [plain(v) for v in ("s", 1, 1.5, True, None)] == ["s", 1, 1.5, True, None]


def test_fields_kept_per_class_and_skip_however_skip_is_given() -> None:
    """The field names are looked up once per class and `skip`: another `skip` of the same
    class, or a `skip` given as a list or set, leaves out what it names and nothing else."""
    inner = Inner("x", (1,))
    outer = Outer(Path("/a"), (inner,), Rounded(1.0))
    assert list(fields_dict(outer)) == ["where", "inner", "rounded", "pairs", "table", "hidden"]
    assert list(fields_dict(outer, skip=["hidden", "pairs"])) == [
        "where",
        "inner",
        "rounded",
        "table",
    ]
    assert list(fields_dict(outer, skip={"where"})) == [
        "inner",
        "rounded",
        "pairs",
        "table",
        "hidden",
    ]
    assert fields_dict(inner, skip=("where",)) == {"name": "x", "lines": [1]}
