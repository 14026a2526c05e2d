"""`check --format json` answered from the report kept last time (patchset/cli/replay.py):
the same bytes, exit code and warnings, without loading the registry; anything that decides
the report (a file of the registry, the index's list, an option, a sealed row tampered with)
makes it run again, and a report made while the registry was being written is not kept."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import sqlite3
import time
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from patchset.authoring.tree import unified
from patchset.cli import loading, registry_state, replay, report_parts
from patchset.cli.commands import check as check_command
from patchset.errors import ExitCode
from tests.helpers.cli import Result, cli
from tests.helpers.fake_index import FakeIndex, Reply
from tests.helpers.synthetic import add_patch

VERSIONS = ("0.50.0", "0.51.0")
OLD = "def f(x):\n    return min(x, 8)\n"


def _release(fake_index: FakeIndex, version: str, text: str = OLD) -> None:
    fake_index.add_release(version, {"vllm/m.py": text.encode()}, wheel_only=True)


def _registry(root: Path) -> Path:
    diff = unified("vllm/m.py", OLD, OLD.replace("8", "4"))
    add_patch(root, "limit-four", diff=diff, targets=["vllm/m.py"])
    (root / "broken").mkdir()
    (root / "broken" / "patch.toml").write_text("id = \n")  # skipped, with a warning
    return root


def _check(registry: Path, cache: Path, index: FakeIndex, *more: str) -> Result:
    argv: list[str | Path] = ["check", "--registry", registry, "--since", VERSIONS[0]]
    argv += ["--format", "json"]
    return cli(
        *argv,
        "--index-url",
        index.index_url,
        *more,
        env={"PATCHSET_CACHE_DIR": str(cache), "PATCHSET_JOBS": "1"},
    )


@contextlib.contextmanager
def _reports_db(cache: Path) -> Iterator[sqlite3.Connection]:
    """The kept reports' file in `cache`, to read or tamper with (committed, then closed)."""
    db = sqlite3.connect(cache / "memo" / f"reports-{replay.FORMAT}.sqlite")
    try:
        with db:
            yield db
    finally:
        db.close()


def _no_load(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("the registry was loaded")

    monkeypatch.setattr(loading, "load_registry", refuse)


def _loaded(result: Result) -> bool:
    """Whether the run (under `_no_load`) went to load the registry: not answered by a
    kept report (the command line reports the refusal as an internal error)."""
    return result.code == ExitCode.INTERNAL and "the registry was loaded" in result.err


@pytest.fixture
def settled(monkeypatch: pytest.MonkeyPatch) -> None:
    """Files just written may be kept from (the tests' registries are seconds old)."""
    monkeypatch.setattr(registry_state, "RACY", 0.0)


def test_an_unchanged_check_prints_the_kept_report_without_loading_the_registry(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    for version in VERSIONS:
        _release(fake_index, version)
    registry = _registry(tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    assert first.code == 0, first.err
    assert "skipped patch 'broken'" in first.err
    asked = sum(fake_index.server.hits.values())

    with monkeypatch.context() as m:
        _no_load(m)
        again = _check(registry, cache, fake_index, "--jobs", "2")  # --jobs: the same report
    assert (again.code, again.out, again.err) == (first.code, first.out, first.err)
    assert sum(fake_index.server.hits.values()) == asked  # nothing asked of the index

    # an edit of a patch: checked again, and what it says is the edit's
    toml = registry / "limit-four" / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    edited = _check(registry, cache, fake_index)
    assert edited.code == 0 and edited.out != first.out  # the registry's digest changed
    assert json.loads(edited.out)["registry"] != json.loads(first.out)["registry"]
    with monkeypatch.context() as m:
        _no_load(m)
        assert _check(registry, cache, fake_index).out == edited.out  # and kept in turn


def _list_due(cache: Path) -> None:
    """The index's cached list of files made older than its age of reuse (`MAX_AGE`)."""
    (answer,) = (cache / "index").glob("*.json")
    record = json.loads(answer.read_text())
    record["fetched_at"] -= 3600.0
    answer.write_text(json.dumps(record))


def test_a_report_kept_answers_once_the_index_list_is_due_and_the_same(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    """A check an hour later (a CI restoring its cache): the index's list is due, so it is
    asked for (once) before the kept reports are looked at; the same list, the same report,
    printed without loading the registry. A list that changed (a new release) runs the
    check."""
    for version in VERSIONS:
        _release(fake_index, version)
    registry = _registry(tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    page = "/simple/vllm/"
    asked = fake_index.server.hits[page]
    _list_due(cache)
    with monkeypatch.context() as m:
        _no_load(m)
        again = _check(registry, cache, fake_index)
    assert (again.code, again.out, again.err) == (first.code, first.out, first.err)
    assert fake_index.server.hits[page] == asked + 1
    _list_due(cache)
    fake_index.add_release("0.21.0", {"vllm/m.py": OLD.encode()}, wheel_only=True)
    with monkeypatch.context() as m:
        _no_load(m)
        assert _loaded(_check(registry, cache, fake_index))  # a new list: checked again
    assert fake_index.server.hits[page] == asked + 2


def test_an_index_refusing_the_due_list_is_asked_as_the_check_alone_asks_it(
    tmp_path: Path, fake_index: FakeIndex, settled: None
) -> None:
    """The list due and the index answering 500: the check's own error (one line, exit 3),
    the page asked as many times as by a check no report may answer (`--format table`): the
    look-up before the kept reports does not ask twice."""
    for version in VERSIONS:
        _release(fake_index, version)
    registry = _registry(tmp_path / "patches")
    cache = tmp_path / "cache"
    _check(registry, cache, fake_index)
    page = "/simple/vllm/"
    fake_index.server.route(page, Reply(500, b"down"))
    said = []
    for fmt in ("table", "json"):
        _list_due(cache)
        asked = fake_index.server.hits[page]
        failed = _check(registry, cache, fake_index, "--format", fmt)
        said.append((failed.code, fake_index.server.hits[page] - asked))
        errors = [line for line in failed.err.splitlines() if "error:" in line]
        assert len(errors) == 1 and "HTTP 500" in errors[0], failed.err
    assert said[0] == said[1] == (ExitCode.UNAVAILABLE, said[0][1]), said


def test_an_option_a_new_release_or_a_tampered_row_checks_again(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    _release(fake_index, VERSIONS[0])
    registry = _registry(tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    assert len(json.loads(first.out)["releases"]) == 1

    fuzzed = _check(registry, cache, fake_index, "--fuzz", "1")  # another option: its own
    assert fuzzed.code == 0

    with _reports_db(cache) as db:
        db.execute("UPDATE reports SET seal = 'x' || substr(seal, 2)")
    with monkeypatch.context() as m:
        _no_load(m)
        assert _loaded(
            _check(registry, cache, fake_index)
        )  # a row whose seal fails is not believed

    # a release listed since: seen once the index's list is asked for again
    _release(fake_index, VERSIONS[1], OLD.replace("8", "4"))  # the fix, upstream
    for answer in (cache / "index").glob("*.json"):
        answer.unlink()  # as when the list is due: asked for again
    later = _check(registry, cache, fake_index)
    report = json.loads(later.out)
    assert [r["vllm"] for r in report["releases"]] == list(VERSIONS)
    assert [r["verdict"] for r in report["results"]] == ["needed", "upstream"]


def test_a_report_made_while_the_registry_is_young_or_written_is_not_kept(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch
) -> None:
    _release(fake_index, VERSIONS[0])
    registry = _registry(tmp_path / "patches")
    cache = tmp_path / "cache"
    _check(registry, cache, fake_index)  # the files are seconds old: RACY
    with monkeypatch.context() as m:
        _no_load(m)
        assert _loaded(_check(registry, cache, fake_index))

    monkeypatch.setattr(registry_state, "RACY", 0.0)
    real_load = getattr(loading, "load_registry")  # noqa: B009 -- the name loading calls

    def written_meanwhile(*args: object, **kwargs: object) -> object:
        loaded = real_load(*args, **kwargs)
        (registry / "limit-four" / "notes.txt").write_text("written during the check\n")
        return loaded

    monkeypatch.setattr(loading, "load_registry", written_meanwhile)
    _check(registry, cache, fake_index)
    monkeypatch.setattr(loading, "load_registry", real_load)
    with monkeypatch.context() as m:
        _no_load(m)
        assert _loaded(
            _check(registry, cache, fake_index)
        )  # the files changed during the run: not kept


class _Loads:
    """Counts the registry's whole loads (the edit path loads only the patches edited)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.count = 0
        real = getattr(loading, "load_registry")  # noqa: B009 -- the name loading calls

        def counted(*args: object, **kwargs: object) -> object:
            self.count += 1
            return real(*args, **kwargs)

        monkeypatch.setattr(loading, "load_registry", counted)


def _fresh(registry: Path, cache: Path, index: FakeIndex, tmp_path: Path) -> Result:
    """The check as it runs with no report kept (its memo and files as `cache` has them)."""
    return _fresh_with(registry, cache, index, tmp_path)


def _edit(registry: Path, patch_id: str, old: str, new: str, name: str = "patch.toml") -> None:
    path = registry / patch_id / name
    text = path.read_text()
    assert old in text, (path, old)
    path.write_text(text.replace(old, new, 1))


def _mixed_releases(fake_index: FakeIndex, root: Path) -> Path:
    """`_mixed` at `root`, and the releases it is checked against (both files in each)."""
    for version in VERSIONS:
        fake_index.add_release(
            version, {"vllm/m.py": OLD.encode(), "vllm/n.py": b"a = 1\n"}, wheel_only=True
        )
    return _mixed(root)


def _mixed(root: Path) -> Path:
    """Three independent patches, one required by a fourth, and a support-free layout."""
    for n in range(3):
        diff = unified("vllm/m.py", OLD, OLD.replace("8", str(n + 2)))
        add_patch(root, f"alone-{n}", diff=diff, targets=["vllm/m.py"])
    diff = unified("vllm/m.py", OLD, OLD.replace("min", "max"))
    add_patch(root, "base-one", diff=diff, targets=["vllm/m.py"])
    add_patch(
        root,
        "on-top",
        diff=unified("vllm/n.py", "a = 1\n", "a = 2\n"),
        targets=["vllm/n.py"],
    )
    _edit(root, "on-top", "[upstream]", 'requires = ["base-one"]\n\n[upstream]')
    return root


def test_an_edit_of_one_patch_checks_that_patch_alone_and_says_what_the_whole_check_says(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    assert first.code == 0, first.err
    # printed from its parts: the bytes json's own encoder gives the whole report (offline,
    # nothing is kept: the report is encoded whole)
    argv: list[str | Path] = [
        "check",
        "--registry",
        registry,
        "--since",
        VERSIONS[0],
        "--format",
        "json",
    ]
    offline = cli(*argv, "--offline", env={"PATCHSET_CACHE_DIR": str(cache)})
    assert offline.out == first.out
    assert offline.out == json.dumps(json.loads(first.out), indent=2) + "\n"
    loads = _Loads(monkeypatch)

    # its diff edited: another line put in
    _edit(registry, "alone-1", "+    return min(x, 3)", "+    return min(x, 5)", "patch.diff")
    edited = _check(registry, cache, fake_index)
    assert loads.count == 0  # the edited patch alone was loaded
    assert (edited.code, edited.out) == (
        _fresh(registry, cache, fake_index, tmp_path).code,
        _fresh(registry, cache, fake_index, tmp_path).out,
    )
    assert edited.out != first.out
    loads.count = 0
    assert _check(registry, cache, fake_index).out == edited.out  # kept in turn: a lookup
    assert loads.count == 0

    # two patches' titles: both checked alone, one result each release
    _edit(registry, "alone-0", 'title = "', 'title = "new ')
    _edit(registry, "alone-2", 'title = "', 'title = "new ')
    both = _check(registry, cache, fake_index)
    assert loads.count == 0
    assert both.out == _fresh(registry, cache, fake_index, tmp_path).out
    assert json.loads(both.out)["registry"] != json.loads(edited.out)["registry"]


def _chunks(cache: Path) -> dict[str, bytes]:
    with _reports_db(cache) as db:
        return dict(db.execute("SELECT digest, value FROM chunks"))


def test_an_edits_report_shares_the_chunks_of_the_patches_it_left_and_a_bad_chunk_is_no_hit(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    before = _chunks(cache)
    assert len(before) == 1 + len(json.loads(first.out)["patches"])  # the releases, each patch

    _edit(registry, "alone-1", "revision = 1", "revision = 2")  # in each of its results
    edited = _check(registry, cache, fake_index)
    after = _chunks(cache)
    assert len(after) == len(before) + 1  # the edited patch's results: the rest shared
    assert before.items() <= after.items()

    # a report evicted takes the chunks no other report names with it
    monkeypatch.setattr(replay, "KEPT", 1)
    _edit(registry, "alone-0", 'title = "', 'title = "new ')
    newest = _check(registry, cache, fake_index)
    left = _chunks(cache)
    assert len(left) == len(before)
    assert newest.out == _fresh(registry, cache, fake_index, tmp_path).out

    # a chunk whose bytes are not those its digest names is not believed
    with _reports_db(cache) as db:
        db.execute("UPDATE chunks SET value = ?", (zlib.compress(b"[]"),))
    with monkeypatch.context() as m:
        _no_load(m)
        assert _loaded(_check(registry, cache, fake_index))
    assert edited.out != newest.out


def test_a_patch_written_while_an_edit_is_checked_is_checked_again_next_time(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    """An edit's report is kept without a second look at the registry (every entry's content
    digest was read before its check): an entry written meanwhile has another status next
    time, and its content is not the digest kept, so it is checked again."""
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    _check(registry, cache, fake_index)
    _edit(registry, "alone-1", "revision = 1", "revision = 2")
    real = check_command._check

    def written_meanwhile(*args: Any, **kwargs: Any) -> Any:
        report = real(*args, **kwargs)
        _edit(registry, "alone-1", "revision = 2", "revision = 3")
        _edit(registry, "alone-2", "revision = 1", "revision = 4")
        return report

    with monkeypatch.context() as m:
        m.setattr(check_command, "_check", written_meanwhile)
        during = _check(registry, cache, fake_index)
    assert {
        r["revision"] for r in json.loads(during.out)["results"] if r["patch"] == "alone-1"
    } == {2}
    with _reports_db(cache) as db:
        assert db.execute("SELECT count(*) FROM reports").fetchone() == (2,)  # kept
    loads = _Loads(monkeypatch)
    after = _check(registry, cache, fake_index)
    assert loads.count == 0  # the two written meanwhile checked alone, the rest kept
    assert after.out == _fresh(registry, cache, fake_index, tmp_path).out
    revisions = {r["patch"]: r["revision"] for r in json.loads(after.out)["results"]}
    assert (revisions["alone-1"], revisions["alone-2"]) == (3, 4)


def test_files_rewritten_with_the_same_bytes_are_not_an_edit(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    """A checkout or a restore: every file's status changes, none of its bytes (a CI that
    keeps the cache between fresh clones gets the report kept, not the whole check)."""
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    first = _check(registry, cache, fake_index)
    for path in sorted(registry.rglob("*")):
        if path.is_file():  # a new file (another inode) renamed into place, as git writes
            spare = path.with_name(path.name + ".new")
            spare.write_bytes(path.read_bytes())
            spare.replace(path)
    loads = _Loads(monkeypatch)

    def refuse(*args: object, **kwargs: object) -> None:
        raise AssertionError("a patch was checked")

    monkeypatch.setattr(check_command, "_check", refuse)
    again = _check(registry, cache, fake_index)
    assert (again.code, again.out, loads.count) == (first.code, first.out, 0)

    def unread(*args: object, **kwargs: object) -> None:
        raise AssertionError("the registry's files were read again")

    # kept under the new state: the next run replays it by the files' statuses alone
    monkeypatch.setattr(report_parts, "content_digests", unread)
    monkeypatch.setattr(registry_state, "content_digests", unread)
    assert _check(registry, cache, fake_index).out == first.out


@pytest.mark.parametrize(
    "case",
    [
        ("base-one", {"base-one", "on-top"}),  # others require it: they are checked on it again
        ("on-top", {"on-top"}),  # it requires another: checked on top of it, the other loaded
    ],
)
def test_an_edit_of_a_stacked_patch_checks_its_stack_and_says_what_the_whole_check_says(
    tmp_path: Path,
    fake_index: FakeIndex,
    monkeypatch: pytest.MonkeyPatch,
    settled: None,
    case: tuple[str, set[str]],
) -> None:
    """A patch others are stacked on (their results rest on it) is checked with them; one
    stacked on others is checked on top of them: the registry is not loaded whole, only those
    patches are checked, and the report is the whole check's, byte for byte."""
    edited, checked = case
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    _check(registry, cache, fake_index)
    _edit(registry, edited, 'title = "', 'title = "new ')
    if edited == "base-one":  # its payload too: what the patch on top of it reads changes
        (registry / "base-one" / "patch.diff").write_text(
            unified("vllm/m.py", OLD, OLD.replace("min", "max") + "# more\n")
        )
    loads = _Loads(monkeypatch)
    asked: list[list[str] | None] = []
    real = check_command._check

    def recorded(*args: Any, **kwargs: Any) -> Any:
        asked.append(kwargs.get("patches"))
        return real(*args, **kwargs)

    monkeypatch.setattr(check_command, "_check", recorded)
    again = _check(registry, cache, fake_index)
    assert loads.count == 0 and len(asked) == 1 and set(asked[0] or ()) == checked
    fresh = _fresh(registry, cache, fake_index, tmp_path)
    assert (again.code, again.out, again.err) == (fresh.code, fresh.out, fresh.err)


@pytest.mark.parametrize(
    "change",
    [
        "the files it reads",
        "a new patch folder",
        "a file beside the patches",
        "a patch that does not load",
        "more than EDITED_MOST patches",
    ],
)
def test_an_edit_reaching_beyond_one_patch_runs_the_whole_check(
    tmp_path: Path,
    fake_index: FakeIndex,
    monkeypatch: pytest.MonkeyPatch,
    settled: None,
    change: str,
) -> None:
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    _check(registry, cache, fake_index)
    loads = _Loads(monkeypatch)
    monkeypatch.setattr(report_parts, "EDITED_MOST", 2)
    if change == "the files it reads":
        (registry / "alone-0" / "patch.diff").write_text(unified("vllm/n.py", "a = 1\n", "a = 3\n"))
        _edit(registry, "alone-0", '"vllm/m.py"]', '"vllm/n.py"]')
    elif change == "a new patch folder":
        add_patch(
            registry, "alone-9", diff=unified("vllm/m.py", OLD, OLD + "#\n"), targets=["vllm/m.py"]
        )
    elif change == "a file beside the patches":
        (registry / "README.md").write_text("notes\n")
    elif change == "a patch that does not load":
        _edit(registry, "alone-0", 'title = "', 'title = 1\nx = "')
    else:
        for n in range(3):
            _edit(registry, f"alone-{n}", 'title = "', 'title = "new ')
    again = _check(registry, cache, fake_index)
    assert loads.count == 1  # the whole registry
    fresh = _fresh(registry, cache, fake_index, tmp_path)
    assert (again.code, again.out, again.err) == (fresh.code, fresh.out, fresh.err)


def test_files_state_sees_a_rewrite_of_the_same_size(tmp_path: Path) -> None:
    (tmp_path / "a").write_text("one\n")
    before = registry_state.files_state(tmp_path)
    time.sleep(0.01)
    (tmp_path / "a").write_text("two\n")  # the same size; its times change
    after = registry_state.files_state(tmp_path)
    assert after.digest != before.digest
    os.utime(tmp_path / "a", ns=(0, 0))  # a file's change time is not the caller's to set
    assert registry_state.files_state(tmp_path).digest not in {before.digest, after.digest}


def test_the_check_commands_timeout_default_is_the_networks() -> None:
    from patchset.adapters import net
    from patchset.cli.commands import check

    assert check.DEFAULT_TIMEOUT == net.DEFAULT_TIMEOUT


def test_files_state_sees_a_folder_link_and_an_empty_folder(tmp_path: Path) -> None:
    """Entries the loader sees but that hold no file: a link to a folder (listed, never
    walked into) and an empty folder (a patch folder without patch.toml is a warning)."""
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "patch.toml").write_text("x\n")
    before = registry_state.files_state(tmp_path)
    (tmp_path / "empty").mkdir()
    with_empty = registry_state.files_state(tmp_path)
    assert with_empty.digest != before.digest and "empty/" in with_empty.tops
    (tmp_path / "outside").mkdir()
    (tmp_path / "a" / "link").symlink_to(tmp_path / "outside")
    linked = registry_state.files_state(tmp_path)
    assert linked.digest != with_empty.digest
    assert linked.tops["a/"] != with_empty.tops["a/"]


def test_a_check_of_some_patches_is_kept_apart_from_the_whole_one(
    tmp_path: Path, fake_index: FakeIndex, monkeypatch: pytest.MonkeyPatch, settled: None
) -> None:
    registry = _mixed_releases(fake_index, tmp_path / "patches")
    cache = tmp_path / "cache"
    whole = _check(registry, cache, fake_index)
    some = _check(registry, cache, fake_index, "--patch", "alone-1")
    assert len(json.loads(some.out)["results"]) == len(VERSIONS)
    loads = _Loads(monkeypatch)
    assert _check(registry, cache, fake_index, "--patch", "alone-1").out == some.out
    assert _check(registry, cache, fake_index).out == whole.out
    assert loads.count == 0
    _edit(registry, "alone-1", 'title = "', 'title = "new ')
    again = _check(registry, cache, fake_index, "--patch", "alone-1")  # --patch: the whole check
    assert loads.count == 1
    assert again.out == _fresh_with(registry, cache, fake_index, tmp_path, "--patch", "alone-1").out


def _fresh_with(
    registry: Path, cache: Path, index: FakeIndex, tmp_path: Path, *more: str
) -> Result:
    """`_fresh` with more options."""
    other = tmp_path / f"fresh-{len(list(tmp_path.glob('fresh-*')))}"
    shutil.copytree(cache, other)
    for kept in (other / "memo").glob("reports-*"):
        kept.unlink()
    return _check(registry, other, index, *more)
