"""What a collection checkout may not smuggle in (links out of it, special files, loops) and
what patches.yml may not hold (an entry of the wrong type): one line, exit 2, nothing
written; and club statuses kept as the collection gives them."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from patchset.importers.club import meta as club_meta
from patchset.importers.club.meta import metadata
from tests.helpers import import_fixtures as fx
from tests.helpers.cli import cli


def _secret(tmp_path: Path) -> Path:
    secret = tmp_path / "outside" / "secret"
    secret.parent.mkdir()
    secret.write_text("TOKEN = 'do not copy'\n")
    return secret


def _refused(collection: str, checkout: Path, project: Path, path: str) -> str:
    project.mkdir(exist_ok=True)
    result = cli("import", collection, checkout, cwd=project)
    assert result.code == 2, (result.out, result.err)
    assert result.err.count("\n") == 1 and "Traceback" not in result.err
    assert path in result.err and "refused" in result.err
    assert not (project / "patches").exists()  # nothing written
    return result.err


@pytest.mark.parametrize("where", ["sndr/leak.py", "sndr/engines/vllm/patches/core/g1_helper.py"])
def test_genesis_link_out_of_the_checkout_is_refused(tmp_path: Path, where: str) -> None:
    checkout = fx.genesis(tmp_path / "g")
    (checkout / where).symlink_to(_secret(tmp_path))
    err = _refused("genesis", checkout, tmp_path / "p", where)
    assert "leading out of the checkout" in err


@pytest.mark.parametrize(
    "where",
    [
        "models/m1/vllm/patches/vllm-pr111-v0.20.0/extra.patch",
        "models/m1/vllm/patches/hook/sitecustomize.py",
    ],
)
def test_club_link_out_of_the_checkout_is_refused(tmp_path: Path, where: str) -> None:
    checkout = fx.club(tmp_path / "c")
    (checkout / where).unlink(missing_ok=True)
    (checkout / where).symlink_to(_secret(tmp_path))
    _refused("club-3090", checkout, tmp_path / "p", where)


def test_a_fifo_in_the_package_is_refused(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    os.mkfifo(checkout / "sndr" / "pipe.py")
    err = _refused("genesis", checkout, tmp_path / "p", "sndr/pipe.py")
    assert "special file" in err


def test_a_link_to_a_device_and_a_loop_are_refused(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    (checkout / "sndr" / "zero.py").symlink_to("/dev/zero")
    _refused("genesis", checkout, tmp_path / "p", "sndr/zero.py")
    (checkout / "sndr" / "zero.py").unlink()
    (checkout / "sndr" / "a").symlink_to(checkout / "sndr" / "b")
    (checkout / "sndr" / "b").symlink_to(checkout / "sndr" / "a")
    assert "loop" in _refused("genesis", checkout, tmp_path / "p", "sndr/")
    (checkout / "sndr" / "a").unlink()
    (checkout / "sndr" / "b").unlink()
    (checkout / "sndr" / "up").symlink_to(checkout / "sndr")
    assert "folder above it" in _refused("genesis", checkout, tmp_path / "p", "sndr/up")


def test_a_link_inside_the_checkout_is_read(tmp_path: Path) -> None:
    checkout = fx.genesis(tmp_path / "g")
    (checkout / "sndr" / "alias.py").symlink_to(checkout / "sndr" / "__init__.py")
    (tmp_path / "p").mkdir()
    result = cli("import", "genesis", checkout, cwd=tmp_path / "p")
    assert result.code == 1, result.err  # the fixture's g4.py does not parse: named, exit 1


@pytest.mark.parametrize(
    ("entry", "said"),
    [
        ("  - just-a-string", "patches[0]: expected a mapping, got str"),
        ("  - {id: x, files: 5}", "patches[0] (id 'x'): files must be a list or text, got int"),
        ("  - {id: x, model: {a: 1}}", "model must be a list or text, got dict"),
        ("  - {id: x, files: [1, 2]}", "files must list strings"),
        ("  - {id: x, upstream: [open]}", "upstream must be a mapping, got list"),
        ("  - {id: x, upstream: {status: [a]}}", "upstream.status must be text, got list"),
        ("  - {files: [a]}", "patches[0]: no id"),
    ],
)
def test_a_patches_yml_entry_of_the_wrong_type_is_one_line(
    tmp_path: Path, entry: str, said: str
) -> None:
    checkout = fx.club(tmp_path / "c")
    (checkout / club_meta.PATCHES_YML).write_text(f"schema_version: 1\npatches:\n{entry}\n")
    (tmp_path / "p").mkdir()
    result = cli("import", "club-3090", checkout, cwd=tmp_path / "p")
    assert result.code == 2, (result.out, result.err)
    assert result.err.count("\n") == 1 and said in result.err, result.err
    assert "patches.yml" in result.err
    assert not (tmp_path / "p" / "patches").exists()


@pytest.mark.parametrize(
    ("status", "state", "note"),
    [
        ("open", "open", None),
        ("merged", "merged", None),
        ("open-rebased-local", "open", "club-3090 status open-rebased-local"),
        ("local-vendored", "open", "the PR's state is not given: open assumed"),
        ("negative-local-result", "open", "negative-local-result"),
        ("diagnostic-overlay", "open", "diagnostic-overlay"),
    ],
)
def test_club_status_is_kept_and_the_pr_never_dropped(
    status: str, state: str, note: str | None
) -> None:
    meta = metadata(
        "m-pr48375", {"upstream": {"ref": "vllm#48375", "status": status}}, "o/r", None, "f"
    )
    up, x = meta["upstream"], meta["x"]
    assert isinstance(up, dict) and isinstance(x, dict)
    assert up["pr"] == "vllm-project/vllm#48375"
    assert up["state"] == state
    assert x["upstream_status"] == status
    if note is None:
        assert "note" not in up
    else:
        assert note in str(up["note"])


def test_club_status_without_a_pr_is_unsubmitted_and_said() -> None:
    meta = metadata(
        "m-x",
        {"upstream": {"ref": "local", "status": "upstream-adopted-vendored"}},
        "o/r",
        None,
        "f",
    )
    assert meta["upstream"] == {
        "state": "unsubmitted",
        "note": "club-3090 status upstream-adopted-vendored",
    }
