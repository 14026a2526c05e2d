"""Support packages carried into images and bundles: the Python packages patches import.

A patch (or one of its sites) declares the modules its inserted code imports in
`requires_modules`; the registry's support packages (`patches/_support/<name>/`) provide
them. An image or a bundle carries the packages its patches need under ``support/<name>/``
beside the entrypoint, and the start puts each on the import path of vLLM's processes
(``PYTHONPATH``: the API server, the engine core and spawned workers inherit it):

- a folder package: its files, the folder on the path;
- a pinned wheel: the wheel file itself on the path (a pure wheel imports from its zip);
- a pinned sdist: its packages (beside its root folder, or under ``src/``) unpacked.

Of a folder package or an sdist only what the patches import is carried (`closure`): the
modules the inserted code, the python patches and `requires_modules` name, the modules those
import within the package (read with `ast`, absolute and relative imports, and module names
given as strings, as to `importlib.import_module`), every package ``__init__.py`` on the way,
and the data files those modules name (string literals that are existing paths relative to the
module or the package root; a folder only when it holds no module). What is left out is
said by `left_out`. A pinned wheel is carried
whole (its file is what the sha256 pins).
"""

from __future__ import annotations

import ast
import posixpath
import tarfile
import zipfile
from collections.abc import Callable, Collection, Iterable
from pathlib import PurePosixPath

from patchset.errors import RegistryError
from patchset.registry import Registry
from patchset.registry.model import SupportPackage
from patchset.registry.support import imported_modules, provider

FOLDER = "support"


def needed(registry: Registry, patch_ids: Iterable[str]) -> list[SupportPackage]:
    """The support packages the patches `patch_ids` need, each once, by name."""
    found: dict[str, SupportPackage] = {}
    ids = list(patch_ids)
    for patch in registry.select(ids) if ids else ():
        for module in patch.modules_needed():
            package = provider(module, registry.support)
            if package is not None:
                found.setdefault(package.name, package)
    return [found[name] for name in sorted(found)]


def wanted_modules(registry: Registry, patch_ids: Iterable[str]) -> list[str]:
    """Every module the patches `patch_ids` import or declare: `requires_modules` (theirs and
    their sites'), the imports of each site's inserted text and of each python patch."""
    found: list[str] = []
    ids = list(patch_ids)
    for patch in registry.select(ids) if ids else ():
        found += patch.modules_needed()
        for variant in patch.variants:
            texts = [s.text for s in variant.sites]
            texts += [a.text for s in variant.sites for a in s.alternatives if a.text]
            if patch.kind == "python":
                texts.append((patch.folder / variant.name).read_text(encoding="utf-8"))
            found += [module for text in texts for _, module in imported_modules(text)]
    return list(dict.fromkeys(found))


def support_files(
    packages: Iterable[SupportPackage], wanted: Collection[str] | None = None
) -> tuple[dict[str, bytes], list[str]]:
    """The files of `packages` by path under the runtime folder, and the import-path entries
    (relative to it) that make their modules importable. With `wanted` (the modules the
    patches import: `wanted_modules`), a folder package or an sdist carries only their
    `closure`."""
    files: dict[str, bytes] = {}
    paths: list[str] = []
    for package in packages:
        where = f"{FOLDER}/{package.name}"
        if package.kind == "wheel":
            files[f"{where}/{package.source.name}"] = package.source.read_bytes()
            paths.append(f"{where}/{package.source.name}")
            continue
        whole = package_files(package)
        kept = whole if wanted is None else closure(whole, wanted, set(package.modules))
        files.update({f"{where}/{rel}": whole[rel] for rel in sorted(kept)})
        paths.append(where)
    return files, paths


def package_files(package: SupportPackage) -> dict[str, bytes]:
    """A folder package's or an sdist's files, by path under the folder put on the path."""
    if package.kind == "folder":
        return {
            item.relative_to(package.source).as_posix(): item.read_bytes()
            for item in sorted(package.source.rglob("*"))
            if item.is_file() and "__pycache__" not in item.parts
        }
    return dict(_sdist_members(package))


def left_out(packages: Iterable[SupportPackage], carried: Collection[str]) -> tuple[int, int]:
    """How many files of `packages` (folders and sdists) are not among `carried` (paths under
    the runtime folder), and their bytes."""
    count = size = 0
    for package in packages:
        if package.kind == "wheel":
            continue
        for rel, data in package_files(package).items():
            if f"{FOLDER}/{package.name}/{rel}" not in carried:
                count, size = count + 1, size + len(data)
    return count, size


def said_left_out(
    packages: Iterable[SupportPackage], carried: Collection[str], say: Callable[[str], None]
) -> tuple[int, int]:
    """`left_out`, said in one line when some file was (the export's summary)."""
    count, size = left_out(packages, carried)
    if count:
        say(
            f"support packages: {count} files ({size:,} bytes) that no patch imports left out"
            " (only the modules the patches import, what those import and the data files they"
            " name are carried)"
        )
    return count, size


def _module_index(files: Collection[str]) -> dict[str, str]:
    """Module name -> its file (``a/b.py``, or ``a/b/__init__.py`` for the package ``a.b``)."""
    index: dict[str, str] = {}
    for rel in sorted(files):
        if not rel.endswith(".py"):
            continue
        parts = rel[:-3].split("/")
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts and all(p.isidentifier() for p in parts):
            index.setdefault(".".join(parts), rel)
    return index


def closure(files: dict[str, bytes], roots: Iterable[str], tops: Collection[str]) -> set[str]:
    """The files of `files` (path -> bytes) that importing `roots` (dotted names: modules, or
    names inside them) needs, within the packages `tops`: see the module's docstring."""
    index = _module_index(files)
    folders: dict[str, list[str]] = {}
    for member in files:
        for parent in PurePosixPath(member).parents:
            if str(parent) != ".":
                folders.setdefault(str(parent), []).append(member)
    data_folders = {k for k, held in folders.items() if not any(f.endswith(".py") for f in held)}
    keep: set[str] = set()
    queue = [r for r in roots if r.split(".", 1)[0] in tops]
    while queue:
        name = queue.pop()
        parts = name.split(".")
        while parts and ".".join(parts) not in index:  # a name inside a module: the module
            parts.pop()
        for n in range(1, len(parts) + 1):  # every package __init__ on the way, then it
            rel = index.get(".".join(parts[:n]))
            if rel is None or rel in keep:
                continue
            keep.add(rel)
            package = ".".join(parts[: n if rel.endswith("__init__.py") else n - 1])
            found, data = _reads(files[rel], package, index)
            queue += [m for m in found if m.split(".", 1)[0] in tops]
            base = posixpath.dirname(rel)
            for literal in data:
                for path in (posixpath.normpath(posixpath.join(base, literal)), literal):
                    if path in files and not path.endswith(".py"):  # a module: imported
                        keep.add(path)
                    elif path in data_folders:  # a folder of data the module names
                        keep.update(folders[path])
    return keep


def _reads(source: bytes, package: str, index: dict[str, str]) -> tuple[list[str], list[str]]:
    """The modules `source` (of a module in `package`) imports, and the string literals in
    it that may name a data file or a module."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return [], []
    modules: list[str] = []
    literals: list[str] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            modules += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                up = package.split(".")[: max(0, len(package.split(".")) - node.level + 1)]
                base = ".".join([*up, *([base] if base else [])])
            modules.append(base)
            modules += [f"{base}.{alias.name}" for alias in node.names if alias.name != "*"]
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            text = node.value
            if text in index:
                modules.append(text)  # importlib.import_module("pkg.mod")
            elif 0 < len(text) < 300 and "\n" not in text:
                literals.append(text.removeprefix("./"))  # a data file, maybe
    return [m for m in modules if m], literals


def _sdist_members(package: SupportPackage) -> list[tuple[str, bytes]]:
    """An sdist's files under the packages it provides (its root folder, maybe `src/`, cut)."""
    out: list[tuple[str, bytes]] = []
    tops = set(package.modules)
    path = package.source
    try:
        if path.name.endswith(".zip"):
            with zipfile.ZipFile(path) as archive:
                for info in archive.infolist():
                    rel = _inner(info.filename, tops)
                    if rel is not None and not info.is_dir():
                        out.append((rel, archive.read(info)))
        else:
            with tarfile.open(path) as archive:
                for member in archive.getmembers():
                    rel = _inner(member.name, tops)
                    handle = archive.extractfile(member) if member.isfile() else None
                    if rel is not None and handle is not None:
                        out.append((rel, handle.read()))
    except (OSError, tarfile.TarError, zipfile.BadZipFile, EOFError) as exc:
        raise RegistryError(f"{path.name} cannot be unpacked: {exc}", path=path) from None
    return out


def _inner(name: str, tops: set[str]) -> str | None:
    parts = PurePosixPath(name).parts[1:]
    if parts[:1] == ("src",):
        parts = parts[1:]
    if not parts or parts[0].removesuffix(".py") not in tops or ".." in parts:
        return None
    return PurePosixPath(*parts).as_posix()
