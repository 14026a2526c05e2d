"""Compute-capability scopes: which GPUs a patch is for (`[hardware] compute_capability`).

A scope is a comma-separated conjunction of PEP 440 style clauses over "major.minor", e.g.
">=12.0" or ">=9.0,<12.0". The registry validates a scope with `parse_scope` when it loads,
and the image entrypoint evaluates it with `in_scope` at container start: one evaluator, so a
scope that loads also runs. Supported: ``== != >= <= > <`` with "major" or "major.minor",
``==12.*`` / ``!=12.*`` (any minor of a major), and ``~=12.0`` (at least 12.0, same major).
``===``, pre-releases and more than two numbers mean nothing for a GPU and are refused.
A clause of that shape is evaluated as a version specifier's (`kernel.specifiers`) over
"major.minor": the same rules as ``torch = ">=2.9"``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from .specifiers import Grammar, VersionTest, parse_clauses

Capability = tuple[int, int]  # (major, minor), e.g. (12, 0) for sm_120
Clause = Callable[[Capability], bool]

# major or major.minor, or major.* (not major.minor.*): a version clause of two numbers at most
_SCOPES = Grammar(
    re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*(\d+(?:\.\d+(?!\.\*))?)(\.\*)?$"),
    "a compute-capability clause",
    "(use ==, !=, >=, <=, >, < or ~= with major.minor, e.g. '>=12.0', or '==12.*')",
    "major.minor, e.g. '~=12.0'",
)
_CAPABILITY = re.compile(r"^\s*(\d+)(?:\.(\d+))?\s*$")


def parse_capability(text: str) -> Capability:
    """ "12.0" or "12" as (12, 0); ValueError on anything else."""
    match = _CAPABILITY.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a compute capability (e.g. '12.0')")
    return int(match.group(1)), int(match.group(2) or 0)


def parse_scope(scope: str) -> tuple[Clause, ...]:
    """The clauses of `scope`; ValueError with a one-line reason when one cannot be evaluated."""
    tests = parse_clauses(scope, _SCOPES)
    return tuple(_over_capability(test) for test in tests)


def _over_capability(test: VersionTest) -> Clause:
    return lambda c: test(f"{c[0]}.{c[1]}")


def in_scope(scope: str | None, capability: Capability | None) -> bool:
    """Whether a GPU of `capability` (None: no GPU) is in `scope` (None or "": every GPU)."""
    if not scope:
        return True
    if capability is None:
        return False
    return all(clause(capability) for clause in parse_scope(scope))
