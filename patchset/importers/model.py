"""What an importer produces: draft patches (patch.toml data and payload texts) and a report."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

from patchset.errors import ExitCode, PatchsetError
from patchset.registry.write import TomlData

ImportStatus = Literal["imported", "imported-with-loss", "not-imported", "out-of-scope"]
ImportAction = Literal[
    "added", "updated", "unchanged", "removed", "kept", "none", "would-add", "would-update"
]
STATE_FOLDER = ".imported"  # under the registry folder: never a patch id (starts with '.')
SUPPORT_FOLDER = "_support"


class CollectionError(PatchsetError):
    """The folder is not the named collection, or its layout is one the importer does not
    know (exit 2)."""

    exit_code = ExitCode.BAD_INPUT


class Skipped(Exception):  # noqa: N818 - a reason, not an error
    """Why one entry of a collection is not imported (said in the report, not an error);
    `scope`: the entry is out of the importer's scope rather than failed."""

    def __init__(self, message: str, *, scope: bool = False) -> None:
        super().__init__(message)
        self.scope = scope


@dataclass(frozen=True)
class Collection:
    """Who a collection is: its name (`patchset import NAME`), how its docs call it, the
    repository a checkout is taken for when its remote does not say, its patch ids' prefix."""

    name: str
    title: str
    repository: str
    prefix: str

    def id_of(self, raw: str) -> str:
        return patch_id(self.prefix, raw)

    def checkout_file(self, folder: Path, file: str, beside: str, holding: str = "") -> Path:
        """`folder/file`, when `folder` is a checkout of this collection: the file is there
        (holding `holding`, when given) and so is the folder `beside`; else one line naming
        what was looked for."""
        path = folder / file
        ok = path.is_file() and (folder / beside).is_dir()
        if ok and holding:
            try:
                ok = holding in path.read_text(errors="replace")
            except OSError:
                ok = False
        if not ok:
            held = f" holding {holding}" if holding else ""
            raise CollectionError(
                f"{folder}: not a {self.title} checkout (looked for {file}{held} and {beside}/)"
            )
        return path


def patch_id(prefix: str, raw: str) -> str:
    """A collection's id as a patchset id: lowercase, runs of other characters as '-'."""
    body = re.sub(r"[^a-z0-9]+", "-", raw.lower()).strip("-")
    return f"{prefix}-{body}"[:64].rstrip("-")


@dataclass
class Draft:
    """One patch to write: `meta` is patch.toml (plain data, keys in order), `payloads` the
    files beside it (name -> text), `lost` what of the collection's patch did not carry over."""

    id: str
    source_id: str
    meta: TomlData
    payloads: dict[str, str]
    lost: list[str] = field(default_factory=list)
    # Files of the collection the patch needs at run time (support packages by name).
    support: tuple[str, ...] = ()

    @property
    def status(self) -> ImportStatus:
        return "imported-with-loss" if self.lost else "imported"


@dataclass(frozen=True)
class Support:
    """A support package to carry under patches/_support/<name>/: its support.toml data and
    the folder it copies from (the collection's package)."""

    name: str
    meta: TomlData
    source: str  # folder to copy as <name>/<path>/<package>
    package: str  # the top-level package folder name


@dataclass
class Entry:
    """One line of the summary: a collection's patch (or file) and what became of it."""

    source_id: str
    status: ImportStatus
    patch: str | None = None
    reasons: list[str] = field(default_factory=list)
    action: ImportAction = "none"
    kept: list[str] = field(default_factory=list)  # the user's own edits kept

    def to_dict(self) -> dict[str, object]:
        return {
            "source": self.source_id,
            "status": self.status,
            "patch": self.patch,
            "action": self.action,
            "reasons": list(self.reasons),
            "kept_edits": list(self.kept),
        }


@dataclass(frozen=True)
class Plan:
    """One definition to write: `builds/<name>`, its release, the patches wanted (the order
    they are preferred in when two cannot both be listed), the other keys, a header."""

    name: str
    vllm: str
    wanted: tuple[str, ...]
    data: dict[str, object]
    header: str


@dataclass
class Collected:
    """What an importer read from a collection, before anything is written."""

    collection: str
    repository: str
    commit: str | None
    drafts: list[Draft]
    entries: list[Entry]  # the ones that produced no draft (not imported, out of scope)
    supports: list[Support] = field(default_factory=list)
    broken: dict[str, str] = field(default_factory=dict)  # collection file -> why skipped
    builds: dict[str, str] = field(default_factory=dict)  # unused: definitions are `plans`
    ran: list[str] = field(default_factory=list)  # the collection's scripts run (--run-scripts)
    notes: list[str] = field(default_factory=list)  # lines for the summary (pins not checked)
    plans: list[Plan] = field(default_factory=list)  # build definitions to plan once landed


@dataclass
class ImportReport:
    collection: str
    commit: str | None
    entries: list[Entry]
    broken: dict[str, str]
    dry_run: bool
    builds: list[str] = field(default_factory=list)
    seconds: float = 0.0
    ran: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def exit_code(self) -> int:
        return ExitCode.ATTENTION if self.broken else ExitCode.OK

    def count(self, *statuses: ImportStatus) -> int:
        return sum(1 for e in self.entries if e.status in statuses and e.action != "removed")

    def to_dict(self) -> dict[str, object]:
        return {
            "schema": "patchset.import/1",
            "collection": self.collection,
            "commit": self.commit,
            "dry_run": self.dry_run,
            "imported": self.count("imported"),
            "imported_with_loss": self.count("imported-with-loss"),
            "not_imported": self.count("not-imported"),
            "out_of_scope": self.count("out-of-scope"),
            "entries": [e.to_dict() for e in self.entries],
            "unparsed": dict(self.broken),
            "builds": list(self.builds),
            "scripts_run": list(self.ran),
            "notes": list(self.notes),
            "seconds": round(self.seconds, 3),
        }
