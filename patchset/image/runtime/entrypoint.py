"""The patched image's entrypoint: check build patches, apply startup patches, exec vllm serve.

Runs inside the image with nothing but Python's standard library and patchset's own
standard-library kernel (`patchset.kernel`, copied beside it as the package `patchset_kernel`).
It touches only the files its manifest names, and checks each file's sha256 before and after.
The same file runs from a bundle made by `patchset runtime export`, mounted read-only into the
stock image (manifest ``"delivery": "stock"``): there it applies the build patches too.

    python3 /opt/patchset/entrypoint.py [vllm serve arguments...]
    python3 /opt/patchset/entrypoint.py --verify      # JSON report, exit 0 when all present
    python3 /opt/patchset/entrypoint.py --prove [args...]  # a start without the exec: JSON

`--prove` (what `patchset verify IMAGE --start/--bundle` runs in a throwaway container) does
all a start does, the startup patches written and every applied patch's `[[verify]]` run,
then prints the JSON report instead of exec'ing vllm serve.

Every file is planned in memory first (patched, sha256-checked, compiled with this Python),
then written by rename; what decides whether and how each patch runs (its switch, predicate,
modules, failure policy and proof) is `patchset_kernel.startup`. Environment: docs/stock-image.md;
PATCHSET_MANIFEST, PATCHSET_VLLM_ROOT and PATCHSET_EXEC override the manifest path, the vLLM
folder and the program exec'd (for tests).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

HERE = Path(__file__).resolve().parent


# An exported bundle (it has payloads/) lives in the user's folder, mounted read-only as the
# docs say, or by mistake read-write: never leave root-owned __pycache__ there; its bytecode
# goes to the container's /tmp instead (a restarted container starts from it). In a built
# image /opt/patchset is the image's own: its bytecode is cached in the container's layer.
def _private_cache() -> str | None:
    """A folder only this user can write (made 0700, never through a symlink), else None."""
    path = Path(os.environ.get("PATCHSET_PYCACHE") or tempfile.gettempdir()) / f"ps-{os.getuid()}"
    with contextlib.suppress(OSError):
        path.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = path.lstat()
        if stat.S_ISDIR(info.st_mode) and info.st_uid == os.getuid() and not info.st_mode & 0o077:
            return str(path)
    return None


if (HERE / "payloads").is_dir():
    sys.pycache_prefix = _private_cache()
    sys.dont_write_bytecode = sys.pycache_prefix is None
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

if TYPE_CHECKING:  # the same files, checked where they live in the source tree
    from patchset.kernel import gpus as gpu_query
    from patchset.kernel import modelconfig, stack, startup, switchnames, tree, vllm
    from patchset.kernel.capability import Capability, in_scope
    from patchset.kernel.hunks import split_text
    from patchset.kernel.manifest import (
        Manifest,
        ManifestError,
        PatchEntry,
        StartOutcome,
        StartReport,
    )
    from patchset.kernel.order import in_order
    from patchset.kernel.predicates import Facts, installed_versions
    from patchset.kernel.sites import check_site, served_from_args
    from patchset.kernel.touches import resolve
else:
    from patchset_kernel import gpus as gpu_query
    from patchset_kernel import modelconfig, stack, startup, switchnames, tree, vllm
    from patchset_kernel.capability import Capability, in_scope
    from patchset_kernel.hunks import split_text
    from patchset_kernel.manifest import (
        Manifest,
        ManifestError,
        PatchEntry,
        StartOutcome,
        StartReport,
    )
    from patchset_kernel.order import in_order
    from patchset_kernel.predicates import Facts, installed_versions
    from patchset_kernel.sites import check_site, served_from_args
    from patchset_kernel.touches import resolve

MANIFEST = HERE / "manifest.json"
REFUSED = startup.START_REFUSED  # the container start was refused
PLUGIN_GROUP = "vllm.general_plugins"
SKIPS = ("skipped", "upstream")  # sites rightly left out (optional, `when`, their probe)


class PatchFailedError(Exception):
    """One patch could not be verified or applied."""


class StartRefusedError(Exception):
    """The start cannot go on as asked: no manifest, another vLLM release, an unknown id."""


TEMP_SUFFIX = ".patchset-new"  # the new bytes, beside the file, until the rename


def vllm_root() -> Path:
    override = os.environ.get("PATCHSET_VLLM_ROOT")
    if override:
        return Path(override)
    try:
        return vllm.find_installed()
    except vllm.NotATargetError:
        raise StartRefusedError("no vllm package is importable in this image") from None


def check_root(root: Path) -> None:
    """vLLM's package folder is a real folder: through a symlink the start would write
    wherever it leads."""
    package = root / "vllm"
    if package.is_symlink():
        raise StartRefusedError(f"{package} is a symlink; refusing to patch through it")
    if not package.is_dir():
        raise StartRefusedError(f"{package} is not a folder")


Plan = stack.Files  # vLLM's files as found and as this start's patches leave them


def _compiles(rel: str, data: bytes, *, before: bytes | None = None) -> None:
    """Compile a patched file with this (the image's own) Python, in memory: no .pyc."""
    if (problem := stack.compile_problem(rel, data, before)) is not None:
        raise PatchFailedError(problem)


def check_build_patch(
    patch: PatchEntry,
    plan: Plan,
    *,
    compile_check: bool,
    served: dict[str, str] | None = None,
) -> str:
    """A patch applied at build: its files are the ones built (the manifest's targets), or
    hold startup patches of an earlier start on top of them."""
    for rel in patch.files:
        found = plan.get(rel)
        if found is None:
            continue  # deleted at build time, and gone: as it should be
        if patch.kind == "runtime":
            lines = split_text(found.decode("utf-8", errors="surrogateescape"))[0]
            for site in patch.sites:
                if site.file != rel:
                    continue
                if check_site(site, lines, served).status not in ("already-applied", *SKIPS):
                    raise PatchFailedError(f"site {site.name} is not in {rel}")
        if compile_check:
            _compiles(rel, found)
    return "present"


def apply_patch(
    patch: PatchEntry, plan: Plan, *, dry_run: bool, served: dict[str, str] | None = None
) -> str:
    """One patch's files, planned: each patched in memory on what the patches before it
    left (each file checked once against its target first); all or none. The files are
    compiled once all patches are in (`Files.compile_blame`)."""
    new_files: dict[str, bytes | None] = {}
    for rel in patch.files:
        data = plan.get(rel)
        if data is None and stack.deletes(patch, rel) and patch.id in plan.found_in.get(rel, ()):
            new_files[rel] = None  # an earlier start deleted it already
            continue
        new_files[rel] = stack.patched_text(patch, rel, data, served)
    for rel, new in new_files.items():
        plan.steps.setdefault(rel, []).append((patch.id, plan.current[rel], new))
    plan.current.update(new_files)
    plan.executable.update(rel for rel in patch.executable if new_files.get(rel) is not None)
    already = [rel for rel in patch.files if patch.id in plan.found_in.get(rel, ())]
    if dry_run:
        return "already-applied" if len(already) == len(patch.files) else "applies"
    if len(already) == len(patch.files):
        return "already-applied"
    return "applied (some files were already patched)" if already else "applied"


def check_plugin(patch: PatchEntry, plan: Plan, *, registered: bool) -> str:
    """A python patch: every name it touches is still in vLLM; with `registered`, vLLM's
    plugin lookup (importlib.metadata, as vllm.plugins does it) finds its entry point."""
    for touch in patch.touches:
        missing = resolve(touch, plan.get)[1]  # as Python's import system finds the name
        if missing is not None and ": " in missing:
            rel, _, name = missing.partition(": ")
            raise PatchFailedError(f"touches {touch}, which {rel} no longer defines {name}")
        if missing is not None:
            raise PatchFailedError(f"touches {touch}, but {missing} is missing")
    if not registered:
        return "plugin (vLLM runs it in each process)"
    import importlib.metadata  # noqa: PLC0415 - 60 ms at every start otherwise; --verify only

    found = [
        ep for ep in importlib.metadata.entry_points(group=PLUGIN_GROUP) if ep.name == patch.id
    ]
    if len(found) != 1:
        raise PatchFailedError(f"{len(found)} {PLUGIN_GROUP} entry points named {patch.id}")
    try:
        found[0].load()
    except Exception as exc:
        raise PatchFailedError(f"entry point {found[0].value} does not load: {exc}") from None
    return f"plugin registered ({PLUGIN_GROUP}: {found[0].name} = {found[0].value})"


def check_plugin_files(manifest: Manifest, root: Path) -> None:
    """The plugin distribution vLLM imports in each of its processes, and the support
    packages, are the ones the manifest names, file by file: none missing, none different,
    none added (plugins under plugins/ in a bundle, in vLLM's site folder in a built image;
    its entry_points.txt is one of them, so an entry point added to it is refused)."""
    base = HERE / "plugins" if manifest.delivery == "stock" else root
    if manifest.delivery == "stock":
        folders = [base] if base.is_dir() else []
    else:
        folders = [base / top for top in sorted({rel.split("/")[0] for rel in manifest.plugins})]
    try:
        startup.check_files(HERE, manifest.support, [HERE / "support"], "support")
        startup.check_files(base, manifest.plugins, folders, "plugin")
    except ValueError as exc:
        raise StartRefusedError(str(exc)) from None


def check_payload(patch: PatchEntry) -> None:
    """A stock bundle carries each payload beside the manifest: it must be the one exported."""
    path = HERE / "payloads" / patch.id / patch.variant
    if not path.is_file():
        raise PatchFailedError(f"payload {path} is missing from the bundle")
    if tree.sha256(path.read_bytes()) != patch.payload_sha256:
        raise PatchFailedError(f"payload {path} differs from the one exported (sha256)")


def series(manifest: Manifest) -> list[PatchEntry]:
    """The manifest's patches in the order they go in: each after those it `requires` (the
    order the build wrote them in; the same rule as patchset's engine)."""
    return in_order(list(manifest.patches), lambda p: p.id, lambda p: p.requires)


def release_check(manifest: Manifest, root: Path) -> str:
    """The vLLM release in this image is the one the manifest was made for."""
    read = vllm.read_version(root)
    found = read[0] if read else None
    wanted = manifest.vllm
    if found is None:
        raise StartRefusedError(f"cannot tell which vLLM release is at {root}")
    if found.split("+")[0] != wanted:
        raise StartRefusedError(
            f"this bundle is for vLLM {wanted}, but the image holds vLLM {found}"
            f" ({root}); export one for {found}"
        )
    said = installed_versions(root, ["vllm"]).get("vllm")  # the dist-info, read as text
    if said is not None and said.split("+")[0] != found.split("+")[0]:
        raise StartRefusedError(
            f"{read[1] if read else root} says vLLM {found}, but its dist-info says {said}:"
            " this is not one installed release"
        )
    return found


@dataclass(frozen=True)
class Here:
    """What every patch of a start is planned against."""

    stock: bool
    verify: bool
    served: dict[str, str]
    gpus: list[Capability]
    gpu: str  # how the GPUs were found, for the lines


def plan_one(
    patch: PatchEntry,
    plan: Plan,
    run: startup.Run,
    out: dict[str, str],
    here: Here,
) -> str:
    """One patch that its switches, predicate and requirements let in: checked, and planned
    in memory (its files or its plugin); its state."""
    scope = patch.compute_capability
    fits = all(in_scope(scope, c) for c in here.gpus) if here.gpus else in_scope(scope, None)
    if here.stock:
        check_payload(patch)
    if patch.edits_sha256 and patch.edits_sha256 != patch.edits_digest():
        raise PatchFailedError(
            "its edits in the manifest differ from the ones exported (sha256): the result"
            " differs from the one checked at export"
        )
    if (problem := startup.import_problem(patch.requires_modules)) is not None:
        raise PatchFailedError(problem)
    if patch.kind == "python":
        state = check_plugin(patch, plan, registered=here.verify)
        if fits or here.verify:
            run.plugins.append(patch.id)
            return state
    elif patch.apply == "build" and not here.stock:
        state = check_build_patch(patch, plan, compile_check=here.verify, served=here.served)
        return state if fits else f"{state} (built in; scope cc {scope}, this GPU: {here.gpu})"
    elif fits or here.verify:
        return apply_patch(patch, plan, dry_run=here.verify, served=here.served)
    out[patch.id] = "which is skipped on this GPU"
    return f"skipped (scope cc {scope}, this GPU: {here.gpu})"


def run_patches(
    manifest: Manifest, *, verify: bool, extra_args: list[str]
) -> tuple[startup.Run, Plan]:
    """Check, plan and (unless `verify`) write every patch, each by its switch, predicate,
    modules and failure policy; the python patches selected. A patch that breaks a file's
    compile fails by its policy, and the plan is made again without it."""
    root = vllm_root()
    check_plugin_files(manifest, root)
    try:
        gpus, names, gpu, driver = gpu_query.detect(os.environ.get("PATCHSET_COMPUTE_CAPABILITY"))
        left_out = startup.selection(manifest, os.environ)
    except ValueError as exc:
        raise StartRefusedError(str(exc)) from None
    switchnames.at_start(HERE / switchnames.FILE, manifest, os.environ)  # aliases mapped
    served = served_from_args([*manifest.serve_args, *extra_args])
    model = modelconfig.at_start(served, [*manifest.serve_args, *extra_args], manifest.patches)
    served, known = model.served, model.into(startup.facts(model.served, gpus, names, root, driver))
    where = Here(manifest.delivery == "stock", verify, served, gpus, gpu)
    broken: dict[str, str] = {}
    while True:
        run, plan = _attempt(manifest, root, left_out, known, where, broken)
        more = {k: v for k, v in plan.compile_blame().items() if k not in broken}
        if not more:
            break
        broken.update(more)
    plan.settle()  # patches an earlier start left in, off at this one, come out
    run.results.insert(0, StartOutcome("gpu", "-", gpu))
    return run, plan


def _attempt(  # noqa: PLR0917 - the start's parts, named at the one call
    manifest: Manifest,
    root: Path,
    left_out: dict[str, str],
    known: Facts,
    where: Here,
    broken: dict[str, str],
) -> tuple[startup.Run, Plan]:
    """One pass over the patches in order; those in `broken` fail with their reason."""
    patches = series(manifest)
    plan, run = files_of(manifest, root, patches), startup.Run()
    out: dict[str, str] = {}  # the patches not in at this start, and why
    stock = where.stock
    for patch in patches:
        name = f"{patch.id} r{patch.revision}"
        policy, why = startup.policy_for(patch, os.environ)
        try:
            state = startup.held_back(patch, left_out, out, stock=stock) or _gate(
                patch, known, out, stock
            )
            if state is not None:
                run.results.append(StartOutcome(name, patch.apply, state))
                continue
            if patch.id in broken:
                raise PatchFailedError(broken[patch.id])
            state = plan_one(patch, plan, run, out, where)
            if patch.id not in out:
                run.applied.append(patch)
            failed = False
        except (PatchFailedError, stack.StackError, OSError, UnicodeError) as exc:
            failed, out[patch.id] = True, "which failed"
            if policy == "warn":
                run.warned.append(patch.id)
                state = f"FAILED ({why}: left out, the start goes on): {exc}"
            else:
                run.ok, state = False, f"FAILED: {exc}"
        run.results.append(StartOutcome(name, patch.apply, state, not failed or policy == "warn"))
    return run, plan


def files_of(manifest: Manifest, root: Path, patches: list[PatchEntry]) -> Plan:
    """vLLM's files for this start: each checked once against the manifest's target (the
    release's file; in an image, the file as built), the patches an earlier start may have
    left in them known (taken out to find the target: a bundle's every patch, an image's
    startup ones)."""
    stock = manifest.delivery == "stock"
    undo = [p for p in patches if p.kind != "python" and (stock or p.apply != "build")]
    built = frozenset(rel for p in patches if p.apply == "build" and not stock for rel in p.files)
    known = stack.read_units(HERE / stack.UNITS_FILE) if stock else {}  # a bundle's
    return Plan(root, manifest.targets, undo, built, known)


def _gate(patch: PatchEntry, known: Facts, out: dict[str, str], stock: bool) -> str | None:
    """The state of a patch its switch or predicate keeps out at this start (`out` updated),
    or None. A build patch of a built image is in its files whatever they say: only noted."""
    state = startup.switched_off(patch, os.environ) or startup.gated(patch, known)
    if state is None:
        return None
    if patch.apply == "build" and not stock:
        return None  # built in: check_build_patch checks it is there
    out[patch.id] = f"which is {state.split(' (')[0]}"
    return state


def commit(plan: Plan) -> None:
    """Write every planned file by the kernel's rules (`patchset_kernel.tree`, those of
    `patchset apply` and of image builds), all or none."""
    try:
        tree.write_all(
            plan.root,
            plan.changed(),
            plan.original,
            executable=plan.executable,
            suffix=tree.unique_suffix(TEMP_SUFFIX),  # two starts on one tree never share one
        )
    except tree.WriteRefusedError as exc:
        raise PatchFailedError(
            f"{exc}: start the container as the user that owns vLLM's files (root in the"
            " official image), or build an image with `patchset build`"
            if "not writable" in str(exc)
            else str(exc)
        ) from None


def _say(line: str, *, err: bool = False) -> None:
    print(line, file=sys.stderr if err else sys.stdout, flush=True)


def load_manifest() -> Manifest:
    path = Path(os.environ.get("PATCHSET_MANIFEST", str(MANIFEST)))
    try:
        text = path.read_bytes()
    except OSError as exc:
        raise StartRefusedError(
            f"cannot read {path}: {exc.strerror} (is the bundle mounted?)"
        ) from None
    try:
        return Manifest.loads(text)
    except ManifestError as exc:
        raise StartRefusedError(f"{path} is not a usable patchset manifest: {exc}") from None


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    verify = argv[:1] == ["--verify"]
    dry = argv[:1] == ["--prove"]  # a start, reported in JSON, with no exec
    report = verify or dry
    imports = report and argv[1:2] == ["--imports"]  # import every module the start changed
    if imports:
        argv = [argv[0], *argv[2:]]
    program = os.environ.get("PATCHSET_EXEC", "vllm")
    manifest: Manifest | None = None
    refusal, root, version = None, None, "?"
    run, path = startup.Run(), []
    try:
        policy = startup.global_policy(os.environ)
        manifest = load_manifest()
        root = vllm_root()
        check_root(root)
        stock = manifest.delivery == "stock"
        if stock and (HERE / "plugins").is_dir():
            sys.path.insert(0, str(HERE / "plugins"))
        path = [str(HERE / entry) for entry in manifest.support_paths]
        sys.path[:0] = path  # the support packages, for the modules patches declare
        sys.path.append(str(root))
        version = release_check(manifest, root) if stock else manifest.vllm
        if not report and shutil.which(program) is None:
            raise StartRefusedError(f"no {program} program on PATH: nothing to start")
        with tree_lock(root):  # two starts on one tree go one after the other
            run = start_tree(
                manifest,
                root,
                path,
                verify=verify,
                args=argv[1:] if report else argv,
                imports=imports,
            )
    except (
        StartRefusedError,
        PatchFailedError,
        startup.StartInputError,
        tree.TreeLockedError,
    ) as exc:
        refusal, run = str(exc), startup.Run()
        run.ok = False
        policy = "fail" if isinstance(exc, startup.StartInputError) else _policy()
    on, on_digest = stack.on_set([p.id for p in run.applied if p.id not in run.warned])
    if report:
        registry = None if manifest is None else manifest.registry
        found = StartReport(run.ok, registry, refusal, tuple(run.results), on, on_digest)
        print(json.dumps(found.to_json()))
        return 0 if run.ok else 1
    if refusal is None:
        _say(f"patchset: vLLM {version} at {root}; GPU: {run.results[0].state}")
    for result in run.results[1:]:
        _say(f"patchset: {result.patch} ({result.apply}): {result.state}")
    if refusal is None:
        _say(f"patchset: on: {', '.join(on) or 'none'} (set {on_digest})")
    if not run.ok:
        if refusal is not None and policy == "warn" and shutil.which(program) is not None:
            _say(f"patchset: {refusal}; starting vllm unpatched (PATCHSET_ON_FAILURE=warn)",
                 err=True)  # fmt: skip
            return run_vllm(manifest, program, argv, [], [], started)
        reason = refusal or "a patch failed (its policy: fail); vLLM's files are left as they were"
        _say(f"patchset: {reason}; not starting vllm (PATCHSET_ON_FAILURE=warn to go on)",
             err=True)  # fmt: skip
        return REFUSED
    for patch_id in run.warned:
        _say(f"patchset: {patch_id} failed; its policy is warn: starting vllm without it", err=True)
    return run_vllm(manifest, program, argv, run.plugins, path, started)


def tree_lock(root: Path) -> contextlib.AbstractContextManager[None]:
    """The lock on vLLM's folder every start takes (PATCHSET_LOCK_TIMEOUT s of waiting)."""
    try:
        wait = float(os.environ.get("PATCHSET_LOCK_TIMEOUT", "") or 300)
    except ValueError:
        raise startup.StartInputError("PATCHSET_LOCK_TIMEOUT: a number of seconds") from None
    return tree.locked(root / "vllm", timeout=wait)


def start_tree(
    manifest: Manifest,
    root: Path,
    path: list[str],
    *,
    verify: bool,
    args: list[str],
    imports: bool = False,
) -> startup.Run:
    """Plan every patch, write the files (unless `verify`), run the proofs (and with
    `imports`, import every module the start changed): under the lock."""
    run, plan = run_patches(manifest, verify=verify, extra_args=args)
    if run.ok and not verify:
        try:
            commit(plan)
        except (PatchFailedError, OSError) as exc:
            run.ok = False
            run.results.append(StartOutcome("write", "-", f"FAILED: {exc}", ok=False))
    if run.ok:
        if verify:  # only what is in the files already: the rest is proven at start
            run.applied = [p for p in run.applied if run.in_place(p)]
        startup.prove(run, root, path, os.environ)
    if run.ok and imports:
        plugins = [str(HERE / "plugins")] if (HERE / "plugins").is_dir() else []
        startup.prove_imports(
            run,
            startup.changed_modules(run.applied, plan.current),
            root,
            [*plugins, *path],
            os.environ,
        )
    return run


def _policy() -> str:
    try:
        return startup.global_policy(os.environ)
    except startup.StartInputError:
        return "fail"


def run_vllm(  # noqa: PLR0917 - one call site, each argument named there
    manifest: Manifest | None,
    program: str,
    argv: list[str],
    plugins: list[str],
    support: list[str],
    started: float,
) -> int:
    """Exec `program serve` with the manifest's arguments and environment, the support
    packages (and the python patches' plugins, when some were selected) on the import path of
    every vLLM process; returns only when the exec fails (one line, exit 9)."""
    for key, value in ({} if manifest is None else manifest.env).items():
        os.environ.setdefault(key, value)
    os.environ["PATCHSET_ACTIVE_PLUGINS"] = ",".join(plugins)
    stock = manifest is not None and manifest.delivery == "stock"
    entries = list(support)
    if plugins and stock and (HERE / "plugins").is_dir():  # only plugin code that checked out
        entries.insert(0, str(HERE / "plugins"))
    if entries:
        path = os.environ.get("PYTHONPATH")
        os.environ["PYTHONPATH"] = os.pathsep.join([*entries, *([path] if path else [])])
    serve_args = () if manifest is None else manifest.serve_args
    elapsed = (time.perf_counter() - started) * 1000
    _say(f"patchset: ready in {elapsed:.0f} ms; exec {program} serve")
    try:
        os.execvp(program, [program, "serve", *serve_args, *argv])  # noqa: S606 - vllm replaces us
    except OSError as exc:
        _say(f"patchset: cannot start {program}: {exc.strerror}", err=True)
    return REFUSED


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
