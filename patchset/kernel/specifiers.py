"""PEP 440 style specifiers (``>=2.9,<3``, ``==2.9.*``, ``~=12.8``): the one evaluator.

Standard library only (it ships into images). `predicates` tests installed versions with it
(torch, CUDA, the driver) and `capability` a GPU's compute capability, as "major.minor".
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_VERSION = re.compile(
    r"^\s*v?(?P<release>\d+(?:\.\d+)*)"
    r"(?:[-_.]?(?P<pre>a|b|c|rc|alpha|beta|pre|preview)[-_.]?(?P<pre_n>\d*))?"
    r"(?:[-_.]?(?P<post>post|rev|r)[-_.]?(?P<post_n>\d*))?"
    r"(?:[-_.]?(?P<dev>dev)[-_.]?(?P<dev_n>\d*))?"
    r"(?:\+[a-z0-9]+(?:[-_.][a-z0-9]+)*)?\s*$",
    re.IGNORECASE,
)
_PHASE = {"dev": 0, "a": 1, "alpha": 1, "b": 2, "beta": 2, "c": 3, "rc": 3, "pre": 3}
_PHASE["preview"] = 3
VersionKey = tuple[tuple[int, ...], int, int]


def version_key(text: str) -> VersionKey:
    """A version (``2.9.0+cu130``, ``2.10.0a0``, ``575.57.08``) as a sortable key: its
    numbers (trailing zeros dropped), then its phase (dev < a < b < rc < final < post) and that
    phase's number. The local part (``+cu130``) is ignored. ValueError if not a version."""
    match = _VERSION.match(text)
    if match is None:
        raise ValueError(f"{text!r} is not a version")
    release = tuple(int(n) for n in match["release"].split("."))
    while len(release) > 1 and release[-1] == 0:
        release = release[:-1]
    if match["pre"]:
        phase, number = _PHASE[match["pre"].lower()], int(match["pre_n"] or 0)
    elif match["dev"] and not match["post"]:
        phase, number = 0, int(match["dev_n"] or 0)
    elif match["post"]:
        phase, number = 5, int(match["post_n"] or 0)
    else:
        phase, number = 4, 0
    return release, phase, number


VersionTest = Callable[[str], bool]


@dataclass(frozen=True)
class Grammar:
    """What a clause may say, and how a refusal names it: `pattern` matches the operator, the
    number and an optional ``.*``; `name` and `usage` make the message for a clause it does
    not match, `compatible` the one for a ``~=`` with one number."""

    pattern: re.Pattern[str]
    name: str
    usage: str
    compatible: str


VERSIONS = Grammar(
    re.compile(r"^(~=|==|!=|<=|>=|<|>)\s*(\S+?)(\.\*)?$"),
    "a version clause",
    "(use ==, !=, >=, <=, >, < or ~=, e.g. '>=2.9' or '==2.9.*')",
    "two numbers, e.g. '~=2.9'",
)


def parse_specifier(text: str) -> tuple[VersionTest, ...]:
    """The clauses of a comma-separated specifier (``>=2.9,<3``, ``==2.9.*``, ``~=12.8``),
    each a test of a version string; ValueError with a one-line reason."""
    if not text.strip():
        raise ValueError("an empty specifier")
    return parse_clauses(text, VERSIONS)


def parse_clauses(text: str, grammar: Grammar) -> tuple[VersionTest, ...]:
    return tuple(_clause(part.strip(), text, grammar) for part in text.split(","))


def _clause(text: str, whole: str, grammar: Grammar) -> VersionTest:
    match = grammar.pattern.match(text)
    if match is None:
        raise ValueError(f"{text!r} in {whole!r} is not {grammar.name} {grammar.usage}")
    op, version, star = match.groups()
    try:
        bound = version_key(version)
    except ValueError:
        raise ValueError(f"{text!r} in {whole!r}: {version!r} is not a version") from None
    if star:
        if op not in ("==", "!="):
            raise ValueError(f"{text!r} in {whole!r}: '.*' goes with == or != only")
        prefix = tuple(int(n) for n in version.split("."))

        def starts(v: str) -> bool:
            return _padded(version_key(v)[0], prefix)

        return starts if op == "==" else (lambda v: not starts(v))
    if op == "~=":
        parts = version.split(".")
        if len(parts) < 2:
            raise ValueError(f"{text!r} in {whole!r}: '~=' needs {grammar.compatible}")
        head = tuple(int(n) for n in parts[:-1])
        return lambda v: version_key(v) >= bound and _padded(version_key(v)[0], head)
    tests: dict[str, Callable[[VersionKey], bool]] = {
        "==": lambda k: k == bound,
        "!=": lambda k: k != bound,
        ">=": lambda k: k >= bound,
        "<=": lambda k: k <= bound,
        ">": lambda k: k > bound,
        "<": lambda k: k < bound,
    }
    test = tests[op]
    return lambda v: test(version_key(v))


def _padded(numbers: tuple[int, ...], head: tuple[int, ...]) -> bool:
    numbers = numbers + (0,) * (len(head) - len(numbers))
    return numbers[: len(head)] == head


def satisfies(version: str, specifier: str) -> bool:
    """Whether `version` meets every clause of `specifier` (ValueError on either)."""
    clauses = parse_specifier(specifier)
    version_key(version)
    return all(clause(version) for clause in clauses)
