"""Diffs that delete files, end to end: parsed in git's form, checked, applied and reverted.

Every verdict on a synthetic tree is held against real `git apply --check` and `--reverse
--check` in a real git repository, and every applied tree against the tree `git apply` leaves,
so the rules are git's, not a memory of them."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from patchset.authoring.diff import normalize_diff
from patchset.authoring.tree import diff_tree
from patchset.cli.main import main
from patchset.engine.apply import apply, revert
from patchset.errors import PayloadError
from patchset.image.build import _write_context
from patchset.refresh import refresh
from patchset.registry import load_registry
from patchset.registry.builds import load_definition
from patchset.registry.diffs import parse_diff
from patchset.release_check import CheckResult, check
from patchset.sources.folder import FolderSource
from tests.helpers.releases import tree_digest
from tests.helpers.synthetic import (
    BODY,
    MemoryReleases,
    add_patch,
    build_manifest,
    definition_text,
    exported_bundle,
    make_tree,
)

Completed = subprocess.CompletedProcess[str]
GONE = "vllm/sub/gone.py"
GONE_TEXT = "import os\n\n\ndef helper():\n    return os.sep\n"
MOD = "vllm/mod.py"
GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@example.invalid",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@example.invalid",
    "GIT_CONFIG_GLOBAL": os.devnull,
    "GIT_CONFIG_NOSYSTEM": "1",
}


def git(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["git", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        check=False,
        env={**os.environ, **GIT_ENV},
    )


def git_diff(tmp: Path, before: dict[str, str], after: dict[str, str | None]) -> str:
    """A real diff from git: `before` committed, then `after` written (None: `git rm`)."""
    repo = make_tree(tmp, before)
    assert git("init", "-q", ".", cwd=repo).returncode == 0
    git("add", "-A", cwd=repo)
    assert git("commit", "-qm", "before", cwd=repo).returncode == 0
    for rel, text in after.items():
        if text is None:
            assert git("rm", "-q", rel, cwd=repo).returncode == 0
        else:
            (repo / rel).write_text(text)
    git("add", "-A", cwd=repo)
    return git("diff", "--cached", cwd=repo).stdout


def payload(tmp: Path, before: dict[str, str], after: dict[str, str | None]) -> str:
    """The registry's form of git's diff, as `patchset add --diff` writes it."""
    return normalize_diff(git_diff(tmp, before, after), file="in.diff").text


def git_fits(tree: Path, diff: str, *, reverse: bool = False) -> bool:
    """`git apply --check` (or `--reverse --check`) in a git repository holding `tree`."""
    repo = Path(tempfile.mkdtemp(dir=tree.parent, prefix=f"{tree.name}-git-"))
    shutil.copytree(tree, repo, dirs_exist_ok=True)
    git("init", "-q", ".", cwd=repo)
    (repo / "p.diff").write_text(diff)
    extra = ["--reverse"] if reverse else []
    return git("apply", "--check", *extra, "p.diff", cwd=repo).returncode == 0


def git_class(tree: Path, diff: str) -> str:
    forward, backward = git_fits(tree, diff), git_fits(tree, diff, reverse=True)
    return {(True, False): "needed", (False, True): "upstream", (True, True): "both"}.get(
        (forward, backward), "conflict"
    )


def check_one(tmp: Path, tree: Path, diff: str, targets: list[str]) -> CheckResult:
    registry = tmp / "patches"
    if not (registry / "pat").exists():
        add_patch(registry, "pat", diff=diff, targets=targets)
    report = check(load_registry(registry), ["0.19.1"], source=FolderSource(tree), use_memo=False)
    return report.result("0.19.1", "pat")


def files_of(root: Path) -> dict[str, tuple[bytes, int]]:
    """Every file and folder under root (its bytes and mode), patchset's and git's own aside."""
    out: dict[str, tuple[bytes, int]] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if rel.split("/")[0] in (".git", ".patchset.lock", "p.diff"):
            continue
        data = path.read_bytes() if path.is_file() else b"<dir>"
        out[rel] = (data, stat.S_IMODE(path.stat().st_mode) & 0o111)
    return out


BASE = {MOD: BODY, GONE: GONE_TEXT}


@pytest.mark.parametrize(
    ("name", "release", "verdict"),
    [
        ("the very file", {GONE: GONE_TEXT}, "needed"),
        ("already gone", {}, "upstream"),
        ("a line more", {GONE: GONE_TEXT + "x = 1\n"}, "conflict"),
        ("a line changed", {GONE: GONE_TEXT.replace("os.sep", "os.pathsep")}, "conflict"),
        ("no final newline", {GONE: GONE_TEXT.rstrip("\n")}, "conflict"),
        ("CRLF line ends", {GONE: GONE_TEXT.replace("\n", "\r\n")}, "conflict"),
    ],
)
def test_deletion_verdicts_are_gits(
    tmp_path: Path, name: str, release: dict[str, str], verdict: str
) -> None:
    diff = payload(tmp_path / "cut", BASE, {GONE: None})
    assert "+++ /dev/null" in diff and "deleted file mode 100644" in diff
    tree = make_tree(tmp_path / "release", {MOD: BODY, **release})
    assert git_class(tree, diff) == verdict, name
    r = check_one(tmp_path, tree, diff, [GONE])
    assert r.verdict == verdict, (name, r)
    assert (r.signals.reverse, r.signals.forward) == (
        verdict == "upstream",
        {"needed": "applies", "upstream": "already-applied"}.get(verdict, "conflict"),
    )
    if verdict == "needed":
        assert r.locations == (f"{GONE}: hunk #1 applies: deletes the file",)
    elif verdict == "upstream":
        assert r.locations == (f"{GONE}: hunk #1 already present: the file is gone",)
    else:  # the reason names the file and says what differs
        assert r.detail.startswith(f"{GONE}: hunk #1 does not match: the diff deletes this file")
        assert "it is not the file the diff removes" in r.detail


def test_applied_deletion_is_gits_and_reverts_byte_exactly(tmp_path: Path) -> None:
    """The file deleted as git deletes it (its emptied folder too), then put back: the same
    bytes, the same mode (a 755 file stays executable), the folder recreated."""
    base = {MOD: BODY, GONE: GONE_TEXT, "vllm/run.sh": "#!/bin/sh\necho hi\n"}
    cut = make_tree(tmp_path / "cut", base)
    (cut / "vllm" / "run.sh").chmod(0o755)
    repo = cut
    git("init", "-q", ".", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "before", cwd=repo)
    git("rm", "-q", GONE, "vllm/run.sh", cwd=repo)
    (repo / MOD).write_text(BODY.replace("line 11\n", "line 11 patched\n"))
    git("add", "-A", cwd=repo)
    diff = normalize_diff(git("diff", "--cached", cwd=repo).stdout, file="in.diff").text
    assert "deleted file mode 100755" in diff
    ours = make_tree(tmp_path / "ours", base)
    (ours / "vllm" / "run.sh").chmod(0o755)
    theirs = tmp_path / "theirs"
    shutil.copytree(ours, theirs)
    before = files_of(ours)
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=diff, targets=[MOD, GONE, "vllm/run.sh"])
    report = apply(load_registry(registry), ours, patches=["pat"])
    assert report.written and report.exit_code == 0
    git("init", "-q", ".", cwd=theirs)
    (theirs / "p.diff").write_text(diff)
    assert git("apply", "p.diff", cwd=theirs).returncode == 0
    assert files_of(ours) == files_of(theirs)
    assert not (ours / "vllm" / "sub").exists()  # emptied, removed as git removes it
    back = revert(load_registry(registry), ours, patches=["pat"])
    assert back.written and back.exit_code == 0
    assert files_of(ours) == before
    assert os.access(ours / "vllm" / "run.sh", os.X_OK)


def test_partly_deleted_is_partial_with_hunk_states(tmp_path: Path) -> None:
    """A deletion already done upstream beside an edit still to make: `partial`, per hunk;
    git finds neither direction (whole-patch verdicts), so the benchmark counts a conflict."""
    after: dict[str, str | None] = {GONE: None, MOD: BODY.replace("line 11\n", "line 11 new\n")}
    diff = payload(tmp_path / "cut", BASE, after)
    tree = make_tree(tmp_path / "release", {MOD: BODY})
    assert git_class(tree, diff) == "conflict"
    r = check_one(tmp_path, tree, diff, [MOD, GONE])
    assert r.verdict == "partial"
    assert set(r.locations) == {
        f"{GONE}: hunk #1 already present: the file is gone",
        f"{MOD}: hunk #1 applies at line 8",
    }


def test_an_empty_file_deleted(tmp_path: Path) -> None:
    """git writes an empty file's deletion as a header without a hunk: it still has a state."""
    diff = payload(tmp_path / "cut", {MOD: BODY, "vllm/empty.py": ""}, {"vllm/empty.py": None})
    assert "@@" not in diff
    (only,) = parse_diff(diff, file="x.diff")
    assert (only.path, only.removed, only.whole_text()) == ("vllm/empty.py", True, "")
    tree = make_tree(tmp_path / "release", {MOD: BODY, "vllm/empty.py": ""})
    assert git_class(tree, diff) == "needed"
    assert check_one(tmp_path, tree, diff, ["vllm/empty.py"]).verdict == "needed"
    registry = load_registry(tmp_path / "patches")
    assert apply(registry, tree, patches=["pat"]).written
    assert not (tree / "vllm" / "empty.py").exists()
    assert git_class(tree, diff) == "upstream"
    assert revert(registry, tree, patches=["pat"]).written
    assert (tree / "vllm" / "empty.py").read_bytes() == b""


def test_conflicting_deletion_names_the_file_and_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    diff = payload(tmp_path / "cut", BASE, {GONE: None})
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=diff, targets=[GONE])
    tree = make_tree(tmp_path / "release", {MOD: BODY, GONE: GONE_TEXT + "EXTRA = 1\n"})
    before = tree_digest(tree)
    code = main(["--registry", str(registry), "apply", "--target", str(tree), "--patch", "pat"])
    out = capsys.readouterr().out
    assert code == 1
    assert "gone.py" in out and "it is not the file the diff" in out
    assert tree_digest(tree) == before


def test_truncated_deletion_is_refused_in_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A deletion whose hunk has fewer lines than its header says: refused (exit 2) in one
    line by `add`, nothing written to the registry; and by `apply`, nothing deleted."""
    diff = payload(tmp_path / "cut", BASE, {GONE: None})
    cut = diff[: diff.index("-import os\n") + len("-import os\n")]  # one line of five kept
    (tmp_path / "trunc.diff").write_text(cut)
    registry = tmp_path / "patches"
    registry.mkdir()
    code = main(
        ["--registry", str(registry), "add", "trunc", "--diff", str(tmp_path / "trunc.diff")]
    )
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1 and "shorter than expected" in err[0], err
    assert list(registry.iterdir()) == []
    add_patch(registry, "trunc", diff=cut, targets=[GONE])
    tree = make_tree(tmp_path / "release", BASE)
    before = tree_digest(tree)
    code = main(["--registry", str(registry), "apply", "--target", str(tree), "--patch", "trunc"])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert code == 2
    assert len(err) == 1 and "shorter than expected" in err[0], err
    assert tree_digest(tree) == before


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (  # two hunks: git writes one
            f"diff --git a/{GONE} b/{GONE}\ndeleted file mode 100644\n--- a/{GONE}\n+++ /dev/null\n"
            "@@ -1,1 +0,0 @@\n-a\n@@ -2,1 +0,0 @@\n-b\n",
            "must be one hunk removing every line from line 1",
        ),
        (  # a context line in a deletion
            f"--- a/{GONE}\n+++ /dev/null\n@@ -1,2 +0,1 @@\n a\n-b\n",
            "must be one hunk removing every line from line 1",
        ),
        (  # a symlink's deletion
            f"diff --git a/{GONE} b/{GONE}\ndeleted file mode 120000\n--- a/{GONE}\n+++ /dev/null\n"
            "@@ -1 +0,0 @@\n-target\n\\ No newline at end of file\n",
            "file mode 120000 is not a regular file's",
        ),
        (  # a plain rename stays refused
            f"diff --git a/{GONE} b/vllm/other.py\nsimilarity index 100%\n"
            f"rename from {GONE}\nrename to vllm/other.py\n",
            "renames are not supported",
        ),
    ],
)
def test_deletions_git_does_not_write_are_refused(text: str, message: str) -> None:
    with pytest.raises(PayloadError, match=message):
        normalize_diff(text, file="in.diff")


def test_from_tree_expresses_deletions(tmp_path: Path) -> None:
    """`add --from-tree`: a release file gone from a folder the edited tree holds is a
    deletion when deletions are allowed (issue 36: never otherwise); one whose folder the tree
    lacks altogether is not (a checkout has no wheel-built folders) unless named; `--file`
    limits the patch to the files named, as before."""
    pristine = make_tree(tmp_path / "pristine", BASE)
    edited = make_tree(tmp_path / "edited", {MOD: BODY.replace("line 3\n", "line three\n")})
    with FolderSource(pristine).open("0.19.1") as tree:
        unheld = diff_tree(edited, tree)
        (edited / GONE).parent.mkdir()  # the folder is there, the file is gone: deleted
        kept = diff_tree(edited, tree)  # ... only when allowed
        found = diff_tree(edited, tree, deletions=True)
        limited = diff_tree(edited, tree, [MOD])
        only_gone = diff_tree(edited, tree, [GONE])
    assert (unheld.deleted, unheld.files, unheld.not_held) == ((), (MOD,), ("vllm/sub/",))
    assert (kept.deleted, kept.files, kept.absent) == ((), (MOD,), (GONE,))
    assert found.deleted == (GONE,) and set(found.files) == {MOD, GONE}
    assert (limited.deleted, limited.files) == ((), (MOD,))
    assert only_gone.deleted == (GONE,)
    diffs = {d.path: d for d in parse_diff(normalize_diff(found.text, file="t").text, file="t")}
    assert diffs[GONE].removed and diffs[GONE].whole_text() == GONE_TEXT
    # The payload takes the pristine tree to the edited one, as git does.
    assert git_class(pristine, normalize_diff(found.text, file="t").text) == "needed"


DEFINITION = definition_text("0.20.0", ["drop-it"])


def _starter(bin_dir: Path, bundle: Path, site: Path) -> Callable[..., Completed]:
    """Runs the bundle's entrypoint on `site` (a stand-in `vllm` on PATH, no GPU)."""
    bin_dir.mkdir()
    (bin_dir / "vllm").write_text("#!/bin/sh\nexit 0\n")
    (bin_dir / "vllm").chmod(0o755)

    def start(*args: str, manifest_path: Path | None = None) -> Completed:
        env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "PATCHSET_VLLM_ROOT": str(site)}
        env["PATCHSET_PYCACHE"] = str(bin_dir.parent / "pycache")  # not the machine's /tmp
        if manifest_path is not None:
            env["PATCHSET_MANIFEST"] = str(manifest_path)
        return subprocess.run(
            [sys.executable, str(bundle / "entrypoint.py"), *args],
            capture_output=True,
            text=True,
            check=False,
            env={**env, "PATCHSET_COMPUTE_CAPABILITY": "none"},
        )

    return start


SCRIPT = "vllm/tools/run.sh"
SCRIPT_DIFF = f"""\
diff --git a/{SCRIPT} b/{SCRIPT}
new file mode 100755
--- /dev/null
+++ b/{SCRIPT}
@@ -0,0 +1,2 @@
+#!/bin/sh
+echo hi
"""


def test_stock_bundle_deletes_at_start_and_a_built_image_verifies_it(tmp_path: Path) -> None:
    """The in-image entrypoint (standard library only) applies a deletion from an exported
    bundle: the file goes (and the folder it empties), a restart finds it gone (already
    applied), a file changed since the export is refused with nothing written; a script the
    same diff creates is written 755; the built-image check (`--verify` on a manifest of
    delivery "image") holds a deleted file to be gone."""
    code = "".join(f"x{i} = {i}\n" for i in range(1, 21))  # compiled by --verify
    base = {MOD: code, GONE: GONE_TEXT}
    diff = payload(tmp_path / "cut", base, {GONE: None, MOD: code.replace("x2 = 2", "two = 2")})
    diff = normalize_diff(diff + SCRIPT_DIFF, file="in.diff").text
    registry = tmp_path / "patches"
    add_patch(registry, "drop-it", diff=diff, targets=[MOD, GONE, SCRIPT])
    bundle, site = exported_bundle(tmp_path, registry, base, DEFINITION)
    manifest = json.loads((bundle / "manifest.json").read_text())
    (entry,) = manifest["patches"]
    assert entry["files"][GONE]["after"] == "" and entry["files"][GONE]["before"]
    start = _starter(tmp_path / "bin", bundle, site)

    (site / GONE).write_text(GONE_TEXT + "# edited\n")
    before = tree_digest(site)
    done = start()
    assert done.returncode == 9 and "vllm/sub/gone.py differs" in done.stdout, done.stdout
    assert tree_digest(site) == before  # nothing written, not even mod.py
    (site / GONE).write_text(GONE_TEXT)
    done = start()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "drop-it r1 (build): applied" in done.stdout
    assert not (site / GONE).exists() and "two" in (site / MOD).read_text()
    assert not (site / "vllm" / "sub").exists()  # the folder it emptied goes, as with git
    assert (site / SCRIPT).read_text() == "#!/bin/sh\necho hi\n"
    assert stat.S_IMODE((site / SCRIPT).stat().st_mode) == 0o755  # created as git creates it
    again = start()
    assert again.returncode == 0 and "drop-it r1 (build): already-applied" in again.stdout
    built = {rel: digests["after"] for rel, digests in entry["files"].items()}
    image = {**manifest, "delivery": "image", "targets": {**manifest["targets"], **built}}
    (tmp_path / "image.json").write_text(json.dumps(image))
    report = json.loads(start("--verify", manifest_path=tmp_path / "image.json").stdout)
    assert report["ok"], json.dumps(report)
    (site / GONE).parent.mkdir()
    (site / GONE).write_text(GONE_TEXT)  # the deleted file is back: the image is not as built
    report = json.loads(start("--verify", manifest_path=tmp_path / "image.json").stdout)
    assert not report["ok"]
    assert "still there, though deleted at build time" in json.dumps(report)


TwoReleases = MemoryReleases


def test_refresh_carries_a_deletion(tmp_path: Path) -> None:
    """A patch deleting a file and editing another, refreshed onto a release where the edit's
    context moved: the three-way merge keeps the deletion, and the new variant holds it."""
    after: dict[str, str | None] = {GONE: None, MOD: BODY.replace("line 11\n", "line 11 new\n")}
    diff = payload(tmp_path / "cut", BASE, after)
    registry = tmp_path / "patches"
    add_patch(registry, "pat", diff=diff, targets=[MOD, GONE], vllm=">=0.19.1,<0.20.0")
    newer = BODY.replace("line 8\n", "line 8 upstream\n")
    source = TwoReleases({"0.19.1": BASE, "0.20.0": {MOD: newer, GONE: GONE_TEXT}})
    result = refresh(load_registry(registry), "pat", "0.20.0", source=source)
    assert result.outcome == "written", result
    carried = {d.path: d for d in parse_diff(result.payload, file="new.diff")}
    assert carried[GONE].removed and carried[GONE].whole_text() == GONE_TEXT
    report = check(load_registry(registry), ["0.20.0"], source=source, use_memo=False)
    assert report.result("0.20.0", "pat").verdict == "needed"


def test_add_from_tree_names_the_deletions(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The command: without --allow-deletions nothing is deleted (said); with it the deletion
    is named on stderr, the payload checked `needed` on the release it was cut from; `--file`
    leaves it out."""
    pristine = make_tree(tmp_path / "pristine", BASE)
    edited = make_tree(tmp_path / "edited", {MOD: BODY.replace("line 3\n", "line three\n")})
    (edited / GONE).parent.mkdir()
    registry = tmp_path / "patches"
    registry.mkdir()
    source = ["--vllm", "0.19.1", "--source", str(pristine)]
    args = ["--registry", str(registry), "add", "edits", "--from-tree", str(edited), *source]
    assert main([*args[:3], "no-deletion", *args[4:]]) == 0
    assert f"not deleted: 1 file(s) of vLLM 0.19.1 absent from the edited tree ({GONE})" in (
        capsys.readouterr().err
    )
    assert "+++ /dev/null" not in (registry / "no-deletion" / "patch.diff").read_text()
    assert main([*args, "--allow-deletions"]) == 0
    err = capsys.readouterr().err
    assert f"deletes 1 file of vLLM 0.19.1 absent from the edited tree: {GONE}" in err
    assert "0.19.1 needed" in (registry / "edits" / "patch.toml").read_text()
    assert main([*args[:3], "only-mod", *args[4:], "--file", MOD]) == 0
    assert "deletes" not in capsys.readouterr().err
    assert "+++ /dev/null" not in (registry / "only-mod" / "patch.diff").read_text()


def test_a_created_script_keeps_its_mode_from_add_to_apply(tmp_path: Path) -> None:
    """A file a diff creates 755 (git's `new file mode 100755`) stays executable: `add --diff`
    keeps the mode, `add --from-tree` writes it for an executable file of the edited tree, and
    apply creates it 755, as `git apply` does; revert removes it."""
    base = {MOD: BODY}
    repo = make_tree(tmp_path / "repo", base)
    git("init", "-q", ".", cwd=repo)
    git("add", "-A", cwd=repo)
    git("commit", "-qm", "before", cwd=repo)
    (repo / "vllm" / "tools").mkdir()
    (repo / "vllm" / "tools" / "run.sh").write_text("#!/bin/sh\necho hi\n")
    (repo / "vllm" / "tools" / "run.sh").chmod(0o755)
    (repo / "vllm" / "tools" / "data.py").write_text("DATA = 1\n")
    git("add", "-A", cwd=repo)
    from_git = normalize_diff(git("diff", "--cached", cwd=repo).stdout, file="in.diff").text
    assert from_git.count("new file mode 100755") == 1
    with FolderSource(make_tree(tmp_path / "pristine", base)).open("0.19.1") as tree:
        files = ["vllm/tools/run.sh", "vllm/tools/data.py"]
        from_tree = normalize_diff(diff_tree(repo, tree, files).text, file="t").text
    assert from_tree.count("new file mode 100755") == 1
    for name, diff in (("git", from_git), ("tree", from_tree)):
        modes = {d.path: d.executable for d in parse_diff(diff, file="t")}
        assert modes == {"vllm/tools/run.sh": True, "vllm/tools/data.py": False}, name
        ours = make_tree(tmp_path / f"ours-{name}", base)
        theirs = make_tree(tmp_path / f"theirs-{name}", base)
        registry = tmp_path / f"patches-{name}"
        add_patch(registry, "pat", diff=diff, targets=files)
        report = apply(load_registry(registry), ours, patches=["pat"])
        assert report.written and report.exit_code == 0
        git("init", "-q", ".", cwd=theirs)
        (theirs / "p.diff").write_text(diff)
        assert git("apply", "p.diff", cwd=theirs).returncode == 0
        (theirs / "p.diff").unlink()
        shutil.rmtree(theirs / ".git")
        assert files_of(ours) == files_of(theirs)
        assert os.access(ours / "vllm" / "tools" / "run.sh", os.X_OK)
        assert not os.access(ours / "vllm" / "tools" / "data.py", os.X_OK)
        back = revert(load_registry(registry), ours, patches=["pat"])
        assert back.written and not (ours / "vllm" / "tools").exists()


def test_a_build_context_keeps_a_created_script_executable(tmp_path: Path) -> None:
    """`COPY files/` keeps the context's modes: a script a build patch creates 755 is laid
    out 755, the files it patches 644; what it deletes is removed by `RUN rm`, then the folders
    that leaves empty (never vllm/ itself)."""
    (tmp_path / "builds").mkdir()
    (tmp_path / "builds" / "0.20.0.toml").write_text(DEFINITION)
    definition = load_definition(tmp_path / "builds" / "0.20.0.toml")
    context = tmp_path / "context"
    _write_context(
        context,
        definition=definition,
        from_ref="base",
        root="/site",
        build_ids=["drop-it"],
        patched={MOD: b"x = 1\n", SCRIPT: b"#!/bin/sh\n"},
        manifest=build_manifest("drop-it", [MOD, SCRIPT, GONE], executable=(SCRIPT,)),
        plugins={},
    )
    assert stat.S_IMODE((context / "files" / SCRIPT).stat().st_mode) == 0o755
    assert stat.S_IMODE((context / "files" / MOD).stat().st_mode) & 0o111 == 0
    dockerfile = (context / "Dockerfile").read_text()
    assert "COPY files/ /site/\n" in dockerfile
    removal = f"RUN rm -f -- /site/{GONE}"
    removal += ' && for d in /site/vllm/sub; do rmdir -- "$d" 2>/dev/null || true; done\n'
    assert removal in dockerfile, dockerfile
