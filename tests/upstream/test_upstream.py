"""`patchset upstream` against a fake forge on 127.0.0.1 that speaks the REST API's shape:
the decision table, the ETag cache, the token (sent, never printed), rate limits, a 404,
answers that are not the API's, --write through the registry writer, and the first release
of a merged pull request read from a real git clone."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from patchset.adapters.forge import ForgeAPI, ForgeError
from patchset.errors import ExitCode
from patchset.registry import load_registry
from patchset.upstream import audit, record
from tests.helpers.cli import run_cli
from tests.helpers.fake_forge import FakeForge
from tests.helpers.gitrepos import git
from tests.helpers.hardening import full_disk_under
from tests.helpers.schemas import assert_matches
from tests.helpers.synthetic import MOD_DIFF, add_patch

SHA = "a" * 40


@pytest.fixture
def forge() -> Iterator[FakeForge]:
    fake = FakeForge()
    yield fake
    fake.close()


def tracked(registry: Path, patch_id: str, pr: str, state: str) -> Path:
    folder = add_patch(registry, patch_id, diff=MOD_DIFF, targets=["vllm/mod.py"])
    toml = folder / "patch.toml"
    text = toml.read_text().replace(
        '[upstream]\nstate = "unsubmitted"\n',
        f'[upstream]\n# kept by --write\npr = "{pr}"\nstate = "{state}"\n',
    )
    toml.write_text(text)
    return folder


@pytest.fixture
def registry(tmp_path: Path, forge: FakeForge) -> Path:
    """One patch per row of the decision table, and one without a pull request."""
    root = tmp_path / "patches"
    root.mkdir()
    tracked(root, "merged-now", "o/r#1", "open")
    forge.pull("o/r#1", "closed", merged=True, sha=SHA)
    tracked(root, "closed-now", "o/r#2", "open")
    forge.pull("o/r#2", "closed")
    tracked(root, "still-open", "o/r#3", "open")
    forge.pull("o/r#3", "open")
    tracked(root, "stale", "o/r#4", "merged")
    forge.pull("o/r#4", "open")
    tracked(root, "gone", "o/r#5", "open")  # the forge has no #5: 404
    tracked(root, "known", "o/r#6", "merged")
    forge.pull("o/r#6", "closed", merged=True, sha="b" * 40)
    add_patch(root, "no-pr", diff=MOD_DIFF, targets=["vllm/mod.py"])
    return root


def cli(
    registry: Path, forge: FakeForge, *args: str, **env: str
) -> subprocess.CompletedProcess[str]:
    more: dict[str, str | None] = {"PATCHSET_FORGE_API_URL": forge.api, **env}
    return run_cli("--registry", registry, "upstream", *args, env=more, timeout=120)


def test_the_decision_table(registry: Path, forge: FakeForge, tmp_path: Path) -> None:
    report = audit(load_registry(registry), ForgeAPI(forge.api, token="", cache_dir=None))
    got = {f.patch: (f.recorded, f.forge, f.status, f.new_state) for f in report.findings}
    assert got == {
        "merged-now": ("open", "merged", "newly-merged", "merged"),
        "closed-now": ("open", "closed", "closed-unmerged", "closed"),
        "still-open": ("open", "open", "still-open", None),
        "stale": ("merged", "open", "out-of-date", "open"),
        "gone": ("open", "gone", "gone", None),
        "known": ("merged", "merged", "up-to-date", None),
    }
    assert report.exit_code == ExitCode.ATTENTION
    merged = next(f for f in report.findings if f.patch == "merged-now")
    assert (merged.merge_commit, merged.merged_at) == (SHA, "2026-11-30T12:00:00Z")
    calm = audit(load_registry(registry), ForgeAPI(forge.api, token=""), patches=["still-open"])
    assert [f.status for f in calm.findings] == ["still-open"] and calm.exit_code == 0
    for each in (report, calm):
        assert_matches(each.to_dict(), "upstream")


def test_answers_are_cached_by_etag(registry: Path, forge: FakeForge, tmp_path: Path) -> None:
    api = ForgeAPI(forge.api, token="", cache_dir=tmp_path / "forge")
    first = audit(load_registry(registry), api)
    assert not any(f.cached for f in first.findings)
    assert sum(forge.script.conditional.values()) == 0
    second = audit(load_registry(registry), api)
    assert [(f.patch, f.status) for f in second.findings] == [
        (f.patch, f.status) for f in first.findings
    ]
    cached = {f.patch for f in second.findings if f.cached}
    assert cached == {"merged-now", "closed-now", "still-open", "stale", "known"}  # not the 404
    assert sum(forge.script.conditional.values()) == 5
    forge.pull("o/r#3", "closed", merged=True, sha=SHA)  # changed: a new ETag, a new answer
    third = audit(load_registry(registry), api, patches=["still-open"])
    assert [(f.status, f.cached) for f in third.findings] == [("newly-merged", False)]
    for each in (first, second, third):
        assert_matches(each.to_dict(), "upstream")


def test_a_full_disk_under_the_answer_cache_costs_nothing_but_the_cache(
    registry: Path, forge: FakeForge, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Issue 23 item 9: the forge's answers meeting a full disk (tests/hardening.
    full_disk_under) are simply not kept: the audit is the same, no temp file is left, and
    the next run asks again."""
    cache = tmp_path / "forge"
    cache.mkdir()
    full_disk_under(monkeypatch, cache)
    api = ForgeAPI(forge.api, token="", cache_dir=cache)
    full = audit(load_registry(registry), api)
    assert [p.name for p in cache.rglob("*") if p.is_file()] == []
    monkeypatch.undo()
    roomy = audit(load_registry(registry), ForgeAPI(forge.api, token="", cache_dir=cache))
    assert [(f.patch, f.status, f.cached) for f in full.findings] == [
        (f.patch, f.status, False) for f in roomy.findings
    ]
    assert sum(forge.script.conditional.values()) == 0  # nothing was kept to revalidate


def test_the_token_is_sent_and_never_printed_or_kept(
    registry: Path, forge: FakeForge, tmp_path: Path
) -> None:
    secret = "ghp_s3cr3t-token-value"  # noqa: S105 -- a fake token for the fake forge
    cache = tmp_path / "cache"
    done = cli(
        registry, forge, "--format", "json", GITHUB_TOKEN=secret, PATCHSET_CACHE_DIR=str(cache)
    )
    assert done.returncode == ExitCode.ATTENTION, done.stderr
    assert set(forge.script.authorization) == {f"Bearer {secret}"}
    assert secret not in done.stdout + done.stderr
    kept = [p.read_bytes() for p in cache.rglob("*") if p.is_file()]
    assert kept and not any(secret.encode() in blob for blob in kept)
    data = json.loads(done.stdout)
    assert_matches(data, "upstream")
    assert data["schema"] == "patchset.upstream/1" and data["exit_code"] == 1
    assert data["counts"] == {
        "newly-merged": 1,
        "closed-unmerged": 1,
        "still-open": 1,
        "out-of-date": 1,
        "gone": 1,
        "up-to-date": 1,
    }


@pytest.mark.parametrize(
    ("mode", "words"),
    [
        ("rate-limit", "rate limit is spent until"),
        ("rate-limit-429", "rate limit is spent for 60 s"),
        ("unauthorized", "refused the token in $GITHUB_TOKEN"),
        ("html", "the forge's answer is an HTML page"),
        ("bad-json", "the forge's answer is not JSON"),
    ],
)
def test_forge_trouble_is_one_line_exit_3(
    registry: Path, forge: FakeForge, tmp_path: Path, mode: str, words: str
) -> None:
    forge.script.mode = mode
    done = cli(
        registry,
        forge,
        GITHUB_TOKEN="tok-secret",  # noqa: S106 -- fake
        PATCHSET_CACHE_DIR=str(tmp_path / "c"),
    )
    assert done.returncode == ExitCode.UNAVAILABLE, done.stderr
    (line,) = done.stderr.strip().splitlines()
    assert words in line and "tok-secret" not in line and "Traceback" not in done.stderr
    assert sum(forge.script.hits.values()) <= 6 + 1  # no retry storm on a 4xx


def test_an_unreachable_forge_is_exit_3(registry: Path, tmp_path: Path) -> None:
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    done = run_cli(
        "--registry",
        registry,
        "upstream",
        timeout=120,
        env={
            "PATCHSET_FORGE_API_URL": f"http://127.0.0.1:{port}",
            "PATCHSET_CACHE_DIR": str(tmp_path / "c"),
        },
    )
    assert done.returncode == ExitCode.UNAVAILABLE
    assert "cannot reach the forge" in done.stderr


def test_write_records_the_new_state_and_keeps_comments(
    registry: Path, forge: FakeForge, tmp_path: Path
) -> None:
    cache = str(tmp_path / "c")
    done = cli(registry, forge, "--write", "--format", "json", PATCHSET_CACHE_DIR=cache)
    assert done.returncode == ExitCode.ATTENTION, done.stderr
    data = json.loads(done.stdout)
    assert_matches(data, "upstream")
    assert data["written"] == ["closed-now", "merged-now", "stale"]
    merged = (registry / "merged-now" / "patch.toml").read_text()
    assert 'state = "merged"' in merged and f'commit = "{SHA}"' in merged
    assert "# kept by --write" in merged
    assert 'state = "closed"' in (registry / "closed-now" / "patch.toml").read_text()
    assert 'state = "open"' in (registry / "stale" / "patch.toml").read_text()
    assert 'state = "open"' in (registry / "gone" / "patch.toml").read_text()  # nothing to say
    loaded = load_registry(registry)
    assert loaded.get("merged-now").upstream.commit == SHA
    again = audit(loaded, ForgeAPI(forge.api, token=""))
    left = {f.patch: f.status for f in again.findings if f.attention}
    assert left == {"gone": "gone"}  # what --write could record, it did
    unchanged = record(loaded, again)
    assert unchanged.written == ()
    assert_matches(unchanged.to_dict(), "upstream")


def test_formats(registry: Path, forge: FakeForge, tmp_path: Path) -> None:
    env = {"PATCHSET_CACHE_DIR": str(tmp_path / "c"), "GITHUB_WORKSPACE": str(registry.parent)}
    summary = tmp_path / "summary.md"
    done = cli(registry, forge, "--format", "github", GITHUB_STEP_SUMMARY=str(summary), **env)
    assert done.returncode == ExitCode.ATTENTION
    errors = [line for line in done.stdout.splitlines() if line.startswith("::error")]
    assert len(errors) == 4  # merged, closed, out of date, gone
    merged = next(line for line in errors if "o/r#1" in line)
    toml_lines = (registry / "merged-now" / "patch.toml").read_text().splitlines()
    state_line = next(i for i, row in enumerate(toml_lines, 1) if row.startswith("state ="))
    assert f"file=patches/merged-now/patch.toml,line={state_line}," in merged
    assert "newly-merged" in merged
    assert done.stdout.splitlines()[-1].startswith("::notice")
    assert "| merged-now | o/r#1 | open | merged | **newly-merged** |" in summary.read_text()
    md = cli(registry, forge, "--format", "markdown", **env)
    rows = [row for row in md.stdout.splitlines() if row.startswith("| ")]
    assert rows[0].startswith("| patch |") and len(rows) == 1 + 6
    assert "**" in rows[1] and "**" not in rows[-1]  # attention first
    table = cli(registry, forge, **env)
    assert "6 pull requests:" in table.stdout and "1 newly-merged" in table.stdout


def test_first_release_from_a_real_clone(registry: Path, forge: FakeForge, tmp_path: Path) -> None:
    clone = tmp_path / "vllm"
    (clone / "vllm").mkdir(parents=True)
    git(clone, "init", "-q")
    for n, tag in enumerate(["v0.1.0", None, "v0.2.0rc1", "v0.2.0", "v0.3.0"]):
        (clone / "vllm" / "x.py").write_text(f"x = {n}\n")
        git(clone, "add", ".")
        git(clone, "commit", "-qm", f"c{n}")
        if n == 1:
            merge = git(clone, "rev-parse", "HEAD")
        if tag:
            git(clone, "tag", tag)
    forge.pull("o/r#1", "closed", merged=True, sha=merge)
    report = audit(load_registry(registry), ForgeAPI(forge.api, token=""), git=clone)
    found = {f.patch: f.first_release for f in report.findings}
    assert found["merged-now"] == "0.2.0"  # not the rc, not 0.1.0 (before the merge)
    assert found["known"] is None  # the clone lacks that commit
    merged = next(f for f in report.findings if f.patch == "merged-now")
    assert "first in 0.2.0" in merged.advice
    assert_matches(report.to_dict(), "upstream")


def test_an_unknown_patch_is_exit_2(registry: Path, forge: FakeForge) -> None:
    done = cli(registry, forge, "--patch", "nope")
    assert done.returncode == ExitCode.BAD_INPUT and "nope" in done.stderr


def test_the_token_does_not_follow_a_redirect_to_another_host(forge: FakeForge) -> None:
    """A redirect to another host (here `localhost` for `127.0.0.1`) gets the request, not the
    token; one to the same host keeps it."""
    other = FakeForge()
    try:
        other.pull("o/r#1", "open")
        forge.script.mode = "redirect"
        forge.script.redirect_to = other.api.replace("127.0.0.1", "localhost").removesuffix("/api")
        state = ForgeAPI(forge.api, token="tok").pull("o/r#1")  # noqa: S106 -- a fake token
        assert state.state == "open"
        assert forge.script.authorization == ["Bearer tok"]
        assert other.script.authorization == [None]
    finally:
        other.close()


def test_errors_are_forge_errors(forge: FakeForge) -> None:
    forge.script.mode = "html"
    with pytest.raises(ForgeError):
        ForgeAPI(forge.api, token="").pull("o/r#1")


def test_the_first_release_beside_the_checks_first_upstream(
    registry: Path, forge: FakeForge, tmp_path: Path
) -> None:
    """Issue 36 item 2: with a clone, the forge's first release is set beside the first of the
    clone's releases the check reads upstream; where they differ, that is a finding."""
    clone = tmp_path / "vllm"
    (clone / "vllm").mkdir(parents=True)
    git(clone, "init", "-q")
    body = "".join(f"line {i}\n" for i in range(1, 21))
    fixed = body.replace("line 11\n", "line 11 patched\n")
    merges = []
    # the first merge carries the fix (agrees); the second's commit ships before the code
    for n, (text, tag) in enumerate([(body, "v0.1.0"), (fixed, "v0.2.0"), (fixed, "v0.3.0")]):
        (clone / "vllm" / "__init__.py").write_text("")
        (clone / "vllm" / "mod.py").write_text(text)
        (clone / "vllm" / "x.py").write_text(f"x = {n}\n")
        git(clone, "add", ".")
        git(clone, "commit", "-qm", f"c{n}")
        merges.append(git(clone, "rev-parse", "HEAD"))
        git(clone, "tag", tag)
    forge.pull("o/r#1", "closed", merged=True, sha=merges[1])  # merged-now: fix in 0.2.0
    forge.pull("o/r#6", "closed", merged=True, sha=merges[0])  # known: says 0.1.0
    report = audit(load_registry(registry), ForgeAPI(forge.api, token=""), git=clone)
    by = {f.patch: f for f in report.findings}
    agree, differ = by["merged-now"], by["known"]
    assert (agree.first_release, agree.check_first_upstream, agree.disagreement) == (
        "0.2.0",
        "0.2.0",
        None,
    )
    assert (differ.first_release, differ.check_first_upstream) == ("0.1.0", None)
    assert differ.disagreement is not None and "no upstream up to 0.1.0" in differ.disagreement
    assert differ.attention and differ.status == "up-to-date"  # a finding by the disagreement
    assert_matches(report.to_dict(), "upstream")
