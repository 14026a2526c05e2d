"""The release inside a Docker image, e.g. an official ``vllm/vllm-openai`` image.

The image's own python3 says where vLLM is and which version it is, by running
`patchset.kernel.vllm.locate` (`find_spec` does not import a top-level package, and the version
files are parsed, never run, so nothing of vLLM runs). The
``vllm/`` folder's Python files are then copied out once, through the engine's archive API
without starting anything, and held in memory.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator

from packaging.version import InvalidVersion, Version

from patchset.adapters.dockerengine import Engine, ImageInfo, connect
from patchset.errors import SourceError
from patchset.kernel import vllm
from patchset.sources.base import MemoryTree, ReleaseInfo, ReleaseSource, ReleaseTree


class ImageSource(ReleaseSource):
    """The one vLLM release a Docker image holds (pulled first if it is not local)."""

    name = "image"

    def __init__(self, ref: str, *, engine: Engine | None = None) -> None:
        self.ref = ref
        self._engine = engine
        self._image: ImageInfo | None = None
        self._located: tuple[str, str, str] | None = None  # (folder, full version, via)
        self._files: dict[str, bytes] | None = None

    @property
    def engine(self) -> Engine:
        if self._engine is None:
            self._engine = connect()
        return self._engine

    def _locate(self) -> tuple[str, str, str]:
        if self._located is None:
            self._image = self.engine.ensure_image(self.ref)
            raw = self.engine.run_python(self._image.id, vllm.locate_script(), network=False)
            try:
                found = json.loads(raw.strip().splitlines()[-1])
            except (ValueError, IndexError) as exc:
                raise SourceError(f"image {self.ref}: python3 printed {raw[-200:]!r}") from exc
            folder, version, via = found.get("folder"), found.get("version"), found.get("via")
            if not isinstance(folder, str):
                raise SourceError(
                    f"image {self.ref} has no vllm package on its python3's path"
                    f" (python {found.get('python')})"
                )
            if not isinstance(version, str) or not isinstance(via, str):
                raise SourceError(
                    f"image {self.ref}: vllm at {folder} has neither a vllm/_version.py"
                    " nor a .dist-info that names its version"
                )
            self._located = (folder, version, via)
        return self._located

    def _public_version(self) -> str:
        """The release version: a local part such as ``+cu130`` names a build, not a release."""
        version = self._locate()[1]
        try:
            return Version(version).public
        except InvalidVersion:
            return version

    def versions(self) -> list[str]:
        return [self._public_version()]

    @contextlib.contextmanager
    def open(self, version: str) -> Iterator[ReleaseTree]:
        folder, full_version, via = self._locate()
        held = self._public_version()
        try:
            same = Version(version) == Version(held)
        except InvalidVersion:
            same = version in {held, full_version}
        if not same:
            raise SourceError(f"image {self.ref} holds vllm {full_version}, not {version}")
        image_id = self._image.id if self._image else self.ref
        if self._files is None:
            copied = self.engine.copy_tree(image_id, folder, suffixes=(".py",))
            if not copied:
                raise SourceError(f"image {self.ref}: no Python files under {folder}")
            # Keyed "vllm/..." whatever the folder's real name (it may be a symlink's target).
            self._files = {
                "vllm/" + name.partition("/")[2]: data
                for name, data in copied.items()
                if "/" in name
            }
        info = ReleaseInfo(
            version=held,
            origin=f"image {self.ref} ({image_id[:19]}) {folder}, version {full_version}"
            f" from {via}",
            digest=image_id if image_id.startswith("sha256:") else None,
        )
        yield MemoryTree(info, self._files)
