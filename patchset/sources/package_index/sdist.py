"""Reading a whole sdist once: every file's sha256 for the manifest, its bytes as blobs.

The tar.gz is streamed; nothing is extracted to disk. Links and special files are skipped;
a member with an absolute path or a ``..`` component makes the whole sdist unusable.
"""

from __future__ import annotations

import hashlib
import tarfile
import zlib
from pathlib import PurePosixPath
from typing import IO, Any

from patchset.errors import SourceError
from patchset.sources.package_index.cache import Cache

MAX_MEMBER = 4 << 20  # bytes; larger files (data, binaries) are not release code to check


def sdist_manifest(source: IO[bytes], sdist: str, cache: Cache) -> dict[str, list[Any]]:
    """path (``vllm/...``, ``csrc/...``) -> [sha256, size] of every regular file kept, read
    from the open file `source` (the sdist named `sdist`, from where it stands)."""
    members: dict[str, list[Any]] = {}
    try:
        with tarfile.open(fileobj=source, mode="r|gz") as tar:
            for member in tar:
                relpath = _relpath(member.name, sdist)
                if relpath is None or not member.isfile() or member.size > MAX_MEMBER:
                    continue
                handle = tar.extractfile(member)
                if handle is None:  # pragma: no cover -- isfile() members always have data
                    continue
                data = handle.read()
                sha = hashlib.sha256(data).hexdigest()
                if not cache.has_blob(sha):
                    packer = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
                    cache.store_blob(sha, packer.compress(data) + packer.flush())
                members[relpath] = [sha, len(data)]
    except (tarfile.TarError, EOFError, zlib.error) as exc:
        raise SourceError(f"unreadable sdist ({exc})", path=sdist) from None
    if not any(name.startswith("vllm/") for name in members):
        raise SourceError("the sdist holds no vllm/ package", path=sdist)
    return members


def _relpath(name: str, sdist: str) -> str | None:
    """``vllm-X/vllm/a/b.py`` -> ``vllm/a/b.py``; None for the top folder itself."""
    pure = PurePosixPath(name)
    if pure.is_absolute() or ".." in pure.parts or "\\" in name:
        raise SourceError(f"unsafe member {name!r} in the sdist; refusing it", path=sdist)
    parts = pure.parts
    if len(parts) < 2:
        return None
    return "/".join(parts[1:])
