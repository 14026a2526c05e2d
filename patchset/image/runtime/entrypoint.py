"""The patched image's entrypoint: check build patches, apply startup patches, exec vllm serve.

Runs inside the image with nothing but Python's standard library and patchset's own
standard-library kernel (`patchset.kernel`, copied beside it as the package `patchset_kernel`).
It touches only the files its manifest names, and checks each file's sha256 before and after.

    python3 /opt/patchset/entrypoint.py [vllm serve arguments...]
    python3 /opt/patchset/entrypoint.py --verify      # JSON report, exit 0 when all present

Environment: PATCHSET_ON_FAILURE=fail|warn (default fail); PATCHSET_COMPUTE_CAPABILITY=12.0
overrides GPU detection ("none" for no GPU); PATCHSET_MANIFEST, PATCHSET_VLLM_ROOT and
PATCHSET_EXEC override the manifest path, the vLLM folder and the program exec'd (for tests).
"""

from __future__ import annotations

import hashlib
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

HERE = Path(__file__).resolve().parent
if str(HERE) not in sys.path:
    sys.path.insert(0, str(HERE))

if TYPE_CHECKING:  # the same files, checked where they live in the source tree
    from patchset.kernel.hunks import Hunk, apply_hunks, join_text, split_text
    from patchset.kernel.sites import GOOD, Site, apply_site, check_site, served_from_args
else:
    from patchset_kernel.hunks import Hunk, apply_hunks, join_text, split_text
    from patchset_kernel.sites import GOOD, Site, apply_site, check_site, served_from_args

MANIFEST = HERE / "manifest.json"
SKIPS = ("skipped", "upstream")  # sites rightly left out (optional, `when`, their probe)


class PatchFailedError(Exception):
    """One patch could not be verified or applied."""


def sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def vllm_root() -> Path:
    override = os.environ.get("PATCHSET_VLLM_ROOT")
    if override:
        return Path(override)
    spec = importlib.util.find_spec("vllm")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise PatchFailedError("no vllm package is importable in this image")
    return Path(next(iter(spec.submodule_search_locations))).parent


def compute_capability() -> tuple[int, int] | None:
    forced = os.environ.get("PATCHSET_COMPUTE_CAPABILITY")
    if forced is not None:
        if forced.strip().lower() in ("", "none"):
            return None
        major, _, minor = forced.partition(".")
        return int(major), int(minor or 0)
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run(
            [smi, "--query-gpu=compute_cap", "--format=csv,noheader"],
            capture_output=True,
            text=True,
            timeout=10,
            check=True,
        ).stdout.split()
    except (OSError, subprocess.SubprocessError):
        return None
    if not out:
        return None
    major, _, minor = out[0].partition(".")
    return int(major), int(minor or 0)


def in_scope(scope: str | None, capability: tuple[int, int] | None) -> bool:
    """`scope` is a conjunction like ">=12.0" or ">=9.0,<12.0" over major.minor."""
    if not scope:
        return True
    if capability is None:
        return False
    ops = {
        ">=": lambda a, b: a >= b,
        "<=": lambda a, b: a <= b,
        "==": lambda a, b: a == b,
        "!=": lambda a, b: a != b,
        ">": lambda a, b: a > b,
        "<": lambda a, b: a < b,
    }
    for raw in scope.split(","):
        clause = raw.strip()
        op = next(o for o in (">=", "<=", "==", "!=", ">", "<") if clause.startswith(o))
        major, _, minor = clause[len(op) :].strip().partition(".")
        if not ops[op](capability, (int(major), int(minor or 0))):
            return False
    return True


def _hunks(data: list[dict[str, Any]]) -> tuple[Hunk, ...]:
    return tuple(
        Hunk(
            index=h["index"],
            old_start=h["old_start"],
            new_start=h["new_start"],
            lines=tuple((tag, text) for tag, text in h["lines"]),
            section=h.get("section", ""),
            old_eof_newline=h["old_eof_newline"],
            new_eof_newline=h["new_eof_newline"],
        )
        for h in data
    )


def _sites(data: list[dict[str, Any]]) -> list[Site]:
    return [Site.from_dict(site) for site in data]


def patched_text(
    patch: dict[str, Any], rel: str, data: bytes, served: dict[str, str] | None = None
) -> bytes:
    """The file after the patch's edits to it, computed with the engine."""
    lines, eol, eof = split_text(data.decode("utf-8", errors="surrogateescape"))
    if patch["kind"] == "diff":
        result = apply_hunks(lines, _hunks(patch["hunks"][rel]), eof_newline=eof)
        if result.lines is None:
            failed = [h.describe() for h in result.hunks if h.status == "failed"]
            raise PatchFailedError(f"{rel}: {'; '.join(failed)}")
        lines, eof = list(result.lines), result.eof_newline
    else:
        for site in _sites(patch["sites"]):
            if site.file != rel:
                continue
            # `when` reads the image's own serve arguments, as the build did.
            found, lines = apply_site(site, lines, served)
            if found.status not in GOOD:
                raise PatchFailedError(found.describe())
    return join_text(lines, eol, eof).encode("utf-8", errors="surrogateescape")


def write_atomically(path: Path, data: bytes) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        shutil.copymode(path, tmp)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def check_build_patch(
    patch: dict[str, Any], root: Path, served: dict[str, str] | None = None
) -> str:
    for rel, digests in patch["files"].items():
        data = (root / rel).read_bytes() if (root / rel).is_file() else None
        if data is None:
            raise PatchFailedError(f"{rel} is missing")
        if sha256(data) != digests["after"]:
            raise PatchFailedError(f"{rel} is not the file patched at build time (sha256 differs)")
        if patch["kind"] == "runtime":
            lines = split_text(data.decode("utf-8", errors="surrogateescape"))[0]
            for site in _sites(patch["sites"]):
                if site.file != rel:
                    continue
                if check_site(site, lines, served).status not in ("already-applied", *SKIPS):
                    raise PatchFailedError(f"site {site.name} is not in {rel}")
    return "present"


def apply_startup_patch(
    patch: dict[str, Any], root: Path, *, dry_run: bool, served: dict[str, str] | None = None
) -> str:
    """Apply every file of one startup patch, or none: all are checked before any write."""
    planned: dict[Path, bytes] = {}
    already = 0
    for rel, digests in patch["files"].items():
        path = root / rel
        if not path.is_file():
            raise PatchFailedError(f"{rel} is missing")
        data = path.read_bytes()
        current = sha256(data)
        if current == digests["after"]:
            already += 1
            continue
        if current != digests["before"]:
            raise PatchFailedError(f"{rel} differs from the file checked at build time (sha256)")
        new = patched_text(patch, rel, data, served)
        if sha256(new) != digests["after"]:
            raise PatchFailedError(f"{rel}: the result differs from the one checked at build time")
        planned[path] = new
    if not planned:
        return "already-applied"
    if dry_run:
        return "applies"
    for path, new in planned.items():
        write_atomically(path, new)
    for path, new in planned.items():
        if sha256(path.read_bytes()) != sha256(new):
            raise PatchFailedError(f"{path}: read back differs after writing")
    return "applied" if not already else "applied (some files were already patched)"


def run_patches(manifest: dict[str, Any], *, verify: bool) -> tuple[list[dict[str, str]], bool]:
    root = vllm_root()
    capability = compute_capability()
    gpu = "none" if capability is None else f"{capability[0]}.{capability[1]}"
    results: list[dict[str, str]] = []
    ok = True
    served = served_from_args(manifest.get("serve_args", []))
    for patch in manifest["patches"]:
        name = f"{patch['id']} r{patch['revision']}"
        scope = patch.get("compute_capability")
        try:
            if patch["apply"] == "build":
                state = check_build_patch(patch, root, served)
                if not in_scope(scope, capability):
                    state += f" (built in; scope cc {scope}, this GPU: {gpu})"
            elif not in_scope(scope, capability) and not verify:
                state = f"skipped (scope cc {scope}, this GPU: {gpu})"
            else:
                state = apply_startup_patch(patch, root, dry_run=verify, served=served)
        except (PatchFailedError, OSError, UnicodeError) as exc:
            ok = False
            state = f"FAILED: {exc}"
        results.append({"patch": name, "apply": patch["apply"], "state": state})
    return results, ok


def main(argv: list[str]) -> int:
    started = time.perf_counter()
    manifest_path = Path(os.environ.get("PATCHSET_MANIFEST", str(MANIFEST)))
    manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
    verify = argv[:1] == ["--verify"]
    results, ok = run_patches(manifest, verify=verify)
    if verify:
        print(json.dumps({"ok": ok, "registry": manifest["registry"], "results": results}))
        return 0 if ok else 1
    for result in results:
        print(f"patchset: {result['patch']} ({result['apply']}): {result['state']}", flush=True)
    policy = os.environ.get("PATCHSET_ON_FAILURE", "fail")
    if not ok and policy != "warn":
        print(
            "patchset: a patch failed; not starting vllm (PATCHSET_ON_FAILURE=warn to go on)",
            file=sys.stderr,
            flush=True,
        )
        return 1
    program = os.environ.get("PATCHSET_EXEC", "vllm")
    args = [program, "serve", *manifest["serve_args"], *argv]
    elapsed = (time.perf_counter() - started) * 1000
    print(f"patchset: ready in {elapsed:.0f} ms; exec {program} serve", flush=True)
    os.execvp(program, args)  # noqa: S606 - exec is the point: vllm replaces this process
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
