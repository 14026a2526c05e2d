"""Hostile and malformed input from tests/corpus/, through the command line as a user runs it.

Each case gives its documented exit code; an error is one line that names the place (the
payload, the patch folder or the target) and says what is wrong; nothing outside the target
changes; nothing at all changes on failure; a successful apply is reverted byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from patchset.errors import PayloadError
from patchset.registry.paths import check_relpath
from tests.helpers.cli import run_cli
from tests.helpers.fake_index import FakeIndex, Reply
from tests.helpers.hardening import LOCK, Snapshot, changed, cli, error_line, snapshot
from tests.helpers.other_user import patchset_as_other_user
from tests.helpers.reliability import HOSTILE, record
from tests.helpers.synthetic import BODY, MOD_DIFF, OTHER, OTHER_DIFF, OTHER_FIX

CORPUS = Path(__file__).parent / "corpus"
PWNED = Path("/tmp/patchset-pwned")  # what the Python-looking payloads would create if run

GOOD_DIFF = MOD_DIFF + OTHER_FIX
GOOD_SITES = """\
[[site]]
name = "five"
file = "vllm/mod.py"
action = "replace"
marker = "patchset: corpus five"
anchor = "line 5"
text = "line five"
"""
PATCH_TOML = """\
id = "{id}"
title = "a corpus case"
description = "built by tests/test_hostile_corpus.py"
kind = "{kind}"
revision = 1
vllm = ">=0.1"
apply = "{when}"
targets = {targets}
origin = "tests/corpus"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""
GROUPS = {
    ".diff": "corpus: diff payloads",
    ".sites.toml": "corpus: runtime site payloads",
    ".patch.toml": "corpus: patch.toml metadata",
    ".registry.toml": "corpus: registry layouts",
    ".tree.toml": "corpus: target trees",
}
_ROW = re.compile(r"^\| `(?P<name>[^`]+)` \| (?P<code>\d+)(?:: (?P<text>.*?))? \| (?P<what>.+) \|$")


@dataclass(frozen=True)
class Case:
    name: str
    code: int
    text: str
    what: str

    @property
    def suffix(self) -> str:
        return next(s for s in GROUPS if self.name.endswith(s))


def read_cases() -> list[Case]:
    rows = []
    for line in (CORPUS / "README.md").read_text(encoding="utf-8").splitlines():
        if match := _ROW.match(line):
            code = int(match["code"])
            rows.append(Case(match["name"], code, match["text"] or "", match["what"]))
    return rows


CASES = read_cases()


@dataclass(frozen=True)
class Setup:
    registry: Path
    target: Path
    outside: Path
    place: Path  # what an error must name
    transient: tuple[str, ...] = ()  # entries patchset may remove (planted in its own names)


def _safe(path: str) -> bool:
    try:
        check_relpath(path, file="corpus")
    except PayloadError:
        return False
    return True


def _toml_list(items: list[str]) -> str:
    return "[" + ", ".join(json.dumps(i) for i in dict.fromkeys(items)) + "]"


def _diff_targets(text: str) -> list[str]:
    found = []
    for line in text.splitlines():
        if line.startswith(("--- ", "+++ ")):
            path = line[4:].split("\t")[0].strip()
            path = path[2:] if path.startswith(("a/", "b/")) else path
            if _safe(path):
                found.append(path)
    return found or ["vllm/mod.py"]


def _write_patch(folder: Path, *, kind: str, targets: list[str], payload: bytes) -> None:
    folder.mkdir(parents=True)
    when = "build" if kind == "diff" else "startup"
    meta = PATCH_TOML.format(id=folder.name, kind=kind, when=when, targets=_toml_list(targets))
    (folder / "patch.toml").write_text(meta)
    (folder / ("patch.diff" if kind == "diff" else "sites.toml")).write_bytes(payload)


def _default_tree(target: Path) -> None:
    (target / "vllm").mkdir(parents=True)
    (target / "vllm" / "__init__.py").write_text("")
    (target / "vllm" / "_version.py").write_text("__version__ = version = '0.19.1'\n")
    (target / "vllm" / "mod.py").write_text(BODY)
    (target / "vllm" / "other.py").write_text(OTHER)


def _fill(value: str, outside: Path) -> str:
    return (
        value.replace("{outside}", str(outside))
        .replace("{body_crlf}", BODY.replace("\n", "\r\n"))
        .replace("{body}", BODY)
    )


def _build_tree(spec: dict[str, Any], target: Path, outside: Path) -> None:
    if spec.get("bare"):
        target.mkdir(parents=True)
    else:
        _default_tree(target)
    for item in spec.get("outside", []):
        path = outside / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(_fill(item["text"], outside))
    for item in spec.get("file", []):
        path = target / item["path"]
        path.parent.mkdir(parents=True, exist_ok=True)
        if "hex" in item:
            data = bytes.fromhex(item["hex"])
        else:
            data = _fill(item["text"], outside).encode() * item.get("repeat", 1)
        with path.open("ab" if item.get("append") else "wb") as fh:
            fh.write(data)
    for item in spec.get("dir", []):
        _clear(target / item["path"]).mkdir(parents=True)
    for item in spec.get("fifo", []):
        os.mkfifo(_clear(target / item["path"]))
    for item in spec.get("link", []):
        _clear(target / item["path"]).symlink_to(_fill(item["to"], outside))
    for item in spec.get("hardlink", []):
        _clear(target / item["path"]).hardlink_to(_fill(item["to"], outside))


def _clear(path: Path) -> Path:
    """Make room for a special entry where the default tree has a file."""
    if path.is_symlink() or path.is_file():
        path.unlink()
    return path


def build(case: Case, tmp: Path) -> Setup:
    registry, target, outside = tmp / "patches", tmp / "target", tmp / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("do not touch\n")
    data = (CORPUS / case.name).read_bytes()
    folder = registry / "corpus-case"
    transient: tuple[str, ...] = ()
    place = folder
    if case.suffix == ".diff":
        targets = _diff_targets(data.decode("utf-8", errors="replace"))
        _write_patch(folder, kind="diff", targets=targets, payload=data)
        _default_tree(target)
    elif case.suffix == ".sites.toml":
        found = re.findall(r'^file = "([^"]*)"', data.decode("utf-8", "replace"), re.M)
        targets = [f for f in found if _safe(f)] or ["vllm/mod.py"]
        _write_patch(folder, kind="runtime", targets=targets, payload=data)
        _default_tree(target)
    elif case.suffix == ".patch.toml":
        _write_patch(folder, kind="diff", targets=[], payload=GOOD_DIFF.encode())
        (folder / "sites.toml").write_text(GOOD_SITES)
        (folder / "patch.toml").write_bytes(data)
        _default_tree(target)
    elif case.suffix == ".registry.toml":
        place = registry
        registry.mkdir()
        for name, spec in tomllib.loads(data.decode())["folders"].items():
            if spec.get("missing"):
                (registry / name).mkdir()
                continue
            _write_patch(
                registry / name,
                kind="diff",
                targets=["vllm/mod.py", "vllm/other.py"],
                payload=GOOD_DIFF.encode(),
            )
            meta = registry / name / "patch.toml"
            text = meta.read_text().replace(f'id = "{name}"', f"id = {json.dumps(spec['id'])}")
            meta.write_text(text)
            if spec.get("toml_is_folder"):
                meta.unlink()
                meta.mkdir()
        _default_tree(target)
    else:
        spec = tomllib.loads(data.decode())
        diff = spec.get("diff", GOOD_DIFF)
        targets = _diff_targets(diff)
        _write_patch(folder, kind="diff", targets=targets, payload=diff.encode())
        _build_tree(spec, target, outside)
        place = target
        transient = tuple(spec.get("transient", ()))
    return Setup(registry, target, outside, place, transient)


def _report_text(stdout: str) -> str:
    report = json.loads(stdout)
    lines = [line for r in report["results"] for line in r["details"] + r["warnings"]]
    return "\n".join(lines)


@dataclass(frozen=True)
class Outcome:
    setup: Setup
    before: Snapshot  # the target before the apply
    after: Snapshot  # ... after it
    proc: subprocess.CompletedProcess[str]
    untouched: bool  # outside the target, the registry: unchanged; no payload ran
    restored: bool  # failed: the target unchanged; applied: the revert gave it back


def run_case(case: Case, tmp: Path) -> Outcome:
    tmp.mkdir()
    setup = build(case, tmp)
    before = snapshot(setup.target)
    outside_before = snapshot(setup.outside)
    registry_before = snapshot(setup.registry)
    args = ("--registry", str(setup.registry))
    # --strict: the corpus names the distinct codes (7 for an offset). Every patch folder is
    # asked for by id: a plain apply skips a patch that does not load, with a warning.
    asked = [
        arg
        for p in sorted(setup.registry.iterdir() if setup.registry.is_dir() else [])
        if p.is_dir() and not p.name.startswith(".")
        for arg in ("--patch", p.name)
    ]
    proc = cli(
        *args, "apply", "--strict", *asked, "--target", str(setup.target), "--format", "json"
    )
    after = snapshot(setup.target)
    untouched = snapshot(setup.outside) == outside_before
    untouched = untouched and snapshot(setup.registry) == registry_before and not PWNED.exists()
    if proc.returncode in (0, 7):
        back = cli(*args, "revert", "--target", str(setup.target), "--format", "json")
        now = snapshot(setup.target, ignore=(LOCK, *setup.transient))
        expected = {k: v for k, v in before.items() if k not in setup.transient}
        restored = back.returncode == 0 and now == expected
    else:
        restored = after == before
    return Outcome(setup, before, after, proc, untouched, restored)


@pytest.fixture(scope="module")
def outcomes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Outcome]:
    """Every case at once, a few processes at a time: each costs an interpreter start."""
    root = tmp_path_factory.mktemp("corpus")
    with ThreadPoolExecutor(max_workers=4) as pool:
        futures = {c.name: pool.submit(run_case, c, root / c.name) for c in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_corpus_case(case: Case, outcomes: dict[str, Outcome]) -> None:
    out = outcomes[case.name]
    record(HOSTILE, GROUPS[case.suffix], case.name, intact=out.untouched and out.restored)
    assert out.untouched, "something outside the target, or the registry, changed"
    assert out.proc.returncode == case.code, out.proc.stdout + out.proc.stderr
    if case.code == 2:
        line = error_line(out.proc)
        assert case.text in line
        assert str(out.setup.place) in line, f"the error does not name {out.setup.place}"
        assert out.after == out.before, changed(out.before, out.after)
    else:
        assert case.text in _report_text(out.proc.stdout)
        assert out.restored, "the revert did not give back the very bytes"


def test_every_corpus_file_has_a_readme_line() -> None:
    files = {p.name for p in CORPUS.iterdir() if p.name != "README.md"}
    described = [c.name for c in CASES]
    assert len(described) == len(set(described)), "a case is described twice"
    assert files == set(described)
    assert all(c.what.strip() for c in CASES)


# -- generated: inputs too big to keep as files ----------------------------------------------


def _giant_setup(tmp_path: Path, diff: str, files: dict[str, bytes]) -> tuple[Path, Path]:
    registry, target = tmp_path / "patches", tmp_path / "target"
    targets = [p for p in _diff_targets(diff) if p in files] or ["vllm/mod.py"]
    _write_patch(registry / "giant", kind="diff", targets=targets, payload=diff.encode())
    _default_tree(target)
    for rel, data in files.items():
        (target / rel).write_bytes(data)
    return registry, target


@pytest.mark.parametrize("size", [1 << 20, 8 << 20])
def test_giant_payload_line(tmp_path: Path, size: int) -> None:
    """A diff adding one line of `size` bytes: applied and reverted byte for byte."""
    giant = "x" * size
    diff = f"--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -1,2 +1,3 @@\n line 1\n+{giant}\n line 2\n"
    registry, target = _giant_setup(tmp_path, diff, {"vllm/mod.py": BODY.encode()})
    before = snapshot(target)
    args = ("--registry", str(registry))
    done = cli(*args, "apply", "--target", str(target))
    back = cli(*args, "revert", "--target", str(target))
    ok = done.returncode == 0 and back.returncode == 0
    ok = ok and snapshot(target, ignore=(LOCK,)) == before
    record(HOSTILE, "generated: giant inputs", f"a {size >> 20} MB payload line", intact=ok)
    assert ok, done.stderr + back.stderr


def test_huge_hunk(tmp_path: Path) -> None:
    """One hunk replacing a 20,000-line file with 40,000 lines, against a CRLF copy."""
    old = [f"old {i}" for i in range(20_000)]
    new = [f"new {i}" for i in range(40_000)]
    diff = "--- a/vllm/mod.py\n+++ b/vllm/mod.py\n@@ -1,20000 +1,40000 @@\n"
    diff += "".join(f"-{line}\n" for line in old) + "".join(f"+{line}\n" for line in new)
    text = "\r\n".join(old) + "\r\n"
    registry, target = _giant_setup(tmp_path, diff, {"vllm/mod.py": text.encode()})
    before = snapshot(target)
    args = ("--registry", str(registry))
    done = cli(*args, "apply", "--target", str(target))
    patched = (target / "vllm/mod.py").read_bytes()
    back = cli(*args, "revert", "--target", str(target))
    ok = done.returncode == 0 and patched == ("\r\n".join(new) + "\r\n").encode()
    ok = ok and back.returncode == 0 and snapshot(target, ignore=(LOCK,)) == before
    record(HOSTILE, "generated: giant inputs", "a 60,000-line hunk", intact=ok)
    assert ok, done.stderr + back.stderr


def test_giant_error_is_one_short_line(tmp_path: Path) -> None:
    """A megabyte-long path with '..' and escape sequences: one line, cut, escaped."""
    path = "vllm/" + "\x1b[31m../" * 100_000 + "x.py"
    diff = f"--- a/{path}\n+++ b/{path}\n@@ -1 +1 @@\n-a\n+b\n"
    registry, target = _giant_setup(tmp_path, diff, {})
    before = snapshot(target)
    proc = cli("--registry", str(registry), "apply", "--patch", "giant", "--target", str(target))
    line = error_line(proc)
    ok = proc.returncode == 2 and len(line) < 2_200 and snapshot(target) == before
    record(HOSTILE, "generated: giant inputs", "a 1 MB hostile path", intact=ok)
    assert ok, line[:300]
    assert "characters cut" in line


# -- generated: what a red team found (issue 16) ---------------------------------------------


def _two_patch_registry(tmp_path: Path, *, conflicting: bool) -> tuple[Path, Path]:
    registry, target = tmp_path / "patches", tmp_path / "target"
    _write_patch(registry / "good", kind="diff", targets=["vllm/mod.py"], payload=MOD_DIFF.encode())
    other = OTHER_DIFF.replace(" alpha\n", " not alpha\n") if conflicting else OTHER_DIFF
    _write_patch(
        registry / "stopper", kind="diff", targets=["vllm/other.py"], payload=other.encode()
    )
    _default_tree(target)
    return registry, target


@pytest.mark.parametrize("operation", ["apply", "revert"])
def test_a_blocked_run_says_so_on_every_row(tmp_path: Path, operation: str) -> None:
    """One patch conflicts: the one that fits is `blocked`, not `applied`/`reverted`."""
    registry, target = _two_patch_registry(tmp_path, conflicting=True)
    args = ("--registry", str(registry))
    if operation == "revert":
        assert cli(*args, "apply", "--target", str(target), "--patch", "good").returncode == 0
    before = snapshot(target)
    proc = cli(*args, operation, "--target", str(target), "--format", "json")
    outcomes = {r["patch"]: r["outcome"] for r in json.loads(proc.stdout)["results"]}
    unchanged = snapshot(target) == before
    ok = proc.returncode == 1 and outcomes["good"] == "blocked" and unchanged
    record(HOSTILE, "generated: red-team findings", f"blocked {operation}", intact=unchanged)
    assert ok, (outcomes, proc.stderr)
    table = cli(*args, operation, "--target", str(target), env={"COLUMNS": "300"})
    assert "blocked" in table.stdout and "stopper stopped the run" in table.stdout


def test_the_library_says_blocked_too(tmp_path: Path) -> None:
    from patchset.engine.apply import apply
    from patchset.registry import load_registry

    registry, target = _two_patch_registry(tmp_path, conflicting=True)
    report = apply(load_registry(registry), target)
    assert not report.written
    assert [r.outcome for r in report.results] == ["blocked", "conflict"]
    assert [r.outcome for r in apply(load_registry(registry), target, dry_run=True).results] == [
        "applied",
        "conflict",
    ]  # a dry run says what would happen to each


@pytest.mark.parametrize("command", ["apply", "check"])
def test_negative_fuzz_is_refused(tmp_path: Path, command: str) -> None:
    registry, target = _two_patch_registry(tmp_path, conflicting=False)
    before = snapshot(target)
    where = ("--target", str(target)) if command == "apply" else ("--source", f"folder:{target}")
    proc = cli("--registry", str(registry), command, *where, "--fuzz", "-1")
    line = error_line(proc)
    ok = proc.returncode == 2 and "--fuzz" in line and snapshot(target) == before
    record(HOSTILE, "generated: red-team findings", f"{command} --fuzz -1", intact=ok)
    assert ok, line


def test_negative_fuzz_in_the_library(tmp_path: Path) -> None:
    from patchset.engine.apply import apply
    from patchset.errors import UsageError
    from patchset.registry import load_registry

    registry, target = _two_patch_registry(tmp_path, conflicting=False)
    with pytest.raises(UsageError, match="--fuzz -1"):
        apply(load_registry(registry), target, max_fuzz=-1)


def test_revert_of_a_never_applied_final_newline(tmp_path: Path) -> None:
    """A diff that only adds a final newline, never applied: nothing to take out (was: it
    "reverted", exit 7, rewriting the same bytes)."""
    diff = "--- a/vllm/other.py\n+++ b/vllm/other.py\n@@ -1,3 +1,3 @@\n alpha\n beta\n-gamma\n"
    diff += "\\ No newline at end of file\n+gamma\n"
    registry, target = _giant_setup(tmp_path, diff, {"vllm/other.py": b"alpha\nbeta\ngamma"})
    before = snapshot(target)
    proc = cli("--registry", str(registry), "revert", "--target", str(target), "--format", "json")
    outcomes = [r["outcome"] for r in json.loads(proc.stdout)["results"]]
    ok = proc.returncode in (0, 6) and outcomes == ["not-applied"] and snapshot(target) == before
    record(HOSTILE, "generated: red-team findings", "revert of a never-applied newline", intact=ok)
    assert ok, (proc.returncode, outcomes)


@pytest.mark.parametrize("link", ["payload", "patch.toml", "folder"])
def test_symlinks_out_of_the_patch_folder_are_refused(tmp_path: Path, link: str) -> None:
    registry, target = _two_patch_registry(tmp_path, conflicting=False)
    outside = tmp_path / "outside"
    shutil.copytree(registry / "good", outside / "good")
    if link == "folder":
        shutil.rmtree(registry / "good")
        (registry / "good").symlink_to(outside / "good")
    else:
        name = "patch.diff" if link == "payload" else "patch.toml"
        (registry / "good" / name).unlink()
        (registry / "good" / name).symlink_to(outside / "good" / name)
    lines = []
    proc = cli("--registry", str(registry), "validate")
    lines.append((proc.returncode, error_line(proc)))
    ok = proc.returncode == 2 and "a symlink leading out of" in lines[0][1]
    # apply refuses it, or (asked for another patch) goes on without it, and says so
    for only in ((), ("--patch", "stopper")):
        proc = cli("--registry", str(registry), "apply", "--target", str(target), *only)
        lines.append((proc.returncode, proc.stderr))
        ok = ok and "a symlink leading out of" in proc.stderr and "Traceback" not in proc.stderr
        ok = ok and (target / "vllm/mod.py").read_text() == BODY
    record(HOSTILE, "generated: red-team findings", f"{link} symlinked out", intact=ok)
    assert ok, lines


def test_usage_errors_are_one_line(tmp_path: Path) -> None:
    """argparse's usage block is not printed: one line, exit 2."""
    for args in (("bogus",), ("apply", "--fuzz", "x"), ("check", "--vllm")):  # argparse
        proc = cli(*args)
        assert proc.returncode == 2
        assert "usage:" not in error_line(proc)


def test_a_damaged_cache_then_a_failed_fetch_is_one_line(
    fake_index: FakeIndex, tmp_path: Path
) -> None:
    """Every cached file tampered with (each is deleted when it does not check out), then the
    release cannot be fetched again: stderr is the one error line, no warning before it."""
    fake_index.add_release("0.19.1", {"vllm/mod.py": BODY.encode()})
    registry, _ = _two_patch_registry(tmp_path, conflicting=False)
    cache = tmp_path / "cache"
    env = {"PATCHSET_CACHE_DIR": str(cache)}
    args = ("--registry", str(registry), "check", "--vllm", "0.19.1")
    first = cli(*args, "--index-url", fake_index.index_url, env=env)
    assert first.returncode in (0, 1, 5), first.stderr
    cached = [p for p in cache.rglob("*") if p.is_file() and not p.name.endswith(".lock")]
    assert cached
    for path in cached:
        path.write_bytes(b"tampered")
    for url in (fake_index.sdist_path("0.19.1"), fake_index.wheel_path("0.19.1")):
        fake_index.server.route(url, Reply(404, b"gone"))
    proc = cli(*args, "--index-url", fake_index.index_url, env=env)
    line = error_line(proc)
    ok = proc.returncode == 3
    record(HOSTILE, "generated: red-team findings", "a damaged cache, then no fetch", intact=ok)
    assert ok, line


def _add(
    registry: Path, diff: Path, patch_id: str, *, user: bool = False
) -> subprocess.CompletedProcess[str]:
    args = ("--registry", str(registry), "add", patch_id, "--diff", str(diff), "--no-check")
    if not user:
        return cli(*args)
    return patchset_as_other_user(args)  # from a copy that user reads, wherever the checkout is


def test_add_takes_a_crlf_diff(tmp_path: Path) -> None:
    """A diff saved with CRLF line ends (was: refused, naming a temporary staging folder)."""
    registry = tmp_path / "patches"
    registry.mkdir()
    diff = tmp_path / "fix.diff"
    diff.write_bytes(MOD_DIFF.replace("\n", "\r\n").encode())
    proc = _add(registry, diff, "crlf-fix")
    ok = proc.returncode == 0 and ".add-" not in proc.stdout + proc.stderr
    toml = (registry / "crlf-fix" / "patch.toml").read_text() if ok else ""
    ok = ok and 'targets = ["vllm/mod.py"]' in toml
    record(HOSTILE, "generated: red-team findings", "add: a CRLF diff", intact=ok)
    assert ok, proc.stderr


def test_add_names_the_input_not_its_staging(tmp_path: Path) -> None:
    """An error found in what add staged names the diff given, never the hidden folder."""
    registry = tmp_path / "patches"
    registry.mkdir()
    diff = tmp_path / "fix.diff"
    head, _, body = MOD_DIFF.partition("@@")
    diff.write_bytes((head.replace("\n", "\r\n") + "@@" + body).encode())  # CRLF headers only
    before = snapshot(registry)
    proc = _add(registry, diff, "odd-path")
    line = error_line(proc)
    ok = proc.returncode == 2 and ".add-" not in line and snapshot(registry) == before
    record(HOSTILE, "generated: red-team findings", "add: error names the input", intact=ok)
    assert ok, line


def test_add_refuses_a_plain_diff_rename(tmp_path: Path) -> None:
    """`--- old/vllm/a.py` / `+++ new/vllm/b.py` is a rename (was: an edit of b.py)."""
    registry = tmp_path / "patches"
    registry.mkdir()
    diff = tmp_path / "rename.diff"
    diff.write_text("--- old/vllm/a.py\n+++ new/vllm/b.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n d\n")
    backup = tmp_path / "backup.diff"  # diff -u x.py.orig x.py: one file, an edit
    backup.write_text("--- vllm/a.py.orig\n+++ vllm/a.py\n@@ -1,3 +1,3 @@\n a\n-b\n+c\n d\n")
    renamed = _add(registry, diff, "renamed")
    edited = _add(registry, backup, "edited")
    line = error_line(renamed)
    ok = renamed.returncode == 2 and "renames are not supported" in line
    ok = ok and not (registry / "renamed").exists() and edited.returncode == 0
    record(HOSTILE, "generated: red-team findings", "add: a plain-diff rename", intact=ok)
    assert ok, (line, edited.stderr)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to run as another user")
def test_add_into_an_unwritable_registry(tmp_path: Path) -> None:
    """A registry folder the user may not write to (was: a traceback from mkdtemp)."""
    import tempfile

    tmp_path = Path(tempfile.mkdtemp(prefix="patchset-unwritable-", dir="/tmp"))
    try:  # removed however the test ends (a skip, a failure): nothing left in /tmp
        tmp_path.chmod(0o755)  # the other user reaches it (pytest's own folders are private)
        registry = tmp_path / "patches"
        registry.mkdir()
        diff = tmp_path / "fix.diff"
        diff.write_text(MOD_DIFF)
        diff.chmod(0o644)
        before = snapshot(registry)
        proc = _add(registry, diff, "no-room", user=True)
        line = error_line(proc)
        ok = proc.returncode == 2 and "not writable" in line and snapshot(registry) == before
        record(HOSTILE, "generated: red-team findings", "add: an unwritable registry", intact=ok)
    finally:
        shutil.rmtree(tmp_path)
    assert ok, line


@pytest.mark.parametrize("where", ["patch.toml", "sites.toml", "pyproject.toml"])
def test_toml_nested_thousands_deep(tmp_path: Path, where: str) -> None:
    """TOML nested a few thousand levels (was: RecursionError, a traceback)."""
    registry, _ = _two_patch_registry(tmp_path, conflicting=False)
    deep = "x = " + "[" * 5000 + "]" * 5000 + "\n"
    cwd = tmp_path / "project"
    cwd.mkdir()
    if where == "patch.toml":
        with (registry / "good" / "patch.toml").open("a") as fh:
            fh.write(deep)
    elif where == "sites.toml":
        _write_patch(registry / "deep-sites", kind="runtime", targets=["vllm/mod.py"],
                     payload=GOOD_SITES.encode() + deep.encode())  # fmt: skip
    else:
        (cwd / "pyproject.toml").write_text('[project]\nname = "x"\n' + deep)
    proc = run_cli("--registry", registry, "validate", cwd=cwd, timeout=120)
    line = error_line(proc)
    ok = proc.returncode == 2 and "nested too deeply" in line and where in line
    record(HOSTILE, "generated: red-team findings", f"TOML nested deep: {where}", intact=ok)
    assert ok, line
