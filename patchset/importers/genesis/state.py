"""A Genesis entry's upstream pull request state, read from its own text.

Genesis records `upstream_pr` (a number) and says the PR's state only in prose: the credit
("Backport of vllm#41845 (Or Ozeri @ IBM, MERGED 2026-05-07 ...)", "#45199 CLOSED unmerged",
"Vendor of OPEN vllm#45389"), the title, `superseded_by` ("vllm#42739 (merged 2026-05-23,
commit d19db10...)"). A state word counts only where it is attached to that PR's number: the
word right after it (`#N CLOSED`, `#N was CLOSED`), inside the parenthesis right after it
(`#N (author, MERGED date)`), or right before it (`OPEN vllm#N`, `MERGED upstream PR #N`).
Terminal states win over `open` (the text was written at several times); `merged` and
`closed` both attached to the PR is no clear reading: the state stays `open`, with a line.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STATE_WORD = r"(?<![\w-])(MERGED|merged|Merged|CLOSED|closed|Closed|OPEN|open|DRAFT|draft)(?![\w])"
_COMMIT = re.compile(
    r"(?:merge\s*commit|mergeCommit|at\s+commit|in\s+commit|commit)\s+`?([0-9a-f]{7,40})\b"
)
_STATES = {"merged": "merged", "closed": "closed", "open": "open", "draft": "open"}


@dataclass(frozen=True)
class PrState:
    state: str  # open | merged | closed | superseded
    commit: str | None = None
    superseded_by: int | None = None
    problem: str | None = None  # no clear reading (said as a loss)
    evidence: str | None = None  # the words read


def _texts(entry: dict[str, object]) -> list[str]:
    out = []
    for key in ("title", "credit", "superseded_by", "retired_reason", "notes", "deprecation_note"):
        value = entry.get(key)
        if isinstance(value, str):
            out.append(value)
        elif isinstance(value, list | tuple):
            out.extend(str(v) for v in value)
    return out


def _ref(number: int) -> str:
    return rf"(?:(?:vllm-project/)?vllm)?\s?(?:PR\s*)?#{number}(?!\d)"


def mentions(text: str, number: int) -> list[tuple[str, str]]:
    """(state, the words read) for each state word attached to PR `number` in `text`."""
    found: list[tuple[str, str]] = []
    ref = _ref(number)
    for match in re.finditer(ref, text):
        after = text[match.end() :]
        if after.startswith("'s"):
            continue  # "#45199's merged form": the PR's code, not its state
        word = re.match(r"\s*(?:was\s+|is\s+|got\s+)?" + _STATE_WORD, after)
        if word:
            found.append((word.group(1).lower(), text[match.start() : match.end() + word.end()]))
            continue
        paren = re.match(r"\s*\(([^()]{0,240})", after)
        if paren:
            inner = paren.group(1)
            for hit in re.finditer(_STATE_WORD, inner):
                if re.search(r"(?:\bnot\s+(?:yet\s+)?|\bun)$", inner[: hit.start()]):
                    continue
                found.append(
                    (hit.group(1).lower(), text[match.start() : match.end() + paren.end()])
                )
                break
            if found and found[-1][1].startswith(text[match.start() : match.end()]):
                continue
        before = re.search(
            _STATE_WORD + r"(?:/\w+)?(?:\s+upstream)?(?:\s+PR)?\s*$", text[: match.start()]
        )
        if before:
            found.append((before.group(1).lower(), text[before.start() : match.end()]))
    return [(_STATES[s], words) for s, words in found]


def pr_state(entry: dict[str, object], number: int) -> PrState:
    """The state of the entry's own PR `number` as its text says it (default `open`)."""
    states: dict[str, str] = {}
    texts = _texts(entry)
    for text in texts:
        for state, words in mentions(text, number):
            states.setdefault(state, words)
    superseding = _superseding(entry, number)
    if "merged" in states and "closed" in states:
        return PrState(
            "open",
            problem=(
                f"the collection's text names vllm#{number} both merged"
                f" ({states['merged'][:80]!r}) and closed ({states['closed'][:80]!r}):"
                " state left open (check with `patchset upstream`)"
            ),
        )
    if "merged" in states:
        return PrState("merged", _commit_near(texts, number), evidence=states["merged"])
    if superseding is not None:
        return PrState(
            "superseded", superseded_by=superseding, evidence=f"superseded by #{superseding}"
        )
    if "closed" in states:
        return PrState("closed", evidence=states["closed"])
    return PrState("open", evidence=states.get("open"))


def _commit_near(texts: list[str], number: int) -> str | None:
    """The merge commit named beside a merged mention of the PR (within its sentence)."""
    for text in texts:
        for match in re.finditer(_ref(number), text):
            window = text[match.end() : match.end() + 200].split(". ", 1)[0]
            if not re.search(r"(?i)\bmerged\b", window):
                continue
            commit = _COMMIT.search(window)
            if commit:
                return commit.group(1)
    return None


def _superseding(entry: dict[str, object], number: int) -> int | None:
    """Another vllm PR the entry is superseded by: its `superseded_by` naming that PR (alone,
    or as merged), or its text saying "superseded by [MERGED] vllm#M"."""
    value = entry.get("superseded_by")
    fields = [value] if isinstance(value, str) else list(value) if isinstance(value, list) else []
    for text in map(str, fields):
        for match in re.finditer(r"vllm#(\d{3,6})", text):
            other = int(match.group(1))
            if other == number:
                continue
            if text.strip() == match.group(0) or any(
                s == "merged" for s, _ in mentions(text, other)
            ):
                return other
    for text in _texts(entry):
        said = re.search(r"(?i)superseded\s+by\s+(?:the\s+)?(?:merged\s+)?vllm#(\d{3,6})", text)
        if said and int(said.group(1)) != number:
            return int(said.group(1))
    return None
