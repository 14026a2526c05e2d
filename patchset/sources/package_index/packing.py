"""A cached manifest's on-disk form: one artifact's file list as `Cache` keeps it.

A header line (JSON: the format, the artifact, the index's sha256 of it, what was verified,
the digest of the body) and the body: one JSON object, path -> the member's entry packed as
one string, "sha256 size ...", deflated (zlib). Format 3 kept the body plain and format 2
wrote lists: both still read, and rewritten in today's form. The body is inflated and
decoded on first use, each entry unpacked when asked for.

Deflated, a wheel's list is 2.5 times smaller (a vLLM wheel's, 530 KB plain, is 210 KB): the
lists were a third of the cache after a check of 26 releases (17 of 49.5 MB; the cache's size
is a benchmark target, < 50 MB). Inflating one takes 1.4 ms, deflating it (level 1) 5 ms.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import zlib
from collections.abc import Callable, Iterator, Mapping
from typing import Any, Literal

from patchset.errors import SourceError

FORMAT = "patchset-manifest/4"  # the body deflated (/3: plain, /2: lists; both still read)
_PLAIN = "patchset-manifest/3"  # members as "sha256 size ..." strings, the body not deflated
_LISTS = "patchset-manifest/2"  # entries as lists, the body plain
_READABLE = frozenset({FORMAT, _PLAIN, _LISTS})
_LEVEL = 1  # zlib's: 2.5 times smaller at a third of level 6's time (5 ms against 13 ms)


@dataclasses.dataclass(frozen=True)
class Manifest:
    """One artifact's files: path -> [sha256, size, *where in the wheel]."""

    version: str
    artifact: str  # the wheel's or sdist's file name
    kind: Literal["wheel", "sdist"]
    sha256: str  # the index's sha256 of the artifact
    verified: Literal["members", "full"]  # members: RECORD + CRC per member; full: whole file
    url: str  # where the artifact was read (credential-free)
    members: Mapping[str, list[Any]]
    size: int = 0  # of the artifact
    end: int = 0  # wheels: where the central directory starts

    def header(self) -> dict[str, Any]:
        """The fields but `members` (not `asdict`: it would deep-copy thousands of entries)."""
        fields = {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}
        del fields["members"]
        return {"format": FORMAT, **fields}


def decode(raw: bytes) -> Manifest | None:
    """The manifest `raw` holds; None when it is not one (a format not read, a body that does
    not match its digest, a header that does not fit)."""
    end = raw.find(b"\n")
    if end < 0:
        return None
    body = memoryview(raw)[end + 1 :]  # not copied: most are never decoded
    return _manifest(raw[:end], lambda digest: body if _sha256(body) == digest else None)


def decode_head(head: bytes, body: Callable[[], bytes | None]) -> Manifest | None:
    """The manifest whose header line is `head` (None: not one), its body read with `body`
    and checked against the header's digest when its list is first used (a damaged or
    vanished body then raises `DamagedListError`): a check that the memo tells every file's digest
    reads no file list, and a list is 80% of a cached manifest's bytes."""

    def checked(digest: str) -> Callable[[], bytes]:
        def read() -> bytes:
            data = body()
            if data is None or _sha256(data) != digest:
                raise DamagedListError(_DAMAGED)
            return data

        return read

    return _manifest(head, checked)


def _manifest(head: bytes, body: Callable[[str], Any]) -> Manifest | None:
    """The manifest of header line `head`, its list `body(digest)` (None: not to be believed)."""
    try:
        header = json.loads(head)
        written = header.pop("format")
        if written not in _READABLE:
            return None
        listed = body(header.pop("digest"))
        if listed is None:
            return None
        return Manifest(members=Members(listed, deflated=written == FORMAT), **header)
    except (ValueError, TypeError, KeyError, AttributeError):
        return None


def _sha256(data: bytes | memoryview) -> str:
    return hashlib.sha256(data).hexdigest()


def encode(manifest: Manifest) -> bytes:
    """`manifest` as `decode` reads it: the header line, then the packed members."""
    packed = {  # a wheel's members inline: a call a member would cost 50 ms a cold check
        path: _FIELDS % tuple(entry) if len(entry) == _WHEEL_FIELDS else _pack(entry)
        for path, entry in manifest.members.items()
    }
    plain = json.dumps(packed, separators=(",", ":")).encode()  # in the wheel's order
    body = zlib.compress(plain, _LEVEL)
    header = {**manifest.header(), "digest": hashlib.sha256(body).hexdigest()}
    return json.dumps(header, sort_keys=True).encode() + b"\n" + body


def written_before(manifest: Manifest) -> bool:
    """Whether a decoded manifest was written by an older format (the cache rewrites it)."""
    return isinstance(manifest.members, Members) and not manifest.members.deflated


def _pack(entry: list[Any]) -> str:
    """A member's entry as the cache keeps it: "sha256 size ..." (one string, not a list:
    decoding a wheel's list then makes two objects a member, not seven, and none that the
    garbage collector must walk). `encode` formats a wheel's members with `_FIELDS`
    itself, at json.dumps's own speed."""
    return " ".join(map(str, entry))


_FIELDS = "%s %d %d %d %d %d"  # a wheel's member: sha256, size, offset, compressed, CRC, method
_WHEEL_FIELDS = 6


def _unpack(packed: str | list[Any]) -> list[Any]:
    """An entry as `_pack` wrote it (a list, as format 2 wrote it, is taken as it is)."""
    if isinstance(packed, list):
        return packed
    sha, *numbers = packed.split(" ")
    try:
        return [sha, *(int(n) for n in numbers)]
    except ValueError:
        raise SourceError(_DAMAGED) from None


_DAMAGED = "a cached release's file list is damaged; run `patchset cache clear`"


class DamagedListError(SourceError):
    """A cached file list read after its header (`decode_head`) does not match its digest."""


class Members(Mapping[str, list[Any]]):
    """A cached manifest's file list, decoded on first use (a warm check, answered by the
    memo, opens every release but reads no file, and decoding a wheel's list is most of its
    cost), each entry unpacked when asked for. Its bytes were checked against the manifest's
    digest when it was loaded, or (given as a reader: `decode_head`) are when first read:
    a damaged list then raises `DamagedListError`."""

    def __init__(
        self, body: bytes | memoryview | Callable[[], bytes], *, deflated: bool = True
    ) -> None:
        self._body = body
        self.deflated = deflated  # False: written by format 3 or 2, the body plain
        self._members: dict[str, str | list[Any]] | None = None

    @property
    def checked(self) -> bool:
        """Whether the list's bytes are known to match its digest (read, or given checked)."""
        return self._members is not None or not callable(self._body)

    def check(self) -> None:
        """The list read and decoded now (`DamagedListError` when its bytes do not match)."""
        self._decoded()

    def _decoded(self) -> dict[str, str | list[Any]]:
        if self._members is None:
            body = self._body() if callable(self._body) else self._body
            try:
                members = json.loads(zlib.decompress(body) if self.deflated else bytes(body))
            except (ValueError, zlib.error):
                members = None
            if not isinstance(members, dict):
                raise SourceError(_DAMAGED)
            self._members = members
            self._body = b""  # decoded: its bytes are not needed again
        return self._members

    def __getitem__(self, key: str) -> list[Any]:
        return _unpack(self._decoded()[key])

    def sha256_of(self, key: str) -> str | None:
        """The entry's sha256 alone (its first field), None when there is no such member:
        what a check asks of most entries, without unpacking the others."""
        packed = self._decoded().get(key)
        if packed is None:
            return None
        if isinstance(packed, list):
            return str(packed[0])
        return packed.partition(" ")[0]

    def __contains__(self, key: object) -> bool:
        return key in self._decoded()

    def __iter__(self) -> Iterator[str]:
        return iter(self._decoded())

    def __len__(self) -> int:
        return len(self._decoded())


def member_sha256(members: Mapping[str, list[Any]], path: str) -> str | None:
    """The sha256 a manifest lists for `path` (None: not a member), without unpacking the
    rest of a cached list's entry."""
    if isinstance(members, Members):
        return members.sha256_of(path)
    entry = members.get(path)
    return None if entry is None else str(entry[0])
