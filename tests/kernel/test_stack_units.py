"""A start compiles only the units its patches change (issue 35.5): a bundle's `units.json`
holds, per release .py file, where its defs, classes and module-level statements start and
end (this Python's compile of it, once, at export); `Files.compile_blame` judges an edit by
its units with them, and compiles the whole file when it cannot (no facts, another file,
another Python, a damaged document). The answer is the whole compile's either way."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.kernel import stack
from patchset.kernel.tree import digest

SOURCE = b'''"""A module."""
import os


def first(x):
    return x + 1


class Thing:
    def method(self):
        return os.sep


VALUE = first(1)
'''
GOOD = SOURCE.replace(b"        return os.sep\n", b"        sep = os.sep\n        return sep\n")
BAD = SOURCE.replace(b"    return x + 1\n", b"    return x +\n")


def files_with(tmp_path: Path, after: bytes, units: Path | None) -> stack.Files:
    root = tmp_path / "site"
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "m.py").write_bytes(SOURCE)
    known = stack.read_units(units) if units is not None else {}
    files = stack.Files(root, {"vllm/m.py": digest(SOURCE)}, (), frozenset(), known)
    before = files.read("vllm/m.py")
    files.current["vllm/m.py"] = after
    files.steps["vllm/m.py"] = [("p", before, after)]
    return files


def write_units(tmp_path: Path, sources: dict[str, bytes | None]) -> Path:
    path = tmp_path / "units.json"
    path.write_text(stack.units_document(sources))
    return path


def test_units_document_round_trip(tmp_path: Path) -> None:
    path = write_units(tmp_path, {"vllm/m.py": SOURCE, "vllm/x.txt": b"x", "vllm/gone.py": None})
    data = json.loads(path.read_text())
    assert data["schema"] == "patchset.units/1" and list(data["files"]) == ["vllm/m.py"]
    known = stack.read_units(path)
    sha, facts = known["vllm/m.py"]
    assert sha == digest(SOURCE)
    assert facts.error is None and facts.starts == (4, 8, 9) and facts.classes == (8,)


@pytest.mark.parametrize("with_units", [True, False])
def test_blame_is_the_whole_compiles_with_or_without_units(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, with_units: bool
) -> None:
    units = write_units(tmp_path, {"vllm/m.py": SOURCE}) if with_units else None
    whole: list[str] = []
    real = stack.compile_problem

    def counted(rel: str, data: bytes, before: bytes | None = None) -> str | None:
        whole.append(rel)
        return real(rel, data, before)

    monkeypatch.setattr(stack, "compile_problem", counted)
    assert files_with(tmp_path, GOOD, units).compile_blame() == {}
    assert whole == ([] if with_units else ["vllm/m.py"])  # by its units: no whole compile
    blamed = files_with(tmp_path, BAD, units).compile_blame()
    assert list(blamed) == ["p"] and "vllm/m.py:6" in blamed["p"], blamed


def test_facts_of_another_file_python_or_a_damaged_document_are_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    other = write_units(tmp_path, {"vllm/m.py": SOURCE + b"\nMORE = 1\n"})
    assert not files_with(tmp_path, GOOD, other)._units_compile("vllm/m.py", SOURCE, GOOD)
    path = write_units(tmp_path, {"vllm/m.py": SOURCE})
    data = json.loads(path.read_text())
    assert stack.read_units(path)
    broken: object
    for broken in (
        {**data, "python": "2.7"},
        {**data, "schema": "x"},
        {**data, "files": {"vllm/m.py": {**data["files"]["vllm/m.py"], "starts": ["4"]}}},
        {**data, "files": {"vllm/m.py": {"sha256": "x"}}},
        [],
    ):
        path.write_text(json.dumps(broken))
        assert stack.read_units(path) == {}, broken
    path.write_text("{not json")
    assert stack.read_units(path) == {}
    assert stack.read_units(tmp_path / "none.json") == {}
