"""What a patch means beyond its text (issue 24), the registry side: [switch], [applies],
[failure], requires_modules, [[verify]], [lifecycle], [provenance] and support packages load
into the model; bad input is one line naming the file and key path, exit 2."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from collections.abc import Mapping
from pathlib import Path

import pytest

from patchset import schemas
from patchset.errors import RegistryError
from patchset.kernel.predicates import parse
from patchset.registry import load_registry
from patchset.registry.toml import load_toml
from tests.helpers.cli import cli
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch, make_tree

FULL = """
requires_modules = ["sndr.engines.vllm.middleware"]

[switch]
env = "GENESIS_ENABLE_PN351"
default = false

[applies]
all = [
  { architecture = ["Qwen3Next*", "*Mamba*"] },
  { not = { kv_cache_dtype = "fp8*" } },
  { any = [ { compute_capability = ">=8.6,<9.0" }, { gpu_name = "*5090*" } ] },
  { torch = ">=2.9" },
]

[failure]
policy = "warn"
env = "CLUB_W4A8_STRICT"

[[verify]]
attribute = "vllm.envs:is_set"

[[verify]]
file = "vllm/mod.py"
contains = "line 11 patched"

[[verify]]
module = "vllm.envs"
expr = "m.X == 1"
timeout = 5

[lifecycle]
state = "deprecated"
retire_after = "0.22.0"

[provenance]
collection = "genesis"
repository = "Sandermage/genesis-vllm-patches"
commit = "0123456789abcdef0123456789abcdef01234567"
file = "sndr/engines/vllm/patches/pn351.py"
line = 12
"""


def support_folder(root: Path, name: str = "sndr", modules: str = '["sndr"]') -> Path:
    folder = root / "_support" / name
    (folder / "src" / "sndr" / "engines").mkdir(parents=True)
    (folder / "src" / "sndr" / "__init__.py").write_text("")
    (folder / "src" / "sndr" / "engines" / "__init__.py").write_text("")
    (folder / "support.toml").write_text(f'name = "{name}"\nmodules = {modules}\npath = "src"\n')
    return folder


def registry(tmp_path: Path, extra: str = FULL, *, support: bool = True) -> Path:
    root = tmp_path / "patches"
    folder = add_patch(root, "one", diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    # the new top-level keys go before the first table
    text = toml.read_text()
    head, sep, tail = text.partition("[upstream]")
    top = [line for line in extra.splitlines() if line.startswith("requires_modules")]
    rest = "\n".join(line for line in extra.splitlines() if not line.startswith("requires_modules"))
    toml.write_text(head + "\n".join(top) + "\n" + sep + tail + rest + "\n")
    if support:
        support_folder(root)
    return root


def one_line(tmp_path: Path, root: Path, command: str = "list") -> str:
    result = cli("--registry", root, command, cwd=tmp_path)
    assert result.code == 2, (result.out, result.err)
    lines = result.err.strip().splitlines()
    assert all(line.startswith("patchset: error: ") for line in lines), result.err
    assert "Traceback" not in result.err
    return lines[0]


def test_every_new_key_loads_into_the_model(tmp_path: Path) -> None:
    reg = load_registry(registry(tmp_path))
    (patch,) = reg.patches
    assert patch.switch is not None
    assert (patch.switch.env, patch.switch.default) == ("GENESIS_ENABLE_PN351", False)
    assert patch.switch.line() == "GENESIS_ENABLE_PN351=1"
    assert patch.applies is not None and len(patch.applies.nodes) == 4
    assert (patch.failure.policy, patch.failure.env) == ("warn", "CLUB_W4A8_STRICT")
    assert patch.requires_modules == ("sndr.engines.vllm.middleware",)
    assert [v.kind for v in patch.verify] == ["attribute", "file", "expr"]
    assert patch.verify[2].timeout == 5.0 and patch.verify[0].timeout == 10.0
    assert patch.lifecycle.state == "deprecated"
    assert not patch.lifecycle.retired("0.22.0") and patch.lifecycle.retired("0.22.1")
    assert patch.provenance is not None and patch.provenance.line == 12
    (package,) = reg.support
    assert package.name == "sndr" and package.kind == "folder" and package.modules == ("sndr",)
    assert package.source == tmp_path / "patches" / "_support" / "sndr" / "src"
    shown = patch.to_dict()
    toml = patch.folder / "patch.toml"
    assert shown["switch"] == {"env": "GENESIS_ENABLE_PN351", "default": False}
    assert parse(shown["applies"]) == patch.applies == parse(load_toml(toml)["applies"])
    assert shown["lifecycle"] == {
        "state": "deprecated",
        "retire_after": "0.22.0",
        "superseded_by": None,
    }
    # the patch.toml passes its JSON Schema, and the support.toml its own
    schemas.check_document("patch", load_toml(patch.folder / "patch.toml"), path="patch.toml")
    schemas.check_document("support", load_toml(package.folder / "support.toml"), path="s")


def test_the_support_package_changes_the_registry_digest(tmp_path: Path) -> None:
    root = registry(tmp_path)
    before = load_registry(root).digest
    (root / "_support" / "sndr" / "src" / "sndr" / "extra.py").write_text("X = 1\n")
    assert load_registry(root).digest != before


@pytest.mark.parametrize(
    ("extra", "where", "problem"),
    [
        ("[applies]\narchtecture = 'x'\n", "applies.archtecture", "did you mean 'architecture'"),
        ("[applies]\nany = []\n", "applies.any", "an empty list"),
        ("[applies]\nall = [{ torch = 2 }]\n", "applies.all[0].torch", "got an integer"),
        ("[applies]\nnot = { gpu_count = 'two' }\n", "applies.not.gpu_count", "version clause"),
        ("[switch]\nenv = 'GENESIS-PN351'\n", "switch.env", "not an environment variable name"),
        ("[switch]\nenv = '1ABC'\n", "switch.env", "not an environment variable name"),
        ("[switch]\nenv = 'A'\ndefault = 'no'\n", "switch.default", "expected true or false"),
        ("[failure]\npolicy = 'ignore'\n", "failure.policy", "not one of fail, warn"),
        ("[[verify]]\nfile = 'vllm/x.py'\n", "verify[0].contains", "needs the text"),
        ("[[verify]]\nmodule = 'vllm.envs'\nexpr = 'm.X =='\n", "verify[0].expr", "expression"),
        ("[[verify]]\nattribute = 'a:b'\nfile = 'vllm/x.py'\n", "verify[0]", "exactly one"),
        ("[[verify]]\nattribute = 'a:b'\ntimeout = 9999\n", "verify[0].timeout", "between"),
        ("[lifecycle]\nstate = 'gone'\n", "lifecycle.state", "not one of"),
        ("[lifecycle]\nsuperseded_by = 'nothing-here'\n", "lifecycle.superseded_by", "no patch"),
        ("[provenance]\ncommit = 'abc'\n", "provenance.commit", "40-digit"),
        ('requires_modules = ["genesis.x"]\n', "requires_modules", "no support package"),
        ('requires_modules = ["not a module"]\n', "requires_modules", "dotted module name"),
    ],
)
def test_bad_input_is_one_line_naming_file_and_key(
    tmp_path: Path, extra: str, where: str, problem: str
) -> None:
    root = registry(tmp_path, extra)
    with pytest.raises(RegistryError, match=problem) as caught:
        load_registry(root)
    assert str(caught.value).startswith(f"{root / 'one' / 'patch.toml'}: {where}: ")
    line = one_line(tmp_path, root, "validate")
    assert f"{root / 'one' / 'patch.toml'}: {where}: " in line and problem in line


def test_two_patches_sharing_a_switch(tmp_path: Path) -> None:
    root = registry(tmp_path, "[switch]\nenv = 'SHARED_SWITCH'\n")
    other = add_patch(
        root, "two", diff=MOD_DIFF.replace("mod.py", "two.py"), targets=["vllm/two.py"]
    )
    (other / "patch.toml").write_text(
        (other / "patch.toml").read_text() + "\n[switch]\nenv = 'SHARED_SWITCH'\n"
    )
    with pytest.raises(RegistryError, match="SHARED_SWITCH is already the switch of patch 'one'"):
        load_registry(root)
    line = one_line(tmp_path, root, "validate")
    assert f"{other / 'patch.toml'}: switch.env: " in line


def test_requires_and_conflicts_the_same_id_is_refused(tmp_path: Path) -> None:
    root = registry(tmp_path, "")
    other = add_patch(
        root, "two", diff=MOD_DIFF.replace("mod.py", "two.py"), targets=["vllm/two.py"]
    )
    toml = other / "patch.toml"
    toml.write_text(
        toml.read_text().replace(
            "[upstream]", 'requires = ["one"]\nconflicts = ["one"]\n\n[upstream]'
        )
    )
    with pytest.raises(RegistryError, match="conflicts: one is also in requires"):
        load_registry(root)
    assert "conflicts: one is also in requires" in one_line(tmp_path, root, "validate")


def test_a_site_requiring_a_module_nobody_provides(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    sites = (
        '[[site]]\nname = "s"\nfile = "vllm/run.py"\naction = "insert-after"\n'
        'marker = "patchset: s"\nanchor = "def body(self):"\ntext = "from sndr import x"\n'
        'requires_modules = ["sndr.x"]\n'
    )
    add_patch(root, "rt-x", sites=sites, targets=["vllm/run.py"], when="startup")
    with pytest.raises(RegistryError, match=r"site\[0\]\.requires_modules: 'sndr.x' is provided"):
        load_registry(root)
    support_folder(root)
    (patch,) = load_registry(root).patches
    assert patch.variants[0].sites[0].requires_modules == ("sndr.x",)
    assert patch.modules_needed() == ("sndr.x",)
    assert cli("--registry", root, "validate", cwd=tmp_path).code == 0


def test_validate_flags_imports_nothing_provides_or_nobody_declares(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    sites = (
        '[[site]]\nname = "s"\nfile = "vllm/run.py"\naction = "insert-after"\n'
        'marker = "patchset: s"\nanchor = "def body(self):"\n'
        "text = '''\ntry:\n    from genesis.engines import hook\n    import os, torch.nn\n"
        "except ImportError:\n    pass\n'''\n"
        '\n[[site]]\nname = "t"\nfile = "vllm/run.py"\naction = "insert-after"\n'
        'marker = "patchset: t"\nanchor = "return x"\ntext = "import sndr.engines"\n'
    )
    add_patch(root, "rt-x", sites=sites, targets=["vllm/run.py"], when="startup")
    support_folder(root)
    assert len(load_registry(root).patches) == 1  # loads: the import check is validate's
    result = cli("--registry", root, "validate", "--format", "json", cwd=tmp_path)
    assert result.code == 2
    problems = [p["problem"] for p in json.loads(result.out)["problems"]]
    assert len(problems) == 2, problems
    assert "site[0].text: imports 'genesis.engines' (line 2 of the text)" in problems[0]
    assert "no support package provides" in problems[0]
    assert "site[1].text: imports 'sndr.engines'" in problems[1]
    assert "declare it in requires_modules" in problems[1]
    # declared on the site: fine; the other still flagged
    toml = root / "rt-x" / "sites.toml"
    toml.write_text(toml.read_text() + 'requires_modules = ["sndr.engines"]\n')
    result = cli("--registry", root, "validate", "--format", "json", cwd=tmp_path)
    assert [p["key"] for p in json.loads(result.out)["problems"]] == ["site[0].text"]


def test_a_python_patch_importing_an_undeclared_module(tmp_path: Path) -> None:
    folder = tmp_path / "patches" / "py-x"
    folder.mkdir(parents=True)
    (folder / "patch.toml").write_text(
        'id = "py-x"\ntitle = "t"\ndescription = "d"\nkind = "python"\nrevision = 1\n'
        'vllm = ">=0.1"\napply = "startup"\ntargets = ["vllm/envs.py"]\n'
        'touches = ["vllm.envs:is_set"]\norigin = "o"\ncredit = ["c"]\n'
        '[upstream]\nstate = "unsubmitted"\n'
    )
    (folder / "plugin.py").write_text("import json\nimport mystery.lib\n\ndef apply():\n    pass\n")
    result = cli("--registry", tmp_path / "patches", "validate", cwd=tmp_path)
    assert result.code == 2
    assert "plugin.py: imports 'mystery.lib' (line 2 of the text)" in result.err


def _pinned(root: Path, name: str, data: bytes, sha: str | None = None) -> Path:
    folder = root / "_support" / "pkg"
    folder.mkdir(parents=True)
    (folder / name).write_bytes(data)
    digest = sha or hashlib.sha256(data).hexdigest()
    (folder / "support.toml").write_text(
        f'name = "pkg"\nmodules = ["pkg"]\nfile = "{name}"\nsha256 = "{digest}"\n'
    )
    return folder


def _wheel(members: dict[str, str]) -> bytes:
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as archive:
        for name, text in members.items():
            archive.writestr(name, text)
    return buffer.getvalue()


def test_a_pinned_wheel_and_sdist_load(tmp_path: Path) -> None:
    root = registry(tmp_path, "", support=False)
    _pinned(
        root,
        "pkg-0.1-py3-none-any.whl",
        _wheel({"pkg/__init__.py": "", "pkg-0.1.dist-info/RECORD": ""}),
    )
    (package,) = load_registry(root).support
    assert package.kind == "wheel" and package.modules == ("pkg",)
    other = registry(tmp_path / "b", "", support=False)
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        info = tarfile.TarInfo("pkg-0.1/src/pkg/__init__.py")
        archive.addfile(info, io.BytesIO(b""))
    _pinned(other, "pkg-0.1.tar.gz", buffer.getvalue())
    assert load_registry(other).support[0].kind == "sdist"


@pytest.mark.parametrize(
    ("make", "problem"),
    [
        ("missing-file", "no such file beside support.toml"),
        ("damaged", "is damaged: its sha256 is"),
        ("not-a-zip", "is damaged"),
        ("dotdot", "leads outside the package"),
        ("absolute", "leads outside the package"),
        ("module-absent", "'pkg' is not in"),
        ("symlink-out", "leads outside the package"),
        ("no-toml", "no support.toml"),
        ("both", "either path"),
    ],
)
def test_bad_support_packages(tmp_path: Path, make: str, problem: str) -> None:
    root = registry(tmp_path, "", support=False)
    good = _wheel({"pkg/__init__.py": ""})
    if make == "missing-file":
        folder = _pinned(root, "pkg.whl", good)
        (folder / "pkg.whl").unlink()
    elif make == "damaged":
        _pinned(root, "pkg.whl", good, sha="0" * 64)
    elif make == "not-a-zip":
        _pinned(root, "pkg.whl", b"not a zip")
    elif make == "dotdot":
        _pinned(root, "pkg.whl", _wheel({"pkg/__init__.py": "", "../../evil.py": ""}))
    elif make == "absolute":
        _pinned(root, "pkg.whl", _wheel({"pkg/__init__.py": "", "/etc/evil.py": ""}))
    elif make == "module-absent":
        _pinned(root, "pkg.whl", _wheel({"other/__init__.py": ""}))
    elif make == "symlink-out":
        folder = support_folder(root, "sndr")
        (tmp_path / "secret").write_text("x")
        (folder / "src" / "sndr" / "leak").symlink_to(tmp_path / "secret")
    elif make == "no-toml":
        (root / "_support" / "empty").mkdir(parents=True)
    elif make == "both":
        folder = support_folder(root, "sndr")
        (folder / "support.toml").write_text(
            'name = "sndr"\nmodules = ["sndr"]\npath = "src"\nfile = "x.whl"\nsha256 = "'
            + "0" * 64
            + '"\n'
        )
    with pytest.raises(RegistryError, match=problem):
        load_registry(root)
    line = one_line(tmp_path, root, "validate")
    assert "_support/" in line and problem.split(":", maxsplit=1)[0] in line
    # the other commands go on without it, saying so in one line
    listed = cli("--registry", root, "list", "--format", "json", cwd=tmp_path)
    assert listed.code == 0 and len(json.loads(listed.out)["patches"]) == 1
    (warning,) = listed.err.strip().splitlines()
    assert warning.startswith("patchset: warning: skipped support package '_support/")


# -- apply honours them (issue 24, apply side) -----------------------------------------------


def applied(
    root: Path, target: Path, *args: str, env: Mapping[str, str | None] | None = None
) -> dict[str, tuple[str, str]]:
    result = cli(
        "--registry", root, "apply", "--target", target, "--format", "json", *args, env=env
    )
    assert result.code in (0, 1, 2), result.err
    data = json.loads(result.out)
    return {r["patch"]: (r["outcome"], "; ".join(r["details"])) for r in data["results"]}


def one_patch(tmp_path: Path, extra: str) -> tuple[Path, Path]:
    root = registry(tmp_path, extra, support=False)
    target = make_tree(tmp_path / "tree", {"vllm/mod.py": BODY}, version="0.20.0")
    return root, target


def test_a_default_off_switch_is_skipped_with_the_line_that_turns_it_on(tmp_path: Path) -> None:
    root, target = one_patch(tmp_path, "[switch]\nenv = 'PN351_ON'\ndefault = false\n")
    off = {"PN351_ON": None}
    outcome, why = applied(root, target, "--compute-capability", "none", env=off)["one"]
    assert outcome == "skipped" and "PN351_ON=1 turns it on" in why and "default off" in why
    assert (target / "vllm" / "mod.py").read_text() == BODY
    assert applied(root, target, env={"PN351_ON": " Yes "})["one"][0] == "applied"
    assert "line 11 patched" in (target / "vllm" / "mod.py").read_text()
    assert applied(root, target, env={"PN351_ON": "0"})["one"][0] == "skipped"
    bad = cli("--registry", root, "apply", "--target", target, env={"PN351_ON": "maybe"})
    assert bad.code == 2 and "PN351_ON='maybe'" in bad.err and len(bad.err.splitlines()) == 1
    # asked for by id: it runs, and the row says the switch was off
    (target / "vllm" / "mod.py").write_text(BODY)
    outcome, why = applied(root, target, "--patch", "one", env=off)["one"]
    assert outcome == "applied" and "asked for by id: switched off by PN351_ON" in why


def test_a_default_on_switch_turned_off(tmp_path: Path) -> None:
    root, target = one_patch(tmp_path, "[switch]\nenv = 'PN_DEFAULT_ON'\n")
    assert applied(root, target, env={"PN_DEFAULT_ON": None})["one"][0] == "applied"
    (target / "vllm" / "mod.py").write_text(BODY)
    outcome, why = applied(root, target, env={"PN_DEFAULT_ON": "off"})["one"]
    assert outcome == "skipped" and "default on" in why


def test_predicates_on_served_facts_and_hardware(tmp_path: Path) -> None:
    root, target = one_patch(
        tmp_path,
        "[applies]\nall = [{ quantization = 'gptq*' }, { compute_capability = '>=12.0' }]\n",
    )
    # nothing served given: unknown, skipped, the leaf named
    outcome, why = applied(root, target, "--compute-capability", "12.0")["one"]
    assert outcome == "skipped" and "unknown quantization = 'gptq*'" in why
    outcome, why = applied(
        root, target, "--served", "quantization=awq", "--compute-capability", "12.0"
    )["one"]
    assert outcome == "skipped" and "does not hold" in why
    outcome, why = applied(
        root, target, "--served", "quantization=gptq", "--compute-capability", "8.9"
    )["one"]
    assert outcome == "skipped"
    assert (
        applied(
            root, target, "--served", "quantization=gptq_marlin", "--compute-capability", "12.0"
        )["one"][0]
        == "applied"
    )


def test_versions_are_read_from_the_targets_dist_infos(tmp_path: Path) -> None:
    root, target = one_patch(tmp_path, "[applies]\ntorch = '>=2.9'\n")
    outcome, why = applied(root, target, "--compute-capability", "none")["one"]
    assert outcome == "skipped" and "unknown torch = '>=2.9'" in why
    info = target / "torch-2.8.0+cu128.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.8.0+cu128\n")
    outcome, why = applied(root, target, "--compute-capability", "none")["one"]
    assert outcome == "skipped" and "does not hold" in why
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: torch\nVersion: 2.9.1+cu130\n")
    assert applied(root, target, "--compute-capability", "none")["one"][0] == "applied"


@pytest.mark.parametrize(
    ("extra", "applies"),
    [
        ("[lifecycle]\nstate = 'retired'\n", False),
        ("[lifecycle]\nstate = 'stable'\nretire_after = '0.19.9'\n", False),
        ("[lifecycle]\nstate = 'deprecated'\nretire_after = '0.20.0'\n", True),
    ],
)
def test_a_retired_patch_is_never_applied(tmp_path: Path, extra: str, applies: bool) -> None:
    root, target = one_patch(tmp_path, extra)
    for args in ((), ("--patch", "one")):
        (target / "vllm" / "mod.py").write_text(BODY)
        outcome, why = applied(root, target, *args)["one"]
        assert (outcome == "applied") is applies, why
        if not applies:
            assert "retired" in why and "never applied" in why
    shown = cli("--registry", root, "list", "--format", "json").out
    assert json.loads(shown)["patches"][0]["lifecycle"]["state"] == extra.split("'")[1]


def test_check_judges_every_patch_and_shows_switch_and_lifecycle(tmp_path: Path) -> None:
    extra = (
        "[switch]\nenv = 'PN_CHECKED'\ndefault = false\n[lifecycle]\nstate = 'deprecated'\n"
        "[applies]\ntorch = '>=9'\n"
    )
    root, target = one_patch(tmp_path, extra)
    argv: list[str | Path] = ["--registry", root, "check", "--source", target]
    data = json.loads(cli(*argv, "--format", "json", cwd=tmp_path).out)
    (result,) = data["results"]
    assert result["verdict"] == "needed"  # judged although off, retired-ish and unknown here
    assert data["patches"]["one"] == {
        "switch": {"env": "PN_CHECKED", "default": False},
        "lifecycle": {"state": "deprecated", "retire_after": None, "superseded_by": None},
        "applies": {"torch": ">=9"},
    }
    import jsonschema

    jsonschema.validate(data, schemas.load("check"), cls=jsonschema.Draft202012Validator)
    table = cli(*argv, cwd=tmp_path, env={"COLUMNS": "300"}).out
    assert (
        "one: switch PN_CHECKED (default off); lifecycle deprecated; applies torch = '>=9'" in table
    )


def _release_site(tmp_path: Path) -> Path:
    """A site-packages holding vLLM 0.20.0's real dist-info METADATA (from the release's
    wheel, through the package index source, cached) and two of its requirements installed
    with a top_level.txt naming another import name than the distribution's."""
    from patchset.sources.package_index import IndexSource

    with IndexSource().open("0.20.0") as tree:
        metadata = tree.read("vllm-0.20.0.dist-info/METADATA")
    assert metadata is not None and b"Requires-Dist: prometheus_client" in metadata
    site = tmp_path / "site"
    (site / "vllm-0.20.0.dist-info").mkdir(parents=True)
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_bytes(metadata)
    for dist, version, top in (
        ("pyzmq", "26.2.0", "zmq"),
        ("opencv_python_headless", "4.13.0", "cv2"),
    ):
        info = site / f"{dist}-{version}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
        (info / "top_level.txt").write_text(f"{top}\n")
    return site


@pytest.mark.network  # the release's METADATA, from the cache (downloaded once when empty)
def test_validate_allows_vllms_declared_requirements(tmp_path: Path) -> None:
    """`import prometheus_client` in a site is what vLLM's processes have: with a release at
    hand (--target: its dist-info) validate allows vLLM's Requires-Dist (as import names:
    top_level.txt where installed, else the normalised name); an extra's requirement, an
    unknown module and the distribution's name where its import name differs stay flagged;
    with no release at hand, today's rule holds and the message says so."""
    root = tmp_path / "patches"
    texts = [
        "import prometheus_client",  # Requires-Dist: prometheus_client (no top_level.txt here)
        "from zmq import Context",  # pyzmq: top_level.txt says zmq
        "import cv2",  # opencv-python-headless: top_level.txt says cv2
        "import fastapi.routing",  # fastapi[standard]: the extra is the requirement's own
        "import pyzmq",  # the distribution's name, not an import name it has
        "import tensorizer",  # only in vLLM's `tensorizer` extra
        "import sndr.engines",  # nothing provides it
    ]
    sites = "".join(
        f'[[site]]\nname = "s{i}"\nfile = "vllm/run.py"\naction = "insert-after"\n'
        f'marker = "patchset: s{i}"\nanchor = "def body(self):"\ntext = "{text}"\n\n'
        for i, text in enumerate(texts)
    )
    add_patch(root, "rt-deps", sites=sites, targets=["vllm/run.py"], when="startup")
    site = _release_site(tmp_path)
    result = cli("--registry", root, "validate", "--target", site, "--format", "json", cwd=tmp_path)
    assert result.code == 2, result.err
    report = json.loads(result.out)
    assert report["imports_allowed"] == {"vllm": "0.20.0", "from": str(site)}
    flagged = {p["key"]: p["problem"] for p in report["problems"]}
    assert sorted(flagged) == ["site[4].text", "site[5].text", "site[6].text"], flagged
    assert "vLLM 0.20.0's requirements" in flagged["site[6].text"]
    # no release at hand: the target packages only, and the message says why
    bare = tmp_path / "bare"
    bare.mkdir()
    result = cli("--registry", root, "validate", "--target", bare, "--format", "json", cwd=tmp_path)
    report = json.loads(result.out)
    assert report["imports_allowed"] == {"vllm": None, "from": f"{bare} holds no vllm dist-info"}
    flagged = {p["key"]: p["problem"] for p in report["problems"]}
    assert len(flagged) == len(texts), flagged
    assert "imports 'prometheus_client' (line 1 of the text)" in flagged["site[0].text"]
    assert "holds no vllm dist-info; give --target DIR" in flagged["site[0].text"]
    result = cli("--registry", root, "validate", "--target", tmp_path / "nowhere", cwd=tmp_path)
    assert result.code == 2 and "--target" in result.err and "no such folder" in result.err
