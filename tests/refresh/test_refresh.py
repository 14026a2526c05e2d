"""`patchset refresh` end to end on real releases from the package index and real git.

The cases are real drift between releases:
- tolist-cudagraph (runtime), without its upstream probe: 0.21.0 rewrote site A's line
  (`max(attn_metadata.seq_lens[num_decodes:].tolist())` became
  `int(attn_metadata.seq_lens_cpu[num_decodes:].max())`), so the patch is `partial` there;
- a small diff against 0.19.1's fla utils.py whose context 0.20.0 changed (a line removed two
  lines above) but whose changed line it kept: plain apply conflicts, the three-way merge is
  clean;
- fla-tma-sm12x, without its probe: 0.20.0 rewrote the very lines it changes, a true conflict;
  0.26.0 also moved its file to vllm/third_party/flash_linear_attention/ops/utils.py.
"""

from __future__ import annotations

import difflib
import json
import re
import shutil
import subprocess
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import tomlkit

from patchset.engine.apply import apply
from patchset.errors import RegistryError, UsageError
from patchset.refresh import WORK_FOLDER, MovedFile, finish, refresh
from patchset.registry import load_registry
from patchset.registry.write import RegistryChange, write_ranges
from patchset.release_check import check
from patchset.sources.base import MemoryTree, ReleaseSource, ReleaseTree
from patchset.sources.package_index import IndexSource
from tests.helpers import cli as helpers_cli
from tests.helpers.releases import materialize, tree_digest

pytestmark = pytest.mark.network
REPO = Path(__file__).parents[2]
TQ = "vllm/v1/attention/backends/turboquant_attn.py"
UTILS = "vllm/model_executor/layers/fla/ops/utils.py"
MOVED_UTILS = "vllm/third_party/flash_linear_attention/ops/utils.py"  # since 0.26.0
OLD_A = "prefill_max_seq = max(attn_metadata.seq_lens[num_decodes:].tolist())"
NEW_A = "prefill_max_seq = int(attn_metadata.seq_lens_cpu[num_decodes:].max())"
SUPPRESS = 'SUPPRESS_LEVEL = int(os.getenv("GDN_RECOMPUTE_SUPPRESS_LEVEL", "0"))'
SUPPRESS_CLAMPED = 'SUPPRESS_LEVEL = max(0, int(os.getenv("GDN_RECOMPUTE_SUPPRESS_LEVEL", "0")))'


@pytest.fixture(scope="module")
def source() -> IndexSource:
    return IndexSource()


@pytest.fixture
def registry_root(tmp_path: Path) -> Path:
    """A copy of the real registry, with no upstream probes: refresh refuses a release that
    holds a patch's upstream fix, and these tests carry the patches onto exactly those."""
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    for patch in ("tolist-cudagraph", "fla-tma-sm12x"):
        drop_probe(root / patch / "patch.toml")
    return root


def drop_probe(path: Path) -> None:
    doc = tomlkit.parse(path.read_text())
    del doc["upstream"]["probe"]
    path.write_text(tomlkit.dumps(doc))


@pytest.fixture
def immutable() -> Iterator[list[Path]]:
    """Folders to `chattr +i` (root ignores permission bits, not the immutable flag)."""
    folders: list[Path] = []
    yield folders
    for folder in folders:
        subprocess.run(["chattr", "-i", str(folder)], check=True)


def make_immutable(folders: list[Path], folder: Path) -> None:
    folders.append(folder)
    subprocess.run(["chattr", "+i", str(folder)], check=True)


def run_cli(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return helpers_cli.run_cli("--registry", root, *args, timeout=600)


def one_error_line(proc: subprocess.CompletedProcess[str], code: int, text: str) -> None:
    assert proc.returncode == code, (proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, lines
    assert text in lines[0], lines[0]


def comments(text: str) -> list[str]:
    return [line for line in text.splitlines() if line.lstrip().startswith("#")]


# -- runtime patches ---------------------------------------------------------------------------


def test_runtime_refresh_end_to_end(registry_root: Path, source: IndexSource) -> None:
    tolist = "tolist-cudagraph"
    registry = load_registry(registry_root)
    report = check(registry, ["0.20.0", "0.21.0"], source=source, patches=[tolist])
    assert report.result("0.20.0", tolist).verdict == "needed"
    assert report.result("0.21.0", tolist).verdict == "partial"

    # Without --write: the proposal, and nothing written.
    before = tree_digest(registry_root)
    proposal = refresh(registry, tolist, "0.21.0", source=source, write=False)
    assert proposal.outcome == "proposed" and proposal.exit_code == 0
    assert tree_digest(registry_root) == before
    site_a, site_b = proposal.sites
    assert (site_b.status, site_b.line) == ("applies", 574)
    assert site_a.status == "anchor-not-found"
    assert site_a.anchor == NEW_A and site_a.picked == 1 and site_a.text_follows
    best, *others = site_a.candidates
    assert (best.line, best.unchanged) == (487, False) and best.similarity > 0.8
    # 0.21.0's `prefill_seq_lens = attn_metadata.seq_lens[num_decodes:]` is nearly as alike,
    # but 0.20.2 has that very line beside the anchor: it is other code, not the anchor.
    assert any(c.line == 482 and c.unchanged for c in others)
    assert f"-{OLD_A}" in proposal.payload and f"+{NEW_A}" in proposal.payload

    toml_before = (registry_root / tolist / "patch.toml").read_text()
    result = refresh(registry, tolist, "0.21.0", source=source, write=True)
    assert (result.outcome, result.variant, result.revision) == (
        "written",
        "v0.21.0.sites.toml",
        2,
    )
    assert result.base == "0.20.2"  # the newest release inside >=0.20.0,<0.21.0
    toml_after = (registry_root / tolist / "patch.toml").read_text()
    assert comments(toml_after) == comments(toml_before)  # every comment kept, in order
    assert 'vllm = ">=0.20.0,<0.22.0"' in toml_after  # widened to hold 0.21.0
    assert toml_after.endswith(
        '[[variants]]\npayload = "sites.toml"\nvllm = ">=0.20.0,<0.21.0"\n\n'
        '[[variants]]\npayload = "v0.21.0.sites.toml"\nvllm = ">=0.21.0"\nbase = "0.21.0"\n'
    )
    new_sites = (registry_root / tolist / "v0.21.0.sites.toml").read_text()
    old_sites = (registry_root / tolist / "sites.toml").read_text()
    assert new_sites == old_sites.replace(OLD_A, NEW_A)  # anchor and its copy in the text

    refreshed = load_registry(registry_root)
    report = check(refreshed, ["0.20.0", "0.20.2", "0.21.0", "0.22.0"], source=source)
    for version, variant in [
        ("0.20.0", "sites.toml"),
        ("0.20.2", "sites.toml"),
        ("0.21.0", "v0.21.0.sites.toml"),
        ("0.22.0", "v0.21.0.sites.toml"),
    ]:
        r = report.result(version, tolist)
        assert (r.verdict, r.variant) == ("needed", variant), (version, r.detail)
    assert report.result("0.21.0", tolist).in_range
    data = json.loads(json.dumps(report.to_dict()))  # check's JSON says which variant
    picked = {(r["vllm"], r["variant"]) for r in data["results"] if r["patch"] == tolist}
    assert ("0.20.2", "sites.toml") in picked and ("0.21.0", "v0.21.0.sites.toml") in picked

    # Refreshing again: it fits now.
    with pytest.raises(UsageError, match=r"already fits vllm 0\.21\.0: v0\.21\.0\.sites\.toml"):
        refresh(refreshed, tolist, "0.21.0", source=source)


def test_apply_picks_the_variant_for_the_release(
    registry_root: Path, source: IndexSource, tmp_path: Path
) -> None:
    tolist = "tolist-cudagraph"
    refresh(load_registry(registry_root), tolist, "0.21.0", source=source, write=True)
    registry = load_registry(registry_root)
    for version, variant in [("0.20.0", "sites.toml"), ("0.21.0", "v0.21.0.sites.toml")]:
        tree = materialize(version, tmp_path / version, [TQ])
        report = apply(registry, tree, patches=[tolist])
        (r,) = report.results
        assert (r.outcome, r.variant) == ("applied", variant), r.details
        assert r.to_dict()["variant"] == variant
        assert "# patchset: tolist-cudagraph site a" in (tree / TQ).read_text()


def test_runtime_pick_and_unclear_candidates(registry_root: Path, source: IndexSource) -> None:
    tolist = "tolist-cudagraph"
    site = "a-forward-prefill-max-seq"
    registry = load_registry(registry_root)
    # Candidate 3 is `prefill_max_seq = attn_metadata.max_seq_len` (the else branch).
    picked = refresh(registry, tolist, "0.21.0", source=source, write=False, picks={site: 3})
    assert picked.outcome == "proposed"
    assert picked.sites[0].anchor == "prefill_max_seq = attn_metadata.max_seq_len"
    with pytest.raises(UsageError, match=r"--pick a-forward: .* no such site"):
        refresh(registry, tolist, "0.21.0", source=source, picks={"a-forward": 1})
    with pytest.raises(UsageError, match=r"there are 4 candidates"):
        refresh(registry, tolist, "0.21.0", source=source, picks={site: 9})

    # Without the base release's help (no release inside the range: give no base), the two
    # nearest windows are too close to call: no proposal, nothing written.
    path = registry_root / tolist / "patch.toml"
    path.write_text(path.read_text().replace('vllm = ">=0.20.0,<0.21.0"', 'vllm = "==0.21.0"'))
    before = tree_digest(registry_root)
    unclear = refresh(load_registry(registry_root), tolist, "0.21.0", source=source, write=True)
    assert (unclear.outcome, unclear.exit_code, unclear.base) == ("unresolved", 1, None)
    assert "no clear best: 86% at line 487 and 81% at line 482" in unclear.sites[0].reason
    assert tree_digest(registry_root) == before


# -- diff patches ------------------------------------------------------------------------------


def add_suppress_patch(root: Path, source: IndexSource) -> str:
    """A diff written against 0.19.1: 0.20.0 removed a line two above the one it changes."""
    with source.open("0.19.1") as tree:
        base = (tree.read(UTILS) or b"").decode()
    assert SUPPRESS in base
    diff = "".join(
        difflib.unified_diff(
            base.splitlines(keepends=True),
            base.replace(SUPPRESS, SUPPRESS_CLAMPED).splitlines(keepends=True),
            fromfile=f"a/{UTILS}",
            tofile=f"b/{UTILS}",
        )
    )
    folder = root / "fla-suppress-level"
    folder.mkdir()
    (folder / "patch.diff").write_text(diff)
    toml = (root / "fla-tma-sm12x" / "patch.toml").read_text()
    (folder / "patch.toml").write_text(
        toml.replace('id = "fla-tma-sm12x"', 'id = "fla-suppress-level"')
    )
    return "fla-suppress-level"


def test_diff_refresh_clean_three_way_merge(registry_root: Path, source: IndexSource) -> None:
    patch_id = add_suppress_patch(registry_root, source)
    registry = load_registry(registry_root)
    report = check(registry, ["0.19.1", "0.20.0"], source=source, patches=[patch_id])
    assert report.result("0.19.1", patch_id).verdict == "needed"
    r = report.result("0.20.0", patch_id)
    assert r.verdict == "conflict" and "hunk #1 does not match" in r.detail

    result = refresh(registry, patch_id, "0.20.0", source=source)
    assert (result.outcome, result.base, result.variant, result.revision) == (
        "written",
        "0.19.1",
        "v0.20.0.diff",
        2,
    )
    new_diff = (registry_root / patch_id / "v0.20.0.diff").read_text()
    assert new_diff == result.payload
    assert f"--- a/{UTILS}\n+++ b/{UTILS}\n" in new_diff
    assert f"-{SUPPRESS}\n+{SUPPRESS_CLAMPED}\n" in new_diff
    assert "FLA_CHUNK_SIZE = 64" in new_diff  # 0.20.0's context, not 0.19.1's
    assert [(c.what, c.old, c.new) for c in result.ranges] == [
        ("vllm", ">=0.11.1,<0.20.0", ">=0.11.1,<0.20.1"),
        ("patch.diff", ">=0.11.1,<0.20.0", ">=0.11.1,<0.20.0"),
        ("v0.20.0.diff", None, ">=0.20.0"),
    ]

    refreshed = load_registry(registry_root)
    report = check(refreshed, ["0.17.0", "0.19.1", "0.20.0"], source=source, patches=[patch_id])
    for version, variant in [
        ("0.17.0", "patch.diff"),
        ("0.19.1", "patch.diff"),
        ("0.20.0", "v0.20.0.diff"),
    ]:
        r = report.result(version, patch_id)
        assert (r.verdict, r.variant, r.in_range) == ("needed", variant, True), r.detail


def take_ours(text: str) -> str:
    """Resolve every conflict by keeping the release's side."""
    return re.sub(
        r"^<<<<<<< [^\n]*\n(.*?)^\|\|\|\|\|\|\| .*?^>>>>>>> [^\n]*\n",
        r"\1",
        text,
        flags=re.MULTILINE | re.DOTALL,
    )


def test_diff_refresh_conflict_then_finish(registry_root: Path, source: IndexSource) -> None:
    tma = "fla-tma-sm12x"
    registry = load_registry(registry_root)
    before = tree_digest(registry_root)
    result = refresh(registry, tma, "0.20.0", source=source)
    assert (result.outcome, result.exit_code, result.base) == ("conflict", 1, "0.19.1")
    assert tree_digest(registry_root) == before  # a conflict never touches the registry
    work = registry_root.parent / WORK_FOLDER / tma
    assert result.workdir == work
    (conflict,) = result.conflicts
    assert conflict.file == UTILS and len(conflict.lines) == 2
    merged = (work / UTILS).read_text()
    lines = merged.splitlines()
    assert lines[conflict.lines[0] - 1] == "<<<<<<< vllm 0.20.0"
    assert lines[conflict.lines[1] - 1] == ">>>>>>> fla-tma-sm12x on vllm 0.19.1"
    assert "||||||| vllm 0.19.1 (base)" in lines
    assert "is_nvidia and 9 <= torch.cuda.get_device_capability(0)[0] < 12" in merged

    # A second refresh does not overwrite the unfinished one.
    with pytest.raises(UsageError, match="an unfinished refresh of fla-tma-sm12x"):
        refresh(registry, tma, "0.20.0", source=source)
    # Markers left: refused, registry unchanged.
    with pytest.raises(UsageError, match=rf"conflict markers are left at {UTILS}:\d+"):
        finish(registry, tma)
    assert tree_digest(registry_root) == before

    # Resolve: 0.20.0's opt-in TMA, and still never on compute capability 12.
    resolved = take_ours(merged).replace(
        "    is_nvidia_hopper\n",
        "    is_nvidia_hopper\n    and torch.cuda.get_device_capability(0)[0] < 12\n",
    )
    assert "<<<<<<<" not in resolved and resolved != merged
    (work / UTILS).write_text(resolved)
    done = finish(registry, tma)
    assert (done.outcome, done.variant, done.revision) == ("written", "v0.20.0.diff", 2)
    assert "+    and torch.cuda.get_device_capability(0)[0] < 12\n" in done.payload
    assert not (registry_root.parent / WORK_FOLDER).exists()

    refreshed = load_registry(registry_root)
    report = check(refreshed, ["0.19.1", "0.20.0"], source=source, patches=[tma])
    assert (report.result("0.19.1", tma).verdict, report.result("0.19.1", tma).variant) == (
        "needed",
        "patch.diff",
    )
    assert (report.result("0.20.0", tma).verdict, report.result("0.20.0", tma).variant) == (
        "needed",
        "v0.20.0.diff",
    )


def test_explicit_base_is_the_merge_base(registry_root: Path, source: IndexSource) -> None:
    patch_id = add_suppress_patch(registry_root, source)
    path = registry_root / patch_id / "patch.toml"
    path.write_text(path.read_text().replace('apply = "build"', 'apply = "build"\nbase = "0.18.0"'))
    registry = load_registry(registry_root)
    assert registry.get(patch_id).variants[0].base == "0.18.0"
    result = refresh(registry, patch_id, "0.20.0", source=source)
    assert (result.outcome, result.base) == ("written", "0.18.0")
    text = path.read_text()
    assert 'base = "0.18.0"' in text.split("[[variants]]")[1]  # moved into its variant
    assert load_registry(registry_root).get(patch_id).variants[0].base == "0.18.0"


def test_base_key_is_validated(registry_root: Path) -> None:
    path = registry_root / "fla-tma-sm12x" / "patch.toml"
    text = path.read_text()
    path.write_text(text.replace('apply = "build"', 'apply = "build"\nbase = "latest"'))
    with pytest.raises(RegistryError, match="base: 'latest' is not a PEP 440 version"):
        load_registry(registry_root)
    variants = (
        '\n[[variants]]\npayload = "patch.diff"\nvllm = ">=0.11.1,<0.20.0"\nbase = "0.19.1"\n'
    )
    path.write_text(text.replace('apply = "build"', 'apply = "build"\nbase = "0.19.1"') + variants)
    with pytest.raises(
        RegistryError, match=r"base: with \[\[variants\]\], give 'base' inside each"
    ):
        load_registry(registry_root)
    path.write_text(text + variants)
    assert load_registry(registry_root).get("fla-tma-sm12x").variants[0].base == "0.19.1"


# -- a target file the release moved ------------------------------------------------------------


def cap_below_12(merged: str) -> str:
    """0.20.0's and 0.26.0's opt-in TMA, and still never on compute capability 12."""
    return take_ours(merged).replace(
        "    is_nvidia_hopper\n",
        "    is_nvidia_hopper\n    and torch.cuda.get_device_capability(0)[0] < 12\n",
    )


def test_diff_refresh_follows_a_moved_file(registry_root: Path, source: IndexSource) -> None:
    tma = "fla-tma-sm12x"
    registry = load_registry(registry_root)
    r = check(registry, ["0.26.0"], source=source, patches=[tma]).result("0.26.0", tma)
    assert (r.verdict, r.moved_to) == ("missing-target", (MOVED_UTILS,))

    toml_before = (registry_root / tma / "patch.toml").read_text()
    before = tree_digest(registry_root)
    result = refresh(registry, tma, "0.26.0", source=source)
    # The moved file is the release's side of the merge; 0.26.0 made TMA opt-in, as 0.20.0 did.
    assert (result.outcome, result.base) == ("conflict", "0.19.1")
    assert result.moved == (MovedFile(UTILS, MOVED_UTILS),)
    assert result.to_dict()["moved"] == [{"old": UTILS, "new": MOVED_UTILS}]
    assert tree_digest(registry_root) == before
    work = registry_root.parent / WORK_FOLDER / tma
    (conflict,) = result.conflicts
    assert conflict.file == MOVED_UTILS  # the work folder holds it at its new path
    assert not (work / UTILS).exists()
    merged = (work / MOVED_UTILS).read_text()
    assert 'and os.getenv("FLA_USE_TMA", "0") == "1"' in merged
    with pytest.raises(UsageError, match=rf"conflict markers are left at {MOVED_UTILS}:\d+"):
        finish(registry, tma)

    (work / MOVED_UTILS).write_text(cap_below_12(merged))
    done = finish(registry, tma)
    assert (done.outcome, done.variant, done.revision) == ("written", "v0.26.0.diff", 2)
    assert done.moved == (MovedFile(UTILS, MOVED_UTILS),)
    assert f"--- a/{MOVED_UTILS}\n+++ b/{MOVED_UTILS}\n" in done.payload
    assert UTILS not in done.payload
    assert "+    and torch.cuda.get_device_capability(0)[0] < 12\n" in done.payload
    toml_after = (registry_root / tma / "patch.toml").read_text()
    assert comments(toml_after) == comments(toml_before)
    assert f'targets = [\n    "{UTILS}",\n    "{MOVED_UTILS}",\n]\n' in toml_after

    refreshed = load_registry(registry_root)
    assert refreshed.get(tma).targets == (UTILS, MOVED_UTILS)
    report = check(refreshed, ["0.17.0", "0.19.1", "0.26.0"], source=source, patches=[tma])
    for version, variant in [
        ("0.17.0", "patch.diff"),
        ("0.19.1", "patch.diff"),
        ("0.26.0", "v0.26.0.diff"),
    ]:
        r = report.result(version, tma)
        assert (r.verdict, r.variant, r.in_range) == ("needed", variant, True), r.detail
    with pytest.raises(UsageError, match=r"already fits vllm 0\.26\.0: v0\.26\.0\.diff"):
        refresh(refreshed, tma, "0.26.0", source=source)


def test_diff_refresh_clean_merge_onto_a_moved_file(
    registry_root: Path, source: IndexSource
) -> None:
    patch_id = add_suppress_patch(registry_root, source)
    result = refresh(load_registry(registry_root), patch_id, "0.26.0", source=source)
    assert (result.outcome, result.variant) == ("written", "v0.26.0.diff")
    assert result.moved == (MovedFile(UTILS, MOVED_UTILS),)
    new_diff = (registry_root / patch_id / "v0.26.0.diff").read_text()
    assert new_diff == result.payload
    assert f"--- a/{MOVED_UTILS}\n+++ b/{MOVED_UTILS}\n" in new_diff
    assert f"-{SUPPRESS}\n+{SUPPRESS_CLAMPED}\n" in new_diff
    report = check(
        load_registry(registry_root), ["0.19.1", "0.26.0"], source=source, patches=[patch_id]
    )
    assert report.result("0.19.1", patch_id).variant == "patch.diff"
    r = report.result("0.26.0", patch_id)
    assert (r.verdict, r.variant) == ("needed", "v0.26.0.diff"), r.detail


class Reshaped(ReleaseSource):
    """The index's releases, with one release's files moved (`where` gives a file's new path)
    or removed (None)."""

    name = "index"

    def __init__(
        self, source: IndexSource, version: str, where: Callable[[str], str | None]
    ) -> None:
        self.source, self.version, self.where = source, version, where

    def versions(self) -> list[str]:
        return self.source.versions()

    def open(self, version: str) -> AbstractContextManager[ReleaseTree]:
        @contextmanager
        def opened() -> Iterator[ReleaseTree]:
            with self.source.open(version) as tree:
                if version != self.version:
                    yield tree
                    return
                files = {
                    new: tree.read(p) or b""
                    for p in tree.paths()
                    if p.endswith(".py") and (new := self.where(p)) is not None
                }
                yield MemoryTree(tree.info, files)

        return opened()


def test_diff_refresh_refuses_a_removed_file(registry_root: Path, source: IndexSource) -> None:
    before = tree_digest(registry_root)
    gone = "vllm/third_party/flash_linear_attention/"
    removed = Reshaped(source, "0.26.0", lambda p: None if p.startswith(gone) else p)
    with pytest.raises(UsageError, match=rf"vllm 0\.26\.0 has no {UTILS}, and no file of it"):
        refresh(load_registry(registry_root), "fla-tma-sm12x", "0.26.0", source=removed)
    assert tree_digest(registry_root) == before
    assert not (registry_root.parent / WORK_FOLDER).exists()


def test_runtime_refresh_refuses_a_moved_file(registry_root: Path, source: IndexSource) -> None:
    moved = "vllm/v1/attention/backends/turboquant.py"
    renamed = Reshaped(source, "0.21.0", lambda p: moved if p == TQ else p)
    before = tree_digest(registry_root)
    with pytest.raises(
        UsageError, match=rf"moved {TQ} -> {moved}: refresh follows moved files for diff patches"
    ):
        refresh(load_registry(registry_root), "tolist-cudagraph", "0.21.0", source=renamed)
    assert tree_digest(registry_root) == before


def test_cli_refresh_a_moved_file_then_finish_and_show(registry_root: Path) -> None:
    tma = "fla-tma-sm12x"
    proc = run_cli(registry_root, "refresh", tma, "--vllm", "0.26.0")
    assert proc.returncode == 1, proc.stderr
    assert f"moved in vllm 0.26.0: {UTILS} -> {MOVED_UTILS}" in proc.stdout
    assert f"  {MOVED_UTILS}: conflict markers at lines" in proc.stdout
    work = registry_root.parent / WORK_FOLDER / tma
    (work / MOVED_UTILS).write_text(cap_below_12((work / MOVED_UTILS).read_text()))
    proc = run_cli(registry_root, "refresh", tma, "--finish")
    assert proc.returncode == 0, proc.stderr
    assert f"moved in vllm 0.26.0: {UTILS} -> {MOVED_UTILS}" in proc.stdout
    assert "new variant v0.26.0.diff; revision 2" in proc.stdout
    proc = run_cli(registry_root, "show", tma, "--format", "json")
    assert proc.returncode == 0, proc.stderr
    variants = json.loads(proc.stdout)["variants"]
    assert [(v["payload"], v["base"], v["files"]) for v in variants] == [
        ("patch.diff", None, [UTILS]),
        ("v0.26.0.diff", "0.26.0", [MOVED_UTILS]),
    ]
    proc = run_cli(registry_root, "show", tma)
    assert "payload v0.26.0.diff (vLLM >=0.26.0, base 0.26.0, sha256 " in proc.stdout
    assert "payload patch.diff (vLLM <0.20.0,>=0.11.1, sha256 " in proc.stdout


# -- bad input: one line, non-zero, the registry byte-for-byte unchanged -----------------------


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (
            ("fla-tma-sm12x", "--vllm", "0.19.1"),
            2,
            "fla-tma-sm12x already fits vllm 0.19.1: patch.diff applies cleanly; nothing to",
        ),
        (
            ("fla-tma-sm12x", "--vllm", "0.19.99"),
            2,
            "vllm 0.19.99 is not a release the index source offers (did you mean '0.19.1'?)",
        ),
        (("fla-tma-sm12x", "--vllm", "banana"), 2, "--vllm 'banana' is not a PEP 440 version"),
        (("no-such-patch", "--vllm", "0.21.0"), 2, "no patch 'no-such-patch'"),
        (("fla-tma-sm12x", "--finish"), 2, "no unfinished refresh of fla-tma-sm12x here"),
        (("fla-tma-sm12x", "--vllm", "0.20.0", "--write"), 2, "--write and --pick are for"),
        (
            ("tolist-cudagraph", "--vllm", "0.21.0", "--pick", "a"),
            2,
            "--pick 'a': expected SITE=N",
        ),
    ],
)
def test_cli_bad_input(registry_root: Path, args: tuple[str, ...], code: int, message: str) -> None:
    before = tree_digest(registry_root.parent)
    one_error_line(run_cli(registry_root, "refresh", *args), code, message)
    assert tree_digest(registry_root.parent) == before


def test_cli_refuses_a_release_holding_the_upstream_fix(tmp_path: Path) -> None:
    root = tmp_path / "patches"
    shutil.copytree(REPO / "patches", root)
    before = tree_digest(root)
    proc = run_cli(root, "refresh", "tolist-cudagraph", "--vllm", "0.21.0", "--write")
    one_error_line(proc, 2, "vllm 0.21.0 has tolist-cudagraph's upstream fix")
    assert tree_digest(root) == before


@pytest.mark.parametrize("where", ["patch folder", "registry folder"])
def test_cli_registry_not_writable(registry_root: Path, immutable: list[Path], where: str) -> None:
    folder = registry_root / "tolist-cudagraph" if where == "patch folder" else registry_root
    before = tree_digest(registry_root)
    make_immutable(immutable, folder)
    proc = run_cli(registry_root, "refresh", "tolist-cudagraph", "--vllm", "0.21.0", "--write")
    one_error_line(proc, 2, "the registry folder is not writable (Operation not permitted)")
    assert f"{folder}: " in proc.stderr
    assert tree_digest(registry_root) == before


def test_cli_finish_with_markers_left_then_resolved(registry_root: Path) -> None:
    proc = run_cli(registry_root, "refresh", "fla-tma-sm12x", "--vllm", "0.20.0")
    assert proc.returncode == 1, proc.stderr
    work = registry_root.parent / WORK_FOLDER / "fla-tma-sm12x"
    assert f"are in {work}" in proc.stdout
    assert "patchset refresh fla-tma-sm12x --finish" in proc.stdout
    before = tree_digest(registry_root)
    proc = run_cli(registry_root, "refresh", "fla-tma-sm12x", "--finish")
    one_error_line(proc, 2, "conflict markers are left at")
    assert tree_digest(registry_root) == before
    (work / UTILS).write_text(take_ours((work / UTILS).read_text()).replace('== "1"', '== "2"'))
    proc = run_cli(registry_root, "refresh", "fla-tma-sm12x", "--finish", "--format", "json")
    assert proc.returncode == 0, proc.stderr
    data = json.loads(proc.stdout)
    assert (data["outcome"], data["variant"], data["revision"]) == ("written", "v0.20.0.diff", 2)


def test_cli_abort_drops_the_work_folder(registry_root: Path) -> None:
    assert run_cli(registry_root, "refresh", "fla-tma-sm12x", "--vllm", "0.20.0").returncode == 1
    before = tree_digest(registry_root)
    proc = run_cli(registry_root, "refresh", "fla-tma-sm12x", "--abort")
    assert proc.returncode == 0, proc.stderr
    assert not (registry_root.parent / WORK_FOLDER).exists()
    assert tree_digest(registry_root) == before


def test_cli_runtime_proposal_and_write(registry_root: Path) -> None:
    proc = run_cli(registry_root, "refresh", "tolist-cudagraph", "--vllm", "0.21.0")
    assert proc.returncode == 0, proc.stderr
    assert "1. line 487, 86% alike" in proc.stdout
    assert "(unchanged since the base: other code)" in proc.stdout
    assert f"new anchor (candidate 1): {NEW_A}" in proc.stdout
    assert "nothing was written (--write records it)" in proc.stdout
    proc = run_cli(registry_root, "refresh", "tolist-cudagraph", "--vllm", "0.21.0", "--write")
    assert proc.returncode == 0, proc.stderr
    assert "new variant v0.21.0.sites.toml; revision 2" in proc.stdout
    assert "sites.toml: >=0.20.0,<0.21.0 (unchanged)" in proc.stdout


# -- registry writes ---------------------------------------------------------------------------


def test_a_write_that_would_not_load_is_rolled_back(registry_root: Path) -> None:
    registry = load_registry(registry_root)
    patch = registry.get("fla-tma-sm12x")
    before = tree_digest(registry_root)
    change = RegistryChange(registry)
    change.add_file(patch, "v9.diff", b"not a diff\n")

    def edit(doc: tomlkit.TOMLDocument) -> None:
        doc["payload"] = "v9.diff"

    change.edit_toml(patch, edit)
    with pytest.raises(RegistryError, match=r"would not load .* nothing was changed"):
        change.commit()
    assert tree_digest(registry_root) == before


def test_a_patch_changed_since_it_was_loaded_is_not_overwritten(
    registry_root: Path, source: IndexSource
) -> None:
    registry = load_registry(registry_root)
    sites = registry_root / "tolist-cudagraph" / "sites.toml"
    sites.write_text(sites.read_text() + "# edited by someone else meanwhile\n")
    before = tree_digest(registry_root)
    with pytest.raises(RegistryError, match="changed since it was read"):
        refresh(registry, "tolist-cudagraph", "0.21.0", source=source, write=True)
    assert tree_digest(registry_root) == before


def test_check_suggest_ranges_write(registry_root: Path) -> None:
    path = registry_root / "fla-tma-sm12x" / "patch.toml"
    text = path.read_text()
    proc = run_cli(registry_root, "check", "--vllm", "0.19.1", "--write")
    one_error_line(proc, 2, "give --suggest-ranges too")
    proc = run_cli(
        registry_root,
        "check",
        "--vllm",
        "0.17.0",
        "--vllm",
        "0.19.1",
        "--vllm",
        "0.20.0",
        "--patch",
        "fla-tma-sm12x",
        "--suggest-ranges",
        "--write",
    )
    assert proc.returncode == 0, proc.stderr
    # No probe here: 0.20.0's conflict is no evidence the fix is upstream, so the range stays
    # open and a CI check keeps flagging 0.20.0 (docs/ci.md).
    assert "range written: fla-tma-sm12x: vllm '>=0.11.1,<0.20.0' -> '>=0.17.0'" in proc.stdout
    # Only the value changed: comments, order and the rest byte for byte as they were.
    assert path.read_text() == text.replace('vllm = ">=0.11.1,<0.20.0"', 'vllm = ">=0.17.0"')


def test_write_ranges_leaves_what_one_range_cannot_say(registry_root: Path) -> None:
    registry = load_registry(registry_root)
    before = tree_digest(registry_root)
    results, _ = write_ranges(
        registry,
        {
            "fla-tma-sm12x": (">=0.17.0,<0.18.0", ">=0.19.0,<0.20.0"),
            "tolist-cudagraph": (">=0.20.0,<0.21.0",),
        },
    )
    assert [(r.patch, r.status) for r in results] == [
        ("fla-tma-sm12x", "skipped"),
        ("tolist-cudagraph", "unchanged"),
    ]
    assert "needed in separate runs" in results[0].describe()
    assert tree_digest(registry_root) == before


STACKED = "SUPPRESS_STACKED = SUPPRESS_LEVEL > 0"


def add_stacked_on_suppress(root: Path, source: IndexSource, below: str) -> str:
    """A diff written against 0.19.1 with `below` (the suppress patch) applied: its context
    holds the clamped line, so alone on a release it never fits."""
    with source.open("0.19.1") as tree:
        base = (tree.read(UTILS) or b"").decode().replace(SUPPRESS, SUPPRESS_CLAMPED)
    diff = "".join(
        difflib.unified_diff(
            base.splitlines(keepends=True),
            base.replace(SUPPRESS_CLAMPED, f"{SUPPRESS_CLAMPED}\n{STACKED}").splitlines(
                keepends=True
            ),
            fromfile=f"a/{UTILS}",
            tofile=f"b/{UTILS}",
        )
    )
    folder = root / "fla-suppress-stacked"
    folder.mkdir()
    (folder / "patch.diff").write_text(diff)
    toml = (root / "fla-tma-sm12x" / "patch.toml").read_text()
    toml = toml.replace('id = "fla-tma-sm12x"', 'id = "fla-suppress-stacked"')
    (folder / "patch.toml").write_text(
        toml.replace("[upstream]", f'requires = ["{below}"]\n\n[upstream]', 1)
    )
    return "fla-suppress-stacked"


def test_a_stacked_diff_is_refreshed_on_top_of_what_it_requires(
    registry_root: Path, source: IndexSource
) -> None:
    below = add_suppress_patch(registry_root, source)
    top = add_stacked_on_suppress(registry_root, source, below)
    registry = load_registry(registry_root)
    assert check(registry, ["0.19.1"], source=source, patches=[top]).result(
        "0.19.1", top
    ).verdict == ("needed")  # on top of the suppress patch, as check reads it
    # the patch it requires does not fit 0.20.0 yet: one line, nothing written
    before = tree_digest(registry_root)
    with pytest.raises(UsageError, match=f"{top} requires {below}, which does not fit vllm 0.20.0"):
        refresh(registry, top, "0.20.0", source=source)
    assert tree_digest(registry_root) == before
    assert refresh(registry, below, "0.20.0", source=source).outcome == "written"
    registry = load_registry(registry_root)
    result = refresh(registry, top, "0.20.0", source=source)
    assert (result.outcome, result.base, result.variant) == ("written", "0.19.1", "v0.20.0.diff")
    new_diff = (registry_root / top / "v0.20.0.diff").read_text()
    assert f" {SUPPRESS_CLAMPED}\n+{STACKED}\n" in new_diff  # the context holds the bottom's line
    assert "FLA_GDN_FIX_BT" not in new_diff  # 0.20.0's context, not 0.19.1's
    refreshed = load_registry(registry_root)
    report = check(refreshed, ["0.19.1", "0.20.0"], source=source, patches=[top])
    for version, variant in [("0.19.1", "patch.diff"), ("0.20.0", "v0.20.0.diff")]:
        r = report.result(version, top)
        assert (r.verdict, r.variant) == ("needed", variant), r.detail
