"""The text above a diff: a prose explanation, or the headers and body of a `git format-patch`
mail. It becomes the patch's description (and the mail's subject its title), never dropped."""

from __future__ import annotations

import email.parser
import email.policy
import re
from dataclasses import dataclass

# The first line of a diff proper: git's header, plain `diff -u`'s, or quilt's `Index:`.
_DIFF_START = re.compile(r"^(diff |Index: |--- \S)", re.M)
_MBOX_FROM = re.compile(r"^From [0-9a-f]{7,40} ", re.M)
_SUBJECT_TAG = re.compile(r"^\s*\[[^\]]*(PATCH|RFC)[^\]]*\]\s*", re.I)


@dataclass(frozen=True)
class Preamble:
    description: str | None  # the prose above the diff, or the mail's body; None when blank
    subject: str | None = None  # a mail's Subject without its [PATCH n/m] tag
    author: str | None = None  # a mail's From:


def split(text: str) -> tuple[Preamble, str]:
    """The preamble of `text` and the diff below it (unchanged, from its first diff line)."""
    start = _diff_start(text)
    head, diff = text[:start], text[start:]
    if _MBOX_FROM.match(head) or head.startswith(("From: ", "Subject: ")):
        return _mail(head), diff
    return Preamble(_prose(head.splitlines())), diff


def _diff_start(text: str) -> int:
    """Where the diff starts: the first `diff `/`Index: ` line, or a `--- ` line followed by
    `+++ ` (a mail's `---` separator line, alone, is not one)."""
    for match in _DIFF_START.finditer(text):
        line_end = text.find("\n", match.start())
        if match.group(1).startswith("---"):
            following = text[line_end + 1 : line_end + 5] if line_end >= 0 else ""
            if not following.startswith("+++ "):
                continue
        return match.start()
    return len(text)


def _mail(head: str) -> Preamble:
    lines = head.splitlines(keepends=True)
    if lines and _MBOX_FROM.match(lines[0]):
        lines = lines[1:]  # the mbox separator, not a header
    message = email.parser.Parser(policy=email.policy.default).parsestr("".join(lines))
    subject = message.get("Subject")
    author = message.get("From")
    body = message.get_payload()
    body_lines = body.splitlines() if isinstance(body, str) else []
    if "---" in (line.rstrip() for line in body_lines):  # the diffstat goes below this line
        body_lines = body_lines[: [line.rstrip() for line in body_lines].index("---")]
    clean_subject = _SUBJECT_TAG.sub("", " ".join(str(subject).split())) if subject else None
    return Preamble(_prose(body_lines), clean_subject or None, str(author) if author else None)


def _prose(lines: list[str]) -> str | None:
    """Lines without the blank ones around them, and without trailing spaces; None if empty."""
    kept = [line.rstrip() for line in lines]
    while kept and not kept[0]:
        kept.pop(0)
    while kept and not kept[-1]:
        kept.pop()
    return "\n".join(kept) + "\n" if kept else None
