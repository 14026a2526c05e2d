"""Compute-capability scopes: which GPUs a patch is for (`[hardware] compute_capability`).

A scope is a comma-separated conjunction of PEP 440 style clauses over "major.minor", e.g.
">=12.0" or ">=9.0,<12.0". The registry validates a scope with `parse_scope` when it loads,
and the image entrypoint evaluates it with `in_scope` at container start: one evaluator, so a
scope that loads also runs. Supported: ``== != >= <= > <`` with "major" or "major.minor",
``==12.*`` / ``!=12.*`` (any minor of a major), and ``~=12.0`` (at least 12.0, same major).
``===``, pre-releases and more than two numbers mean nothing for a GPU and are refused.
"""

from __future__ import annotations

import re
from collections.abc import Callable

Capability = tuple[int, int]  # (major, minor), e.g. (12, 0) for sm_120
Clause = Callable[[Capability], bool]

_CLAUSE = re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*(\d+)(?:\.(\d+|\*))?$")
_CAPABILITY = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*$")


def parse_capability(text: str) -> Capability:
    """ "12.0" or "12" as (12, 0); ValueError on anything else."""
    match = _CAPABILITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a compute capability (e.g. '12.0')")
    return int(match.group(1)), int(match.group(2) or 0)


def parse_scope(scope: str) -> tuple[Clause, ...]:
    """The clauses of `scope`; ValueError with a one-line reason when one cannot be evaluated."""
    return tuple(_clause(raw.strip(), scope) for raw in scope.split(","))


def _clause(text: str, scope: str) -> Clause:
    match = _CLAUSE.match(text)
    if match is None:
        raise ValueError(
            f"{text!r} in {scope!r} is not a compute-capability clause"
            " (use ==, !=, >=, <=, >, < or ~= with major.minor, e.g. '>=12.0', or '==12.*')"
        )
    op, major_text, minor_text = match.groups()
    major = int(major_text)
    if minor_text == "*":
        if op not in ("==", "!="):
            raise ValueError(f"{text!r} in {scope!r}: '.*' goes with == or != only")
        return (lambda c: c[0] == major) if op == "==" else (lambda c: c[0] != major)
    bound = (major, int(minor_text or 0))
    if op == "~=":
        if minor_text is None:
            raise ValueError(f"{text!r} in {scope!r}: '~=' needs major.minor, e.g. '~=12.0'")
        return lambda c: c >= bound and c[0] == major
    compare: dict[str, Clause] = {
        "==": lambda c: c == bound,
        "!=": lambda c: c != bound,
        ">=": lambda c: c >= bound,
        "<=": lambda c: c <= bound,
        ">": lambda c: c > bound,
        "<": lambda c: c < bound,
    }
    return compare[op]


def in_scope(scope: str | None, capability: Capability | None) -> bool:
    """Whether a GPU of `capability` (None: no GPU) is in `scope` (None or "": every GPU)."""
    if not scope:
        return True
    if capability is None:
        return False
    return all(clause(capability) for clause in parse_scope(scope))
