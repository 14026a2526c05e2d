"""PEP 440 ranges as `patch.toml` holds them: their text and their arithmetic.

Every place that reads, writes, compares, caps or widens a `vllm = "..."` range calls this
module: the release check's suggested ranges, `check --suggest-ranges --write`, `add` and
`refresh`. Specifiers are parsed by `packaging`; the text is kept as the author wrote it where
nothing changes, and written lower bounds first where something does.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable

from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

# Lower bounds first, exact and compatible ones next, exclusions, then upper bounds.
_ORDER = {">=": 0, ">": 0, "~=": 1, "==": 1, "===": 1, "!=": 2, "<=": 3, "<": 3}


@functools.lru_cache(maxsize=4096)
def as_version(text: str) -> Version:
    """`Version(text)`, parsed once per distinct text (a check asks the same 25 releases of
    every patch); InvalidVersion when it is none. Version objects are not changed once made."""
    return Version(text)


@functools.lru_cache(maxsize=1024)
def specifier(text: str) -> SpecifierSet:
    """`SpecifierSet(text)`, parsed once per distinct text (for `placed`; not handed out to
    be kept). InvalidSpecifier when it is none."""
    return SpecifierSet(text)


@functools.lru_cache(maxsize=65536)
def placed(texts: tuple[str, ...], version: str) -> tuple[bool, int]:
    """Where release `version` stands among a patch's ranges, given as their texts (the
    declared range, then each variant's): whether it is inside the declared range and one
    variant's, and the index of the first variant holding it (-1: none); pre-releases
    count as releases. Asked once per release for all the patches of a registry that share
    their ranges (a few dozen among hundreds). InvalidVersion when `version` is none."""
    release = as_version(version)
    declared, *variants = (specifier(text) for text in texts)
    meant = next(
        (i for i, spec in enumerate(variants) if spec.contains(release, prereleases=True)), -1
    )
    return meant >= 0 and declared.contains(release, prereleases=True), meant


@functools.lru_cache(maxsize=4096)
def is_version(text: str) -> bool:
    try:
        as_version(text)
    except InvalidVersion:
        return False
    return True


def version_key(text: str) -> tuple[int, Version | str]:
    """Sort key: PEP 440 versions in order, anything else after them by its text."""
    return (0, as_version(text)) if is_version(text) else (1, text)


def parts(spec: str) -> list[str]:
    """The clauses of `spec` as written, e.g. ['>=0.17.0', '<0.20.0']."""
    return [part.strip() for part in spec.split(",") if part.strip()]


def operator(part: str) -> str:
    """The operator of one clause ('>=', '<', ...), '' when it is no specifier."""
    try:
        return Specifier(part).operator
    except InvalidSpecifier:
        return ""


def range_text(clauses: Iterable[str]) -> str:
    """Clauses joined lower bounds first (SpecifierSet's own str() sorts them as text)."""
    unique = list(dict.fromkeys(p.strip() for p in clauses if p.strip()))
    return ",".join(sorted(unique, key=lambda p: _ORDER.get(operator(p), 2)))


def same_range(a: str, b: str) -> bool:
    try:
        return SpecifierSet(a) == SpecifierSet(b)
    except InvalidSpecifier:
        return a == b


def holds(spec: str, version: str) -> bool:
    return SpecifierSet(spec).contains(as_version(version), prereleases=True)


def runs(
    hits: set[str], versions: Iterable[str], *, closing: set[str] | None = None
) -> tuple[str, ...]:
    """The releases of `hits` among the checked `versions`, as ranges.

    A run starts at a release in `hits` and ends, ``>=first,<that``, at the first checked
    release after it in `closing`; with no such release it stays open (``>=first``).
    `closing` None means every checked release outside `hits` (plain runs). The release check
    passes the releases where the fix is upstream: a release where the patch conflicts or its
    file vanished is no evidence it is done with, so it leaves the range open and CI keeps
    flagging it (docs/ci.md).
    """
    ordered = _in_order(tuple(versions))
    ends = {v for v in ordered if v not in hits} if closing is None else closing
    found: list[str] = []
    start: str | None = None
    for version in ordered:
        if version in hits and start is None:
            start = version
        elif start is not None and version in ends and version not in hits:
            found.append(f">={start},<{version}")
            start = None
    if start is not None:
        found.append(f">={start}")
    return tuple(found)


@functools.lru_cache(maxsize=64)
def _in_order(versions: tuple[str, ...]) -> tuple[str, ...]:
    """The versions among `versions`, each once, oldest first (`runs` is asked the same
    releases for every patch of a check)."""
    return tuple(sorted({v for v in versions if is_version(v)}, key=as_version))


def cap(spec: str, target: str) -> str:
    """`spec` narrowed to releases before `target` (an upper bound at or below it is kept)."""
    limit = Version(target)
    clauses = parts(spec)
    kept = []
    bounded = False
    for part in clauses:
        one = Specifier(part)
        if one.operator in ("<", "<="):
            bound = Version(one.version)
            if bound < limit or (bound == limit and one.operator == "<"):
                bounded = True
            else:
                continue
        kept.append(part)
    if not bounded:
        kept.append(f"<{target}")
    return spec if kept == clauses else range_text(kept)


def widen(spec: str, target: str, after: str | None) -> str | None:
    """`spec` made to hold `target`: a bound that shut it out moves to `after` (the next
    release) or goes; None when no such edit makes it hold `target`."""
    if holds(spec, target):
        return spec
    clauses = parts(spec)
    kept = [p for p in clauses if holds(p, target)]
    shut = [p for p in clauses if p not in kept]
    if after is not None and any(operator(p) in ("<", "<=") for p in shut):
        kept.append(f"<{after}")
    widened = range_text(kept)
    return widened if holds(widened, target) else None
