"""`parallel.Forked` counted: a test of a split check sees how many children it forked."""

from __future__ import annotations

from patchset.release_check import parallel


class Counted(parallel.Forked):  # type: ignore[type-arg]
    """Set as `parallel.Forked` (monkeypatch); `made` counts the children (reset it first)."""

    made = 0

    def __init__(self, *args: object, **kwargs: object) -> None:
        type(self).made += 1
        super().__init__(*args, **kwargs)  # type: ignore[arg-type]
