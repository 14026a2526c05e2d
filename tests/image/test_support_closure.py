"""Support packages carry what the patches import (issue 35.7): the closure of the modules
the inserted code imports within the package (absolute and relative imports, a module named
to importlib, every package __init__ on the way) and the data files they name, not the whole
tree; the export says what it left out. The bundle's own entrypoint then imports the module
at start (requires_modules), which reads its data: a file missed would fail the patch."""

from __future__ import annotations

import json
from pathlib import Path

from patchset.image.support import closure
from tests.helpers.cli import cli
from tests.helpers.synthetic import (
    add_patch,
    definition_text,
    make_tree,
    run_entrypoint,
    stand_in_vllm,
)

START = "a = 1\nb = 2\nc = 3\n"
PACKAGE = {
    "gpkg/__init__.py": '"""A collection\'s package."""\n',
    "gpkg/engines/__init__.py": "",
    "gpkg/engines/mw.py": """\
import importlib
import os

from . import helpers
from gpkg.util import double

HERE = os.path.dirname(__file__)
TABLE = open(os.path.join(HERE, "data/table.json")).read()
TEMPLATES = sorted(os.listdir(os.path.join(HERE, "templates")))
DYN = importlib.import_module("gpkg.dyn")
VALUE = double(helpers.ONE) + DYN.TWO
""",
    "gpkg/engines/helpers.py": "from ..util import double as _d\nONE = _d(0) + 1\n",
    "gpkg/engines/data/table.json": '{"rows": 3}\n',
    "gpkg/engines/templates/a.jinja": "{{ a }}\n",
    "gpkg/util.py": "def double(x):\n    return 2 * x\n",
    "gpkg/dyn.py": "TWO = 2\n",
    # what no patch imports: a GUI, a CLI
    "gpkg/gui/__init__.py": "import gpkg.cli\n",
    "gpkg/gui/app.js": "console.log('gui');\n" * 200,
    "gpkg/gui/style.css": "body { color: red; }\n" * 100,
    "gpkg/cli.py": "import argparse\n",
}
CARRIED = {
    "gpkg/__init__.py",
    "gpkg/engines/__init__.py",
    "gpkg/engines/mw.py",
    "gpkg/engines/helpers.py",
    "gpkg/engines/data/table.json",
    "gpkg/engines/templates/a.jinja",
    "gpkg/util.py",
    "gpkg/dyn.py",
}
SITES = '''\
[[site]]
name = "s"
file = "vllm/start.py"
action = "insert-after"
marker = "patchset: uses-gpkg"
anchor = """
a = 1
"""
text = """
import gpkg.engines.mw as _mw
"""
requires_modules = ["gpkg.engines.mw"]
'''


def test_closure_in_memory() -> None:
    files = {rel: text.encode() for rel, text in PACKAGE.items()}
    assert closure(files, ["gpkg.engines.mw"], {"gpkg"}) == CARRIED
    assert closure(files, ["gpkg.engines.mw.VALUE"], {"gpkg"}) == CARRIED  # a name in it
    assert closure(files, ["other.mod"], {"gpkg"}) == set()
    assert closure(files, ["gpkg.gui"], {"gpkg"}) == {
        "gpkg/__init__.py",
        "gpkg/gui/__init__.py",
        "gpkg/cli.py",
    }


def test_export_carries_the_closure_and_the_start_imports_it(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    add_patch(registry, "uses-gpkg", sites=SITES, targets=["vllm/start.py"], when="startup")
    support = registry / "_support" / "gpkg"
    for rel, text in PACKAGE.items():
        (support / "src" / rel).parent.mkdir(parents=True, exist_ok=True)
        (support / "src" / rel).write_text(text)
    (support / "README.md").write_text("the package's own notes\n")
    (support / "support.toml").write_text('name = "gpkg"\nmodules = ["gpkg"]\npath = "src"\n')
    release = make_tree(tmp_path / "release", {"vllm/start.py": START}, version="0.20.0")
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.20.0.toml").write_text(definition_text("0.20.0", ["uses-gpkg"]))
    bundle = tmp_path / "bundle"
    done = cli("runtime", "export", bundle, "--build", tmp_path / "builds" / "0.20.0.toml",
               "--registry", registry, "--source", release, "--format", "json")  # fmt: skip
    assert done.code == 0, done.err
    carried = {
        p.relative_to(bundle / "support" / "gpkg").as_posix()
        for p in (bundle / "support" / "gpkg").rglob("*")
        if p.is_file()
    }
    assert carried == CARRIED
    left = {k: v for k, v in PACKAGE.items() if k not in CARRIED}
    size = sum(len(v.encode()) for v in left.values())
    assert json.loads(done.out)["support_left_out"] == {"files": len(left), "bytes": size}
    assert f"support packages: {len(left)} files ({size:,} bytes) that no patch imports" in done.err
    # the start imports gpkg.engines.mw from the bundle (it reads its data file and folder)
    site = make_tree(tmp_path / "site", {"vllm/start.py": START}, version="0.20.0")
    (site / "vllm-0.20.0.dist-info").mkdir()
    (site / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.20.0\n")
    started = run_entrypoint(bundle, site, stand_in_vllm(tmp_path / "bin"))
    assert started.returncode == 0, started.stdout + started.stderr
    assert "patchset: uses-gpkg r1 (startup): applied" in started.stdout
    # the same start without the data file the module reads: the patch fails, by its policy
    (bundle / "support" / "gpkg" / "gpkg" / "engines" / "data" / "table.json").unlink()
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["support"]["support/gpkg/gpkg/engines/data/table.json"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    site2 = make_tree(tmp_path / "site2", {"vllm/start.py": START}, version="0.20.0")
    (site2 / "vllm-0.20.0.dist-info").mkdir()
    (site2 / "vllm-0.20.0.dist-info" / "METADATA").write_text("Name: vllm\nVersion: 0.20.0\n")
    failed = run_entrypoint(bundle, site2, tmp_path / "bin")
    assert failed.returncode == 9
    assert "requires module gpkg.engines.mw, which does not import" in failed.stdout
