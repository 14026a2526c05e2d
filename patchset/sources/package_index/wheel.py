"""Reading a wheel lazily: its central directory once, then only the members asked for.

A wheel is a zip whose central directory, at the end, names every member with its offset
(APPNOTE.TXT 4.3.12). `read_directory` takes the tail of the file (one range request, a
second one when the directory is larger), checks the directory against itself and the
file's size, and reads ``*.dist-info/RECORD``. `read_members` fetches members in as few
ranges as their offsets allow, inflates each, and checks its size, its zip CRC and the
sha256 that RECORD gives for it: a member that does not match is never returned.
"""

from __future__ import annotations

import binascii
import hashlib
import struct
import zlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import NamedTuple

from patchset.errors import IntegrityError

Fetch = Callable[[int, int], bytes]
"""Bytes ``start..end`` (inclusive) of the wheel."""

TAIL = 1 << 20  # the first request: the last MiB holds a vLLM wheel's whole directory
# Members closer than this are fetched in one range: a request costs about what this many
# bytes do (received, decrypted, skipped), and the ranges of a fetch go out in parallel.
GAP = 64 << 10
SLACK = 512  # room for a local header's extra field, which the directory does not state

_EOCD = struct.Struct("<4s4H2LH")
_EOCD64_LOCATOR = struct.Struct("<4sLQL")
_EOCD64 = struct.Struct("<4sQ2H2L4Q")
# the fields read of a central directory entry: signature, flags, method, crc, sizes, the
# name/extra/comment lengths and the local header's offset (the rest skipped, same 46 bytes)
_CENTRAL_USED = struct.Struct("<4s4x2H4x3L3H8xL")
_LOCAL = struct.Struct("<4s5H3L2H")
_MAX16, _MAX32 = 0xFFFF, 0xFFFFFFFF


class Entry(NamedTuple):
    """One member as the central directory states it (a tuple: a wheel has thousands)."""

    name: str
    offset: int  # of its local header
    compressed: int
    size: int
    crc: int
    method: int

    def span(self) -> tuple[int, int]:
        """The bytes that surely hold the local header and the data (extra field guessed)."""
        start = self.offset
        return start, start + _LOCAL.size + len(self.name.encode()) + SLACK + self.compressed


@dataclass(frozen=True)
class Directory:
    """A wheel's central directory and its RECORD: name -> entry, name -> sha256 (hex)."""

    size: int  # of the whole wheel
    end: int  # where the central directory starts; members end before it
    entries: dict[str, Entry]
    record: dict[str, str]


class DamagedWheel(IntegrityError):  # noqa: N818 -- named for what it is, as IntegrityError
    """The wheel's bytes contradict themselves (a lying directory, a bad member)."""


def read_directory(
    fetch_tail: Callable[[int], tuple[bytes, int]], fetch: Fetch, name: str
) -> Directory:
    """The directory of the wheel `name`; `fetch_tail(n)` gives its last n bytes and size."""
    tail, size = fetch_tail(TAIL)
    tail_start = size - len(tail)
    at = _find_eocd(tail)
    if at is None:
        raise DamagedWheel(f"{name}: no zip end record (truncated, or not a zip)")
    (_, disk, cd_disk, _, count, cd_size, cd_offset, _) = _EOCD.unpack_from(tail, at)
    eocd_pos = tail_start + at
    if _MAX16 in (count,) or _MAX32 in (cd_size, cd_offset):
        loc = at - _EOCD64_LOCATOR.size
        if loc < 0:
            raise DamagedWheel(f"{name}: a zip64 end record out of reach")
        sig, _, eocd64, _ = _EOCD64_LOCATOR.unpack_from(tail, loc)
        if sig != b"PK\x06\x07" or not tail_start <= eocd64 <= eocd_pos - _EOCD64.size:
            raise DamagedWheel(f"{name}: a damaged zip64 end record")
        fields = _EOCD64.unpack_from(tail, eocd64 - tail_start)
        if fields[0] != b"PK\x06\x06":
            raise DamagedWheel(f"{name}: a damaged zip64 end record")
        count, cd_size, cd_offset = fields[7], fields[8], fields[9]
        eocd_pos = eocd64
    if disk or cd_disk or cd_offset + cd_size > eocd_pos:
        raise DamagedWheel(f"{name}: the central directory lies about where it is")
    if cd_offset < tail_start:  # a directory larger than the tail: read the rest with it
        tail = fetch(cd_offset, tail_start - 1) + tail
        tail_start = cd_offset
    raw = tail[cd_offset - tail_start : cd_offset - tail_start + cd_size]

    def fetch_near(start: int, end: int) -> bytes:  # RECORD is often in the tail already
        if start >= tail_start:
            return tail[start - tail_start : end - tail_start + 1]
        return fetch(start, end)

    if len(raw) != cd_size:
        raise DamagedWheel(f"{name}: the central directory is truncated")
    entries = _parse_central(raw, count, cd_offset, name)
    directory = Directory(size=size, end=cd_offset, entries=entries, record={})
    record_name = _record_name(entries, name)
    data = read_members(directory, [record_name], fetch_near, name, check_record=False)
    record = parse_record(data[record_name], name)
    _cross_check(entries, record, name)
    return Directory(size, cd_offset, entries, record)


def _cross_check(entries: dict[str, Entry], record: dict[str, str], name: str) -> None:
    """The directory and RECORD name the same files: a member under ``vllm/`` that RECORD
    does not list, or a RECORD path the directory lacks, means one of them is damaged (one
    garbled byte in a directory name would make a file read as absent). RECORD itself and
    signature files (``RECORD.jws``, ``RECORD.p7s``) list no hash of their own; they are
    outside ``vllm/``."""
    unlisted = next((m for m in entries if m.startswith("vllm/") and m not in record), None)
    if unlisted is not None:
        raise DamagedWheel(f"{name}: {unlisted} is in the central directory but not in RECORD")
    absent = next((p for p in record if p not in entries), None)
    if absent is not None:
        raise DamagedWheel(f"{name}: RECORD lists {absent}, the central directory does not")


def _find_eocd(tail: bytes) -> int | None:
    at = len(tail)
    while (at := tail.rfind(b"PK\x05\x06", max(0, len(tail) - _EOCD.size - _MAX16), at)) >= 0:
        if at + _EOCD.size <= len(tail):
            comment = _EOCD.unpack_from(tail, at)[-1]
            if at + _EOCD.size + comment == len(tail):
                return at
    return None


def _parse_central(raw: bytes, count: int, end: int, name: str) -> dict[str, Entry]:
    """The directory's entries (folders left out), each checked against the file's layout.

    The loop body is kept lean (one unpack of the fields used, the name test inline): a
    vLLM wheel has some 6000 members, and this runs for every release of a cold check."""
    entries: dict[str, Entry] = {}
    pos = 0
    length = len(raw)
    unpack = _CENTRAL_USED.unpack_from
    local = _LOCAL.size
    for _ in range(count):
        if pos + _CENTRAL_USED.size > length:
            raise DamagedWheel(f"{name}: the central directory is truncated")
        sig, flags, method, crc, compressed, size, n, e, c, offset = unpack(raw, pos)
        if sig != b"PK\x01\x02":
            raise DamagedWheel(f"{name}: a damaged central directory entry at {end + pos}")
        start = pos + _CENTRAL_USED.size
        pos = start + n + e + c
        if pos > length:
            raise DamagedWheel(f"{name}: the central directory is truncated")
        raw_name = raw[start : start + n]
        try:  # ASCII reads the same in both encodings, and decodes fastest
            member = raw_name.decode("ascii")
        except UnicodeDecodeError:
            member = raw_name.decode("utf-8" if flags & 0x800 else "cp437", errors="strict")
        if _MAX32 in (compressed, size, offset):
            extra = raw[start + n : start + n + e]
            size, compressed, offset = _zip64_extra(extra, size, compressed, offset, name)
        if not _safe_name(member):
            raise DamagedWheel(f"{name}: unsafe member name {member!r}")
        if member in entries:
            raise DamagedWheel(f"{name}: {member} appears twice in the central directory")
        if offset + local + n + compressed > end:
            raise DamagedWheel(f"{name}: the central directory lies about {member}'s offset")
        if member[-1:] != "/":
            entries[member] = Entry(member, offset, compressed, size, crc, method)
    if pos != length:
        raise DamagedWheel(f"{name}: the central directory holds more than its entries")
    return entries


def _zip64_extra(
    extra: bytes, size: int, compressed: int, offset: int, name: str
) -> tuple[int, int, int]:
    pos = 0
    while pos + 4 <= len(extra):
        tag, length = struct.unpack_from("<2H", extra, pos)
        if tag == 1:
            values = list(struct.unpack_from(f"<{length // 8}Q", extra, pos + 4))
            out = [
                values.pop(0) if v == _MAX32 and values else v for v in (size, compressed, offset)
            ]
            return out[0], out[1], out[2]
        pos += 4 + length
    raise DamagedWheel(f"{name}: a zip64 member without its sizes")


def _safe_name(member: str) -> bool:
    """A relative path inside the wheel (string tests: pathlib costs 8 us a member)."""
    if not member or member[0] == "/" or "\\" in member or "\x00" in member:
        return False
    return ".." not in member or ".." not in member.split("/")


def _record_name(entries: dict[str, Entry], name: str) -> str:
    found = [m for m in entries if m.count("/") == 1 and m.endswith(".dist-info/RECORD")]
    if len(found) != 1:
        raise DamagedWheel(f"{name}: the wheel has {len(found)} RECORD files, not one")
    return found[0]


def parse_record(data: bytes, name: str) -> dict[str, str]:
    """RECORD's ``path,sha256=<urlsafe b64>,size`` rows as path -> sha256 hex.

    Plain rows (no quotes, three fields: nearly all) are split by hand; the others go
    through the csv module. A cold check parses some 6000 rows per release."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DamagedWheel(f"{name}: RECORD is not readable") from None
    out: dict[str, str] = {}
    others: list[str] = []
    for line in text.splitlines():
        fields = line.split(",") if '"' not in line else []
        if len(fields) == 3:
            _add_hash(out, fields[0], fields[1], name)
        else:
            others.append(line)
    if others:
        import csv  # noqa: PLC0415 -- quoted rows only (rare)

        try:
            rows = list(csv.reader(others))
        except csv.Error:
            raise DamagedWheel(f"{name}: RECORD is not readable") from None
        for row in rows:
            if len(row) >= 2:
                _add_hash(out, row[0], row[1], name)
    return out


def _add_hash(out: dict[str, str], path: str, spec: str, name: str) -> None:
    algorithm, _, value = spec.partition("=")
    if algorithm != "sha256":
        return
    try:  # binascii straight: base64.urlsafe_b64decode's wrapping costs 2 us a row
        raw = value.replace("-", "+").replace("_", "/") + "=" * (-len(value) % 4)
        out[path] = binascii.a2b_base64(raw, strict_mode=True).hex()
    except ValueError:
        raise DamagedWheel(f"{name}: RECORD's hash of {path} is not base64") from None


@dataclass(frozen=True)
class Member:
    """A member read and checked: its bytes, their sha256, and the raw deflate stream."""

    data: bytes
    sha256: str  # "" for RECORD, read without a hash of its own
    deflated: bytes  # raw deflate (no zlib header) of data, as the cache stores it


def plan(entries: Iterable[Entry], end: int) -> list[tuple[int, int]]:
    """Byte ranges (inclusive) covering the entries, neighbours within GAP merged."""
    spans = sorted(e.span() for e in entries)
    ranges: list[list[int]] = []
    for start, span_end in spans:
        stop = min(span_end, end)
        if ranges and start - ranges[-1][1] <= GAP:
            ranges[-1][1] = max(ranges[-1][1], stop)
        else:
            ranges.append([start, stop])
    return [(a, b - 1) for a, b in ranges]


def read_members(
    directory: Directory,
    names: Iterable[str],
    fetch: Fetch,
    name: str,
    *,
    check_record: bool = True,
) -> dict[str, bytes]:
    """The members' bytes, each checked; names not in the wheel are left out."""
    return {
        member: m.data
        for member, m in fetch_members(
            directory, names, fetch, name, check_record=check_record
        ).items()
    }


def fetch_members(
    directory: Directory,
    names: Iterable[str],
    fetch: Fetch,
    name: str,
    *,
    check_record: bool = True,
    fetch_all: Callable[[list[tuple[int, int]]], list[bytes]] | None = None,
) -> dict[str, Member]:
    """The members named (those in the wheel), checked; `fetch_all` fetches several ranges
    at once (in parallel) when given."""
    wanted = [directory.entries[n] for n in dict.fromkeys(names) if n in directory.entries]
    ranges = plan(wanted, directory.end)
    chunks = fetch_all(ranges) if fetch_all is not None else [fetch(a, b) for a, b in ranges]
    out: dict[str, Member] = {}
    for (start, stop), chunk in zip(ranges, chunks, strict=True):
        for entry in wanted:
            if start <= entry.offset <= stop:
                raw = _member_bytes(entry, chunk, start, fetch, name)
                out[entry.name] = _checked(entry, raw, directory, name, check_record)
    return out


def _member_bytes(entry: Entry, chunk: bytes, base: int, fetch: Fetch, name: str) -> bytes:
    at = entry.offset - base
    if at + _LOCAL.size > len(chunk):
        raise DamagedWheel(f"{name}: {entry.name}'s local header is cut off")
    f = _LOCAL.unpack_from(chunk, at)
    n, e = f[9], f[10]
    local_name = chunk[at + _LOCAL.size : at + _LOCAL.size + n]
    encoding = "utf-8" if f[3] & 0x800 else "cp437"
    if f[0] != b"PK\x03\x04":
        raise DamagedWheel(f"{name}: the central directory lies about {entry.name}'s offset")
    if (local := local_name.decode(encoding, errors="replace")) != entry.name:
        raise DamagedWheel(
            f"{name}: the local header names {local!r}, the central directory {entry.name!r}"
        )
    data_start = entry.offset + _LOCAL.size + n + e
    data_end = data_start + entry.compressed
    if data_end > base + len(chunk):  # a long extra field: fetch the rest
        return fetch(data_start, data_end - 1) if entry.compressed else b""
    return chunk[data_start - base : data_end - base]


def _checked(
    entry: Entry, raw: bytes, directory: Directory, name: str, check_record: bool
) -> Member:
    if len(raw) != entry.compressed:
        raise DamagedWheel(f"{name}: {entry.name} is truncated")
    try:
        if entry.method == 8:
            # bounded: never more than the directory says plus one byte (an inflation bomb
            # is refused after entry.size + 1 bytes, not after it filled the memory)
            inflater = zlib.decompressobj(-zlib.MAX_WBITS)
            data = inflater.decompress(raw, entry.size + 1)
            if len(data) > entry.size or inflater.unconsumed_tail:
                raise DamagedWheel(f"{name}: {entry.name} inflates past its stated size")
            deflated = raw
        elif entry.method == 0:
            data = raw
            compressor = zlib.compressobj(6, zlib.DEFLATED, -zlib.MAX_WBITS)
            deflated = compressor.compress(raw) + compressor.flush()
        else:
            raise DamagedWheel(f"{name}: {entry.name} uses zip method {entry.method}")
    except zlib.error:
        raise DamagedWheel(f"{name}: {entry.name} does not inflate") from None
    if len(data) != entry.size or zlib.crc32(data) != entry.crc:
        raise DamagedWheel(f"{name}: {entry.name} does not match its zip CRC")
    if not check_record:  # RECORD itself: it holds no hash of its own, none is taken
        return Member(data, "", deflated)
    digest = hashlib.sha256(data).hexdigest()
    expected = directory.record.get(entry.name)
    if expected is None:
        raise DamagedWheel(f"{name}: {entry.name} is not in the wheel's RECORD")
    if expected != digest:
        raise DamagedWheel(f"{name}: {entry.name} does not match its sha256 in RECORD")
    return Member(data, digest, deflated)
