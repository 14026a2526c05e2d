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
