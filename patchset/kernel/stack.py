"""What the patches that are on make of the files a start finds (issue 35).

Each target file is checked once against the file the manifest names for it (`targets`: the
release's own file in a bundle, the file as built in an image), then the patches that are on
go in, in the manifest's order, each by its own hunks or sites (the engine's `apply_hunks`
and `apply_site`) on what the patches before it left. A patch that is off leaves no trace,
so it never makes another fail; the base files, the payloads and the set of patches on
determine every byte.

A file that is not its target may be one an earlier start patched (a restarted container,
two containers on one vLLM volume): the patches of the manifest found in it are taken out
again, last first (a diff's hunks reversed, exactly placed; a site by its marker), and the
file counts as found only when what that leaves is its target by sha256.

Standard library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations
import __future__

import contextlib
import hashlib
import json
import sys
import warnings
from collections.abc import Mapping, Sequence
from pathlib import Path

from .hunks import apply_hunks, join_text, split_text
from .manifest import PatchEntry
from .pycompile import broken_by, compile_error
from .pyunits import Known, code_starts, facts, module_ends, units
from .sites import GOOD, apply_site, revert_site
from .tree import digest

# A bundle's `units.json`: for each release .py file a patch changes, where its defs,
# classes and module-level statements start and end (found by compiling it once at export),
# so that a start compiles only the units its patches change (`Files.compile_blame`).
UNITS_FILE = "units.json"
UNITS_SCHEMA = "patchset.units/1"
UNITS_MAX_BYTES = 16 * 1024 * 1024


class StackError(Exception):
    """A file or a patch cannot be taken as the start finds it; the message is one line."""


def deletes(patch: PatchEntry, rel: str) -> bool:
    """Whether `patch` (a diff) deletes `rel` (its `after` is no file)."""
    found = patch.files.get(rel)
    return patch.kind == "diff" and found is not None and not found.after


def patched_text(
    patch: PatchEntry, rel: str, data: bytes | None, served: Mapping[str, str] | None = None
) -> bytes | None:
    """`rel` after `patch`'s edits to it (None: the patch deletes it)."""
    if data is None and not (patch.kind == "diff" and patch.files[rel].before == ""):
        raise StackError(f"{rel} is missing")
    lines, eol, eof = split_text((data or b"").decode("utf-8", errors="surrogateescape"))
    if patch.kind == "diff":
        result = apply_hunks(lines, patch.hunks.get(rel, ()), eof_newline=eof)
        if result.lines is None:
            failed = [h.describe() for h in result.hunks if h.status == "failed"]
            raise StackError(f"{rel}: {'; '.join(failed)}")
        if deletes(patch, rel):
            if result.lines:
                raise StackError(f"{rel}: the diff deletes it, but lines are left")
            return None
        lines, eof = list(result.lines), result.eof_newline
    else:
        for site in patch.sites:
            if site.file != rel:
                continue
            found, lines = apply_site(site, lines, served)
            if found.status not in GOOD:
                raise StackError(found.describe())
    return join_text(lines, eol, eof).encode("utf-8", errors="surrogateescape")


def unpatched_text(patch: PatchEntry, rel: str, data: bytes) -> bytes | None:
    """`rel` with `patch`'s edits taken out, or None when they are not found in it."""
    lines, eol, eof = split_text(data.decode("utf-8", errors="surrogateescape"))
    if patch.kind == "diff":
        back = tuple(h.reversed() for h in patch.hunks.get(rel, ()))
        if not back or deletes(patch, rel):
            return None
        result = apply_hunks(lines, back, eof_newline=eof, unique=True, nearest=False)
        if result.lines is None:
            return None
        lines, eof = list(result.lines), result.eof_newline
    else:
        took = False
        for site in reversed([s for s in patch.sites if s.file == rel]):
            found, lines = revert_site(site, lines)
            took = took or found.status == "already-applied"
        if not took:
            return None
    return join_text(lines, eol, eof).encode("utf-8", errors="surrogateescape")


def compile_problem(rel: str, data: bytes, before: bytes | None = None) -> str | None:
    """What keeps a patched .py file from compiling with this Python (in memory, no .pyc),
    or None; a file that did not compile `before` the patch either is not blamed on it."""
    if not rel.endswith(".py"):
        return None
    problem = compile_error(data, rel)  # the original is compiled only to blame a failure
    if problem is None or (before is not None and broken_by(before, data) is None):
        return None
    return f"{problem.describe(rel)} (does not compile after patching)"


def _python() -> str:
    return f"{sys.version_info[0]}.{sys.version_info[1]}"


def unit_facts(source: bytes) -> dict[str, object] | None:
    """What a start needs to judge an edit of `source` by the units it changes: its sha256,
    its def and class starts, module-level ends, classes and `__future__` features (this
    Python's compile of it, once); None when it does not compile."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            code = compile(source, "<release>", "exec", dont_inherit=True)
    except (SyntaxError, ValueError, UnicodeDecodeError):
        return None
    starts, classes = code_starts(code)
    known = facts(source, 0, (starts, module_ends(code), classes))  # the source's own facts
    return {
        "sha256": digest(source),
        "starts": list(known.starts),
        "ends": list(known.ends),
        "classes": list(known.classes),
        "declared": list(known.declared),
        "top_declares": known.top_declares,
        "futures": list(known.futures),
        "future": [
            name
            for name in __future__.all_feature_names
            if code.co_flags & getattr(__future__, name).compiler_flag
        ],
    }


def units_document(sources: Mapping[str, bytes | None]) -> str:
    """`units.json` for the release's .py files in `sources` (each compiled once here); the
    Python that compiled them is named: a start on another one compiles whole files."""
    found = {
        rel: known
        for rel, data in sorted(sources.items())
        if rel.endswith(".py") and data is not None and (known := unit_facts(data)) is not None
    }
    return json.dumps({"schema": UNITS_SCHEMA, "python": _python(), "files": found}) + "\n"


def read_units(path: Path) -> dict[str, tuple[str, Known]]:
    """`units.json` at `path` as rel -> (the sha256 of the file it describes, its `Known`);
    empty when there is none, it is damaged, or another Python wrote it (its line numbers
    are that Python's compile): then every patched file is compiled whole, as without it."""
    try:
        with path.open("rb") as handle:
            data = json.loads(handle.read(UNITS_MAX_BYTES + 1))
        if data.get("schema") != UNITS_SCHEMA or data.get("python") != _python():
            return {}
        out = {}
        for rel, item in data["files"].items():
            flags = 0
            for name in item["future"]:
                feature = getattr(__future__, name, None)
                flags |= feature.compiler_flag if feature is not None else 0
            keys = ("starts", "declared", "futures", "ends", "classes")
            lines = [item[k] for k in keys]
            if not isinstance(item["sha256"], str) or not all(
                isinstance(x, list) and all(type(n) is int for n in x) for x in lines
            ):
                return {}
            starts, declared, futures, ends, classes = (tuple(x) for x in lines)
            top = item["top_declares"] is True
            known = Known(None, starts, flags, declared, top, futures, ends, classes)
            out[str(rel)] = (item["sha256"], known)
    except (OSError, ValueError, RecursionError, TypeError, KeyError, AttributeError):
        return {}
    return out


def on_set(ids: Sequence[str]) -> tuple[tuple[str, ...], str]:
    """The patches on at a start, sorted, and their set's short digest (what a report names)."""
    on = tuple(sorted(set(ids)))
    return on, hashlib.sha256("\n".join(on).encode()).hexdigest()[:12]


class Files:
    """vLLM's files as the start finds them and as they will be, held in memory.

    `targets`: relpath -> the sha256 each must have before this start ("" for no file);
    `undo`: the patches an earlier start may have left in the files (taken out to find the
    target again), in the order they go in; `built`: files a build patch made (their
    refusal says so)."""

    def __init__(
        self,
        root: Path,
        targets: Mapping[str, str] | None = None,
        undo: Sequence[PatchEntry] = (),
        built: frozenset[str] = frozenset(),
        unit_facts: Mapping[str, tuple[str, Known]] | None = None,
    ) -> None:
        self.root = root
        self.targets = targets or {}
        self.built = built
        self.unit_facts = unit_facts or {}  # `read_units`: judge an edit by its units
        self._undo: dict[str, list[PatchEntry]] = {}
        for patch in undo:
            for rel in patch.files:
                self._undo.setdefault(rel, []).append(patch)
        self.original: dict[str, bytes | None] = {}  # on disk, as found
        self.current: dict[str, bytes | None] = {}  # None: no file (a diff deleted it)
        self.found_in: dict[str, set[str]] = {}  # the patches found in a file already
        self.executable: set[str] = set()  # files a diff creates 755
        self.problems: dict[str, str] = {}  # files that are not their target, and why
        # per file, each patch's step: (its id, the bytes before it, after it)
        self.steps: dict[str, list[tuple[str, bytes | None, bytes | None]]] = {}

    def get(self, rel: str) -> bytes | None:
        """The file as this start's patches begin from: its target; StackError if not."""
        if rel not in self.original:
            path = self.root / rel
            data = path.read_bytes() if path.is_file() else None
            self.original[rel] = data
            self._resolve(rel, data)
        if rel in self.problems:
            raise StackError(self.problems[rel])
        return self.current[rel]

    def settle(self) -> None:
        """Read every file the patches an earlier start may have left cover, so that those
        off at this start are taken out of them too (a file not its target stays as found)."""
        for rel in self._undo:
            if rel not in self.original:
                with contextlib.suppress(StackError, OSError):
                    self.get(rel)

    def read(self, rel: str) -> bytes:
        data = self.get(rel)
        if data is None:
            raise StackError(f"{rel} is missing")
        return data

    def _resolve(self, rel: str, data: bytes | None) -> None:
        want = self.targets.get(rel)
        if want is None or digest(data) == want:
            self.current[rel] = data
            return
        found: set[str] = set()
        base = data
        for patch in reversed(self._undo.get(rel, [])):
            if base is None:
                if deletes(patch, rel):
                    found.add(patch.id)  # deleted by an earlier start; its bytes are gone
                break
            back = unpatched_text(patch, rel, base)
            if back is not None:
                base = back
                found.add(patch.id)
                if digest(base) == want:
                    break
        if not want and base is not None and not base.strip() and found:
            base = None  # a file a patch created: without it, no file
        if data is None and want and found:  # gone, as the patch that deletes it leaves it
            self.current[rel], self.found_in[rel] = None, found
            return
        if digest(base) == want and found:
            self.current[rel], self.found_in[rel] = base, found
            return
        if data is None:
            self.problems[rel] = f"{rel} is missing"
        elif not want and rel in self.built:
            self.problems[rel] = f"{rel} is still there, though deleted at build time"
        elif not want:
            self.problems[rel] = f"{rel} is there already, though the release has no such file"
        elif rel in self.built:
            self.problems[rel] = f"{rel} is not the file patched at build time (sha256 differs)"
        else:
            self.problems[rel] = f"{rel} differs from the file checked at build time (sha256)"

    def compile_blame(self) -> dict[str, str]:
        """Each patched .py file compiled once, as the patches leave it, with this Python (in
        memory): for one that does not, the patch whose step broke it (the first after which
        it stops compiling), and why."""
        blamed: dict[str, str] = {}
        for rel, steps in self.steps.items():
            final = self.current.get(rel)
            if final is None or self._units_compile(rel, steps[0][1], final):
                continue
            if compile_problem(rel, final, steps[0][1]) is None:
                continue
            for patch_id, before, after in steps:
                if after is not None and (problem := compile_problem(rel, after, before)):
                    blamed.setdefault(patch_id, problem)
                    break
            else:
                blamed.setdefault(steps[-1][0], compile_problem(rel, final, steps[0][1]) or "")
        return blamed

    def _units_compile(self, rel: str, before: bytes | None, after: bytes) -> bool:
        """Whether `after` is known to compile from the units it changes in `before` (the
        file as found, when `units.json` knows it by its sha256), each compiled alone with
        this Python (`pyunits.units`); False: compile it whole."""
        found = self.unit_facts.get(rel)
        if found is None or before is None or digest(before) != found[0]:
            return False
        return units(found[1], before, after, facts=False) is not None

    def changed(self) -> dict[str, bytes | None]:
        """The files this start writes (or removes): those whose bytes differ from disk."""
        return {rel: data for rel, data in self.current.items() if data != self.original.get(rel)}


__all__ = [
    "UNITS_FILE",
    "Files",
    "StackError",
    "compile_problem",
    "deletes",
    "on_set",
    "patched_text",
    "read_units",
    "unit_facts",
    "units_document",
    "unpatched_text",
]
