"""Support packages (`patches/_support/<name>/support.toml`) and the modules patches need.

A support package carries Python packages that patches import at run time: a folder beside
support.toml (`path`), or a pinned wheel or sdist beside it (`file` + `sha256`). Nothing in it
may lead outside its own folder (a symlink, an archive member with ``..`` or an absolute
path). A module a patch or site names in `requires_modules` must come from a support package
or be one vLLM's processes have anyway: the standard library and the target's own packages
(`TARGET_PACKAGES`). `import_problems` reads (with `ast`) the imports of every site's text and
python patch and flags those nothing provides or the patch does not declare; with a vLLM
release at hand (`import_rule`: an installed vLLM's dist-info), the modules of vLLM's own
declared requirements need no support package either.
"""

from __future__ import annotations

import ast
import hashlib
import os
import re
import sys
import textwrap
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from patchset.errors import RegistryError
from patchset.kernel.touches import parsed  # one parse per module text
from patchset.registry.model import (
    PATCH_FILE,
    SUPPORT_FILE,
    SUPPORT_FOLDER,
    Patch,
    SupportPackage,
)
from patchset.registry.problems import inside
from patchset.registry.toml import Table, load_toml

# Importable in every vLLM process without a support package: the target's own packages.
TARGET_PACKAGES: tuple[str, ...] = ("vllm", "torch", "triton", "transformers")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
_TOP = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SHA256 = re.compile(r"^[0-9a-f]{64}$")
SDIST_SUFFIXES = (".tar.gz", ".tgz", ".zip")


def load_support(root: Path) -> tuple[list[SupportPackage], dict[str, RegistryError]]:
    """Every support package under `root/_support`, and the problem of each that does not
    load (keyed ``_support/<name>``)."""
    base = root / SUPPORT_FOLDER
    if not base.is_dir():
        return [], {}
    found: list[SupportPackage] = []
    problems: dict[str, RegistryError] = {}
    for folder in sorted(p for p in base.iterdir() if p.is_dir() and p.name[0] != "."):
        try:
            inside(folder, base, "the support folder")
            found.append(load_package(folder))
        except RegistryError as exc:
            problems[f"{SUPPORT_FOLDER}/{folder.name}"] = exc
    owners: dict[str, str] = {}
    for package in list(found):
        for module in package.modules:
            if module in owners:
                problems[f"{SUPPORT_FOLDER}/{package.name}"] = RegistryError(
                    f"modules: {module!r} is also provided by {owners[module]!r}",
                    path=package.folder / SUPPORT_FILE,
                )
                found.remove(package)
                break
            owners[module] = package.name
    return found, problems


def load_package(folder: Path) -> SupportPackage:
    """One support package; a RegistryError naming support.toml and the key otherwise."""
    file = folder / SUPPORT_FILE
    if not file.is_file():
        raise RegistryError(f"no {SUPPORT_FILE} in this support folder", path=folder)
    inside(file, folder, "its support folder")
    top = Table(load_toml(file), file=file)
    name = top.req_str("name")
    if not _NAME.match(name) or name != folder.name:
        raise top.error(f"{name!r}: must be the folder's name ({folder.name!r})", "name")
    modules = top.str_list("modules")
    for module in modules:
        if not _TOP.match(module):
            raise top.error(f"{module!r} is not a top-level import name", "modules")
    path = top.opt_str("path", required=False)
    pinned = top.opt_str("file", required=False)
    sha256 = top.opt_str("sha256", required=False)
    top.finish()
    if (path is None) == (pinned is None):
        raise top.error("give either path (a folder) or file (a wheel or sdist), not both")
    digest = hashlib.sha256(file.read_bytes())
    if path is not None:
        if sha256 is not None:
            raise top.error("a folder is not pinned: sha256 goes with file", "sha256")
        pure = PurePosixPath(path)
        if pure.is_absolute() or ".." in pure.parts or "\\" in path or not path.isprintable():
            raise top.error(f"{path!r}: a folder beside {SUPPORT_FILE}, inside it", "path")
        _folder_package(top, folder, path, modules, digest)
    else:
        assert pinned is not None
        _pinned_package(top, folder, pinned, sha256, modules=modules, digest=digest)
    return SupportPackage(name, folder, modules, path, pinned, sha256, digest.hexdigest())


def _folder_package(
    top: Table, folder: Path, path: str, modules: Sequence[str], digest: hashlib._Hash
) -> None:
    source = folder / path
    if not source.is_dir():
        raise top.error(f"{path!r}: no such folder beside {SUPPORT_FILE}", "path")
    base = folder.resolve()
    for item in _inside_links(top, folder, source, base):
        if item.is_file():
            rel = item.relative_to(source).as_posix()
            digest.update(f"\0{rel}\0".encode() + item.read_bytes())
    for module in modules:
        if not ((source / module).is_dir() or (source / f"{module}.py").is_file()):
            raise top.error(
                f"{module!r}: neither {path}/{module}/ nor {path}/{module}.py", "modules"
            )


def _inside_links(top: Table, folder: Path, source: Path, base: Path) -> list[Path]:
    """Every entry under `source` in order (as `sorted(source.rglob("*"))`: symbolic links
    listed, never walked into), each checked to resolve inside `base`: `source` itself and
    each link are resolved; an entry reached through neither is where its folder is."""
    root = source.resolve()
    if root != base and base not in root.parents:
        raise top.error(f"{source.relative_to(folder)} leads outside the package ({root})", "path")
    found: list[tuple[tuple[str, ...], Path]] = []
    for where, dirs, names in os.walk(source):
        here = Path(where)
        for name in (*dirs, *names):
            item = here / name
            found.append((item.relative_to(source).parts, item))
            if item.is_symlink():
                real = item.resolve()
                if real != base and base not in real.parents:
                    raise top.error(
                        f"{item.relative_to(folder)} leads outside the package ({real})", "path"
                    )
    return [item for _, item in sorted(found)]


def _pinned_package(
    top: Table,
    folder: Path,
    name: str,
    sha256: str | None,
    *,
    modules: Sequence[str],
    digest: hashlib._Hash,
) -> None:
    if "/" in name or name.startswith("."):
        raise top.error(f"{name!r}: a file beside {SUPPORT_FILE}", "file")
    if not (name.endswith(".whl") or name.endswith(SDIST_SUFFIXES)):
        raise top.error(f"{name!r}: a wheel (.whl) or an sdist (.tar.gz, .zip)", "file")
    if sha256 is None or not _SHA256.match(sha256):
        raise top.error("a pinned file needs its sha256 (64 lowercase hex digits)", "sha256")
    path = folder / name
    if not path.is_file():
        raise top.error(f"{name!r}: no such file beside {SUPPORT_FILE}", "file")
    inside(path, folder, "its support folder")
    data = path.read_bytes()
    actual = hashlib.sha256(data).hexdigest()
    if actual != sha256:
        raise top.error(f"{name} is damaged: its sha256 is {actual}, not the pinned one", "sha256")
    digest.update(data)
    import tarfile  # noqa: PLC0415 -- a pinned package only (~3 ms a start otherwise)
    import zipfile  # noqa: PLC0415

    try:
        members = _members(path)
    except (zipfile.BadZipFile, tarfile.TarError, OSError, EOFError) as exc:
        raise top.error(f"{name} is damaged: {exc}", "file") from None
    tops: set[str] = set()
    for member, link in members:
        for rel in (member, *([link] if link is not None else [])):
            pure = PurePosixPath(rel)
            if rel.startswith("/") or ".." in pure.parts or (":" in (pure.parts or ("",))[0]):
                raise top.error(f"{name}: {member!r} leads outside the package", "file")
        parts = PurePosixPath(member).parts
        if not name.endswith(".whl"):  # an sdist: under its root folder, maybe in src/
            parts = parts[1:]
            if parts[:1] == ("src",):
                parts = parts[1:]
        if parts:
            tops.add(parts[0].removesuffix(".py"))
    for module in modules:
        if module not in tops:
            raise top.error(f"{module!r} is not in {name}", "modules")


def _members(path: Path) -> list[tuple[str, str | None]]:
    """The member names of a wheel, zip or tarball, with a link's target (tar)."""
    import tarfile  # noqa: PLC0415 -- see `_pinned_package`
    import zipfile  # noqa: PLC0415

    if path.name.endswith((".whl", ".zip")):
        with zipfile.ZipFile(path) as archive:
            return [(info.filename, None) for info in archive.infolist()]
    with tarfile.open(path) as archive:
        found: list[tuple[str, str | None]] = []
        for member in archive.getmembers():
            link = None
            if member.issym():
                link = str(PurePosixPath(member.name).parent / member.linkname)
                if member.linkname.startswith("/"):
                    link = member.linkname
            elif member.islnk():
                link = member.linkname
            found.append((member.name, link))
        return found


# -- modules ---------------------------------------------------------------------------------


def standard(module: str, also: Iterable[str] = ()) -> bool:
    """Whether `module` needs no support package: the standard library, a target package, or
    one of `also` (top-level names)."""
    top = module.split(".", 1)[0]
    return (
        top in sys.stdlib_module_names
        or top in TARGET_PACKAGES
        or top == "__future__"
        or top in also
    )


@dataclass(frozen=True)
class ImportRule:
    """The third-party modules inserted code may import with no support package: the target
    packages, and with a release at hand (`vllm`, its version) the import names of vLLM's
    declared requirements, read from the dist-infos in `where`."""

    vllm: str | None
    where: str  # the folder read, or why no release is at hand
    modules: frozenset[str] = frozenset()  # import names of vLLM's requirements

    def describe(self) -> str:
        if self.vllm is None:
            return (
                f"the standard library and {', '.join(TARGET_PACKAGES)} only ({self.where};"
                " give --target DIR, a site-packages holding vLLM's dist-info, to allow its"
                " declared requirements)"
            )
        return (
            f"the standard library, {', '.join(TARGET_PACKAGES)} and the {len(self.modules)}"
            f" modules of vLLM {self.vllm}'s requirements (its dist-info in {self.where})"
        )


def import_rule(site_packages: Path | None, why: str = "no vLLM release at hand") -> ImportRule:
    """The rule for `site_packages` (a folder holding vLLM's ``*.dist-info``): each
    Requires-Dist of its METADATA whose marker holds here with no extra, as import names: the
    requirement's own dist-info's top_level.txt when it is installed there and has one, else
    its normalised name (``prometheus-client``: ``prometheus_client``). None, or no vLLM
    dist-info there: today's rule (`why` says so)."""
    if site_packages is None:
        return ImportRule(None, why)
    # packaging's requirement parser only here: its imports cost ~5 ms at every registry load
    from packaging.requirements import InvalidRequirement, Requirement  # noqa: PLC0415
    from packaging.utils import canonicalize_name  # noqa: PLC0415

    infos: dict[str, Path] = {}
    for folder in sorted(site_packages.glob("*.dist-info")):
        infos.setdefault(canonicalize_name(folder.name.split("-", 1)[0]), folder)
    if "vllm" not in infos:
        return ImportRule(None, f"{site_packages} holds no vllm dist-info")
    import importlib.metadata  # noqa: PLC0415 -- 10 ms at every registry load otherwise

    vllm = importlib.metadata.PathDistribution(infos["vllm"])
    modules: set[str] = set()
    for line in vllm.requires or []:
        try:
            requirement = Requirement(line)
        except InvalidRequirement:
            continue
        if requirement.marker is not None and not requirement.marker.evaluate({"extra": ""}):
            continue
        name = canonicalize_name(requirement.name)
        own = infos.get(name)
        listed = (
            None
            if own is None
            else importlib.metadata.PathDistribution(own).read_text("top_level.txt")
        )
        tops = [t.strip() for t in (listed or "").splitlines() if _TOP.match(t.strip())]
        modules.update(tops or [name.replace("-", "_")])
    return ImportRule(vllm.version, str(site_packages), frozenset(modules))


def provider(module: str, packages: Iterable[SupportPackage]) -> SupportPackage | None:
    top = module.split(".", 1)[0]
    return next((p for p in packages if top in p.modules), None)


def module_problems(patch: Patch, packages: Sequence[SupportPackage]) -> list[RegistryError]:
    """`requires_modules` of the patch and its sites that no support package provides."""
    offered = sorted({m for p in packages for m in p.modules})
    hint = f"; support packages provide {', '.join(offered)}" if offered else ""
    where = f"add patches/{SUPPORT_FOLDER}/<name>/{SUPPORT_FILE} providing it{hint}"
    declared = [(patch.folder / PATCH_FILE, "requires_modules", m) for m in patch.requires_modules]
    declared += [
        (patch.folder / variant.name, f"site[{index}].requires_modules", module)
        for variant in patch.variants
        for index, site in enumerate(variant.sites)
        for module in site.requires_modules
    ]
    return [
        _keyed(f"{key}: {module!r} is provided by no support package ({where})", path, key)
        for path, key, module in declared
        if not standard(module) and provider(module, packages) is None
    ]


def _keyed(message: str, path: Path, key: str) -> RegistryError:
    error = RegistryError(message, path=path)
    error.key = key
    return error


def imported_modules(source: str) -> list[tuple[int, str]]:
    """The absolute modules `source` imports (line, dotted name), read with `ast` (a site's
    text is a fragment: dedented, and read line by line when it does not parse whole)."""
    flush = source[:1] not in ("", " ", "\t", "\n", "\r", "\f")  # a module: dedent is a no-op
    text = source if flush else textwrap.dedent(source)
    tree = parsed(text)  # a python patch's module: the parse its load made (kernel.touches)
    if tree is not None:
        return sorted(_imports(tree))
    found: list[tuple[int, str]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            tree = ast.parse(line.strip())
        except (SyntaxError, ValueError):
            continue
        found += [(number, module) for _, module in _imports(tree)]
    return found


# The fields of a statement holding statements: imports are statements, so only these are
# walked (never an expression's nodes, most of a big module's tree).
_BLOCKS = ("body", "orelse", "finalbody", "handlers", "cases")


def _imports(tree: ast.AST) -> list[tuple[int, str]]:
    found: list[tuple[int, str]] = []
    todo = [tree]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.append((node.lineno, node.module))
        else:
            for name in _BLOCKS:
                block = getattr(node, name, None)
                if isinstance(block, list):
                    todo += block
    return found


def import_problems(
    patch: Patch, packages: Sequence[SupportPackage], rule: ImportRule | None = None
) -> list[RegistryError]:
    """The imports in the patch's inserted text (each site's `text` and its alternatives', a
    python patch's module) of modules nothing provides (by `rule`: without one, the target
    packages only), or that a support package provides but the patch (or the site) does not
    declare in `requires_modules`."""
    found: list[RegistryError] = []
    declared = set(patch.requires_modules)
    allowed = rule.modules if rule is not None else frozenset()
    said = f"; allowed without one: {rule.describe()}" if rule is not None else ""

    def judge(
        source: str, path: Path, key: str | None, also: Iterable[str], had: Iterable[str] = ()
    ) -> None:
        names = declared | set(also)
        for line, module in imported_modules(source):
            if standard(module) or module in had:  # the file imported it already
                continue
            owner = provider(module, packages)
            if owner is None and standard(module, allowed):
                continue  # one of vLLM's requirements: its processes have it
            near = f" (line {line} of the text)"
            if owner is None:
                message = (
                    f"imports {module!r}{near}, which no support package provides and vLLM's"
                    f" processes do not have (add patches/{SUPPORT_FOLDER}/<name>/{SUPPORT_FILE}"
                    f"){said}"
                )
            elif not any(module == n or module.startswith(f"{n}.") or n.startswith(f"{module}.")
                         for n in names):  # fmt: skip
                message = (
                    f"imports {module!r}{near} from support package {owner.name!r}: declare it"
                    " in requires_modules"
                )
            else:
                continue
            found.append(_keyed(f"{key}: {message}" if key else message, path, key or ""))

    for variant in patch.variants:
        path = patch.folder / variant.name
        if patch.kind == "python":
            judge(path.read_text(encoding="utf-8"), path, None, ())
        for index, site in enumerate(variant.sites):
            texts = [site.text, *(alt.text for alt in site.alternatives if alt.text)]
            had = [m for _, m in imported_modules(site.anchor)]  # what the anchor imports
            for text in texts:
                judge(text, path, f"site[{index}].text", site.requires_modules, had)
    return found
