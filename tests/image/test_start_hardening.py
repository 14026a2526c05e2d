"""What the container start takes on trust, and now checks (issue 23, items 6, 13, 17, 30).

The bundle's entrypoint run by this Python on a synthetic installed vLLM (as in
tests/image/test_entrypoint.py), with the manifest or the tree made hostile one way per case. Each
refusal is one line on stderr, exit 9, no traceback, and nothing of vLLM's written; with
PATCHSET_ON_FAILURE=warn a refused manifest starts vLLM unpatched.

Grouped by class: the manifest as data (its shape, its paths, its series), the tree the start
patches (vllm/ a symlink, two release versions), the start's own inputs (PATCHSET_ONLY, the
program to exec), and what a built image says about where it came from.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from patchset.image.manifest import public_source
from patchset.kernel.manifest import Manifest, ManifestError
from tests.engine.test_python_kind import TOML as PROBE_TOML
from tests.helpers.synthetic import (
    BODY,
    MOD_DIFF,
    add_patch,
    exported_bundle,
    run_entrypoint,
    stand_in_vllm,
)

DEFINITION = """\
vllm = "0.20.0"
cuda = "cu130"
base = "patchset-test/base:0.20.0"
repository = "patchset-test/out"
tags = ["{vllm}"]
patches = ["mod-fix"]

[serve]
args = ["--model", "m"]
"""

Setup = tuple[Path, Path, Path]


@pytest.fixture
def setup(tmp_path: Path) -> Setup:
    registry = tmp_path / "patches"
    add_patch(registry, "mod-fix", diff=MOD_DIFF, targets=["vllm/mod.py"], when="startup")
    bundle, site = exported_bundle(tmp_path, registry, {"vllm/mod.py": BODY}, DEFINITION)
    bin_dir = stand_in_vllm(tmp_path / "bin")
    return bundle, site, bin_dir


def start(setup: Setup, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    env.setdefault("PATCHSET_COMPUTE_CAPABILITY", "none")
    bundle, site, bin_dir = setup
    return run_entrypoint(bundle, site, bin_dir, *args, **env)


def files_of(site: Path) -> dict[str, bytes]:
    return {str(p.relative_to(site)): p.read_bytes() for p in site.rglob("*") if p.is_file()}


def refused(done: subprocess.CompletedProcess[str], words: str) -> None:
    assert done.returncode == 9, (done.stdout, done.stderr)
    assert "Traceback" not in done.stderr + done.stdout
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and words in lines[0], done.stderr


def _edit(key_path: list[Any], value: object) -> Callable[[dict[str, Any]], object]:
    def edit(data: dict[str, Any]) -> object:
        node: Any = data
        for key in key_path[:-1]:
            node = node[key]
        if value is _DELETE:
            del node[key_path[-1]]
        else:
            node[key_path[-1]] = value
        return data

    return edit


_DELETE = object()
HUNKS = ["patches", 0, "hunks"]

# -- the manifest as data ---------------------------------------------------------------------

MALFORMED: list[tuple[str, Callable[[dict[str, Any]], object], str]] = [
    ("patches not a list", _edit(["patches"], {"a": 1}), "manifest.patches: a list expected"),
    ("a patch without id", _edit(["patches", 0, "id"], _DELETE), "patches[0].id: missing"),
    ("a patch without files", _edit(["patches", 0, "files"], _DELETE), "patches[0].files: missing"),
    ("hunks a string", _edit([*HUNKS, "vllm/mod.py"], "@@"), "a list of hunks expected"),
    ("no vllm", _edit(["vllm"], _DELETE), "manifest.vllm: missing"),
    ("a revision that is text", _edit(["patches", 0, "revision"], "1"), "an integer expected"),
    ("not an object", lambda data: [data], "manifest: an object expected"),
    (
        "a path with ..",
        lambda d: _rename_file(d, "vllm/../../etc/passwd"),
        "'..' is refused",
    ),
    ("an absolute path", lambda d: _rename_file(d, "/etc/passwd"), "absolute paths are refused"),
    (
        "requires in a circle",
        _edit(["patches", 0, "requires"], ["mod-fix"]),
        "requires go in a circle: mod-fix -> mod-fix",
    ),
    (
        "requires an unknown patch",
        _edit(["patches", 0, "requires"], ["nope"]),
        "requires nope, not in this manifest",
    ),
]


def _rename_file(data: dict[str, Any], new: str) -> object:
    patch = data["patches"][0]
    patch["files"] = {new: patch["files"]["vllm/mod.py"]}
    patch["hunks"] = {new: patch["hunks"]["vllm/mod.py"]}
    return data


@pytest.mark.parametrize(("case", "edit", "words"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_manifest_is_one_line_exit_9(
    setup: Setup, case: str, edit: Callable[[dict[str, Any]], object], words: str
) -> None:
    bundle, site, _ = setup
    path = bundle / "manifest.json"
    path.write_text(json.dumps(edit(json.loads(path.read_text()))))
    before = files_of(site)
    refused(start(setup), words)
    assert files_of(site) == before


def test_a_manifest_nested_100000_deep_is_one_line(setup: Setup) -> None:
    bundle, _site, _ = setup
    (bundle / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    refused(start(setup), "nested too deeply")
    with pytest.raises(ManifestError, match="nested too deeply"):
        Manifest.loads('{"a":' * 70 + "1" + "}" * 70)


def test_warn_starts_vllm_unpatched_on_a_malformed_manifest(setup: Setup) -> None:
    bundle, site, _ = setup
    path = bundle / "manifest.json"
    path.write_text(json.dumps(_edit(["patches"], "x")(json.loads(path.read_text()))))
    before = files_of(site)
    done = start(setup, "--port", "1", PATCHSET_ON_FAILURE="warn")
    assert done.returncode == 0, done.stderr
    assert "starting vllm unpatched (PATCHSET_ON_FAILURE=warn)" in done.stderr
    assert json.loads(done.stdout.splitlines()[-1]) == ["serve", "--port", "1"]
    assert files_of(site) == before


def test_verify_reports_a_malformed_manifest_as_json(setup: Setup) -> None:
    bundle, _, _ = setup
    (bundle / "manifest.json").write_text('{"schema": "patchset.manifest/1"}')
    done = start(setup, "--verify")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"]
    assert "manifest.base: missing" in report["error"]


# -- the tree the start patches ---------------------------------------------------------------


def test_vllm_a_symlink_is_refused(setup: Setup, tmp_path: Path) -> None:
    _, site, _ = setup
    elsewhere = tmp_path / "elsewhere"
    (site / "vllm").rename(elsewhere)
    (site / "vllm").symlink_to(elsewhere, target_is_directory=True)
    before = files_of(elsewhere)
    refused(start(setup), "is a symlink; refusing to patch through it")
    assert files_of(elsewhere) == before


def test_version_and_dist_info_that_disagree_are_refused(setup: Setup) -> None:
    _, site, _ = setup
    metadata = site / "vllm-0.20.0.dist-info" / "METADATA"
    metadata.write_text(metadata.read_text().replace("Version: 0.20.0", "Version: 0.19.1"))
    before = files_of(site)
    refused(start(setup), "says 0.19.1: this is not one installed release")
    assert files_of(site) == before


# -- the start's own inputs -------------------------------------------------------------------


@pytest.mark.parametrize("value", [",", " , ,"])
def test_patchset_only_naming_nothing_is_refused(setup: Setup, value: str) -> None:
    _, site, _ = setup
    before = files_of(site)
    refused(start(setup, PATCHSET_ONLY=value), "names no patch")
    assert files_of(site) == before


def test_a_missing_vllm_program_is_refused_before_writing(setup: Setup) -> None:
    _, site, bin_dir = setup
    (bin_dir / "vllm").unlink()
    before = files_of(site)
    refused(start(setup, PATCHSET_ON_FAILURE="warn"), "no vllm program on PATH")
    assert files_of(site) == before


def test_a_program_that_cannot_be_exec_d_is_one_line(setup: Setup) -> None:
    _, _, bin_dir = setup
    (bin_dir / "vllm").write_bytes(b"\x7fELF not really")
    done = start(setup)
    assert done.returncode == 9 and "Traceback" not in done.stderr
    assert "patchset: cannot start vllm: Exec format error" in done.stderr


# -- what a built image says about where it came from (item 30) -------------------------------


@pytest.mark.parametrize(
    ("remote", "label"),
    [
        (
            "https://user:secret@git.example.test/team/patches.git",
            "https://git.example.test/team/patches.git",
        ),
        ("https://token@git.example.test:8443/p.git?x=1", "https://git.example.test:8443/p.git"),
        ("ssh://git@git.example.test/team/p.git", "ssh://git.example.test/team/p.git"),
        ("git@git.example.test:team/p.git", "git@git.example.test:team/p.git"),
        ("/home/builder/src/patches", None),
        ("file:///home/builder/src/patches", None),
        ("../patches", None),
        (None, None),
    ],
)
def test_the_source_label_is_a_remote_without_credentials(
    remote: str | None, label: str | None
) -> None:
    assert public_source(remote) == label


# -- the plugin code vLLM imports (items 8 and 16) --------------------------------------------

INIT = "plugins/patchset_plugins/__init__.py"


@pytest.fixture
def with_plugin(tmp_path: Path) -> Setup:
    registry = tmp_path / "patches"
    folder = registry / "envs-probe"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(PROBE_TOML)  # touches vllm.envs and vllm.v1.engine
    (folder / "plugin.py").write_text("def apply():\n    pass\n")
    definition = DEFINITION.replace('patches = ["mod-fix"]', 'patches = ["envs-probe"]')
    files = {
        "vllm/envs.py": "def is_set(name):\n    return False\n",
        "vllm/v1/engine/__init__.py": "class EngineCoreRequest:\n    prompt = None\n",
    }
    bundle, site = exported_bundle(tmp_path, registry, files, definition)
    bin_dir = stand_in_vllm(tmp_path / "bin")
    return bundle, site, bin_dir


def test_the_plugin_files_start_as_exported(with_plugin: Setup) -> None:
    done = start(with_plugin)
    assert done.returncode == 0, done.stderr
    assert "envs-probe r1 (startup): plugin" in done.stdout


@pytest.mark.parametrize(
    ("change", "words"),
    [
        (lambda b: (b / INIT).write_text((b / INIT).read_text() + "\nimport os\n"), "differs"),
        (lambda b: (b / INIT).unlink(), "is missing"),
        (lambda b: (b / "plugins/patchset_plugins/extra.py").write_text("x = 1\n"), "not in"),
        (
            lambda b: next((b / "plugins").glob("*.dist-info/entry_points.txt")).write_text(
                "[vllm.general_plugins]\nevil = patchset_plugins.extra:apply\n"
            ),
            "differs",
        ),
    ],
    ids=["edited", "missing", "added", "entry-point-added"],
)
def test_plugin_files_that_do_not_check_out_are_refused(
    with_plugin: Setup, change: Callable[[Path], object], words: str
) -> None:
    bundle = with_plugin[0]
    change(bundle)
    refused(start(with_plugin), words)
    warned = start(with_plugin, PATCHSET_ON_FAILURE="warn")
    assert warned.returncode == 0 and "starting vllm unpatched" in warned.stderr
    # the plugin code that did not check out is not put where vLLM would import it
    assert "PYTHONPATH" not in warned.stdout


def test_verify_flags_an_entry_point_added_to_the_plugin_distribution(with_plugin: Setup) -> None:
    bundle = with_plugin[0]
    points = next((bundle / "plugins").glob("*.dist-info/entry_points.txt"))
    points.write_text(points.read_text() + "evil = os:getcwd\n")
    done = start(with_plugin, "--verify")
    report = json.loads(done.stdout)
    assert done.returncode == 1 and not report["ok"]
    assert "entry_points.txt differs from the one exported (sha256)" in report["error"]


@pytest.mark.parametrize("raised", ["SystemExit(0)", "SystemExit(None)", "GeneratorExit()"])
@pytest.mark.parametrize("policy", ["fail", "warn"])
def test_a_plugin_ending_the_process_goes_by_the_failure_policy(
    tmp_path: Path, raised: str, policy: str
) -> None:
    """`sys.exit(0)` in a plugin's apply() would end vLLM's process with status 0."""
    (tmp_path / "quitter.py").write_text(f"def apply():\n    raise {raised}\n")
    code = (
        "import sys; from patchset.image.runtime import plugins;"
        " plugins.run('quitter', 'quitter'); print('served')"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=False,
        env={"PYTHONPATH": f"{tmp_path}:{Path.cwd()}", "PATCHSET_ON_FAILURE": policy},
    )
    assert "patchset: plugin quitter failed in pid" in done.stderr
    if policy == "warn":
        assert (done.returncode, done.stdout.strip()) == (0, "served")
    else:
        assert (done.returncode, done.stdout) == (9, "")
