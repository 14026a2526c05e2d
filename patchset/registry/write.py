"""Every write to the registry: style-kept TOML edits, atomic files, checked by a reload.

`patch.toml` is edited through tomlkit, so comments, key order and quoting stay as the author
wrote them; only the values asked for change. A change is planned in memory, then written file
by file (a temp file in the same folder, fsync, rename). The registry is loaded again
afterwards; if it does not load, every file is put back, so a change that fails leaves the
registry byte-for-byte unchanged. Nothing is written unless every folder involved is writable.

A new patch folder (`patchset add`, `patchset import`) is written by `write_patch_folder`: its
patch.toml a tomlkit document (`toml_text` lays plain data out as one: keys, then tables, then
arrays of tables; strings escaped so that any text reads back byte for byte), its payloads
beside it.
"""

from __future__ import annotations

import errno
import logging
import os
import re
import secrets
import tempfile
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import tomlkit
from tomlkit.exceptions import TOMLKitError
from tomlkit.items import KeyType, SingleKey, String, StringType, Table, Trivia
from tomlkit.toml_document import TOMLDocument

from patchset._fs import staged_file, sync_folder
from patchset.errors import PatchsetError, RegistryError
from patchset.registry import PATCH_FILE, Patch, Registry, load_patch, load_registry
from patchset.registry.lock import registry_lock
from patchset.registry.ranges import same_range

LOG = logging.getLogger(__name__)

# patch.toml (support.toml, a build definition) as plain data: str, int, bool, lists and
# tables of them, keys in order; a None value is left out.
TomlData = dict[str, Any]


class RegistryChange:
    """New contents for some registry files, written together by `commit()`."""

    def __init__(self, registry: Registry) -> None:
        self.registry = registry
        self._planned: dict[Path, bytes] = {}
        self._patches: dict[Path, Patch] = {}  # the patches changed, as they were loaded
        self._read: dict[Path, bytes | None] = {}  # each file as it was when first read

    @property
    def planned(self) -> tuple[Path, ...]:
        return tuple(self._planned)

    def _current(self, path: Path) -> bytes | None:
        if path in self._planned:
            return self._planned[path]
        if path not in self._read:
            self._read[path] = path.read_bytes() if path.is_file() else None
        return self._read[path]

    def edit_toml(self, patch: Patch, edit: Callable[[TOMLDocument], None]) -> None:
        """Change `patch.toml` of `patch` in memory; `edit` gets the parsed document."""
        path = patch.folder / PATCH_FILE
        self._patches[patch.folder] = patch
        data = self._current(path)
        if data is None:
            raise RegistryError("no such file", path=path)
        try:
            doc = tomlkit.parse(data.decode("utf-8"))
            edit(doc)
            text = tomlkit.dumps(doc)
        except (TOMLKitError, UnicodeDecodeError, RecursionError) as exc:
            reason = str(exc) or "nested too deeply"  # a RecursionError may say nothing
            raise RegistryError(f"cannot edit: {reason}", path=path) from None
        self._planned[path] = text.encode("utf-8")

    def _payload(self, patch: Patch, name: str) -> Path:
        """Where the payload file `name` of `patch` goes (a bare name, not patch.toml)."""
        if "/" in name or name.startswith(".") or name == PATCH_FILE:
            raise RegistryError(f"{name!r} is not a payload file name", path=patch.folder)
        self._patches[patch.folder] = patch
        return patch.folder / name

    def add_file(self, patch: Patch, name: str, data: bytes) -> Path:
        """A new payload file in the patch's folder; an existing file is never overwritten."""
        path = self._payload(patch, name)
        current = self._current(path)
        if current is not None and current != data:  # the same bytes: a killed run's
            raise RegistryError("exists already; not overwritten", path=path)
        self._planned[path] = data
        return path

    def replace_file(self, patch: Patch, name: str, data: bytes) -> Path:
        """New contents for an existing payload file of the patch."""
        path = self._payload(patch, name)
        if self._current(path) is None:
            raise RegistryError("no such file", path=path)
        self._planned[path] = data
        return path

    def commit(self) -> Registry:
        """Write every planned file, then load the registry again; on failure, undo all.
        Under the registry's writer lock (`registry.lock`): an import or another writer
        waits, and a file changed meanwhile is refused, never written over."""
        with registry_lock(self.registry.root):
            return self._commit()

    def _commit(self) -> Registry:
        root = self.registry.root
        folders = dict.fromkeys([root, *(p.parent for p in self._planned)])
        for folder in folders:
            check_writable(folder)
        stale = [path for path, before in self._read.items() if _bytes(path) != before]
        stale += [
            p.folder for p in self._patches.values() if load_patch(p.folder).digest != p.digest
        ]
        if stale:
            raise RegistryError(
                "changed since it was read (another run?); nothing was written", path=stale[0]
            )
        # New files first, the edits that name them last: a run killed in between leaves
        # only files nothing refers to yet (and the same run again takes them as they are).
        order = sorted(self._planned.items(), key=lambda item: self._read.get(item[0]) is not None)
        staged: dict[Path, Path] = {}
        swapped: list[_Swap] = []
        try:
            # Every byte is written first, beside its file: a full disk fails here, while
            # the registry is still untouched. Swapping in then only renames and links.
            for path, data in order:
                staged[path] = staged_file(path, data)
            for path, _ in order:
                swapped.append(_swap_in(path, staged[path]))
                del staged[path]  # renamed in: no longer ours to remove
            for folder in dict.fromkeys(p.parent for p in self._planned):
                sync_folder(folder)
            registry = _reload(root, [p.parent for p in self._planned])
        except PatchsetError as exc:
            _undo(swapped)
            raise RegistryError(
                f"the changed registry would not load ({exc}); nothing was changed"
            ) from None
        except OSError as exc:
            _undo(swapped)
            raise _write_error(exc) from None
        except BaseException:
            _undo(swapped)
            raise
        finally:
            for name in staged.values():
                name.unlink(missing_ok=True)
        for swap in swapped:
            if swap.old is not None:
                swap.old.unlink(missing_ok=True)
        return registry


@dataclass(frozen=True)
class _Swap:
    path: Path
    old: Path | None  # a second name of the file it replaced (a hard link)
    before: bytes | None = None  # the file it replaced, where no link could be made


def _swap_in(dest: Path, staged: Path) -> _Swap:
    """Rename `staged` over `dest`, keeping the file it replaces under a second name (a hard
    link: no data written), so putting it back is a rename that a full disk cannot fail."""
    old: Path | None = None
    before: bytes | None = None
    if dest.is_file() and not dest.is_symlink():
        old = dest.with_name(f".{dest.name}.{secrets.token_hex(4)}.tmp")
        try:
            os.link(dest, old)
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise
            old, before = None, dest.read_bytes()  # a file system without hard links
    try:
        os.replace(staged, dest)
    except BaseException:
        if old is not None:
            old.unlink(missing_ok=True)
        raise
    return _Swap(dest, old, before)


def _write_error(exc: OSError) -> RegistryError:
    """A write in the registry that failed (a full disk, a quota, an I/O error): one line,
    exit 2, the registry as it was."""
    path = Path(exc.filename) if exc.filename else None
    return RegistryError(f"{why_not_written(exc)}; nothing was changed", path=path)


def why_not_written(exc: OSError) -> str:
    """What a failed write of a project file says: a full disk (or quota) by that name."""
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return f"the disk is full ({exc.strerror})"
    return f"cannot write: {exc.strerror or exc}"


def _reload(root: Path, changed: list[Path]) -> Registry:
    """The registry again: other patches' problems are theirs (a half-written one must not
    block this write), but every patch changed here must load."""
    registry = load_registry(root, tolerant=True)
    for folder in dict.fromkeys(changed):
        if folder.name in registry.problems:
            raise registry.problems[folder.name]
    return registry


def _bytes(path: Path) -> bytes | None:
    return path.read_bytes() if path.is_file() else None


def _undo(swapped: list[_Swap]) -> None:
    """Put back every file swapped in, newest first: renames and unlinks only."""
    for swap in reversed(swapped):
        try:
            if swap.old is not None:
                os.replace(swap.old, swap.path)
            elif swap.before is not None:
                os.replace(staged_file(swap.path, swap.before), swap.path)
            else:
                swap.path.unlink(missing_ok=True)
        except OSError:  # pragma: no cover -- the folder turned read-only mid-way
            LOG.warning("could not put back %s", swap.path)


def check_writable(folder: Path) -> None:
    """Create and delete a file in `folder`: the only test that root, ACLs and immutable
    folders (`chattr +i`) all answer truthfully."""
    try:  # an unnamed file where the system has them (O_TMPFILE): a kill leaves nothing
        with tempfile.TemporaryFile(prefix=".patchset-probe-", dir=folder):
            pass
    except OSError as exc:
        raise RegistryError(
            f"the registry folder is not writable ({exc.strerror}); nothing was changed",
            path=folder,
        ) from None


# -- `patchset check --suggest-ranges --write` -------------------------------------------------

RangeStatus = Literal["written", "unchanged", "skipped"]


@dataclass(frozen=True)
class RangeWrite:
    patch: str
    old: str
    new: str | None
    status: RangeStatus
    reason: str = ""

    def describe(self) -> str:
        if self.status == "written":
            return f"{self.patch}: vllm {self.old!r} -> {self.new!r}"
        if self.status == "unchanged":
            return f"{self.patch}: vllm {self.old!r} already says so"
        return f"{self.patch}: vllm {self.old!r} left as is: {self.reason}"


def write_ranges(
    registry: Registry, suggested: Mapping[str, tuple[str, ...]]
) -> tuple[tuple[RangeWrite, ...], Registry]:
    """Record each patch's evidence-derived range as its top-level `vllm`, all or nothing.

    A patch needed in no checked release, or in separate runs of releases (which one PEP 440
    range cannot say), is left as is and reported.
    """
    change = RegistryChange(registry)
    results: list[RangeWrite] = []
    for patch_id, runs in suggested.items():
        patch = registry.get(patch_id)
        old = str(_declared(patch))
        if not runs:
            results.append(RangeWrite(patch_id, old, None, "skipped", "needed in none checked"))
            continue
        if len(runs) > 1:
            reason = f"needed in separate runs ({' | '.join(runs)}); edit it by hand"
            results.append(RangeWrite(patch_id, old, None, "skipped", reason))
            continue
        new = runs[0]
        if same_range(old, new):
            results.append(RangeWrite(patch_id, old, new, "unchanged"))
            continue

        def edit(doc: TOMLDocument, new: str = new) -> None:
            doc["vllm"] = new

        change.edit_toml(patch, edit)
        results.append(RangeWrite(patch_id, old, new, "written"))
    if change.planned:
        registry = change.commit()
    return tuple(results), registry


def _declared(patch: Patch) -> str:
    """The range as written in patch.toml (keeps the author's order of specifiers)."""
    try:
        doc = tomlkit.parse((patch.folder / PATCH_FILE).read_text(encoding="utf-8"))
        value = doc.get("vllm")
    except (OSError, TOMLKitError, UnicodeDecodeError, RecursionError):
        value = None
    return str(value) if isinstance(value, str) else str(patch.vllm)


# -- new patch folders: `patchset add`, `patchset import` ---------------------------------------


def write_patch_folder(
    folder: Path,
    patch: TOMLDocument | Mapping[str, Any],
    payloads: Mapping[str, str] = {},
    *,
    header: str = "",
    durable: bool = True,
) -> None:
    """Write a patch folder's files: the payloads (name -> text), then patch.toml (a tomlkit
    document, or plain data laid out by `toml_text` under `header`), each whole; with
    `durable`, each fsynced (what is renamed into a registry is on disk). An OSError is the
    caller's to say (it knows what the folder will be called)."""
    folder.mkdir(parents=True, exist_ok=True)
    for name, text in payloads.items():
        write_text(folder / name, text, durable=durable)
    write_text(folder / PATCH_FILE, toml_text(patch, header=header), durable=durable)


def write_text(path: Path, text: str, *, durable: bool = True) -> None:
    """`text` as the file `path`, UTF-8, newlines as they are; fsynced with `durable`. An
    OSError names the file (a full disk's, raised by a write, names none of itself)."""
    try:
        with path.open("w", encoding="utf-8", newline="") as out:
            out.write(text)
            if durable:
                out.flush()
                os.fsync(out.fileno())
    except OSError as exc:
        if exc.filename is None:
            exc.filename = str(path)
        raise


def toml_text(data: TOMLDocument | Mapping[str, Any], *, header: str = "") -> str:
    """TOML text of a tomlkit document, or of plain data laid out as a document: each
    table's own keys, its tables, its arrays of tables (a list of tables under `all`/`any`,
    a predicate, stays inline); strings escaped (`_escape`); an array longer than 90
    characters one item a line. `header` lines are comments at the top."""
    comments = "".join(f"# {line}".rstrip() + "\n" for line in header.splitlines())
    if isinstance(data, TOMLDocument):
        return comments + tomlkit.dumps(data)
    doc = tomlkit.document()
    _fill(doc, data)
    return (comments + tomlkit.dumps(doc)).strip("\n") + "\n"


_BARE = re.compile(r"^[A-Za-z0-9_-]+$")
_INLINE_TABLES = ("all", "any")  # predicate lists read better inline


def _fill(container: TOMLDocument | Table, data: Mapping[str, Any]) -> None:
    later: list[tuple[str, object]] = []
    for key, value in data.items():
        if value is None:
            continue
        if isinstance(value, Mapping) or (_is_tables(value) and key not in _INLINE_TABLES):
            later.append((key, value))
        else:
            container.add(_key(key), _item(value))
    for key, value in later:
        body = container.body if isinstance(container, TOMLDocument) else container.value.body
        if not body or isinstance(body[-1][1], Table):
            container.add(tomlkit.nl())  # a blank line before each table header
        if isinstance(value, Mapping):
            table = tomlkit.table(is_super_table=False)
            _fill(table, value)
            container.add(_key(key), table)
        else:
            assert isinstance(value, list)
            tables = tomlkit.aot()
            for each in value:
                table = tomlkit.table()
                _fill(table, each)
                tables.append(table)
            container.add(_key(key), tables)


def _key(key: str) -> str | SingleKey:
    return key if _BARE.match(key) else SingleKey(key, KeyType.Basic, original=_raw(key))


def _item(value: object) -> Any:
    if isinstance(value, str):  # the text as `_raw` writes it, inside its quotes
        quotes = 3 if "\n" in value else 1
        kind = StringType.MLB if quotes == 3 else StringType.SLB
        return String(kind, value, _raw(value)[quotes:-quotes], Trivia())
    if isinstance(value, bool | int):
        return tomlkit.item(value)
    return tomlkit.value(_raw(value))


def _raw(value: object) -> str:
    """TOML text of a value inside an array or inline table."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, str):
        if "\n" in value:
            return '"""\n' + _escape(value, multiline=True) + '"""'
        return '"' + _escape(value, multiline=False) + '"'
    if isinstance(value, Mapping):
        inner = ", ".join(
            f"{k if _BARE.match(k) else _raw(k)} = {_raw(v)}" for k, v in value.items()
        )
        return "{ " + inner + " }" if inner else "{}"
    if isinstance(value, list | tuple):
        items = [_raw(v) for v in value]
        one = "[" + ", ".join(items) + "]"
        if len(one) <= 90 and "\n" not in one:
            return one
        return "[\n" + "".join(f"  {item},\n" for item in items) + "]"
    raise TypeError(f"cannot write {type(value).__name__} as TOML")


# Every backslash, quote and control character escaped (a multi-line string keeps its
# newlines and tabs): any text reads back byte for byte.
_ESCAPES = {c: f"\\u{c:04x}" for c in [*range(0x20), 0x7F]} | {
    ord("\\"): "\\\\",
    ord('"'): '\\"',
    ord("\t"): "\\t",
    ord("\n"): "\\n",
    ord("\r"): "\\r",
}
_MULTILINE_ESCAPES = _ESCAPES | {ord("\t"): "\t", ord("\n"): "\n"}


def _escape(text: str, *, multiline: bool) -> str:
    return text.translate(_MULTILINE_ESCAPES if multiline else _ESCAPES)


def _is_tables(value: object) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(v, Mapping) for v in value)
