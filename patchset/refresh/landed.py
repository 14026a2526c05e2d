"""What a refresh must not do: carry a change the release already holds (every hunk or site
whose added lines are there, `release_check.landed`), or delete what the release added."""

from __future__ import annotations

from collections.abc import Mapping

from patchset.errors import UsageError
from patchset.registry import Variant
from patchset.release_check.landed import Landed, landed, removed_by, unexpected_deletions


class RefusedRefreshError(UsageError):
    """A refresh refused for what it would do to the release: the change landed there
    (`upstream`: every hunk or site; else some), or the new variant deletes lines the
    original never deleted. `landed` and `lines` name what was found."""

    def __init__(
        self,
        message: str,
        *,
        upstream: bool = False,
        landed: tuple[Landed, ...] = (),
        lines: tuple[str, ...] = (),
    ) -> None:
        super().__init__(message)
        self.upstream = upstream
        self.landed = landed
        self.lines = lines


def refuse_landed(
    patch_id: str, variant: Variant, target: str, files: Mapping[str, bytes | None]
) -> None:
    """Refused (`RefusedRefreshError`) when a hunk or site of `variant` landed in `target`."""
    found = landed(variant, files)
    hits = [x for x in found if x.present]
    if not hits:
        return
    every = all(x.present for x in found if x.lines)
    named = "; ".join(x.describe() for x in hits[:3]) + (" and more" if len(hits) > 3 else "")
    if every:
        message = f"vllm {target} already holds {patch_id}'s change ({named}): nothing to refresh"
    else:
        rest = ", ".join(x.what for x in found if x.lines and not x.present)
        message = (
            f"vllm {target} holds part of {patch_id}'s change ({named}); {rest} not:"
            " carry what is left by hand"
        )
    raise RefusedRefreshError(message, upstream=every, landed=found)


def refuse_deletions(
    patch_id: str,
    variant: Variant,
    target: str,
    release: Mapping[str, bytes | None],
    edited: Mapping[str, bytes | None],
) -> None:
    """Refused when the new variant removes lines `variant` never removed, or breaks a file."""
    lines = unexpected_deletions(removed_by(variant), release, edited)
    if lines:
        raise RefusedRefreshError(
            f"the refreshed {patch_id} would delete vllm {target}'s own lines or break a file"
            f" ({'; '.join(lines)}): not a refresh, carry it by hand",
            lines=tuple(lines),
        )
