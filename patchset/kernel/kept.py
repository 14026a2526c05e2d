"""Facts about a source worked out once and kept between runs (standard library only).

Some of what a check works out about a release's file takes real time and depends on its
bytes alone: where its defs and classes start and end (`pycompile`, to judge an edit by the
units it changes), the names its module binds (`touches`, for a python patch). A check keeps
them in its memo (`patchset.release_check.memo.Memo` is a `Store`): an edited patch's check
then works out nothing about the release's files again. Each kind of fact is kept as JSON's
values under a digest of the source, and its module checks what it reads back (a row that is
not such a fact is not believed). Outside `kept_in`, nothing is asked or kept.
"""

from __future__ import annotations

import contextlib
import hashlib
from collections.abc import Iterator
from typing import Protocol


class Store(Protocol):
    """Where facts are kept: by their kind and a digest of the source they are about."""

    def fact(self, kind: str, key: bytes) -> object | None: ...

    def keep_fact(self, kind: str, key: bytes, value: object) -> None: ...


_STORES: list[Store | None] = []  # the innermost `kept_in`'s last


@contextlib.contextmanager
def kept_in(store: Store | None) -> Iterator[None]:
    """Within it, facts are asked of `store` before they are worked out, and kept there
    after (None: neither)."""
    _STORES.append(store)
    try:
        yield
    finally:
        _STORES.pop()


def store() -> Store | None:
    """The store facts are kept in here, if any."""
    return _STORES[-1] if _STORES else None


def digest(source: bytes) -> bytes:
    """The key of a source's facts."""
    return hashlib.blake2b(source, digest_size=16).digest()


__all__ = ["Store", "digest", "kept_in", "store"]
