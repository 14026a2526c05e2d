"""The one `with` shape of the wrappers that hold something open (an engine connection, a
repository): `with X(...) as x:` returns `x` and calls `x.close()` on the way out."""

from __future__ import annotations

from contextlib import AbstractContextManager
from types import TracebackType
from typing import Any, Self


class Closing(AbstractContextManager[Any]):
    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
