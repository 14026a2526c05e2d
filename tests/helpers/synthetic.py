"""Small synthetic registries and trees, only for edge cases the real releases do not show."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from patchset.kernel.manifest import Manifest

from patchset.sources.base import MemoryTree, ReleaseInfo, ReleaseSource

# A small tree and diffs for it, shared by the engine, fault and hostile-input tests.
BODY = "".join(f"line {i}\n" for i in range(1, 21))
OTHER = "alpha\nbeta\ngamma\n"
MOD_DIFF = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -9,5 +9,5 @@
 line 9
 line 10
-line 11
+line 11 patched
 line 12
 line 13
"""
OTHER_DIFF = """\
--- a/vllm/other.py
+++ b/vllm/other.py
@@ -1,3 +1,3 @@
 alpha
-beta
+beta patched
 gamma
"""
# OTHER_DIFF with an edit that still compiles (apply checks a patched .py file compiles)
OTHER_FIX = OTHER_DIFF.replace("beta patched", "beta_patched")
# A quilt-style series on vllm/mod.py: this top patch's context holds MOD_DIFF's line.
ON_TOP = """\
--- a/vllm/mod.py
+++ b/vllm/mod.py
@@ -10,4 +10,4 @@
 line 10
 line 11 patched
-line 12
+line 12 patched too
 line 13
"""

PATCH_TOML = """\
id = "{id}"
title = "synthetic {id}"
description = "a patch made by a test"
kind = "{kind}"
revision = 1
vllm = "{vllm}"
apply = "{when}"
targets = {targets}
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""


def add_patch(
    registry: Path,
    patch_id: str,
    *,
    diff: str | None = None,
    sites: str | None = None,
    targets: list[str],
    vllm: str = ">=0.1",
    when: str = "build",
    tail: str = "",
) -> Path:
    """A synthetic patch folder (`PATCH_TOML`, `tail` appended to it: tables after
    [upstream]) with its diff or sites."""
    folder = registry / patch_id
    folder.mkdir(parents=True)
    kind = "diff" if diff is not None else "runtime"
    quoted = "[" + ", ".join(f'"{t}"' for t in targets) + "]"
    (folder / "patch.toml").write_text(
        PATCH_TOML.format(id=patch_id, kind=kind, vllm=vllm, when=when, targets=quoted) + tail
    )
    if diff is not None:
        (folder / "patch.diff").write_text(textwrap.dedent(diff))
    else:
        assert sites is not None
        (folder / "sites.toml").write_text(textwrap.dedent(sites))
    return folder


def add_keys(registry: Path, patch_id: str, text: str) -> None:
    """Put top-level keys (TOML `text`) into a patch.toml, before its [upstream] table."""
    toml = registry / patch_id / "patch.toml"
    toml.write_text(toml.read_text().replace("[upstream]", f"{text}\n\n[upstream]"))


def make_tree(root: Path, files: dict[str, str], version: str = "0.19.1") -> Path:
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(text.encode())
    return root


def definition_text(
    vllm: str,
    patches: Sequence[str],
    *,
    repository: str = "patchset/vllm-openai",
    tables: str = "",
    args: Sequence[str] = ("--model", "m"),
) -> str:
    """A build definition (builds/<vllm>.toml) for `vllm` listing `patches`, with `tables`
    (TOML, e.g. an [env] table) before its [serve] table."""
    return (
        f'vllm = "{vllm}"\ncuda = "cu130"\nbase = "vllm/vllm-openai:v{vllm}-cu130"\n'
        f'repository = "{repository}"\ntags = ["{{vllm}}-{{cuda}}"]\n'
        f"patches = {json.dumps(list(patches))}\n\n{tables}"
        f"[serve]\nargs = {json.dumps(list(args))}\n"
    )


def exported_bundle(
    tmp_path: Path, registry: Path, files: dict[str, str], definition: str
) -> tuple[Path, Path]:
    """The stock-image route on a synthetic release: `registry` exported for the 0.20.0 build
    `definition` (its text) from a release holding `files`, and a site folder holding the same
    files as an installed vLLM 0.20.0 (its dist-info too). Returns (bundle, site)."""
    from patchset.image.export import export_runtime
    from patchset.registry import load_registry
    from patchset.registry.builds import load_definition
    from patchset.sources.folder import FolderSource

    release = make_tree(tmp_path / "release", files, version="0.20.0")
    site = make_tree(tmp_path / "site", files, version="0.20.0")
    info = site / "vllm-0.20.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: vllm\nVersion: 0.20.0\n")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.20.0.toml").write_text(definition)
    bundle = tmp_path / "bundle"
    build = load_definition(tmp_path / "builds" / "0.20.0.toml")
    export_runtime(build, load_registry(registry), bundle, source=FolderSource(release))
    return bundle, site


def build_manifest(
    patch_id: str, files: list[str], *, executable: tuple[str, ...] = ()
) -> Manifest:
    """A one-patch image manifest of a build-time diff patch touching `files` (digests left
    empty): what `image.build._write_context` reads to lay out a context."""
    from patchset.kernel.manifest import Base, FileDigests, Manifest, PatchEntry

    entry = PatchEntry(
        id=patch_id,
        revision=1,
        kind="diff",
        apply="build",
        variant="patch.diff",
        payload_sha256="",
        verdict="needed",
        files={rel: FileDigests("", "") for rel in files},
        executable=executable,
    )
    return Manifest("image", "0" * 64, "0.20.0", Base("base"), (entry,), vllm_root="/site")


# A stand-in `vllm` program: prints its arguments as JSON (what the entrypoint exec'd it with).
ECHO_VLLM = (
    '#!/bin/sh\nexec "$PYTHON" -c \'import json,sys; print(json.dumps(sys.argv[1:]))\' "$@"\n'
)


def stand_in_vllm(bin_dir: Path, script: str = ECHO_VLLM) -> Path:
    """`bin_dir` made, holding an executable `vllm` running `script` (`ECHO_VLLM`)."""
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(script)
    (bin_dir / "vllm").chmod(0o755)
    return bin_dir


def run_entrypoint(
    bundle: Path, site: Path, bin_dir: Path, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    """A bundle's entrypoint run by this Python on `site`, with `bin_dir` (a stand-in `vllm`)
    first on PATH and `$PYTHON` naming this interpreter."""
    return subprocess.run(
        [sys.executable, str(bundle / "entrypoint.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        env={
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "PYTHON": sys.executable,
            "PATCHSET_VLLM_ROOT": str(site),
            "PATCHSET_PYCACHE": str(bundle.parent / "pycache"),  # not the machine's /tmp
            **env,
        },
    )


class MemoryReleases(ReleaseSource):
    """Releases held in memory (version: {path: text}), oldest first."""

    name = "memory"
    fork_safe = True

    def __init__(self, releases: dict[str, dict[str, str]]) -> None:
        self.releases = releases

    def versions(self) -> list[str]:
        return list(self.releases)

    @contextmanager
    def open(self, version: str) -> Iterator[MemoryTree]:
        files = {rel: text.encode() for rel, text in self.releases[version].items()}
        yield MemoryTree(ReleaseInfo(version, "memory"), files)


# E22: a python patch whose plugin.py the test or benchmark makes big (tests/test_hostile_big.py,
# benchmarks/reliability_report.py --big)
BIG_PLUGIN_TOML = """id = "big-plugin"
title = "A big plugin"
description = "E22: validate of a big plugin.py."
kind = "python"
revision = 1
vllm = ">=0.1"
apply = "startup"
targets = ["vllm/envs.py"]
touches = ["vllm.envs:is_set"]
origin = "tests"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""
