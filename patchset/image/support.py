"""Support packages carried into images and bundles: the Python packages patches import.

A patch (or one of its sites) declares the modules its inserted code imports in
`requires_modules`; the registry's support packages (`patches/_support/<name>/`) provide
them. An image or a bundle carries the packages its patches need under ``support/<name>/``
beside the entrypoint, and the start puts each on the import path of vLLM's processes
(``PYTHONPATH``: the API server, the engine core and spawned workers inherit it):

- a folder package: its files, the folder on the path;
- a pinned wheel: the wheel file itself on the path (a pure wheel imports from its zip);
- a pinned sdist: its packages (beside its root folder, or under ``src/``) unpacked.
"""

from __future__ import annotations

import tarfile
import zipfile
from collections.abc import Iterable
from pathlib import PurePosixPath

from patchset.errors import RegistryError
from patchset.registry import Registry
from patchset.registry.model import SupportPackage
from patchset.registry.support import provider

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


def support_files(packages: Iterable[SupportPackage]) -> tuple[dict[str, bytes], list[str]]:
    """The files of `packages` by path under the runtime folder, and the import-path entries
    (relative to it) that make their modules importable."""
    files: dict[str, bytes] = {}
    paths: list[str] = []
    for package in packages:
        where = f"{FOLDER}/{package.name}"
        if package.kind == "folder":
            for item in sorted(package.source.rglob("*")):
                if item.is_file() and "__pycache__" not in item.parts:
                    files[f"{where}/{item.relative_to(package.source).as_posix()}"] = (
                        item.read_bytes()
                    )
            paths.append(where)
        elif package.kind == "wheel":
            files[f"{where}/{package.source.name}"] = package.source.read_bytes()
            paths.append(f"{where}/{package.source.name}")
        else:
            files.update({f"{where}/{rel}": data for rel, data in _sdist_members(package)})
            paths.append(where)
    return files, paths


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
