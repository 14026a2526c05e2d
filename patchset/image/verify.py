"""`patchset verify IMAGE`: an image's patches re-checked in a throwaway container.

Two questions, each answered by the image's own entrypoint with no network:

- `verify_image`: is every patch present? (``entrypoint.py --verify``: the build-time patches'
  files and the plugins checked, the startup patches planned without writing; the proofs of
  the patches already in the files run.)
- `prove_start`: what would a start do? (``entrypoint.py --prove``: the whole start, the
  startup patches written into the throwaway container's layer and every applied patch's
  `[[verify]]` run, each failure by its policy; everything but the exec of `vllm serve`.) With
  a bundle (`patchset runtime export`), the bundle is copied to /opt/patchset of a container of
  the stock image, as its read-only mount would show it.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from patchset._plain import fields_dict
from patchset.adapters import dockerengine
from patchset.errors import BuildError, DockerError, UsageError
from patchset.image.manifest import RUNTIME_DIR
from patchset.kernel.manifest import Manifest, ManifestError, StartOutcome, StartReport

_RUN = """import runpy, sys
sys.argv = {argv!r}
try:
    runpy.run_path('{runtime}/entrypoint.py', run_name='__main__')
except SystemExit:
    pass
"""


TIMEOUT = 600.0  # seconds a verification may take before its container is killed


def verify_image(
    engine: dockerengine.Engine, image: str, *, timeout: float = TIMEOUT
) -> StartReport:
    """Re-check, in a throwaway container with no network, that every patch is present."""
    return _report(engine, image, ["entrypoint", "--verify"], {}, {}, timeout=timeout)


def prove_start(
    engine: dockerengine.Engine,
    image: str,
    *,
    bundle: Path | None = None,
    environment: Mapping[str, str] | None = None,
    imports: bool = False,
    timeout: float = TIMEOUT,
) -> StartReport:
    """A start of `image` (with `bundle` at /opt/patchset when given) in a throwaway
    container with no network, up to where it would exec `vllm serve`: its report. With
    `imports`, every vLLM module the start changed (and each a python patch touches) is
    imported in a child process after the files are written. The container is killed after
    `timeout` seconds (an image whose python3 hangs: a DockerError, exit 3)."""
    files = bundle_files(bundle) if bundle is not None else {}
    argv = ["entrypoint", "--prove", *(["--imports"] if imports else [])]
    return _report(engine, image, argv, dict(environment or {}), files, timeout=timeout)


def bundle_files(bundle: Path) -> dict[str, bytes]:
    """The files of an exported bundle, keyed by where they go in the container; a
    UsageError when `bundle` is no export of `patchset runtime export`."""
    manifest = bundle / "manifest.json"
    try:
        delivery = Manifest.loads(manifest.read_bytes()).delivery
    except OSError as exc:
        raise UsageError(f"--bundle {bundle}: no manifest.json ({exc.strerror})") from None
    except ManifestError as exc:
        raise UsageError(f"--bundle {manifest}: not a patchset manifest: {exc}") from None
    if delivery != "stock":
        raise UsageError(f"--bundle {bundle}: not a runtime export (delivery {delivery!r})")
    for part in ("entrypoint.py", "patchset_kernel/__init__.py"):
        if not (bundle / part).is_file():
            raise UsageError(
                f"--bundle {bundle}: no {part}: not a whole runtime export (export it again)"
            )
    return {
        f"{RUNTIME_DIR}/{path.relative_to(bundle).as_posix()}": path.read_bytes()
        for path in sorted(bundle.rglob("*"))
        if path.is_file() and "__pycache__" not in path.parts
    }


def _report(
    engine: dockerengine.Engine,
    image: str,
    argv: list[str],
    environment: dict[str, str],
    files: dict[str, bytes],
    *,
    timeout: float,
) -> StartReport:
    code = _RUN.format(argv=argv, runtime=RUNTIME_DIR)
    try:
        out = engine.run_python(
            image, code, network=False, environment=environment, files=files, timeout=timeout
        )
    except DockerError as exc:
        raise BuildError(f"{image}: verification could not run: {exc}") from exc
    lines = out.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise BuildError(f"{image}: no patchset manifest/runtime in this image")
    try:
        return StartReport.loads(lines[-1])
    except ManifestError as exc:
        raise BuildError(f"{image}: {exc}") from None


@dataclass(frozen=True)
class PatchProof:
    """One patch of a proved start: what became of it, in one word, and its lines."""

    patch: str  # "id rN"
    apply: str
    outcome: str  # verified, failed (warn), failed (fail), or the start's word: applied, off...
    states: tuple[str, ...]

    def to_json(self) -> dict[str, object]:
        return fields_dict(self)


def per_patch(report: StartReport) -> list[PatchProof]:
    """The report's lines gathered per patch (a patch's start line, then its proof's), each
    with its outcome: a failure with its policy (``FAILED (...)``/``verify FAILED (...)`` is
    a failure that `warn` let the start go on from), else `verified` when its proof ran and
    held, else the first word of its state."""
    lines: dict[str, list[StartOutcome]] = {}
    for result in report.results:
        if result.patch not in ("gpu", "write"):
            lines.setdefault(result.patch, []).append(result)
    proofs = []
    for patch, outcomes in lines.items():
        states = tuple(o.state for o in outcomes)
        failed = [o for o in outcomes if o.state.startswith(("FAILED", "verify FAILED"))]
        if failed:
            outcome = "failed (warn)" if all(o.ok for o in failed) else "failed (fail)"
        elif "verified" in states:
            outcome = "verified"
        else:
            outcome = states[0].split(" (")[0].split(":")[0]
        proofs.append(PatchProof(patch, outcomes[0].apply, outcome, states))
    return proofs


def report_json(report: StartReport, *, mode: str) -> dict[str, Any]:
    """`patchset verify --format json`: the entrypoint's report, the mode it ran in
    (``present``: --verify; ``start``: --prove) and, for a start, each patch's outcome."""
    out = {"mode": mode, **report.to_json()}
    if mode == "start":
        out["patches"] = [p.to_json() for p in per_patch(report)]
    return out


def environment_of(pairs: Sequence[str]) -> dict[str, str]:
    """``KEY=VALUE`` pairs (``--env``) as a mapping; a UsageError for one without ``=``."""
    found: dict[str, str] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key:
            raise UsageError(f"--env {pair!r}: give KEY=VALUE")
        found[key] = value
    return found


__all__ = [
    "PatchProof",
    "bundle_files",
    "environment_of",
    "per_patch",
    "prove_start",
    "report_json",
    "verify_image",
]
