"""What decides at container start whether and how a patch runs (issue 24, the image side),
on a synthetic installed vLLM (the bundle's entrypoint run by this Python, as in
tests/image/test_entrypoint.py; the same on the stand-in image: tests/image/test_runtime_export.py).

One exported bundle of five patches: a switch that is off by default, a predicate on the
served configuration, one on the GPU, a warn-policy patch, a site that imports a support
package (imported at start, and by vLLM's spawned processes), and a failing `[[verify]]`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from patchset.image.export import export_runtime
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.sources.folder import FolderSource
from tests.helpers.synthetic import PATCH_TOML, exported_bundle, make_tree, run_entrypoint
from tests.image.test_image_selection import DEFINITION as BASE_DEFINITION

DEFINITION = (
    BASE_DEFINITION.replace("args = []", 'args = ["--model", "m", "--kv-cache-dtype", "fp8_e4m3"]')
    + "{extra}\n"
)
FILES = {
    "vllm/a.py": "a = 1\n",
    "vllm/b.py": "b = 1\n",
    "vllm/c.py": "c = 1\n",
    "vllm/d.py": "d = 1\n",
    "vllm/e.py": "e = 1\n",
}
SUPPORT = 'name = "psup"\nmodules = ["psup"]\npath = "src"\n'
# The stand-in `vllm`: a spawned process (as vLLM's engine core and workers are) imports the
# patched vllm/e.py, whose inserted site imports the support package, and says what it got.
VLLM = """#!{python}
import json, multiprocessing, sys

def child(queue):
    import vllm.e
    queue.put(vllm.e.FROM_SUPPORT)

if __name__ == "__main__":
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=child, args=(queue,))
    proc.start()
    got = queue.get(timeout=30)
    proc.join()
    print(json.dumps({{"argv": sys.argv[1:], "spawned": got}}))
"""


def site(patch_id: str, file: str, text: str, *, extra: str = "") -> str:
    return (
        f'[[site]]\nname = "s"\nfile = "{file}"\naction = "insert-after"\n'
        f'marker = "patchset: {patch_id}"\nanchor = """\n{FILES[file].strip()}\n"""\n'
        f'text = """\n{text}\n"""\n{extra}'
    )


def add(registry: Path, patch_id: str, file: str, text: str, toml: str = "", **kw: str) -> None:
    folder = registry / patch_id
    folder.mkdir(parents=True)
    head = PATCH_TOML.format(
        id=patch_id, kind="runtime", vllm=">=0.1", when="startup", targets=f'["{file}"]'
    )
    (folder / "patch.toml").write_text(head.replace("[upstream]", toml + "\n[upstream]"))
    (folder / "sites.toml").write_text(site(patch_id, file, text, **kw))


@pytest.fixture(scope="module")
def bundle(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path, Path]:
    tmp = tmp_path_factory.mktemp("semantics")
    registry = tmp / "patches"
    add(registry, "off-default", "vllm/a.py", "A_ON = True",
        '[switch]\nenv = "PS_ENABLE_OFF"\ndefault = false\n')  # fmt: skip
    add(registry, "fp8-only", "vllm/b.py", "B_FP8 = True",
        '[applies]\nkv_cache_dtype = "fp8*"\n')  # fmt: skip
    add(registry, "blackwell", "vllm/c.py", "C_SM12 = True",
        '[applies]\ncompute_capability = ">=12.0"\n')  # fmt: skip
    proof = '[[verify]]\nfile = "vllm/d.py"\ncontains = "D_PATCHED"\n'
    add(registry, "may-fail", "vllm/d.py", "D_PATCHED = True",
        f'[failure]\npolicy = "warn"\n\n{proof}')  # fmt: skip
    add(registry, "uses-support", "vllm/e.py", "from psup import WHERE as FROM_SUPPORT",
        '[[verify]]\nattribute = "vllm.e:FROM_SUPPORT"\n',
        extra='requires_modules = ["psup"]\n')  # fmt: skip
    support = registry / "_support" / "psup"
    (support / "src" / "psup").mkdir(parents=True)
    (support / "support.toml").write_text(SUPPORT)
    (support / "src" / "psup" / "__init__.py").write_text('WHERE = "the support package"\n')
    ids = ["off-default", "fp8-only", "blackwell", "may-fail", "uses-support"]
    definition = DEFINITION.format(patches=json.dumps(ids), extra="")
    bundle, site_folder = exported_bundle(tmp, registry, FILES, definition)
    bin_dir = tmp / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text(VLLM.format(python=__import__("sys").executable))
    (bin_dir / "vllm").chmod(0o755)
    return bundle, site_folder, bin_dir


def start(
    bundle: tuple[Path, Path, Path], *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    folder, site_folder, bin_dir = bundle
    for rel, text in FILES.items():  # a fresh container each time: the stock files
        (site_folder / rel).write_text(text)
    env.setdefault("PATCHSET_COMPUTE_CAPABILITY", "none")
    env.setdefault("PYTHONPATH", str(site_folder))  # the stand-in's vllm, importable
    return run_entrypoint(folder, site_folder, bin_dir, *args, **env)


def states(done: subprocess.CompletedProcess[str]) -> dict[str, str]:
    found: dict[str, str] = {}
    for line in done.stdout.splitlines():
        if line.startswith("patchset: ") and " r1 (startup): " in line:
            name, _, state = line.removeprefix("patchset: ").partition(" r1 (startup): ")
            found.setdefault(name, state)
            if state == "verified" or state.startswith("verify FAILED"):
                found[f"{name}/verify"] = state
    return found


def test_a_default_off_patch_is_off_then_on_by_its_variable(
    bundle: tuple[Path, Path, Path],
) -> None:
    done = start(bundle)
    assert done.returncode == 0, done.stderr
    assert states(done)["off-default"] == "off (by default; PS_ENABLE_OFF=1 turns it on)"
    assert "A_ON" not in (bundle[1] / "vllm/a.py").read_text()
    on = start(bundle, PS_ENABLE_OFF="yes")
    assert states(on)["off-default"] == "applied"
    assert "A_ON = True" in (bundle[1] / "vllm/a.py").read_text()
    off = start(bundle, PS_ENABLE_OFF="0")
    assert states(off)["off-default"].startswith("off (PS_ENABLE_OFF=0;")
    refused = start(bundle, PS_ENABLE_OFF="maybe")
    assert (
        refused.returncode == 9 and "PS_ENABLE_OFF: 'maybe' is not a switch value" in refused.stderr
    )
    assert "A_ON" not in (bundle[1] / "vllm/a.py").read_text()


def test_a_predicate_on_the_served_configuration(bundle: tuple[Path, Path, Path]) -> None:
    """The definition serves an fp8 KV cache: fp8-only is in the bundle and applied; a start
    whose own arguments serve another one leaves it out."""
    done = start(bundle)
    assert states(done)["fp8-only"] == "applied"
    auto = start(bundle, "--kv-cache-dtype", "auto")
    assert states(auto)["fp8-only"] == "skipped (applies: kv_cache_dtype = 'fp8*' is false here)"
    assert json.loads(auto.stdout.splitlines()[-1])["argv"][-2:] == ["--kv-cache-dtype", "auto"]


def test_a_predicate_false_for_the_definition_is_left_out_of_the_export(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    add(registry, "fp8-only", "vllm/b.py", "B_FP8 = True", '[applies]\nkv_cache_dtype = "fp8*"\n')
    (tmp_path / "builds").mkdir()
    definition = tmp_path / "builds" / "0.20.0.toml"
    definition.write_text(
        DEFINITION.format(patches='["fp8-only"]', extra="").replace(
            ', "--kv-cache-dtype", "fp8_e4m3"', ""
        )
    )
    logged: list[str] = []
    export_runtime(
        load_definition(definition),
        load_registry(registry),
        tmp_path / "bundle",
        source=FolderSource(make_tree(tmp_path / "release", FILES, version="0.20.0")),
        log=logged.append,
    )
    assert (
        "fp8-only: applies = kv_cache_dtype = 'fp8*' is false for the definition's served"
        " configuration; left out"
    ) in logged
    assert json.loads((tmp_path / "bundle" / "manifest.json").read_text())["patches"] == []


def test_a_retired_patch_is_never_exported(tmp_path: Path) -> None:
    """A patch retired (by its state, or by `retire_after` below the definition's release) is
    left out of the bundle with a line, and its switch is not in compose.yaml; a deprecated
    one still goes in."""
    registry = tmp_path / "patches"
    add(registry, "gone", "vllm/a.py", "A = 2",
        '[switch]\nenv = "PS_GONE"\n\n[lifecycle]\nstate = "retired"\n')  # fmt: skip
    add(registry, "aged-out", "vllm/b.py", "B = 2",
        '[lifecycle]\nstate = "stable"\nretire_after = "0.19.1"\n')  # fmt: skip
    add(registry, "old-but-here", "vllm/c.py", "C = 2",
        '[lifecycle]\nstate = "deprecated"\nretire_after = "0.20.0"\n')  # fmt: skip
    (tmp_path / "builds").mkdir()
    definition = tmp_path / "builds" / "0.20.0.toml"
    ids = ["gone", "aged-out", "old-but-here"]
    definition.write_text(DEFINITION.format(patches=json.dumps(ids), extra=""))
    logged: list[str] = []
    export_runtime(
        load_definition(definition),
        load_registry(registry),
        tmp_path / "bundle",
        source=FolderSource(make_tree(tmp_path / "release", FILES, version="0.20.0")),
        log=logged.append,
    )
    left_out = [line for line in logged if "never exported or built; left out" in line]
    assert [line.split(":")[0] for line in left_out] == ["gone", "aged-out"], logged
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    assert [p["id"] for p in manifest["patches"]] == ["old-but-here"]
    assert "PS_GONE" not in (tmp_path / "bundle" / "compose.yaml").read_text()
    assert not (tmp_path / "bundle" / "payloads" / "gone").exists()


@pytest.mark.parametrize(
    ("capability", "state"),
    [
        ("12.0", "applied"),
        ("8.6", "skipped (applies: compute_capability = '>=12.0' is false here)"),
        ("none", "skipped (applies: compute_capability = '>=12.0' is false here)"),
    ],
)
def test_a_predicate_on_the_gpu_given_by_the_variable(
    bundle: tuple[Path, Path, Path], capability: str, state: str
) -> None:
    done = start(bundle, PATCHSET_COMPUTE_CAPABILITY=capability)
    assert done.returncode == 0, done.stderr
    assert states(done)["blackwell"] == state


def test_a_warn_policy_failure_serves_without_the_patch(bundle: tuple[Path, Path, Path]) -> None:
    manifest = json.loads((bundle[0] / "manifest.json").read_text())
    assert (
        next(p for p in manifest["patches"] if p["id"] == "may-fail")["failure"]["policy"] == "warn"
    )
    folder, site_folder, bin_dir = bundle
    for rel, text in FILES.items():
        (site_folder / rel).write_text(text)
    (site_folder / "vllm/d.py").write_text("d = 2\n")  # not the release's file
    done = run_entrypoint(folder, site_folder, bin_dir, PATCHSET_COMPUTE_CAPABILITY="none",
                          PYTHONPATH=str(site_folder))  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert states(done)["may-fail"].startswith(
        "FAILED (its [failure] policy = warn: left out, the start goes on): vllm/d.py differs"
    )
    assert "may-fail failed; its policy is warn: starting vllm without it" in done.stderr
    assert states(done)["uses-support"] == "applied"  # the others went in
    assert (site_folder / "vllm/d.py").read_text() == "d = 2\n"
    # the per-patch variable overrides the patch's own policy
    (site_folder / "vllm/d.py").write_text("d = 2\n")
    strict = run_entrypoint(folder, site_folder, bin_dir, PATCHSET_COMPUTE_CAPABILITY="none",
                            PATCHSET_ON_FAILURE_MAY_FAIL="fail")  # fmt: skip
    assert strict.returncode == 9 and states(strict)["may-fail"].startswith("FAILED: vllm/d.py")


def test_a_support_package_reaches_a_spawned_process(bundle: tuple[Path, Path, Path]) -> None:
    manifest = json.loads((bundle[0] / "manifest.json").read_text())
    assert manifest["support_paths"] == ["support/psup"]
    assert (bundle[0] / "support/psup/psup/__init__.py").is_file()
    done = start(bundle)
    assert done.returncode == 0, done.stderr
    assert states(done)["uses-support"] == "applied"
    assert states(done)["uses-support/verify"] == "verified"
    assert json.loads(done.stdout.splitlines()[-1])["spawned"] == "the support package"


def test_a_support_package_that_does_not_import_fails_the_patch(
    bundle: tuple[Path, Path, Path],
) -> None:
    init = bundle[0] / "support/psup/psup/__init__.py"
    original = init.read_bytes()
    try:
        init.write_text("raise RuntimeError('broken')\n")
        done = start(bundle)
    finally:
        init.write_bytes(original)
    assert done.returncode == 9  # its file differs from the export: the start is refused
    assert "support file" in done.stderr and "differs from the one exported" in done.stderr


def test_a_failing_verify_goes_by_the_policy(bundle: tuple[Path, Path, Path]) -> None:
    """may-fail's proof looks for its own text; with a manifest whose check looks for text the
    patch never writes, the proof fails after the files were written: warn serves, fail
    refuses with the reason."""
    path = bundle[0] / "manifest.json"
    original = path.read_text()
    manifest = json.loads(original)
    entry = next(p for p in manifest["patches"] if p["id"] == "may-fail")
    entry["verify"][0]["contains"] = "NEVER_WRITTEN"
    path.write_text(json.dumps(manifest))
    try:
        warned = start(bundle)
        failed = start(bundle, PATCHSET_ON_FAILURE_MAY_FAIL="fail")
    finally:
        path.write_text(original)
    assert warned.returncode == 0, warned.stderr
    assert states(warned)["may-fail/verify"] == (
        "verify FAILED (its [failure] policy = warn): verify vllm/d.py contains 'NEVER_WRITTEN':"
        " not found"
    )
    assert failed.returncode == 9
    assert states(failed)["may-fail/verify"].startswith("verify FAILED: verify vllm/d.py")


def test_compose_lists_every_switch_commented_with_its_default(
    bundle: tuple[Path, Path, Path],
) -> None:
    compose = (bundle[0] / "compose.yaml").read_text()
    assert '      # PS_ENABLE_OFF: "1"  # off-default: off by default\n' in compose


def test_a_module_that_fails_to_import_and_proofs_that_raise_or_hang(tmp_path: Path) -> None:
    """What the start does with a declared module that is carried as exported but fails to
    import (the patch fails by its policy, nothing of it written), a `[[verify]]` whose
    expression raises and one that hangs (killed after its timeout, reported), and the
    patch's own `[failure] env` knob: unset it warns, set truthy it is fatal (club-3090's
    w4a8 rule), and a value that is no policy refuses the start in one line."""
    registry = tmp_path / "patches"
    warn = '[failure]\npolicy = "warn"\nenv = "PS_BROKEN_STRICT"\n'
    add(registry, "needs-broken", "vllm/a.py", "import pbroken", warn,
        extra='requires_modules = ["pbroken"]\n')  # fmt: skip
    hang = '[[verify]]\nmodule = "json"\nexpr = "__import__(\'time\').sleep(60)"\ntimeout = 1\n'
    add(registry, "hangs", "vllm/b.py", "B = 1", f'[failure]\npolicy = "warn"\n\n{hang}')
    boom = '[[verify]]\nmodule = "json"\nexpr = "1 / 0"\n'
    add(registry, "raises", "vllm/c.py", "C = 1", f'[failure]\npolicy = "warn"\n\n{boom}')
    support = registry / "_support" / "pbroken"
    (support / "src" / "pbroken").mkdir(parents=True)
    (support / "support.toml").write_text(SUPPORT.replace("psup", "pbroken"))
    (support / "src" / "pbroken" / "__init__.py").write_text("raise RuntimeError('broken')\n")
    ids = ["needs-broken", "hangs", "raises"]
    definition = DEFINITION.format(patches=json.dumps(ids), extra="")
    folder, site_folder = exported_bundle(tmp_path, registry, FILES, definition)
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\necho serving\n")
    (bin_dir / "vllm").chmod(0o755)
    env = {"PATCHSET_COMPUTE_CAPABILITY": "none"}

    def run(**more: str) -> subprocess.CompletedProcess[str]:
        for rel, text in FILES.items():
            (site_folder / rel).write_text(text)
        return run_entrypoint(folder, site_folder, bin_dir, **env, **more)

    done = run()
    assert done.returncode == 0, done.stderr
    got = states(done)
    assert got["needs-broken"] == (
        "FAILED (its [failure] policy = warn: left out, the start goes on): requires module"
        " pbroken, which does not import: RuntimeError: broken"
    )
    assert (site_folder / "vllm/a.py").read_text() == FILES["vllm/a.py"]  # nothing of it
    assert got["hangs/verify"] == (
        "verify FAILED (its [failure] policy = warn): verify json:"
        " __import__('time').sleep(60): no answer in 1 s"
    )
    assert got["raises/verify"] == (
        "verify FAILED (its [failure] policy = warn): verify json: 1 / 0:"
        " ZeroDivisionError: division by zero"
    )
    assert done.stdout.rstrip().endswith("serving")
    strict = run(PS_BROKEN_STRICT="1")
    assert strict.returncode == 9
    assert states(strict)["needs-broken"].startswith("FAILED: requires module pbroken")
    assert all((site_folder / rel).read_text() == text for rel, text in FILES.items())
    assert states(run(PS_BROKEN_STRICT="warn"))["needs-broken"].startswith(
        "FAILED (PS_BROKEN_STRICT=warn: left out"
    )
    bogus = run(PS_BROKEN_STRICT="maybe")
    assert bogus.returncode == 9
    assert "PS_BROKEN_STRICT='maybe': use fail, warn or a switch word" in bogus.stderr
