"""The similarity used for the "nearest lines (NN% alike)" text: rapidfuzz's normalised Indel
similarity (the measure difflib's ratio approximates, in C), difflib's when it is missing."""

from __future__ import annotations

import difflib


def ratio(a: str, b: str) -> float:
    """How alike two texts are, 0.0 to 1.0."""
    try:
        from rapidfuzz.fuzz import ratio as indel  # noqa: PLC0415 - only when a diagnostic is shown
    except ImportError:  # pragma: no cover - a declared dependency; kept working without it
        return difflib.SequenceMatcher(None, a, b, autojunk=False).quick_ratio()
    return float(indel(a, b)) / 100.0
