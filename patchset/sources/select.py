"""Which releases to check: ``latest``, ``--since``, explicit versions, or none given.

One home for the rules `check`, `add` and `refresh` use to turn what the user asked for into
release versions of a source. Errors are `UsageError`s naming the option at fault.
"""

from __future__ import annotations

from collections.abc import Sequence

from packaging.version import InvalidVersion, Version

from patchset.errors import UsageError
from patchset.registry import ranges
from patchset.registry.toml import did_you_mean
from patchset.sources.base import ReleaseSource

LATEST = "latest"


def _version(text: str, option: str) -> Version:
    try:
        return Version(text)
    except InvalidVersion:
        raise UsageError(f"{option}{text!r} is not a PEP 440 version") from None


def for_check(
    source: ReleaseSource, *, versions: Sequence[str] = (), since: str | None = None
) -> list[str]:
    """The releases `patchset check` checks.

    `versions` (each may be ``latest``: the source's newest) plus every release after `since`;
    with neither, a folder or image source's release, a git clone's newest tag (the package
    index needs one of them). A source other than the index must hold every release named.
    """
    wanted = list(versions)
    for v in wanted:
        if v != LATEST:
            _version(v, "--vllm ")
    index = source.name == "index"
    available: list[str] | None = None
    if LATEST in wanted or since or not index:
        available = source.versions()
    if LATEST in wanted:
        assert available is not None
        if not available:
            raise UsageError("the source offers no release")
        wanted = [available[-1] if v == LATEST else v for v in wanted]
    if since:
        after = _version(since, "--since ")
        assert available is not None
        wanted += [v for v in available if Version(v) > after]
    if not wanted and not index:
        assert available is not None
        wanted = available[-1:] if source.name == "git" else available
    if not wanted:
        raise UsageError("say which releases: --vllm VERSION, --vllm latest or --since VERSION")
    if available is not None and not index:
        missing = [v for v in wanted if v not in available]
        if missing:
            raise UsageError(f"the source has no release {', '.join(missing)}")
    return list(dict.fromkeys(wanted))


def for_add(
    source: ReleaseSource, *, versions: Sequence[str] = (), since: str | None = None
) -> list[str]:
    """The releases `patchset add` checks a new patch against: `versions`, else the releases
    after `since`, else the releases the source holds without downloading."""
    for v in (*versions, *([since] if since else [])):
        _version(v, "")
    if versions:
        return list(dict.fromkeys(versions))
    if since:
        return [v for v in source.versions() if Version(v) > Version(since)]
    return source.cached_versions()


def one(source: ReleaseSource, version: str) -> tuple[str, list[str]]:
    """The one release `patchset refresh --vllm VERSION` carries a patch to (``latest``: the
    newest), as the source spells it, and every release the source offers."""
    available = source.versions()
    if not available:
        raise UsageError(f"the {source.name} source offers no release")
    if version == LATEST:
        return available[-1], available
    wanted = _version(version, "--vllm ")
    for known in available:
        if ranges.is_version(known) and Version(known) == wanted:
            return known, available
    raise UsageError(
        f"vllm {version} is not a release the {source.name} source offers"
        f"{did_you_mean(version, available)}"
    )
