"""club-3090's PR diffs and helper files: `*.patch`/`*.diff` rooted at vllm's folder, and
the helper files `install.sh` copies in, as one unified diff payload.

The facts of the collection this relies on are in `patchset.importers.club`.
"""

from __future__ import annotations

import re
from pathlib import Path

from patchset.authoring.tree import unified

_CP = re.compile(r'cp\s+"?\$(?:PATCHDIR|DIR)/([\w.-]+)"?\s+"?\$(?:VLLM|SITE)/([\w./-]+)"?')


def edits_files(path: Path) -> bool:
    """A module that writes files it opens (an anchor script), not one that is imported."""
    text = path.read_text(errors="replace")
    return bool(re.search(r"\.write(_text)?\(", text)) and "vllm/" in text


def vllm_path(path: str) -> str:
    parts = [p for p in path.split("/") if p]
    if parts[:1] in (["a"], ["b"]):
        parts = parts[1:]
    if parts[:1] != ["vllm"]:
        parts = ["vllm", *parts]
    return "/".join(parts)


def diff_payload(folder: Path, diffs: list[Path], install: Path | None, lost: list[str]) -> str:
    """The PR diffs with package-relative paths (`vllm/...`), and the helper files install.sh
    copies in as created files."""
    out: list[str] = []
    for diff in diffs:
        out.extend(_rooted(line) for line in diff.read_text().splitlines(keepends=True))
    if install is not None:
        for name, dest in _CP.findall(install.read_text(errors="replace")):
            helper = folder / name
            if helper.is_file():
                path = vllm_path(dest)
                out.append(unified(path, None, helper.read_text()))
            else:
                lost.append(f"install.sh copies {name}, not in the folder")
    text = "".join(out)
    return text if text.endswith("\n") else text + "\n"


def _rooted(line: str) -> str:
    """A diff header line with its path under vllm/ (the root the install script patches
    from: site-packages, or inside vllm/)."""
    if line.startswith(("--- ", "+++ ")) and not line[4:].startswith("/dev/null"):
        name = line[4:].split("\t", 1)[0].strip()
        return f"{line[:4]}{'a' if line[0] == '-' else 'b'}/{vllm_path(name)}\n"
    parts = line.split()
    if line.startswith("diff --git ") and len(parts) == 4:
        return f"diff --git a/{vllm_path(parts[2])} b/{vllm_path(parts[3])}\n"
    return line


def diff_targets(payload: str) -> list[str]:
    found = [
        line[6:].strip() for line in payload.splitlines() if line.startswith(("+++ b/", "--- a/"))
    ]
    return list(dict.fromkeys(found))
