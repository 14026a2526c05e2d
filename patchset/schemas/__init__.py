"""The JSON Schemas of patchset's reports, shipped with the package.

``load("check")`` is the schema of ``patchset.check/1`` (`patchset check --format json`,
``CheckReport.to_dict()``); ``load("build")`` that of ``patchset.build/1`` (report.json).
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any

NAMES = ("check", "build")


def load(name: str) -> dict[str, Any]:
    if name not in NAMES:
        raise ValueError(f"no schema {name!r}; there are {', '.join(NAMES)}")
    text = resources.files(__name__).joinpath(f"{name}.json").read_text(encoding="utf-8")
    schema: dict[str, Any] = json.loads(text)
    return schema
