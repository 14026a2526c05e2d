"""Frozen dataclasses as plain data (what `--format json` writes): the one place a result's
fields become a dict, so a new field shows up in every report without a hand-written line.

Standard library only, below every package that writes a report (engine, release check,
refresh)."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


_SCALARS = frozenset({str, int, float, bool, type(None)})


def plain(value: object) -> object:
    """`value` as JSON-ready data: an object with its own `to_dict` by it, another dataclass
    by `fields_dict`, tuples and lists as lists, mappings with plain values, a path as its
    text; anything else (str, int, float, bool, None) as it is."""
    if type(value) in _SCALARS:  # most values: no attribute lookup that fails
        return value
    to_dict = getattr(value, "to_dict", None)
    if callable(to_dict):
        return to_dict()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return fields_dict(value)
    if isinstance(value, tuple | list):
        return [v if type(v) in _SCALARS else plain(v) for v in value]
    if isinstance(value, Mapping):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, Path):
        return str(value)
    return value


def fields_dict(obj: DataclassInstance, *, skip: Collection[str] = ()) -> dict[str, object]:
    """`obj`'s fields in the order they are declared, each as `plain` data, but those in
    `skip`."""
    names = _names(type(obj), skip if isinstance(skip, tuple) else tuple(skip))
    return {name: v if type(v := getattr(obj, name)) in _SCALARS else plain(v) for name in names}


@functools.cache
def _names(cls: type[DataclassInstance], skip: tuple[str, ...]) -> tuple[str, ...]:
    """A dataclass's field names in order but those in `skip`, looked up once per class
    (`dataclasses.fields` makes a new tuple at every call: a check's JSON asks it of every
    result)."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in skip)
