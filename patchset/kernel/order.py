"""The order a stacked series goes in: every patch after the patches it `requires`.

One rule for every place that applies patches: the engine (`patchset apply`, image builds,
`runtime export`) and the image entrypoint, which carries this file as `patchset_kernel`.
Items that name nothing keep the order they were given in; a requirement that is not among
the items is ignored here (whoever selected the items decides what that means).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import TypeVar

T = TypeVar("T")


def in_order(
    items: Sequence[T], key: Callable[[T], str], requires: Callable[[T], Iterable[str]]
) -> list[T]:
    """`items` with each one after those it requires (among them); otherwise as given.
    On a cycle (which the registry refuses when it loads) the rest keep their given order."""
    ids = {key(item) for item in items}
    done: list[T] = []
    placed: set[str] = set()
    pending = list(items)
    while pending:
        for index, item in enumerate(pending):
            if all(r in placed or r not in ids for r in requires(item)):
                done.append(item)
                placed.add(key(item))
                del pending[index]
                break
        else:
            done.extend(pending)
            break
    return done
