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


MAX_VERSION = 64  # characters: vLLM's longest is a dozen; a longer text is no version of it
MAX_RELEASES = 200  # releases one check selects from --since at most (vLLM has ~100 in all)


def _version(text: str, option: str) -> Version:
    shown = text if len(text) <= MAX_VERSION else f"{text[:20]}...({len(text)} characters)"
    if len(text) > MAX_VERSION:  # Version() of thousands of digits is an int conversion error
        raise UsageError(f"{option}{shown!r} is not a PEP 440 version (too long)")
    try:
        return Version(text)
    except (InvalidVersion, ValueError):
        raise UsageError(f"{option}{shown!r} is not a PEP 440 version") from None


def _final(available: list[str], pre: bool) -> list[str]:
    """What ``latest`` and `since` choose from: pre-releases left out unless `pre` (the index
    leaves out yanked files and, unless asked, pre-releases; so do other sources here)."""
    if pre:
        return available
    return [v for v in available if not (ranges.is_version(v) and Version(v).is_prerelease)]


def _since(available: list[str], first: Version, pre: bool) -> list[str]:
    """What ``--since`` selects: the releases from `first` on, `first` included."""
    return [v for v in _final(available, pre) if Version(v) >= first]


def for_check(
    source: ReleaseSource,
    *,
    versions: Sequence[str] = (),
    since: str | None = None,
    pre: bool = False,
) -> list[str]:
    """The releases `patchset check` checks.

    `versions` (each may be ``latest``: the source's newest final release, or pre-release with
    `pre`) plus every release from `since` on, `since` itself included; with neither, the
    source's `default_versions()` (a folder's or image's release, a git clone's newest tag;
    the package index has none: name them). A source whose list is the last word (not
    `named_on_trust`) must hold every release named. Empty only when `since`
    is given and no release is at or after it yet: nothing to check today, not an error.
    """
    wanted = list(versions)
    for v in wanted:
        if v != LATEST:
            _version(v, "--vllm ")
    listed = not source.named_on_trust  # the list is the last word: named releases are on it
    available: list[str] | None = None
    if LATEST in wanted or since or listed:
        available = source.versions()
    if LATEST in wanted:
        assert available is not None
        choice = _final(available, pre)
        if not choice:
            raise UsageError("the source offers no release" + ("" if pre else " (--pre: none)"))
        wanted = [choice[-1] if v == LATEST else v for v in wanted]
    if since:
        after = _version(since, "--since ")
        assert available is not None
        later = _since(available, after, pre)
        if len(later) > MAX_RELEASES:
            raise UsageError(
                f"--since {since} selects {len(later)} releases of the {source.name}; a check"
                f" takes at most {MAX_RELEASES}: give a later --since (newest: {later[-1]})"
            )
        wanted += later
        if not wanted:
            return []
    if not wanted:
        wanted = source.default_versions()
    if not wanted:
        raise UsageError("say which releases: --vllm VERSION, --vllm latest or --since VERSION")
    if available is not None and listed:
        missing = [v for v in wanted if v not in available]
        if missing:
            raise UsageError(f"the source has no release {', '.join(missing)}")
    return list(dict.fromkeys(wanted))


def for_add(
    source: ReleaseSource,
    *,
    versions: Sequence[str] = (),
    since: str | None = None,
    pre: bool = False,
) -> list[str]:
    """The releases `patchset add` checks a new patch against: `versions`, else the releases
    from `since` on (`since` included; pre-releases only with `pre`), else the releases the
    source holds without downloading."""
    for v in (*versions, *([since] if since else [])):
        _version(v, "")
    if versions:
        return list(dict.fromkeys(versions))
    if since:
        return _since(source.versions(), Version(since), pre)
    return source.cached_versions()


def one(source: ReleaseSource, version: str, *, pre: bool = False) -> tuple[str, list[str]]:
    """The one release `patchset refresh --vllm VERSION` carries a patch to (``latest``: the
    newest final release, or pre-release with `pre`), as the source spells it, and every
    release the source offers."""
    available = source.versions()
    if not available:
        raise UsageError(f"the {source.name} source offers no release")
    if version == LATEST:
        choice = _final(available, pre)
        if not choice:
            raise UsageError("the source offers no final release (--pre: pre-releases too)")
        return choice[-1], available
    wanted = _version(version, "--vllm ")
    for known in available:
        if ranges.is_version(known) and Version(known) == wanted:
            return known, available
    raise UsageError(
        f"vllm {version} is not a release the {source.name} source offers"
        f"{did_you_mean(version, available)}"
    )
