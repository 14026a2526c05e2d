"""What the registry loaders share: where a problem goes, and the path rules of a patch folder."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from patchset.errors import RegistryError
from patchset.registry.paths import check_relpath
from patchset.registry.toml import Table

T = TypeVar("T")


class Problems:
    """Where the patch loader keeps going: a failed step's problem kept (`collect`, for
    `validate`) and a stand-in value returned, or raised at once (every other command)."""

    def __init__(self, *, collect: bool) -> None:
        self.collect = collect
        self.errors: list[RegistryError] = []

    def add(self, error: RegistryError) -> None:
        if not self.collect:
            raise error
        self.errors.append(error)

    def step(self, read: Callable[[], T], default: T) -> T:
        try:
            return read()
        except RegistryError as exc:
            self.add(exc)
            return default

    def finish(self, table: Table) -> None:
        """The table's unknown keys, each a problem."""
        for unknown in table.unknown():
            self.add(unknown)

    def since(self, mark: int) -> bool:
        """Whether a problem was kept after `mark` (a `len(errors)` taken before)."""
        return len(self.errors) > mark


def inside(path: Path, folder: Path, what: str) -> None:
    """A symlink may not lead a patch folder, its patch.toml or a payload out of `folder`
    (`payload = "../x"` is refused; a link must not get round that)."""
    if not path.is_symlink():
        return
    real, base = path.resolve(), folder.resolve()
    if real != base and base not in real.parents:
        raise RegistryError(f"a symlink leading out of {what} ({real})", path=path)


def relpath(table: Table, key: str, value: str) -> None:
    try:
        check_relpath(value, file=table.file)
    except RegistryError as exc:
        raise table.error(str(exc).removeprefix(f"{table.file}: "), key) from None
