"""What decides, at container start, whether and how a patch runs (issue 24's image side).

The image entrypoint calls these for each patch of its manifest, in this order: its switch
(`[switch]`, the definition's default, the variable at start), its predicate (`[applies]`,
three-valued over the facts of this container: Unknown means skipped, and the unknown leaves
are named), the modules it declares (`requires_modules`, imported before the patch counts as
applied), and after the files are written its proof (`[[verify]]`, each check bounded by its
timeout). A failure goes by the patch's policy (`policy_for`).

Standard library only: it ships into images with the rest of the kernel.
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from .manifest import Check, Manifest, PatchEntry, StartOutcome
from .predicates import CUDA_RUNTIMES, Facts, cuda_of, evaluate, installed_versions, switch_word
from .tree import sha256

POLICIES = ("fail", "warn")
START_REFUSED = 9  # the exit status of a refused start (docs/exit-codes.md; ExitCode.START_REFUSED)


class StartInputError(ValueError):
    """A variable of the start holds what it cannot mean; the message is one line."""


def global_policy(environ: Mapping[str, str]) -> str:
    value = environ.get("PATCHSET_ON_FAILURE", "fail").strip().lower() or "fail"
    if value not in POLICIES:
        raise StartInputError(f"PATCHSET_ON_FAILURE={value!r}: use fail or warn")
    return value


def policy_env(patch_id: str) -> str:
    """``PATCHSET_ON_FAILURE_<ID>``: the id upper-cased, '-' (and '.') as '_'."""
    return "PATCHSET_ON_FAILURE_" + patch_id.upper().replace("-", "_").replace(".", "_")


def policy_for(patch: PatchEntry, environ: Mapping[str, str]) -> tuple[str, str]:
    """The policy a failure of `patch` goes by, and where it came from: its
    PATCHSET_ON_FAILURE_<ID>, then its `[failure] env` (fail|warn, or truthy = fail and
    falsy = warn), then its `[failure] policy`, then PATCHSET_ON_FAILURE."""
    own = policy_env(patch.id)
    for name in (own, patch.policy_env):
        raw = environ.get(name) if name else None
        if raw is None or not raw.strip():
            continue
        word = raw.strip().lower()
        if word in POLICIES:
            return word, f"{name}={word}"
        try:
            strict = switch_word(raw)
        except ValueError:
            raise StartInputError(f"{name}={raw!r}: use fail, warn or a switch word") from None
        return ("fail" if strict else "warn"), f"{name}={raw.strip()}"
    if patch.policy is not None:
        return patch.policy, f"its [failure] policy = {patch.policy}"
    policy = global_policy(environ)
    return policy, f"PATCHSET_ON_FAILURE={policy}"


def switched_off(patch: PatchEntry, environ: Mapping[str, str]) -> str | None:
    """The state of a patch its switch turns off at this start (with the line that turns it
    on), or None when it is on."""
    if patch.switch is None:
        return None
    raw = environ.get(patch.switch)
    try:
        value = switch_word(raw)
    except ValueError as exc:
        raise StartInputError(f"{patch.switch}: {exc}") from None
    on = patch.switch_default if value is None else value
    if on:
        return None
    why = "by default" if value is None else f"{patch.switch}={raw}"
    return f"off ({why}; {patch.switch}=1 turns it on)"


def facts(
    served: Mapping[str, str],
    capabilities: Sequence[tuple[int, int]] | None,
    gpu_names: Sequence[str] | None,
    site_packages: Path,
    driver: str | None = None,
) -> Facts:
    """What this container knows: the served configuration (the definition's arguments and
    the start's), the GPUs and the NVIDIA driver (`driver`, from the one nvidia-smi query),
    the versions of torch and triton and the CUDA runtime (their dist-info, never imported)
    and Python. PATCHSET_CUDA_VERSION / PATCHSET_DRIVER_VERSION, when set, win; a CUDA or
    driver nobody says stays unknown (so named)."""
    read = installed_versions(site_packages, ("torch", "triton", *CUDA_RUNTIMES))  # one scan
    versions = {"torch": read.get("torch", ""), "triton": read.get("triton", "")}  # "": absent
    versions["python"] = ".".join(str(n) for n in sys.version_info[:3])
    found = {"cuda": cuda_of(read), "driver": driver}
    for key, name in (("cuda", "PATCHSET_CUDA_VERSION"), ("driver", "PATCHSET_DRIVER_VERSION")):
        value = os.environ.get(name, "").strip() or found[key]
        if value:
            versions[key] = value
    return Facts(
        served=dict(served),
        compute_capability=None if capabilities is None else tuple(capabilities),
        gpu_names=None if gpu_names is None else tuple(gpu_names),
        versions=versions,
    )


def gated(patch: PatchEntry, known: Facts) -> str | None:
    """The state of a patch its predicate keeps out here (false, or unknown: skipped, the
    unknown leaves named), or None when it holds."""
    if patch.applies is None:
        return None
    verdict = evaluate(patch.applies, known)
    if verdict.value is True:
        return None
    if verdict.value is False:
        return f"skipped (applies: {patch.applies.describe()} is false here)"
    return f"skipped (applies: unknown here: {verdict.describe_unknown()})"


def import_problem(modules: Sequence[str]) -> str | None:
    """Import each module (support packages are on sys.path); what failed, or None."""
    for module in modules:
        try:
            importlib.import_module(module)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # SystemExit too: a module must not end the start
            return f"requires module {module}, which does not import: {type(exc).__name__}: {exc}"
    return None


_ATTRIBUTE = """import importlib, sys
module, _, attr = sys.argv[1].partition(":")
value = importlib.import_module(module)
for part in attr.split("."):
    value = getattr(value, part)
"""
_EXPR = """import importlib, sys
m = importlib.import_module(sys.argv[1])
sys.exit(0 if eval(sys.argv[2], {"m": m}) else 3)
"""


def _python(
    argv: Sequence[str], root: Path, path: Sequence[str], timeout: float
) -> subprocess.CompletedProcess[str] | None:
    """`python ARGV` in a fresh interpreter with the support packages and vLLM's folder first
    on its path (the patched files as vLLM will import them), writing no bytecode; None when
    it gives no answer in `timeout` s."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([*path, str(root), *filter(None, [env.get("PYTHONPATH")])])
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    try:
        return subprocess.run(
            [sys.executable, *argv],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired:
        return None


def check_problem(check: Check, root: Path, path: Sequence[str]) -> str | None:
    """Run one `[[verify]]` check; what failed, or None. A file check reads the file; the
    others run in a fresh interpreter (the patched files as vLLM will import them) with the
    support packages and vLLM's folder on its path, killed after the check's timeout."""
    if check.file is not None:
        try:
            text = (root / check.file).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            return f"verify {check.describe()}: {exc.strerror}"
        return None if (check.contains or "") in text else f"verify {check.describe()}: not found"
    if check.attribute is not None:
        argv = ["-c", _ATTRIBUTE, check.attribute]
    else:
        argv = ["-c", _EXPR, check.module or "", check.expr or ""]
    done = _python(argv, root, path, check.timeout)
    if done is None:
        return f"verify {check.describe()}: no answer in {check.timeout:g} s"
    if done.returncode == 0:
        return None
    said = (done.stderr.strip().splitlines() or ["false"])[-1]
    return f"verify {check.describe()}: {said}"


_IMPORT = """import importlib, sys
importlib.import_module(sys.argv[1])
"""


def module_of(rel: str) -> str | None:
    """The module a file of vLLM's tree is (vllm/a/b.py: vllm.a.b; vllm/a/__init__.py:
    vllm.a), or None for what is no module."""
    if not rel.endswith(".py"):
        return None
    parts = rel[: -len(".py")].split("/")
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts) if all(p.isidentifier() for p in parts) else None


def changed_modules(
    applied: Sequence[PatchEntry], current: Mapping[str, bytes | None]
) -> dict[str, list[str]]:
    """Each vLLM module the `applied` patches changed (in `current`, the files as written)
    and each module a python patch touches: the ids of the patches behind it."""
    found: dict[str, list[str]] = {}
    for patch in applied:
        names = [module_of(rel) for rel in patch.files if current.get(rel)]
        names += [touch.partition(":")[0] for touch in patch.touches]
        for module in filter(None, names):
            found.setdefault(module, []).append(patch.id)
    return found


def import_failure(module: str, root: Path, path: Sequence[str], timeout: float) -> str | None:
    """Import `module` in a fresh interpreter (the patched files as vLLM will import them,
    the support packages on its path), killed after `timeout` s: the exception's last line,
    or None when it imports."""
    done = _python(["-c", _IMPORT, module], root, path, timeout)
    if done is None:
        return f"no answer in {timeout:g} s"
    if done.returncode == 0:
        return None
    return (done.stderr.strip().splitlines() or [f"exit status {done.returncode}"])[-1]


def prove_imports(
    run: Run,
    changed: Mapping[str, Sequence[str]],
    root: Path,
    path: Sequence[str],
    environ: Mapping[str, str],
) -> None:
    """Import every module the start changed and every one a python patch touches, each in
    a child process (PATCHSET_IMPORT_TIMEOUT s, default 120); a module that fails fails the
    patches that changed or touch it, by their policy, with the exception's last line.
    `changed`: module -> the ids of the patches behind it."""
    try:
        timeout = float(environ.get("PATCHSET_IMPORT_TIMEOUT", "") or 120)
    except ValueError:
        raise StartInputError("PATCHSET_IMPORT_TIMEOUT: a number of seconds") from None
    failed = {m: why for m in sorted(changed) if (why := import_failure(m, root, path, timeout))}
    for patch in run.applied:
        mine = sorted(m for m, ids in changed.items() if patch.id in ids)
        if not mine:
            continue
        name = f"{patch.id} r{patch.revision}"
        bad = [m for m in mine if m in failed]
        if not bad:
            run.results.append(StartOutcome(name, patch.apply, f"imported {', '.join(mine)}"))
            continue
        problem = f"{bad[0]} does not import: {failed[bad[0]]}"
        _fail(run, patch, "import", problem, environ)


def _fail(run: Run, patch: PatchEntry, what: str, problem: str, environ: Mapping[str, str]) -> None:
    """A proof of `patch` (`what`: import, verify) failed: a warning or a refused start, by
    its policy."""
    name = f"{patch.id} r{patch.revision}"
    policy, why = policy_for(patch, environ)
    if policy == "warn":
        run.warned.append(patch.id)
        run.results.append(StartOutcome(name, patch.apply, f"{what} FAILED ({why}): {problem}"))
    else:
        run.ok = False
        run.results.append(StartOutcome(name, patch.apply, f"{what} FAILED: {problem}", ok=False))


def _ids(name: str, environ: Mapping[str, str]) -> list[str] | None:
    raw = environ.get(name)
    if raw is None or not raw.strip():
        return None
    ids = [part.strip() for part in raw.split(",") if part.strip()]
    if not ids:
        raise ValueError(f"{name}={raw!r} names no patch (give ids, comma-separated)")
    return ids


def selection(manifest: Manifest, environ: Mapping[str, str]) -> dict[str, str]:
    """Why each patch is left out at this start (PATCHSET_DISABLE, PATCHSET_ONLY), by id;
    ValueError for an id the manifest lacks, or a list that names nothing."""
    known = [p.id for p in manifest.patches]
    disabled, only = _ids("PATCHSET_DISABLE", environ), _ids("PATCHSET_ONLY", environ)
    for name, ids in (("PATCHSET_DISABLE", disabled), ("PATCHSET_ONLY", only)):
        unknown = [i for i in ids or [] if i not in known]
        if unknown:
            raise ValueError(
                f"{name} names {', '.join(unknown)}, not in this manifest"
                f" (it holds {', '.join(known) or 'no patch'})"
            )
    out = dict.fromkeys(disabled or [], "disabled (PATCHSET_DISABLE)")
    if only is not None:
        out.update({i: "left out (PATCHSET_ONLY)" for i in known if i not in only})
    return out


def held_back(
    patch: PatchEntry, left_out: Mapping[str, str], out: dict[str, str], *, stock: bool
) -> str | None:
    """Why `patch` stays out at this start: the switches leave it out, or a patch it requires
    is out (`out`: those so far, and why; updated). None: it goes in."""
    if patch.id in left_out:
        state = left_out[patch.id]
        out[patch.id] = f"which is {state}"
        if patch.apply == "build" and not stock:  # an image holds it whatever the start says
            state += ", yet its files are patched (the build)"
        return state
    missing = [r for r in patch.requires if r in out]
    if missing:
        out[patch.id] = "which is skipped too"
        return f"skipped (requires {missing[0]}, {out[missing[0]]})"
    return None


class Run:
    """A start's outcome so far: one line per patch, whether it may go on, what was chosen."""

    def __init__(self) -> None:
        self.results: list[StartOutcome] = []
        self.ok = True
        self.plugins: list[str] = []  # python patches selected for vLLM's processes
        self.applied: list[PatchEntry] = []  # patches in at this start (their proof to run)
        self.warned: list[str] = []  # patches left out by a failure under `warn`

    def in_place(self, patch: PatchEntry) -> bool:
        """Whether `patch`'s files (or plugin) are there already (--verify proves those)."""
        name = f"{patch.id} r{patch.revision}"
        state = next((r.state for r in self.results if r.patch == name), "")
        return state.startswith(("present", "already-applied", "plugin"))


def prove(run: Run, root: Path, path: Sequence[str], environ: Mapping[str, str]) -> None:
    """Run each applied patch's `[[verify]]` (after the files were written, before vllm
    serve): `verified`, or a failure by the patch's policy."""
    for patch in run.applied:
        if not patch.verify:
            continue
        name = f"{patch.id} r{patch.revision}"
        problem = next(
            (p for c in patch.verify if (p := check_problem(c, root, path)) is not None), None
        )
        if problem is None:
            run.results.append(StartOutcome(name, patch.apply, "verified"))
            continue
        _fail(run, patch, "verify", problem, environ)


def check_files(base: Path, files: Mapping[str, str], folders: Sequence[Path], kind: str) -> None:
    """Every file of `files` (relpath under `base` -> sha256) as recorded, and nothing else
    in `folders` (bytecode caches aside); ValueError naming the first that is not."""
    for rel, want in files.items():
        path = base / rel
        data = path.read_bytes() if path.is_file() else None
        if data is None or sha256(data) != want:
            what = "is missing" if data is None else "differs from the one exported (sha256)"
            raise ValueError(f"{kind} file {path} {what}")
    for folder in folders:
        for path in sorted(folder.rglob("*")):
            rel = path.relative_to(base).as_posix()
            if "__pycache__" in path.parts or path.is_dir() or rel in files:
                continue
            raise ValueError(f"{kind} file {path} is not in the manifest")


__all__ = [
    "POLICIES",
    "START_REFUSED",
    "Run",
    "StartInputError",
    "changed_modules",
    "check_files",
    "check_problem",
    "facts",
    "gated",
    "global_policy",
    "held_back",
    "import_failure",
    "import_problem",
    "module_of",
    "policy_env",
    "policy_for",
    "prove",
    "prove_imports",
    "selection",
    "switched_off",
]
