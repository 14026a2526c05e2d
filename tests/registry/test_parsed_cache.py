"""The registry's parsed-TOML cache: a load from it is the load without it; an edited file, a
tampered or torn cache file, or a value JSON cannot hold is parsed again, never believed."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from patchset.errors import RegistryError
from patchset.registry import Registry, load_registry
from patchset.registry.toml import key_lines, load_toml, parsed_cache

REAL = Path(__file__).parents[2] / "patches"


def registry_copy(tmp_path: Path) -> Path:
    dest = tmp_path / "patches"
    shutil.copytree(REAL, dest)
    return dest


def shape(registry: Registry) -> list[object]:
    return [registry.digest, *[(p.id, p.title, p.variants, p.upstream) for p in registry.patches]]


def test_a_load_from_the_cache_is_the_load_without_it(tmp_path: Path) -> None:
    root, file = registry_copy(tmp_path), tmp_path / "cache" / "parsed.json"
    plain = load_registry(root)
    first = load_registry(root, parsed=file)
    assert file.is_file() and file.stat().st_mode & 0o077 == 0
    stored = file.read_bytes()
    second = load_registry(root, parsed=file)
    assert shape(plain) == shape(first) == shape(second)
    assert file.read_bytes() == stored  # nothing new parsed: not written again


def test_an_edited_patch_is_parsed_again(tmp_path: Path) -> None:
    root, file = registry_copy(tmp_path), tmp_path / "cache" / "parsed.json"
    load_registry(root, parsed=file)
    toml = root / "fla-tma-sm12x" / "patch.toml"
    toml.write_text(toml.read_text().replace('title = "', 'title = "edited ', 1))
    edited = load_registry(root, parsed=file).get("fla-tma-sm12x")
    assert edited.title.startswith("edited ")
    assert shape(load_registry(root, parsed=file)) == shape(load_registry(root))


def test_a_bad_file_in_the_cache_is_still_an_error(tmp_path: Path) -> None:
    root, file = registry_copy(tmp_path), tmp_path / "cache" / "parsed.json"
    load_registry(root, parsed=file)
    toml = root / "fla-tma-sm12x" / "patch.toml"
    toml.write_text(toml.read_text().replace('kind = "', 'kind = "nope', 1))
    with pytest.raises(RegistryError, match="kind"):
        load_registry(root, parsed=file)
    with pytest.raises(RegistryError, match="kind"):
        load_registry(root, parsed=file)


def tamper(file: Path, tables: object) -> None:
    """Every entry of the cache file replaced by `tables`, the seal left as it was."""
    said, _, body = file.read_text().partition("\n")
    data = json.loads(body)
    data["entries"] = {key: json.dumps(tables) for key in data["entries"]}
    file.write_text(f"{said}\n{json.dumps(data)}")


@pytest.mark.parametrize("how", ["tampered", "torn", "not json", "other salt"])
def test_a_cache_file_not_sealed_by_this_cache_is_not_believed(tmp_path: Path, how: str) -> None:
    root, file = registry_copy(tmp_path), tmp_path / "cache" / "parsed.json"
    load_registry(root, parsed=file)
    if how == "tampered":
        tamper(file, {"id": "evil"})
    elif how == "torn":
        file.write_bytes(file.read_bytes()[: file.stat().st_size // 2])
    elif how == "not json":
        file.write_bytes(b"\x80\x81 not json")
    else:
        said, _, body = file.read_text().partition("\n")
        file.write_text(f"{said}\n{body.replace(json.loads(body)['salt'], '0' * 64)}")
    assert shape(load_registry(root, parsed=file)) == shape(load_registry(root))


def test_a_forged_secret_is_not_believed(tmp_path: Path) -> None:
    root, file = registry_copy(tmp_path), tmp_path / "cache" / "parsed.json"
    load_registry(root, parsed=file)
    (file.parent / ".seal-key").unlink()  # made again: what the old one sealed is not believed
    tamper(file, {"id": "evil"})
    assert shape(load_registry(root, parsed=file)) == shape(load_registry(root))


def test_a_value_json_cannot_hold_is_parsed_each_time(tmp_path: Path) -> None:
    toml, file = tmp_path / "dated.toml", tmp_path / "cache" / "parsed.json"
    toml.write_text('when = 2024-01-02T03:04:05Z\nn = 1.5\ninf = inf\n[t]\nk = "v"\n')
    expected = load_toml(toml)
    for _ in range(2):
        with parsed_cache(file):
            assert load_toml(toml) == expected
            got = load_toml(toml)
            got["t"]["k"] = "changed"  # a caller's change does not reach the next caller
            assert load_toml(toml) == expected


def test_key_lines_are_kept_and_given_back_the_same(tmp_path: Path) -> None:
    text = (REAL / "tolist-cudagraph" / "patch.toml").read_text()
    file, expected = tmp_path / "cache" / "parsed.json", key_lines(text)
    assert expected
    for _ in range(2):
        with parsed_cache(file):
            assert key_lines(text) == expected
            key_lines(text)["upstream.state"] = 999  # a caller's change stays its own
            assert key_lines(text) == expected


def test_an_unwritable_cache_folder_leaves_the_load_as_it_is(tmp_path: Path) -> None:
    root = registry_copy(tmp_path)
    blocker = tmp_path / "blocker"
    blocker.write_text("a file, not a folder")
    assert shape(load_registry(root, parsed=blocker / "parsed.json")) == shape(load_registry(root))
