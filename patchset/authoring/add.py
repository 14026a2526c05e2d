"""`patchset add`: a new patch folder from a payload (`authoring.payload`), or a skeleton.

The payload (already in the registry's form, `authoring.diff`) is written into a staging
folder, the registry's own rules are applied to it, and the new folder is loaded back before
it is moved into place, so a refused add writes nothing. The release range is suggested by a
check of the new patch.
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
import shutil
import tempfile
import textwrap
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import tomlkit
from packaging.specifiers import InvalidSpecifier, SpecifierSet
from tomlkit.items import Table as TomlTable

from patchset._fs import replace_folder
from patchset.adapters import forge
from patchset.authoring.diff import DiffPayload
from patchset.authoring.runtime_sites import SiteEdit, sites_toml
from patchset.errors import RegistryError, UsageError
from patchset.registry import STATES, Patch, Registry, load_patch, load_registry
from patchset.registry.lock import registry_lock
from patchset.registry.model import check_relations
from patchset.registry.write import why_not_written, write_patch_folder
from patchset.release_check import CheckReport, check
from patchset.sources.base import ReleaseSource

ID_RULE = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}[a-z0-9]$")  # as the registry checks it
ANY_RELEASE = ">=0"  # the range written when no release was checked


@dataclass(frozen=True)
class AddResult:
    patch: Patch
    dropped: tuple[str, ...]
    report: CheckReport | None  # the check that suggested the range; None when none ran
    suggested: tuple[str, ...]  # the ranges where the check found the patch `needed`
    range: str  # the range written to patch.toml
    range_note: str  # how it was chosen


def check_new_id(root: Path, patch_id: str) -> None:
    if not ID_RULE.match(patch_id):
        raise UsageError(f"{patch_id!r}: use 3-64 lowercase letters, digits and '-' for an id")
    if not root.is_dir():
        raise UsageError("registry folder does not exist (`patchset init` lays one out)", path=root)
    if (root / patch_id).exists():
        raise UsageError(f"patch {patch_id!r} exists already", path=root / patch_id)


def add_diff(
    root: Path,
    patch_id: str,
    payload: DiffPayload,
    *,
    pr: str | None = None,
    state: str | None = None,
    title: str | None = None,
    origin: str,
    credit: Sequence[str] = (),
    apply: str | None = None,
    vllm: str | None = None,
    source: ReleaseSource | None = None,
    versions: Iterable[str] = (),
    on_release: Callable[[str], None] | None = None,
    requires: Sequence[str] = (),
    base: str | None = None,
    sites: Sequence[SiteEdit] = (),
) -> AddResult:
    """Write `root/patch_id/` (patch.diff and patch.toml; with `sites`, a runtime patch's
    sites.toml instead of the diff), its range suggested by a check of `versions` from
    `source` (on top of the patches it `requires`) unless `vllm` says it; `base` (the release
    the payload was made against) is recorded unless the check finds it not `needed` there;
    nothing is written on any error."""
    check_new_id(root, patch_id)
    state = _state(pr, state)
    if vllm is not None:
        _specifier(vllm)
    wanted = list(versions)
    head = payload.preamble
    kind = "runtime" if sites else "diff"
    targets = tuple(dict.fromkeys(s.file for s in sites)) if sites else payload.targets
    if sites:
        header = f"Runtime sites of {patch_id}, made by `patchset add` from {origin}."
        payloads = {"sites.toml": sites_toml(patch_id, sites, header=header)}
    else:
        payloads = {"patch.diff": payload.text}
    with _staging(root, patch_id) as folder:

        def write_toml(
            range_text: str, note: str, base: str | None, files: Mapping[str, str] = {}
        ) -> None:
            doc = _patch_doc(
                patch_id,
                kind=kind,
                title=title or head.subject or (f"{pr}" if pr else f"{patch_id} (from {origin})"),
                description=head.description or _description(pr, origin),
                vllm=range_text,
                vllm_note=note,
                apply=apply or ("startup" if sites else "build"),
                targets=targets,
                origin=origin,
                credit=list(credit)
                or ([head.author] if head.author else [f"the author(s) of {pr or origin}"]),
                pr=pr,
                state=state,
                base=base,
            )
            if requires:
                doc["requires"] = list(dict.fromkeys(requires))
            _write(folder, doc, files)

        write_toml(vllm or ANY_RELEASE, "", base, payloads)
        try:  # the registry's rules, before a check
            staged = _with_registry(root, load_patch(folder))
        except RegistryError as exc:  # named against what the user gave, not the staging
            raise type(exc)(_unstaged(exc, folder), path=origin) from None
        report = (
            check(staged, wanted, source=source, on_release=on_release, patches=[patch_id])
            if wanted and source
            else None
        )
        suggested = report.suggested.get(patch_id, ()) if report else ()
        range_text, note = _choose_range(vllm, report, suggested)
        if base is not None and report is not None:
            at_base = [r for r in report.results if r.vllm == base]
            if at_base and at_base[0].verdict != "needed":
                base = None  # the check does not bear it out: not recorded
        write_toml(range_text, note, base)
        patch = _move_into_place(folder, root / patch_id)
    return AddResult(patch, payload.dropped, report, suggested, range_text, note)


def _with_registry(root: Path, staged: Patch) -> Registry:
    """The staged patch beside the registry's own (whose ids its `requires` may name)."""
    existing = load_registry(root, tolerant=True)
    patches = [*existing.patches, staged]
    bad = check_relations(patches, set(existing.problems))
    if staged.id in bad:
        raise bad[staged.id]
    return Registry(root=root, patches=tuple(patches), digest=existing.digest)


SKELETONS = {
    "runtime": (
        "What goes wrong without it (the error, the hardware), what the sites change,\nand why"
        " upstream does not (yet).\n",
        "A runtime patch skeleton from `patchset add --runtime`: fill in vllm, targets and at"
        " least\none [[site]] in sites.toml.",
    ),
    "python": (
        "What goes wrong without it, what apply() rebinds or wraps, and why upstream\ndoes not"
        " (yet).\n",
        "A python patch skeleton from `patchset add --python`: fill in vllm, targets (the files"
        " of\nthe modules it touches), touches (module:attribute) and apply() in plugin.py.",
    ),
}


def add_skeleton(
    root: Path,
    patch_id: str,
    *,
    kind: str = "runtime",
    pr: str | None = None,
    state: str | None = None,
    title: str | None = None,
    vllm: str | None = None,
) -> Path:
    """Lay out a runtime patch skeleton (patch.toml with an empty `targets` and a sites.toml
    holding only a commented example) or a python one (empty `targets` and `touches`, and a
    plugin.py whose `apply()` raises until written), so `patchset validate` refuses it until
    it is filled in."""
    description, header = SKELETONS[kind]
    files = (
        {"sites.toml": _sites_example(patch_id)}
        if kind == "runtime"
        else {"plugin.py": _plugin_example(patch_id)}
    )
    return _skeleton(
        root,
        patch_id,
        kind=kind,
        description=description,
        header=header,
        files=files,
        pr=pr,
        state=state,
        title=title,
        vllm=vllm,
        touches=kind == "python",
    )


def _skeleton(
    root: Path,
    patch_id: str,
    *,
    kind: str,
    description: str,
    header: str,
    files: dict[str, str],
    pr: str | None,
    state: str | None,
    title: str | None,
    vllm: str | None,
    touches: bool = False,
) -> Path:
    check_new_id(root, patch_id)
    state = _state(pr, state)
    if vllm is not None:
        _specifier(vllm)
    with _staging(root, patch_id) as folder:
        doc = _patch_doc(
            patch_id,
            kind=kind,
            title=title or f"{patch_id}: say in one line what it fixes",
            description=description,
            vllm=vllm or "",
            vllm_note="the releases it is meant for, e.g. '>=0.20.0,<0.21.0'",
            apply="startup",
            targets=(),
            origin="where the edit comes from (a script, a pull request, your own work)",
            credit=["who found and wrote the fix"],
            pr=pr,
            state=state,
        )
        if touches:
            doc["touches"] = tomlkit.array()
        header += (
            " Until then `patchset validate`\nrefuses it, on purpose, so a half-written patch"
            " never ships."
        )
        _write(folder, doc, files, header=header)
        dest = root / patch_id
        _rename(folder, dest)
    return dest


def _plugin_example(patch_id: str) -> str:
    return f'''"""{patch_id}: a python patch, run by vLLM's general-plugins hook in each of its
processes (API server, engine core, workers). Import vLLM inside apply(), not at the top, and
make it safe to run more than once. List in patch.toml's `touches` every module:attribute
it rebinds or reads, so `patchset check` can say when a release no longer has them."""


def apply() -> None:
    # import vllm.envs as envs
    #
    # original = envs.is_set
    #
    # def is_set(name: str) -> bool:
    #     return original(name)
    #
    # envs.is_set = is_set
    raise NotImplementedError("{patch_id}: write apply() (see the comment above)")
'''


def _state(pr: str | None, state: str | None) -> str:
    if pr is not None:
        forge.parse_pr(pr)
    chosen = state or ("open" if pr else "unsubmitted")
    if chosen not in STATES:
        raise UsageError(f"--state {chosen!r} is not one of {', '.join(STATES)}")
    if chosen != "unsubmitted" and pr is None:
        raise UsageError(f"--state {chosen} needs --pr owner/repo#number")
    return chosen


def _specifier(text: str) -> SpecifierSet:
    try:
        return SpecifierSet(text)
    except InvalidSpecifier:
        raise UsageError(
            f"--range {text!r} is not a PEP 440 version specifier (e.g. '>=0.17.0,<0.20.0')"
        ) from None


def _choose_range(
    explicit: str | None, report: CheckReport | None, suggested: tuple[str, ...]
) -> tuple[str, str]:
    """The range to write and a one-line note of the evidence."""
    if report is None:
        if explicit:
            return explicit, "given with --range; not checked against any release"
        return ANY_RELEASE, "not checked against any release: narrow it (patchset check)"
    verdicts = _verdict_runs(report)
    if explicit:
        return explicit, f"given with --range; checked: {verdicts}"
    if suggested:
        others = f" (also needed in {', '.join(suggested[:-1])})" if len(suggested) > 1 else ""
        return suggested[-1], f"suggested by a check: {verdicts}{others}"
    newest = report.releases[-1].version
    return (
        f">{newest}",
        f"no checked release needs it as it is ({verdicts}); this admits only later ones",
    )


def _verdict_runs(report: CheckReport) -> str:
    """'0.17.0..0.19.1 needed, 0.20.0..0.33.0 upstream': consecutive releases folded."""
    runs: list[tuple[str, str, str]] = []
    for r in report.results:
        if runs and runs[-1][2] == r.verdict:
            runs[-1] = (runs[-1][0], r.vllm, r.verdict)
        else:
            runs.append((r.vllm, r.vllm, r.verdict))
    return ", ".join(f"{a}{'' if a == b else '..' + b} {v}" for a, b, v in runs)


def _description(pr: str | None, origin: str) -> str:
    what = f"the diff of {pr}" if pr else f"the diff {origin}"
    return (
        f"Added by `patchset add` from {what}.\nSay what goes wrong without it (the error,"
        " the hardware) and why it is\ncarried until upstream ships it.\n"
    )


def _patch_doc(
    patch_id: str,
    *,
    kind: str,
    title: str,
    description: str,
    vllm: str,
    vllm_note: str,
    apply: str,
    targets: Sequence[str],
    origin: str,
    credit: list[str],
    pr: str | None,
    state: str,
    base: str | None = None,
) -> tomlkit.TOMLDocument:
    doc = tomlkit.document()
    doc.add("id", patch_id)
    doc.add("title", title)
    doc.add("description", tomlkit.string(description, multiline=True))
    doc.add("kind", kind)
    doc.add("revision", 1)
    for line in textwrap.wrap(vllm_note, 96):
        doc.add(tomlkit.comment(line))
    doc.add("vllm", vllm)
    if base is not None:
        doc.add(tomlkit.comment("the release the payload was made against (refresh starts there)"))
        doc.add("base", base)
    doc.add("apply", apply)
    doc.add("targets", list(targets))
    doc.add("origin", origin)
    doc.add("credit", credit)
    upstream: TomlTable = tomlkit.table()
    if pr is not None:
        upstream.add("pr", pr)
    upstream.add("state", state)
    doc.add(tomlkit.nl())
    doc.add("upstream", upstream)
    return doc


def _sites_example(patch_id: str) -> str:
    return f"""\
# Runtime sites of {patch_id}: each anchor must match exactly once (runs of whitespace are
# folded); the text is re-indented to the anchor and carries its marker as a comment.
# Remove the leading '# ' of the example below and make it yours (docs/registry.md).
#
# [[site]]
# name = "a-short-name"
# file = "vllm/path/to/file.py"
# action = "replace"                # replace | insert-after | insert-before
# marker = "patchset: {patch_id} site a"
# anchor = \"\"\"
# the exact line(s) to find
# \"\"\"
# text = \"\"\"
# the line(s) to put there
# \"\"\"
"""


@contextlib.contextmanager
def _staging(root: Path, patch_id: str) -> Iterator[Path]:
    """`<id>/` inside a hidden folder of the registry root (the loader skips dot folders),
    so the final rename is atomic; the hidden folder goes away whatever happened (a write
    that fails in it, `_write`, included: nothing is added)."""
    try:
        tmp = Path(tempfile.mkdtemp(prefix=f".add-{patch_id}-", dir=root))
        folder = tmp / patch_id
        folder.mkdir()
    except OSError as exc:
        why = _not_written(exc, "the registry folder is not writable")
        raise RegistryError(why, path=root) from None
    try:
        yield folder
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _write(
    folder: Path, doc: tomlkit.TOMLDocument, payloads: Mapping[str, str], *, header: str = ""
) -> None:
    """The staged patch folder's files (`registry.write.write_patch_folder`, the writer the
    importers use; fsynced: what is renamed into the registry is on disk); a full disk or a
    quota is one line naming the file as it would be named, exit 2."""
    try:
        write_patch_folder(folder, doc, payloads, header=header)
    except OSError as exc:
        name = Path(exc.filename).name if exc.filename else "patch.toml"
        named = folder.parent.parent / folder.name / name  # staging's
        raise RegistryError(_not_written(exc, "cannot write"), path=named) from None


def _not_written(exc: OSError, unwritable: str) -> str:
    """A full disk said so (`registry.write.why_not_written`), another error as `unwritable`."""
    full = exc.errno in (errno.ENOSPC, errno.EDQUOT)
    why = why_not_written(exc) if full else f"{unwritable} ({exc.strerror})"
    return f"{why}; nothing was added"


def _unstaged(exc: RegistryError, folder: Path) -> str:
    """An error about a file in the staging folder, said of the file as it will be named."""
    message = str(exc)
    if exc.path is not None:
        message = message.removeprefix(f"{exc.path}: ")
        name = Path(exc.path).relative_to(folder) if Path(exc.path).is_relative_to(folder) else ""
        message = f"the {name or 'patch'} written from it: {message}"
    return message


def _rename(folder: Path, dest: Path) -> None:
    with registry_lock(dest.parent):  # an import's swap or another add waits for it
        if os.path.lexists(dest):  # someone added the same id meanwhile: never replaced
            raise UsageError(f"patch {dest.name!r} exists already", path=dest)
        if not folder.is_dir():  # an import swapped the registry under it: a new copy
            raise RegistryError("the registry was replaced while adding; run it again", path=dest)
        try:
            replace_folder(folder, dest)
        except OSError as exc:
            raise RegistryError(_not_written(exc, "cannot move it into place"), path=dest) from None


def _move_into_place(folder: Path, dest: Path) -> Patch:
    load_patch(folder)  # validated by loading it back, before it is visible
    _rename(folder, dest)
    return load_patch(dest)
