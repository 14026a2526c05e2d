"""`patchset add`: diffs in every common shape, a pull request from a (local) forge, the range
suggested by a check of real cached releases, the runtime skeleton, and refusals that write
nothing."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from packaging.specifiers import SpecifierSet

from patchset.adapters import forge, net
from patchset.authoring.add import ANY_RELEASE
from patchset.authoring.diff import normalize_diff
from patchset.cli.main import main
from patchset.errors import PayloadError, SourceError
from patchset.registry import load_patch, load_registry
from patchset.registry.diffs import parse_diff
from tests.helpers.fake_index import FakeServer, Reply
from tests.helpers.releases import tree_digest

REPO = Path(__file__).parents[2]
TMA = REPO / "patches" / "fla-tma-sm12x"
TMA_DIFF = (TMA / "patch.diff").read_text()
TMA_FILE = "vllm/model_executor/layers/fla/ops/utils.py"
PR = "vllm-project/vllm#36325"


def pr_style(diff: str) -> str:
    """The repository's real diff as a forge serves a pull request's .diff: `diff --git`
    headers, index lines, plus a test file and a new file beside the vllm/ change."""
    body = diff.split("\n", 2)[2]  # without the --- / +++ lines
    return (
        "diff --git a/tests/kernels/test_fla.py b/tests/kernels/test_fla.py\n"
        "index 1111111..2222222 100644\n"
        "--- a/tests/kernels/test_fla.py\n"
        "+++ b/tests/kernels/test_fla.py\n"
        "@@ -1,2 +1,3 @@\n"
        " import torch\n"
        "+import pytest\n"
        " \n"
        f"diff --git a/{TMA_FILE} b/{TMA_FILE}\n"
        "index 3333333..4444444 100644\n"
        f"--- a/{TMA_FILE}\n"
        f"+++ b/{TMA_FILE}\n"
        f"{body}"
        "diff --git a/vllm/model_executor/layers/fla/ops/tma_note.py"
        " b/vllm/model_executor/layers/fla/ops/tma_note.py\n"
        "new file mode 100644\n"
        "index 0000000..5555555\n"
        "--- /dev/null\n"
        "+++ b/vllm/model_executor/layers/fla/ops/tma_note.py\n"
        "@@ -0,0 +1 @@\n"
        "+# TMA needs compute capability 9 to 11\n"
    )


def hunks_of(text: str) -> list[object]:
    return [(d.path, d.hunks) for d in parse_diff(text, file="x")]


# -- reading diffs ---------------------------------------------------------------------------


def test_pr_diff_keeps_vllm_files_only() -> None:
    payload = normalize_diff(pr_style(TMA_DIFF), file="pr.diff")
    assert payload.targets == (TMA_FILE, "vllm/model_executor/layers/fla/ops/tma_note.py")
    assert payload.dropped == ("tests/kernels/test_fla.py",)
    assert "diff --git" not in payload.text and "index " not in payload.text
    parsed = parse_diff(payload.text, file="x")
    assert parsed[0].hunks == parse_diff(TMA_DIFF, file="y")[0].hunks  # hunks as they were
    assert parsed[1].added


@pytest.mark.parametrize(
    ("old", "new"),
    [
        (f"a/{TMA_FILE}", f"b/{TMA_FILE}"),  # git prefixes, no diff --git line
        (TMA_FILE, TMA_FILE),  # no prefixes
        (f"{TMA_FILE}.orig", TMA_FILE),  # diff -u file.orig file
        (f"vllm-0.19.1/{TMA_FILE}", f"vllm-0.19.1.new/{TMA_FILE}"),  # two unpacked trees
        (f"/usr/lib/python3/dist-packages/{TMA_FILE}", f"/tmp/new/{TMA_FILE}"),
    ],
)
def test_plain_diffs_in_every_shape(old: str, new: str) -> None:
    body = TMA_DIFF.split("\n", 2)[2]
    payload = normalize_diff(f"--- {old}\t2025-01-01\n+++ {new}\n{body}", file="x.patch")
    assert payload.targets == (TMA_FILE,)
    assert hunks_of(payload.text) == hunks_of(TMA_DIFF)
    assert payload.text == TMA_DIFF  # the registry's own form, byte for byte


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("not a diff at all\n", "not a unified diff"),
        ("--- a/README.md\n+++ b/README.md\n@@ -1 +1 @@\n-a\n+b\n", "touches no file under vllm/"),
        (f"--- a/{TMA_FILE}\n+++ b/{TMA_FILE}\n@@ -1 +1 @@ x\n-a\n", "not a valid unified diff"),
        (f"--- a/{TMA_FILE}\n+++ b/{TMA_FILE}\n@@ -x +1 @@\n-a\n+b\n", "malformed hunk header"),
        (
            f"diff --git a/{TMA_FILE} b/{TMA_FILE}\ndeleted file mode 100644\n"
            f"--- a/{TMA_FILE}\n+++ /dev/null\n@@ -2 +0,0 @@\n-a\n",
            "a deletion .* must be one hunk removing every line from line 1",
        ),
        (
            f"diff --git a/{TMA_FILE} b/vllm/other.py\n--- a/{TMA_FILE}\n+++ b/vllm/other.py\n"
            "@@ -1 +1 @@\n-a\n+b\n",
            "renames are not supported",
        ),
    ],
)
def test_diffs_refused(text: str, message: str) -> None:
    with pytest.raises(PayloadError, match=message) as caught:
        normalize_diff(text, file="in.diff")
    assert str(caught.value).startswith("in.diff: ")


# -- the command -----------------------------------------------------------------------------


def registry_dir(tmp_path: Path) -> Path:
    root = tmp_path / "patches"
    root.mkdir()
    return root


def first_error(capsys: pytest.CaptureFixture[str]) -> str:
    """validate's first error line (it reports every problem of a patch, one line each)."""
    err = capsys.readouterr().err.strip().splitlines()
    assert err and all(line.startswith("patchset: error: ") for line in err), err
    return err[0]


def one_line_error(capsys: pytest.CaptureFixture[str]) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("patchset: error: "), err
    return err[0]


def test_add_from_a_pull_request_on_the_forge(
    tmp_path: Path, http_server: FakeServer, capsys: pytest.CaptureFixture[str]
) -> None:
    http_server.route("/vllm-project/vllm/pull/36325.diff", Reply(200, pr_style(TMA_DIFF).encode()))
    root = registry_dir(tmp_path)
    code = main(
        [
            *("--registry", str(root), "add", "fla-pr", "--pr", PR),
            *("--forge-url", http_server.url, "--no-check", "--format", "json"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert out["dropped"] == ["tests/kernels/test_fla.py"]
    assert out["upstream"] == {"pr": PR, "state": "open"}
    patch = load_patch(root / "fla-pr")  # it loads: the registry's rules hold
    assert patch.targets == tuple(out["targets"])
    assert patch.upstream.pr == PR and patch.upstream.state == "open"
    assert PR in patch.origin and "fetched" in patch.origin
    assert str(patch.vllm) == ANY_RELEASE  # nothing checked: every release, said so
    assert "not checked" in (root / "fla-pr" / "patch.toml").read_text()
    assert sorted(p.name for p in root.iterdir()) == ["fla-pr"]  # no staging folder left


def test_forge_from_the_environment_and_a_404(
    tmp_path: Path,
    http_server: FakeServer,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    monkeypatch.setenv(forge.FORGE_ENV, http_server.url + "/")
    assert forge.pr_diff_url(PR) == f"{http_server.url}/vllm-project/vllm/pull/36325.diff"
    root = registry_dir(tmp_path)
    code = main(["--registry", str(root), "add", "fla-pr", "--pr", PR, "--no-check"])
    assert code == 3
    assert "HTTP 404" in one_line_error(capsys)
    assert list(root.iterdir()) == []
    assert http_server.hits["/vllm-project/vllm/pull/36325.diff"] == 1  # a 4xx is not retried


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["fla-tma-sm12x", "--diff", str(TMA / "patch.diff")], "exists already"),
        (["Bad_Id", "--diff", str(TMA / "patch.diff")], "lowercase letters"),
        (["x-doc", "--diff", "DOC"], "touches no file under vllm/"),
        (["x-bad", "--diff", "BAD"], "not a unified diff"),
        (["x-none"], "say where the patch comes from"),
        (["x-state", "--diff", str(TMA / "patch.diff"), "--state", "merged"], "needs --pr"),
        (["x-pr", "--pr", "vllm#1"], "expected owner/repo#number"),
        (["x-range", "--diff", str(TMA / "patch.diff"), "--range", "0.19"], "not a PEP 440"),
    ],
)
def test_refusals_write_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str], message: str
) -> None:
    root = tmp_path / "patches"
    (root / "fla-tma-sm12x").mkdir(parents=True)
    (root / "fla-tma-sm12x" / "keep").write_text("x")
    (tmp_path / "DOC").write_text("--- a/docs/x.md\n+++ b/docs/x.md\n@@ -1 +1 @@\n-a\n+b\n")
    (tmp_path / "BAD").write_text("this is prose\n")
    before = tree_digest(tmp_path)
    args = [
        a.replace("DOC", str(tmp_path / "DOC")).replace("BAD", str(tmp_path / "BAD")) for a in args
    ]
    code = main(["--registry", str(root), "add", *args, "--no-check"])
    assert code == 2
    assert message in one_line_error(capsys)
    assert tree_digest(tmp_path) == before
    assert sorted(p.name for p in root.iterdir()) == ["fla-tma-sm12x"]


def test_missing_registry_points_at_init(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    code = main(
        ["--registry", str(tmp_path / "nope"), "add", "x-y", "--diff", str(TMA / "patch.diff")]
    )
    assert code == 2
    assert "patchset init" in one_line_error(capsys)


@pytest.mark.network  # real releases from the cache (downloaded once if it is empty)
def test_range_suggested_by_a_check_of_real_releases(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = registry_dir(tmp_path)
    diff = tmp_path / "tma.patch"
    diff.write_text(pr_style(TMA_DIFF).split("new file mode")[0].rsplit("diff --git", 1)[0])
    code = main(
        [
            *("--registry", str(root), "add", "tma", "--diff", str(diff), "--pr", PR),
            *("--vllm", "0.18.1", "--vllm", "0.19.1", "--vllm", "0.20.0", "--format", "json"),
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    verdicts = {r["vllm"]: r["verdict"] for r in out["check"]["results"]}
    # no probe in a new patch: 0.20.0's rewrite of the line reads as a conflict
    assert verdicts == {"0.18.1": "needed", "0.19.1": "needed", "0.20.0": "conflict"}
    # a conflict is no evidence the fix is upstream: the range stays open, CI keeps flagging
    assert out["vllm"] == ">=0.18.1" == out["suggested_ranges"][0]
    written = tomllib.loads((root / "tma" / "patch.toml").read_text())
    assert written["vllm"] == ">=0.18.1"
    assert written["upstream"] == {"pr": PR, "state": "open"}
    assert written["targets"] == [TMA_FILE]
    assert (root / "tma" / "patch.diff").read_text() == TMA_DIFF
    assert "0.18.1..0.19.1 needed, 0.20.0 conflict" in (root / "tma" / "patch.toml").read_text()
    registry = load_registry(root)
    assert [p.id for p in registry.patches] == ["tma"]


@pytest.mark.network
def test_cached_releases_by_default(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """No --vllm/--since: every release in the cache, nothing downloaded (offline source)."""
    from patchset.cachedir import cache_root
    from patchset.sources.package_index import IndexSource
    from patchset.sources.package_index.cache import Cache

    IndexSource().fetch("0.19.1")  # at least one release in the cache
    cached = Cache(cache_root()).cached_tree_versions()
    # a cached release is its file list; the files this add reads are fetched once, online
    warm = tmp_path / "warm"
    warm.mkdir()
    releases = [f"--vllm={v}" for v in cached]
    assert (
        main(["--registry", str(warm), "add", "tma", "--diff", str(TMA / "patch.diff"), *releases])
        == 0
    )
    capsys.readouterr()
    root = registry_dir(tmp_path)
    code = main(
        [
            "--registry",
            str(root),
            "add",
            "tma",
            "--diff",
            str(TMA / "patch.diff"),
            "--format",
            "json",
        ]
    )
    assert code == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out)
    assert {r["vllm"] for r in out["check"]["releases"]} == set(cached)
    assert out["upstream"] == {"pr": None, "state": "unsubmitted"}
    assert out["vllm"] == out["suggested_ranges"][-1]
    assert SpecifierSet(out["vllm"]).contains("0.19.1")  # where the diff was written


def test_runtime_skeleton_validates_only_once_filled_in(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = registry_dir(tmp_path)
    assert main(["--registry", str(root), "add", "--runtime", "tq-sync"]) == 0
    capsys.readouterr()
    folder = root / "tq-sync"
    assert sorted(p.name for p in folder.iterdir()) == ["patch.toml", "sites.toml"]
    assert main(["--registry", str(root), "validate"]) == 2
    assert "patch.toml: vllm: must not be empty" in first_error(capsys)
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text().replace('vllm = ""', 'vllm = ">=0.20.0,<0.21.0"'))
    assert main(["--registry", str(root), "validate"]) == 2
    assert "targets: must not be empty" in first_error(capsys)
    real = REPO / "patches" / "tolist-cudagraph"
    target = tomllib.loads((real / "patch.toml").read_text())["targets"][0]
    toml.write_text(toml.read_text().replace("targets = []", f'targets = ["{target}"]'))
    assert main(["--registry", str(root), "validate"]) == 2
    assert "sites.toml: site: required key is missing" in first_error(capsys)
    sites = folder / "sites.toml"
    sites.write_text(sites.read_text() + (real / "sites.toml").read_text())  # a real site
    assert main(["--registry", str(root), "validate"]) == 0
    patch = load_registry(root).get("tq-sync")
    assert patch.kind == "runtime" and patch.apply == "startup"
    assert patch.upstream.state == "unsubmitted"


def test_forge_fetch_retries_a_5xx_and_caps_the_size(
    http_server: FakeServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(net, "BACKOFF_BASE", 0.001)
    http_server.route("/d", Reply(502), Reply(200, b"diff"))
    assert net.fetch_bytes(f"{http_server.url}/d", what="the forge") == b"diff"
    assert http_server.hits["/d"] == 2
    http_server.route("/big", Reply(200, b"x" * 100))
    with pytest.raises(SourceError, match="larger than 10 bytes"):
        net.fetch_bytes(f"{http_server.url}/big", max_bytes=10)
    http_server.route("/down", Reply(503))
    with pytest.raises(net.UnreachableError, match=r"cannot reach the forge at .*tried 2 times\)$"):
        net.fetch_bytes(f"{http_server.url}/down", retries=1, what="the forge")
