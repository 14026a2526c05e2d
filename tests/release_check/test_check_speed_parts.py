"""The parts a check of a hundred patches leans on for its speed, each held to the plain
definition it replaces: the moved-file search's path indexes and size bound, one read of each
target per evaluation, hunk sides made once but never shared with callers, and the cached
file list's packed entries (format 3; format 2 still read)."""

from __future__ import annotations

import hashlib
import itertools
import json
import zlib
from collections.abc import Iterator
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from patchset.engine import evaluate
from patchset.engine.evaluate import evaluate_diff
from patchset.errors import SourceError
from patchset.kernel.touches import resolve
from patchset.registry import Variant
from patchset.registry.diffs import parse_diff
from patchset.release_check import moves
from patchset.release_check.moves import PythonFiles, _best_file, _smallest_holding
from patchset.sources.base import KnowsDigests, ReleaseInfo, ReleaseTree
from patchset.sources.package_index.cache import Cache, read_entry
from patchset.sources.package_index.packing import FORMAT, Manifest, member_sha256

PATHS = [
    "vllm/__init__.py",
    "vllm/a/inc.py",
    "vllm/a/inc/__init__.py",
    "vllm/a/inc/gptq.py",
    "vllm/a/inc/deep/x.py",
    "vllm/a/incubator/y.py",
    "vllm/b/inc/z.py",
    "vllm/b/utils.py",
    "vllm/a/utils.py",
    "vllm/a/deepep_ht_prepare_finalize.py",
    "vllm/a/deepep_ht.py",
    "vllm/a/README.md",
    "inc/top.py",
]


def test_python_file_indexes_answer_as_the_plain_scans() -> None:
    files = PythonFiles(PATHS)
    py = [p for p in PATHS if p.endswith(".py")]
    assert files.paths == py
    for name in {p.rpartition("/")[2] for p in py}:
        assert sorted(files.by_name[name]) == sorted(p for p in py if p.endswith(f"/{name}"))
    for folder in {p.rpartition("/")[0] for p in py}:
        assert sorted(files.by_folder[folder]) == sorted(
            p for p in py if p.rpartition("/")[0] == folder
        )
        assert sorted(files.under(folder)) == sorted(p for p in py if p.startswith(f"{folder}/"))
    for stem in ("inc", "deep", "incubator", "vllm", "nothing"):
        assert sorted(files.in_folders_named(stem)) == sorted(p for p in py if f"/{stem}/" in p)
    assert "vllm/a/README.md" not in files.under("vllm/a")


def test_akin_stems_are_the_plain_rule() -> None:
    """`PythonFiles.akin`: one stem holds the other, both 4+ characters, not equal, not
    `__init__` (the rule the kindred-name search had as a function per pair)."""
    files = PythonFiles(PATHS)
    py = [p for p in PATHS if p.endswith(".py")]

    def stem(p: str) -> str:
        return p.rpartition("/")[2][: -len(".py")]

    for old in ("inc", "deepep_ht", "deepep_ht_prepare_finalize", "incubator", "__init__", "x"):
        plain = [
            p
            for p in py
            if min(len(old), len(stem(p))) >= 4
            and "__init__" not in (old, stem(p))
            and old != stem(p)
            and (old in stem(p) or stem(p) in old)
        ]
        assert sorted(files.akin(old)) == sorted(plain)
    assert files.akin("deepep_ht") == ["vllm/a/deepep_ht_prepare_finalize.py"]


def test_a_vanished_file_is_looked_for_once_a_release() -> None:
    """Two patches on the same vanished file, in the same release (its `PythonFiles`): the
    second is answered from the first's search, reading no file (a tree that lists no
    digests, so nothing is kept by digest); another release's list searches again."""
    body = [f"def function_number_{i}(argument):" for i in range(8)]
    old = "\n".join(body).encode()
    tree = _UnlistedTree({"vllm/b/x.py": old, "vllm/b/other.py": b"nothing alike here\n"})
    assert not isinstance(tree, KnowsDigests)
    variant = _variant()
    found: list[object] = []
    moves.forget_lines()
    for paths in (PythonFiles(tree.paths()), PythonFiles(tree.paths())):
        for _ in range(2):
            tree.read_paths.clear()
            found.append(
                moves.moved_homes(
                    tree,
                    variant,
                    ("vllm/x.py",),
                    before=lambda rel: old,
                    python_files=lambda paths=paths: paths,  # type: ignore[misc]
                )
            )
            found.append(tree.read_paths[:])
        moves.forget_lines()
    home = {"vllm/x.py": ("vllm/b/x.py",)}
    assert found == [home, ["vllm/b/x.py"], home, [], home, ["vllm/b/x.py"], home, []]


def test_the_size_bound_is_the_fewest_bytes_that_can_hold_the_lines() -> None:
    lines = {"aaaaaaaaaa", "bbbbbbbbbbbbbbbbbbbb", "ccccccccccccccc"}
    assert _smallest_holding(lines, 0) == 0
    assert _smallest_holding(lines, 1) == 10
    assert _smallest_holding(lines, 2) == 10 + 15 + 1  # two shortest, a newline between
    text = "aaaaaaaaaa\nccccccccccccccc"  # the smallest file holding two of them
    assert len(text) == _smallest_holding(lines, 2)
    assert _smallest_holding({"é" * 9}, 1) == 9  # characters: each at least one byte


class _UnlistedTree(ReleaseTree):
    """A release whose file list says nothing but the paths; records which files were read."""

    def __init__(self, files: dict[str, bytes]) -> None:
        self.files = files
        self.read_paths: list[str] = []
        self.info = ReleaseInfo(version="0.0.1", origin="test")

    def read(self, relpath: str) -> bytes | None:
        self.read_paths.append(relpath)
        return self.files.get(relpath)

    def paths(self) -> Iterator[str]:
        return iter(sorted(self.files))


class _ListedTree(_UnlistedTree):
    """A release whose file list gives digests and sizes (as a wheel's RECORD does); records
    which files were read."""

    def listed_digest(self, relpath: str) -> str | None:
        return f"sha-{relpath}" if relpath in self.files else "-"

    def read_listed(self, relpath: str, digest: str) -> bytes | None:
        return self.read(relpath)

    def listed_size(self, relpath: str) -> int | None:
        data = self.files.get(relpath)
        return None if data is None else len(data)


def test_a_candidate_too_small_to_carry_the_file_is_not_read() -> None:
    expected = {f"def function_number_{i}(argument):" for i in range(6)}
    carrier = "\n".join(sorted(expected)[:4]).encode()  # holds 4 of 6: carries it
    small = "\n".join(sorted(expected)[:2]).encode()  # holds 2: could never carry half
    tree = _ListedTree({"vllm/a/new.py": carrier, "vllm/a/small.py": small})
    assert isinstance(tree, KnowsDigests)
    moves.forget_lines()
    assert _best_file(tree, ["vllm/a/new.py", "vllm/a/small.py"], expected) == "vllm/a/new.py"
    assert tree.read_paths == ["vllm/a/new.py"]
    # Without the list's sizes both are read, and the answer is the same.
    moves.forget_lines()
    files = {"vllm/a/new.py": carrier, "vllm/a/small.py": small}
    plain = _ListedTree(files)
    plain.listed_size = lambda relpath: None  # type: ignore[method-assign]
    assert _best_file(plain, ["vllm/a/new.py", "vllm/a/small.py"], expected) == "vllm/a/new.py"
    assert sorted(plain.read_paths) == ["vllm/a/new.py", "vllm/a/small.py"]


DIFF = """\
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -1,3 +1,3 @@
 one
-two
+TWO
 three
--- a/vllm/y.py
+++ b/vllm/y.py
@@ -2,2 +2,3 @@
 b
 c
+d
"""


def _variant() -> Variant:
    return Variant(
        name="fix.diff", vllm=SpecifierSet(), sha256="0" * 64, diffs=parse_diff(DIFF, file="x")
    )


def test_an_evaluation_reads_each_target_once() -> None:
    files = {"vllm/x.py": b"one\ntwo\nthree\n", "vllm/y.py": b"a\nb\nc\n"}
    reads: list[str] = []

    def read(rel: str) -> bytes | None:
        reads.append(rel)
        return files.get(rel)

    ev = evaluate_diff(_variant(), read)
    assert ev.state == "applies"
    assert ev.changes == {"vllm/x.py": b"one\nTWO\nthree\n", "vllm/y.py": b"a\nb\nc\nd\n"}
    assert sorted(reads) == ["vllm/x.py", "vllm/y.py"]
    done = {rel: ev.changes[rel] for rel in files}
    again = evaluate_diff(_variant(), done.get)
    assert again.state == "already-applied"


def test_hunk_sides_handed_out_are_copies() -> None:
    variant = _variant()
    hunk = variant.diffs[0].hunks[0]
    old = hunk.old
    old[:] = ["something", "else", "entirely"]  # a caller's own list
    assert hunk.old == ["one", "two", "three"]
    assert hunk.reversed() is hunk.reversed()  # made once
    assert hunk.reversed().old == ["one", "TWO", "three"]
    assert variant.diffs[0].reversed() is variant.diffs[0].reversed()
    ev = evaluate_diff(variant, {"vllm/x.py": b"one\ntwo\nthree\n", "vllm/y.py": b"a\nb\nc\n"}.get)
    assert ev.state == "applies"
    assert list(itertools.chain.from_iterable(h.lines for h in variant.diffs[1].hunks))


def _manifest(members: dict[str, list[object]]) -> Manifest:
    return Manifest(
        version="0.0.1",
        artifact="vllm-0.0.1-py3-none-any.whl",
        kind="wheel",
        sha256="a" * 64,
        verified="members",
        url="index/vllm-0.0.1-py3-none-any.whl",
        members=members,
    )


def test_a_cached_file_list_packs_each_entry_into_one_string(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    entries: dict[str, list[object]] = {
        "vllm/a.py": ["1" * 64, 10, 200, 8, 12345, 8],
        "vllm/b.py": ["", 0, 0, 0, 0, 0],  # RECORD without a hash: an empty field kept
    }
    cache.store_manifest(_manifest(entries))
    raw = cache.manifest_path("vllm-0.0.1-py3-none-any.whl").read_bytes()
    head, _, body = raw.partition(b"\n")
    assert json.loads(head)["format"] == FORMAT
    assert json.loads(zlib.decompress(body))["vllm/a.py"] == f"{'1' * 64} 10 200 8 12345 8"
    loaded = cache.load_manifest("vllm-0.0.1-py3-none-any.whl")
    assert loaded is not None
    assert dict(loaded.members) == entries
    assert "vllm/a.py" in loaded.members and "vllm/c.py" not in loaded.members
    assert loaded.members.get("vllm/c.py") is None
    # A member's sha256 alone, as the entry's first field (a plain dict: the same answers).
    for members in (loaded.members, entries):
        assert member_sha256(members, "vllm/a.py") == "1" * 64
        assert member_sha256(members, "vllm/b.py") == ""
        assert member_sha256(members, "vllm/c.py") is None


@pytest.mark.parametrize("written", ["patchset-manifest/2", "patchset-manifest/3"])
def test_a_file_list_of_an_older_format_is_read_and_rewritten(tmp_path: Path, written: str) -> None:
    """Format 2 (entries as lists) and 3 (entries packed, the body plain): read as they are,
    then rewritten in today's form (the body deflated), whether loaded whole or head first."""
    cache = Cache(tmp_path)
    entries: dict[str, list[object]] = {"vllm/a.py": ["2" * 64, 3, 4, 5, 6, 8]}
    listed = entries if written.endswith("/2") else {"vllm/a.py": f"{'2' * 64} 3 4 5 6 8"}
    body = json.dumps(listed).encode()
    manifest = _manifest(entries)
    header = {**manifest.header(), "format": written}
    header["digest"] = hashlib.sha256(body).hexdigest()
    path = cache.manifest_path(manifest.artifact)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    loaded = cache.load_manifest(manifest.artifact, later=True)
    assert loaded is not None and dict(loaded.members) == entries
    assert member_sha256(loaded.members, "vllm/a.py") == "2" * 64
    head, _, kept = path.read_bytes().partition(b"\n")
    assert json.loads(head)["format"] == FORMAT
    assert json.loads(zlib.decompress(kept)) == {"vllm/a.py": f"{'2' * 64} 3 4 5 6 8"}
    again = cache.load_manifest(manifest.artifact, later=True)
    assert again is not None and dict(again.members) == entries


def test_a_deflated_file_list_is_smaller_and_read_back(tmp_path: Path) -> None:
    """A wheel's list of many members is kept deflated: well under its plain JSON's size,
    and every entry read back as stored."""
    cache = Cache(tmp_path)
    entries: dict[str, list[object]] = {
        f"vllm/pkg{i % 40}/mod{i}.py": [hashlib.sha256(b"%d" % i).hexdigest(), i, 9 * i, i, i, 8]
        for i in range(3000)
    }
    cache.store_manifest(_manifest(entries))
    raw = cache.manifest_path("vllm-0.0.1-py3-none-any.whl").read_bytes()
    plain = json.dumps({p: " ".join(map(str, e)) for p, e in entries.items()}).encode()
    assert len(raw) < 0.6 * len(plain), (len(raw), len(plain))
    loaded = cache.load_manifest("vllm-0.0.1-py3-none-any.whl", later=True)
    assert loaded is not None and dict(loaded.members) == entries


def test_a_damaged_entry_is_a_clear_error(tmp_path: Path) -> None:
    cache = Cache(tmp_path)
    cache.store_manifest(_manifest({"vllm/a.py": ["3" * 64, 1, 2, 3, 4, 8]}))
    path = cache.manifest_path("vllm-0.0.1-py3-none-any.whl")
    head, _, body = path.read_bytes().partition(b"\n")
    body = zlib.compress(zlib.decompress(body).replace(b" 1 2", b" x 2"))
    header = json.loads(head)
    header["digest"] = hashlib.sha256(body).hexdigest()  # the digest matches: damage inside
    path.write_bytes(json.dumps(header).encode() + b"\n" + body)
    loaded = cache.load_manifest("vllm-0.0.1-py3-none-any.whl")
    assert loaded is not None
    with pytest.raises(SourceError, match="damaged; run `patchset cache clear`"):
        loaded.members["vllm/a.py"]


def test_a_cache_entry_is_read_whole_by_plain_reads(tmp_path: Path) -> None:
    """`read_entry` reads an entry with plain reads of its size: every byte of an empty, a
    small and a large file; a folder in an entry's place is removed (None)."""
    for size in (0, 1, 65_535, 65_536, 300_001):
        path = tmp_path / f"entry-{size}"
        data = bytes(i % 251 for i in range(size))
        path.write_bytes(data)
        assert read_entry(path) == data
        assert read_entry(str(path)) == data
    (tmp_path / "folder").mkdir()
    assert read_entry(tmp_path / "folder") is None
    assert not (tmp_path / "folder").exists()
    assert read_entry(tmp_path / "absent") is None


def test_a_touch_is_answered_by_content_as_resolve_answers_it() -> None:
    """`evaluate._resolve` answers a touch from the bytes `resolve` read before: the same
    answer as `resolve` in each of a run of trees where the module changes, moves into a
    package, loses the name, and comes back with the bytes it had (new objects each time)."""
    touches = ["vllm.a:f", "vllm.a:C.m", "vllm.a:sub.g", "vllm.b:x"]
    shapes = [
        {"vllm/a.py": "def f(): ...\nclass C:\n    def m(self): ...\n"},
        {"vllm/a.py": "def f(): ...\nclass C:\n    pass\n"},
        {"vllm/a/__init__.py": "f = 1\n", "vllm/a/sub.py": "def g(): ...\n"},
        {"vllm/a/__init__.py": "f = 1\n", "vllm/a/sub.py": "g = None\n", "vllm/b.py": "x = 2\n"},
        {"vllm/a.py": "class C:\n    def m(self): ...\n"},
        {"vllm/a.py": "def f(): ...\nclass C:\n    def m(self): ...\n"},
    ]
    evaluate.clear_caches()
    for _ in range(2):
        for shape in shapes:
            files = {rel: bytes(text, "utf-8") for rel, text in shape.items()}
            for touch in touches:
                assert evaluate._resolve(touch, files.get) == resolve(touch, files.get), touch
