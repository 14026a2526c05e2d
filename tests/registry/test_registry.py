"""The registry format: the real registry loads; every kind of bad metadata is one clear error."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from patchset.errors import PayloadError, RegistryError, UnknownPatchError
from patchset.kernel.capability import in_scope
from patchset.registry import load_registry
from tests.helpers.synthetic import MOD_DIFF, OTHER_DIFF, add_patch

REPO = Path(__file__).parents[2]
REAL = REPO / "patches"


def copy_registry(tmp_path: Path) -> Path:
    dest = tmp_path / "patches"
    shutil.copytree(REAL, dest)
    return dest


def edit(path: Path, old: str, new: str) -> None:
    text = path.read_text()
    assert old in text, old
    path.write_text(text.replace(old, new, 1))


def test_real_registry_loads() -> None:
    registry = load_registry(REAL)
    assert [p.id for p in registry.patches] == ["fla-tma-sm12x", "tolist-cudagraph"]
    tma = registry.get("fla-tma-sm12x")
    assert tma.kind == "diff" and tma.apply == "build"
    assert tma.upstream.pr == "vllm-project/vllm#36325"
    scope = str(tma.hardware.compute_capability)
    assert in_scope(scope, (12, 0)) and not in_scope(scope, (9, 0))
    assert tma.in_range("0.19.1") and not tma.in_range("0.20.0")
    tolist = registry.get("tolist-cudagraph")
    assert tolist.kind == "runtime" and tolist.apply == "startup"
    assert [s.name for s in tolist.variants[0].sites] == [
        "a-forward-prefill-max-seq",
        "b-prefill-attention-capture",
    ]
    assert registry.digest.startswith("sha256:") and len(registry.digest) == 71


@pytest.mark.parametrize(
    ("scope", "inside", "outside"),
    [("~=12.0", (12, 1), (13, 0)), ("==12.*", (12, 9), (11, 0)), (">=9.0,<12.0", (9, 0), (12, 0))],
)
def test_a_scope_that_loads_is_evaluated_as_it_runs_in_the_image(
    tmp_path: Path, scope: str, inside: tuple[int, int], outside: tuple[int, int]
) -> None:
    root = copy_registry(tmp_path)
    edit(root / "fla-tma-sm12x" / "patch.toml", '">=12.0"', f'"{scope}"')
    loaded = load_registry(root).get("fla-tma-sm12x").hardware.compute_capability
    assert loaded is not None
    assert in_scope(str(loaded), inside) and not in_scope(str(loaded), outside)


def test_digest_changes_with_payload(tmp_path: Path) -> None:
    root = copy_registry(tmp_path)
    before = load_registry(root).digest
    assert load_registry(root).digest == before
    edit(root / "tolist-cudagraph" / "sites.toml", "safe upper bound", "safe upper bound.")
    assert load_registry(root).digest != before


@pytest.mark.parametrize(
    ("file", "old", "new", "message"),
    [
        ("patch.toml", 'kind = "diff"', 'knd = "diff"', "kind: required key is missing"),
        (
            "patch.toml",
            "revision = 1",
            "revision = 1\nrevison = 2",
            "revison: unknown key (did you mean 'revision'?)",
        ),
        (
            "patch.toml",
            'state = "open"',
            'state = "opne"',
            "upstream.state: 'opne' is not one of open, merged, closed, superseded, unsubmitted"
            " (did you mean 'open'?)",
        ),
        (
            "patch.toml",
            'vllm = ">=0.11.1,<0.20.0"',
            'vllm = ">=0.11.1,<<0.20"',
            "vllm: '>=0.11.1,<<0.20' is not a PEP 440 version specifier",
        ),
        ("patch.toml", "revision = 1", 'revision = "1"', "revision: expected an integer"),
        ("patch.toml", 'apply = "build"', 'apply = "boot"', "apply: 'boot' is not one of"),
        (
            "patch.toml",
            'pr = "vllm-project/vllm#36325"',
            'pr = "36325"',
            "upstream.pr: '36325': expected owner/repo#number",
        ),
        ("patch.toml", 'targets = ["vllm/', 'targets = ["../vllm/', "targets: ../vllm/"),
        ("patch.toml", 'targets = ["vllm/', 'targets = ["/vllm/', "absolute paths are refused"),
        ("patch.toml", 'id = "fla-tma-sm12x"', 'id = "other-id"', "differs from the folder"),
        ("patch.toml", "[hardware]", "[hardware\n", "not valid TOML"),
        (
            "patch.toml",
            'compute_capability = ">=12.0"',
            'compute_capability = "===12.0"',
            "hardware.compute_capability: '===12.0' in '===12.0' is not a compute-capability"
            " clause",
        ),
        (
            "patch.toml",
            'compute_capability = ">=12.0"',
            'compute_capability = ">=12.0.1"',
            "hardware.compute_capability: '>=12.0.1' in '>=12.0.1' is not a compute-capability",
        ),
        ("patch.diff", "@@ -152,7 +152,11 @@", "@@ -152,7 +152 @", "malformed hunk header"),
        ("patch.diff", "+++ b/vllm/", "+++ b/../vllm/", "'..' is refused"),
    ],
)
def test_bad_metadata_names_file_and_key(
    tmp_path: Path, file: str, old: str, new: str, message: str
) -> None:
    root = copy_registry(tmp_path)
    path = root / "fla-tma-sm12x" / file
    edit(path, old, new)
    with pytest.raises(RegistryError) as info:
        load_registry(root)
    text = str(info.value)
    assert message in text
    assert "fla-tma-sm12x" in text  # names the file
    assert "\n" not in text  # one line


def test_site_rules(tmp_path: Path) -> None:
    root = copy_registry(tmp_path)
    sites = root / "tolist-cudagraph" / "sites.toml"
    edit(sites, 'action = "replace"', 'action = "swap"')
    with pytest.raises(RegistryError, match=r"site\[0\]\.action: 'swap' is not one of"):
        load_registry(root)
    edit(sites, 'action = "swap"', 'action = "replace"')
    edit(sites, "site b", "site a")
    with pytest.raises(RegistryError, match="every site needs its own marker"):
        load_registry(root)


def test_payload_outside_targets_is_refused(tmp_path: Path) -> None:
    root = copy_registry(tmp_path)
    edit(
        root / "tolist-cudagraph" / "patch.toml",
        'targets = ["vllm/v1/attention/backends/turboquant_attn.py"]',
        'targets = ["vllm/other.py"]',
    )
    with pytest.raises(RegistryError, match="payload touches files not listed"):
        load_registry(root)


@pytest.mark.parametrize(
    ("diff", "message"),
    [
        ("", "holds no file changes"),
        (
            "diff --git a/vllm/x.bin b/vllm/x.bin\n"
            "Binary files a/vllm/x.bin and b/vllm/x.bin differ\n",
            "binary diffs are not supported",
        ),
        ("--- a/vllm/x.py\n+++ b/vllm/y.py\n@@ -1 +1 @@\n-a\n+b\n", "renames are not supported"),
        ("--- a/setup.py\n+++ b/setup.py\n@@ -1 +1 @@\n-a\n+b\n", "targets must lie under vllm/"),
        ("--- /etc/passwd\n+++ /etc/passwd\n@@ -1 +1 @@\n-a\n+b\n", "absolute paths are refused"),
    ],
)
def test_bad_diffs(tmp_path: Path, diff: str, message: str) -> None:
    root = copy_registry(tmp_path)
    (root / "fla-tma-sm12x" / "patch.diff").write_text(diff)
    with pytest.raises(PayloadError, match=message):
        load_registry(root)


def test_unknown_id_suggests(tmp_path: Path) -> None:
    registry = load_registry(REAL)
    with pytest.raises(UnknownPatchError, match="did you mean 'fla-tma-sm12x'"):
        registry.get("fla-tma-sm12")


def test_release_in_a_gap_between_variants_is_out_of_range(tmp_path: Path) -> None:
    root = copy_registry(tmp_path)
    folder = root / "fla-tma-sm12x"
    shutil.copy(folder / "patch.diff", folder / "v0.26.0.diff")
    toml = folder / "patch.toml"
    edit(toml, 'vllm = ">=0.11.1,<0.20.0"', 'vllm = ">=0.11.1,<0.27.0"')
    toml.write_text(
        toml.read_text()
        + '\n[[variants]]\npayload = "patch.diff"\nvllm = ">=0.11.1,<0.20.0"\n'
        + '\n[[variants]]\npayload = "v0.26.0.diff"\nvllm = ">=0.26.0"\n'
    )
    patch = load_registry(root).get("fla-tma-sm12x")
    assert [patch.in_range(v) for v in ("0.19.1", "0.22.0", "0.26.0", "0.27.0")] == [
        True,
        False,
        True,
        False,
    ]
    assert patch.variant_for("0.22.0") is None
    # both at once, as a check asks them: the variant meant, even out of the declared range
    first, newest = patch.variants
    assert [patch.placed(v) for v in ("0.19.1", "0.22.0", "0.26.0", "0.27.0")] == [
        (True, first),
        (False, None),
        (True, newest),
        (False, newest),
    ]


def test_reads_is_every_variants_targets_and_the_probes_file_sorted(tmp_path: Path) -> None:
    """`Patch.reads`, what a check reads of a release for the patch, is worked out once: the
    files of every variant and the probe's, each once, in order."""
    folder = add_patch(
        tmp_path / "patches",
        "pat",
        diff=OTHER_DIFF,
        targets=["vllm/other.py"],
        tail='\n[upstream.probe]\nfile = "vllm/a_probe.py"\ncontains = ["x"]\n',
    )
    (folder / "patch.diff").write_text(OTHER_DIFF + MOD_DIFF)
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text().replace('"vllm/other.py"]', '"vllm/other.py", "vllm/mod.py"]'))
    (patch,) = load_registry(tmp_path / "patches").patches
    assert patch.reads == ("vllm/a_probe.py", "vllm/mod.py", "vllm/other.py")
    assert patch.reads is patch.reads
