"""The JSON Schemas of the files a project writes (patch.toml, sites.toml, builds/*.toml,
[tool.patchset]): what loads passes them, the shape errors the loader refuses they refuse
too, `validate` uses them, `init` points editors at them, and apply's JSON has its own."""

from __future__ import annotations

import ast
import json
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import jsonschema
import pytest

from patchset import schemas
from patchset.cli.main import main
from patchset.errors import RegistryError
from patchset.kernel.predicates import COMBINATORS, LEAVES
from patchset.project import init_project
from tests.helpers.synthetic import make_tree

REPO = Path(__file__).parents[2]
CORPUS = REPO / "tests" / "corpus"

# Corpus files the loader refuses for their shape: the schema must refuse each as well.
SHAPE_ERRORS = [
    "sites-absolute.sites.toml",
    "sites-blank-anchor.sites.toml",
    "sites-dotdot.sites.toml",
    "sites-empty.sites.toml",
    "sites-multiline-marker.sites.toml",
    "sites-not-array.sites.toml",
    "sites-unknown-action.sites.toml",
    "sites-unknown-key.sites.toml",
    "sites-wrong-type.sites.toml",
    "toml-hook-key.patch.toml",
    "toml-id-bool.patch.toml",
    "toml-kind-array.patch.toml",
    "toml-payload-dotdot.patch.toml",
    "toml-payload-escape.patch.toml",
    "toml-revision-bool.patch.toml",
    "toml-revision-string.patch.toml",
    "toml-revision-zero.patch.toml",
    "toml-spec-number.patch.toml",
    "toml-superseded-in.patch.toml",
    "toml-targets-dotdot.patch.toml",
    "toml-targets-int.patch.toml",
    "toml-targets-mixed.patch.toml",
    "toml-title-date.patch.toml",
    "toml-unknown-key.patch.toml",
    "toml-upstream-string.patch.toml",
    "toml-variants-empty.patch.toml",
]
# Corpus files that load: the schema must not be stricter than the loader.
LOADS = ["sites-python-payload.sites.toml", "toml-crlf.patch.toml"]


def kind_of(name: str) -> str:
    return "sites" if name.endswith(".sites.toml") else "patch"


@pytest.mark.parametrize("name", SHAPE_ERRORS)
def test_a_shape_the_loader_refuses_the_schema_refuses(name: str) -> None:
    data = tomllib.loads((CORPUS / name).read_text())
    with pytest.raises(RegistryError, match=rf"^{name}: .*\(JSON Schema {kind_of(name)}\.json\)$"):
        schemas.check_document(kind_of(name), data, path=name)


@pytest.mark.parametrize("name", LOADS)
def test_what_loads_passes_the_schema(name: str) -> None:
    schemas.check_document(kind_of(name), tomllib.loads((CORPUS / name).read_text()), path=name)


def test_every_real_file_passes_and_validate_counts_them(
    capsys: pytest.CaptureFixture[str],
) -> None:
    registry, builds = REPO / "patches", REPO / "builds"
    argv = ["validate", "--registry", str(registry), "--builds", str(builds), "--format", "json"]
    assert main(argv) == 0
    out = json.loads(capsys.readouterr().out)
    patches = list(registry.glob("*/patch.toml"))
    sites = list(registry.glob("*/*sites.toml"))
    assert out["schema_checked"] >= len(patches) + len(sites) + len(list(builds.glob("*.toml")))


def test_validate_names_the_file_and_key_a_schema_refuses(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "patches").mkdir()
    (tmp_path / "builds").mkdir()
    shutil.copy(REPO / "builds" / "0.19.1.toml", tmp_path / "builds" / "x.toml")
    toml = tmp_path / "builds" / "x.toml"
    toml.write_text(toml.read_text() + '\n[extra]\nkey = "v"\n')
    argv = [
        "validate",
        "--registry",
        str(tmp_path / "patches"),
        "--builds",
        str(tmp_path / "builds"),
    ]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"patchset: error: {toml}: ")
    assert "extra" in err


def test_tool_table_schema_matches_the_loader(tmp_path: Path) -> None:
    good = {"registry": "p", "builds": "b", "index-url": "http://127.0.0.1:1/", "offline": True}
    schemas.check_document("tool-patchset", {**good, "cache-dir": "c", "since": "0.19.1"}, path="x")
    with pytest.raises(RegistryError, match=r"^x: tool.patchset: .*'index_url' was unexpected"):
        schemas.check_document("tool-patchset", {"index_url": "u"}, path="x", where="tool.patchset")
    with pytest.raises(RegistryError, match=r"^x: tool.patchset.offline: 'yes' is not of type"):
        schemas.check_document("tool-patchset", {"offline": "yes"}, path="x", where="tool.patchset")


def test_init_points_editors_at_the_schemas(tmp_path: Path) -> None:
    init_project(tmp_path)
    taplo = tomllib.loads((tmp_path / ".taplo.toml").read_text())
    for rule in taplo["rule"]:
        schema = tmp_path / rule["schema"]["path"]
        assert json.loads(schema.read_text()) == schemas.load(schema.stem)
    sample = (tmp_path / "builds" / "example.toml.sample").read_text().splitlines()[0]
    assert sample.startswith("#:schema ")
    referenced = (tmp_path / "builds" / sample.split(" ", 1)[1]).resolve()
    assert referenced == (tmp_path / ".patchset/schemas/build-definition.json").resolve()
    # the commented example, uncommented, is a valid build definition by the schema
    lines = [
        line[2:]
        for line in (tmp_path / "builds" / "example.toml.sample").read_text().splitlines()
        if line.startswith("# ") and ("=" in line or line.startswith("# ["))
    ]
    schemas.check_document("build-definition", tomllib.loads("\n".join(lines)), path="sample")


def test_apply_json_has_a_schema_tag_and_matches_its_schema(tmp_path: Path) -> None:
    tree = make_tree(
        tmp_path / "tree", {"vllm/mod.py": "".join(f"line {i}\n" for i in range(1, 21))}
    )
    proc = subprocess.run(
        [
            sys.executable,
            "-m",
            "patchset",
            "apply",
            "--target",
            str(tree),
            "--dry-run",
            "--registry",
            str(REPO / "patches"),
            "--format",
            "json",
            "--ignore-range",
        ],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
    )
    report = json.loads(proc.stdout)
    assert report["schema"] == "patchset.apply/1"
    jsonschema.validate(report, schemas.load("apply"), cls=jsonschema.Draft202012Validator)


GETTERS = {
    "opt_str", "req_str", "integer", "flag", "choice", "specifier", "version",
    "str_list", "matching_list", "str_map", "free_table", "table", "tables", "number", "raw",
}  # fmt: skip


def loader_keys(*modules: str) -> set[str]:
    """Every key a loader reads through `Table` (`table.req_str("title")`, ...) or through a
    helper given the table (`_ids(top, "requires")`)."""
    keys: set[str] = set()
    for module in modules:
        tree = ast.parse((REPO / module).read_text())
        for node in ast.walk(tree):
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr in GETTERS
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and isinstance(node.args[0].value, str)
            ):
                keys.add(node.args[0].value)
            elif (  # a helper of the loader's, `_ids(top, "requires")`
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and len(node.args) >= 2
                and isinstance(node.args[0], ast.Name)
                and node.args[0].id in ("top", "table")
                and isinstance(node.args[1], ast.Constant)
                and isinstance(node.args[1].value, str)
            ):
                keys.add(node.args[1].value)
    return keys


def schema_keys(*names: str) -> set[str]:
    """Every property name anywhere in the schemas `names`."""
    found: set[str] = set()

    def walk(node: object) -> None:
        if isinstance(node, dict):
            props = node.get("properties")
            if isinstance(props, dict):
                found.update(props)
            for value in node.values():
                walk(value)
        elif isinstance(node, list):
            for value in node:
                walk(value)

    for name in names:
        walk(schemas.load(name))
    return found


@pytest.mark.parametrize(
    ("modules", "names"),
    [
        (
            (
                "patchset/registry/load.py",
                "patchset/registry/sites.py",
                "patchset/registry/semantics.py",
            ),
            ("patch", "sites"),
        ),
        (("patchset/registry/support.py",), ("support",)),
        (("patchset/registry/builds.py",), ("build-definition",)),
        (("patchset/project.py",), ("tool-patchset",)),
    ],
)
def test_the_schemas_name_every_key_the_loaders_read(
    modules: tuple[str, ...], names: tuple[str, ...]
) -> None:
    """A key added to a loader and not to its schema (or the other way) fails here, so the
    shipped schemas follow the format as it grows."""
    read = loader_keys(*modules)
    assert read, modules
    if "patch" in names:  # the [applies] predicate's keys, read by the kernel's parser
        read |= {*LEAVES, *COMBINATORS}
    declared = schema_keys(*names)
    assert read - declared == set(), f"keys the loader reads that {names} lack"
    assert declared - read == set(), f"keys in {names} no loader reads"
