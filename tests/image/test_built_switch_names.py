"""An image built with switches carries ``switches.json`` as an exported bundle does (issue
35.4): `patchset build`'s context holds it beside the manifest, naming the registry's prefixes,
the aliases of its switches and its other switch names (and why each is not in the image), so
the start reports an alias, a registry patch and an unknown name alike. An engine standing in
for Docker hands out the release's files: no container here (test_stock_semantics starts the
built image on the stand-in)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, cast

from patchset.adapters import dockerengine
from patchset.image.build import prepare_context
from patchset.kernel.switchnames import Names, check_start
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from tests.helpers.synthetic import BODY, MOD_DIFF, add_patch

ROOT = "/site"
ALIAS = 'aliases = ["PS_ENABLE_OLD_ONE"]\n'


class FilesEngine:
    """What `prepare_context` asks of the engine, from a dict of the base's files."""

    def __init__(self, files: dict[str, str]) -> None:
        self.files = files

    def ensure_image(self, ref: str, **_: Any) -> dockerengine.ImageInfo:
        return dockerengine.ImageInfo(id="sha256:" + "0" * 64, repo_digests=())

    def run_python(self, image: str, code: str, **_: Any) -> str:
        return json.dumps({"root": ROOT, "version": "0.20.0"}) + "\n"

    def copy_files(self, image: str, paths: list[str]) -> dict[str, Any]:
        return {
            p: None
            if p.removeprefix(f"{ROOT}/") not in self.files
            else dockerengine.CopiedFile(self.files[p.removeprefix(f"{ROOT}/")].encode(), 0o644)
            for p in paths
        }


def test_a_built_context_carries_switch_names(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    switch = '\n[switch]\nenv = "PS_ENABLE_{n}"\ndefault = {d}\n{more}'
    add_patch(root, "on-one", diff=MOD_DIFF, targets=["vllm/mod.py"], when="startup",
              tail=switch.format(n="ONE", d="true", more=ALIAS))  # fmt: skip
    add_patch(root, "built", diff=MOD_DIFF.replace("mod", "other"), targets=["vllm/other.py"],
              tail=switch.format(n="BUILT", d="false", more=""))  # fmt: skip
    add_patch(root, "unlisted", diff=MOD_DIFF.replace("mod", "third"),
              targets=["vllm/third.py"], when="startup",
              tail=switch.format(n="THIRD", d="false", more=""))  # fmt: skip
    path = tmp_path / "0.20.0.toml"
    path.write_text(
        'vllm = "0.20.0"\ncuda = "cu130"\nbase = "b:1"\nrepository = "r"\ntags = ["t"]\n'
        'patches = ["on-one", "built"]\n\n[switches]\nPS_ENABLE_BUILT = true\n\n'
        "[serve]\nargs = []\n"
    )
    engine = FilesEngine({f"vllm/{n}.py": BODY for n in ("mod", "other", "third")})
    context = prepare_context(
        load_definition(path),
        load_registry(root),
        cast("dockerengine.Engine", engine),
        tmp_path / "context",
    )
    names = Names.loads((context.folder / "runtime" / "switches.json").read_bytes())
    assert names.prefixes == ("PS_ENABLE_",)
    assert names.aliases == {"PS_ENABLE_OLD_ONE": "PS_ENABLE_ONE"}
    assert names.registry == {"PS_ENABLE_THIRD": ("unlisted", "not listed in 0.20.0.toml")}
    switches = {"PS_ENABLE_ONE": "on-one", "PS_ENABLE_BUILT": "built"}
    environ = {"PS_ENABLE_OLD_ONE": "0", "PS_ENABLE_THIRD": "1", "PS_ENABLE_ONNE": "1"}
    lines, mapped = check_start(names, switches, environ)
    assert mapped == {"PS_ENABLE_ONE": "0"}
    assert lines == [
        "PS_ENABLE_OLD_ONE: an alias of PS_ENABLE_ONE, the switch of on-one (mapped)",
        "PS_ENABLE_ONNE=1: names no switch of this bundle's registry; nearest: PS_ENABLE_ONE",
        "PS_ENABLE_THIRD: the switch of unlisted, not in this bundle (not listed in 0.20.0.toml)",
    ]
