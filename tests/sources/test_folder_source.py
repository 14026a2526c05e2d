"""FolderSource: checkouts, unpacked sdists and site-packages folders, read in place."""

from __future__ import annotations

from pathlib import Path

import pytest

from patchset.errors import SourceError, UsageError
from patchset.sources import parse_source
from patchset.sources.base import ReleaseSource
from patchset.sources.folder import FolderSource, folder_version

UTILS = "vllm/model_executor/layers/fla/ops/utils.py"


def make_folder(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"vllm/__init__.py": "", **files}.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return root


@pytest.mark.parametrize(
    ("files", "expected"),
    [
        ({"vllm/_version.py": "__version__ = version = '0.19.1'\n"}, "0.19.1"),
        (
            {"vllm/_version.py": "__version__: str = '0.20.0rc2.dev5+g1a2b3c'\n"},
            "0.20.0rc2.dev5+g1a2b3c",
        ),
        ({"vllm/version.py": '"""doc"""\n__version__ = "0.4.0"\n'}, "0.4.0"),
        (
            {  # version.py that only re-exports: the folder name is the next clue
                "vllm/version.py": "from ._version import __version__\n",
                "vllm/_version.py": "raise SystemExit('never run')\n",
            },
            "unknown",
        ),
        ({"vllm/_version.py": "__version__ = compute()\n"}, "unknown"),
        ({"vllm/_version.py": "this is not python ((\n"}, "unknown"),
    ],
)
def test_version_from_the_package(tmp_path: Path, files: dict[str, str], expected: str) -> None:
    assert folder_version(make_folder(tmp_path / "site-packages", files)) == expected


def test_version_from_the_folder_name(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "vllm-0.17.0", {})
    assert FolderSource(folder).versions() == ["0.17.0"]
    assert FolderSource(folder, version="0.17.1").versions() == ["0.17.1"]  # the caller knows


def test_reads_files_in_place(tmp_path: Path) -> None:
    folder = make_folder(
        tmp_path / "checkout",
        {
            "vllm/_version.py": "__version__ = version = '0.19.1'\n",
            UTILS: "is_tma_supported = True\n",
            "vllm/__pycache__/x.cpython-312.pyc": "bytecode",
            "setup.py": "outside vllm/",
        },
    )
    src: ReleaseSource = FolderSource(folder)
    assert src.name == "folder"
    with src.open("v0.19.1") as tree:
        assert tree.read(UTILS) == b"is_tma_supported = True\n"
        assert tree.read("vllm/missing.py") is None
        assert tree.read("vllm/model_executor") is None  # a folder is no file
        assert list(tree.paths()) == ["vllm/__init__.py", "vllm/_version.py", UTILS]
        assert tree.info.version == "0.19.1"
        assert tree.info.origin == f"folder {folder}"
        assert tree.info.digest is None


def test_other_version_is_refused(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "x", {"vllm/_version.py": "__version__ = '0.19.1'\n"})
    with (
        pytest.raises(SourceError, match=r"holds vllm 0\.19\.1, not 0\.20\.0"),
        FolderSource(folder).open("0.20.0"),
    ):
        pass


def test_a_folder_without_a_version_is_refused_unless_told(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "x", {})
    with pytest.raises(UsageError) as caught:
        FolderSource(folder)
    assert str(caught.value).startswith(f"{folder}: the vLLM version cannot be read")
    assert "--source-version X" in str(caught.value) and caught.value.exit_code == 2
    with FolderSource(folder, version="0.20.0").open("0.20.0") as tree:
        assert tree.info.version == "0.20.0"
    with pytest.raises(UsageError, match="--source-version 'next' is not a version"):
        FolderSource(folder, version="next")


def test_folder_without_vllm(tmp_path: Path) -> None:
    with pytest.raises(SourceError) as caught:
        FolderSource(tmp_path)
    assert str(caught.value) == f"{tmp_path}: no vllm/ package here"
    assert caught.value.exit_code == 3
    with pytest.raises(SourceError, match="no such folder"):
        FolderSource(tmp_path / "missing")


def test_symlinks_out_of_the_folder_are_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret.py"
    secret.write_text("outside")
    folder = make_folder(tmp_path / "x", {"vllm/real.py": "inside"})
    (folder / "vllm" / "leak.py").symlink_to(secret)
    (folder / "vllm" / "alias.py").symlink_to(folder / "vllm" / "real.py")
    (folder / "vllm" / "outdir").symlink_to(tmp_path, target_is_directory=True)
    with FolderSource(folder, version="0.1.0").open("0.1.0") as tree:
        with pytest.raises(SourceError, match="leads outside the folder"):
            tree.read("vllm/leak.py")
        with pytest.raises(SourceError, match="leads outside the folder"):
            tree.read("vllm/outdir/secret.py")
        with pytest.raises(SourceError, match="not a path inside"):
            tree.read("vllm/../secret.py")
        assert tree.read("vllm/alias.py") == b"inside"
        assert list(tree.paths()) == ["vllm/__init__.py", "vllm/alias.py", "vllm/real.py"]


def test_parse_source_folder(tmp_path: Path) -> None:
    folder = make_folder(tmp_path / "vllm-0.18.0", {})
    for spec in (str(folder), f"folder:{folder}"):
        src = parse_source(spec)
        assert isinstance(src, FolderSource)
        assert src.versions() == ["0.18.0"]
    with pytest.raises(SourceError, match="no such folder"):
        parse_source(str(tmp_path / "nothing"))
    with pytest.raises(UsageError, match="did you mean git:"):
        parse_source("gti:/somewhere")
    with pytest.raises(UsageError, match="say which folder"):
        parse_source("git:")
