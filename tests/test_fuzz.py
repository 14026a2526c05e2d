"""Random diffs, sites and trees (hypothesis): patchset fails only with a PatchsetError, never
writes outside the target, writes nothing when it fails, and a revert gives back the very bytes
of every tree it applied to.

Bounded for two cores: 200 examples per property, no deadline (file writes vary), the whole
file well under a minute. `HYPOTHESIS_PROFILE=long` runs ten times as many.
"""

from __future__ import annotations

import difflib
import os
import tempfile
import textwrap
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

from hypothesis import HealthCheck, assume, event, given, settings
from hypothesis import strategies as st

from patchset.engine.apply import ApplyReport, apply, revert
from patchset.errors import PatchsetError
from patchset.registry import load_registry
from tests.helpers.hardening import LOCK, changed, snapshot
from tests.helpers.reliability import HOSTILE, record

settings.register_profile(
    "default",
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
settings.register_profile("long", parent=settings.get_profile("default"), max_examples=2000)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "default"))

FILES = ("vllm/a.py", "vllm/sub/b.py", "vllm/c.py")
# Lines that stress the engine: repeats (ambiguous matches), indentation, and characters that
# other tools treat as line ends (form feed, NEL, U+2028, a lone CR inside a line) or as
# terminators (NUL). No line ends in CR: a CR before LF is a CRLF line end by definition.
POOL = (
    "a",
    "b",
    "a",
    "",
    "def f(x):",
    "    return x",
    "\tpass",
    "x = 1  ",
    "# \u00e9t\u00e9",
    "form\x0cfeed",
    "nel\x85here",
    "sep\u2028here",
    "cr\rinside",
    "nul\x00byte",
    "@@ -1 +1 @@",
    "--- a/vllm/a.py",
    "+++",
    "\\ No newline at end of file",
)
line = st.sampled_from(POOL)
lines = st.lists(line, max_size=14)
NOISE = (b"\xff\xfe junk\n", b"drift\n", b"\n", b"a\n")


@dataclass(frozen=True)
class FileCase:
    path: str
    old: list[str]
    new: list[str]
    old_eof: bool  # the old side ends with a newline
    new_eof: bool
    crlf: bool  # the tree's copy uses CRLF line ends
    drift: bytes  # lines put in front of the tree's copy (offsets, or a conflict)


@st.composite
def edits(draw: st.DrawFn, old: list[str]) -> list[str]:
    new = list(old)
    for _ in range(draw(st.integers(1, 4))):
        kind = draw(st.sampled_from(["insert", "delete", "replace"]))
        at = draw(st.integers(0, len(new)))
        if kind == "insert" or not new:
            new.insert(at, draw(line))
        elif kind == "delete":
            del new[min(at, len(new) - 1)]
        else:
            new[min(at, len(new) - 1)] = draw(line)
    return new


@st.composite
def file_cases(draw: st.DrawFn) -> list[FileCase]:
    paths = draw(st.lists(st.sampled_from(FILES), min_size=1, max_size=3, unique=True))
    cases = []
    for path in paths:
        old = draw(lines)
        new = draw(edits(old))
        # An empty last line without a newline is no line: diff never writes one.
        old_eof = draw(st.booleans()) or not old or not old[-1]
        new_eof = draw(st.booleans()) or not new or not new[-1]
        assume((old, old_eof) != (new, new_eof))
        drift = b"".join(draw(st.lists(st.sampled_from(NOISE), max_size=3)))
        # A file without any line end has no line-end style to keep or follow (a known limit:
        # CRLF comes back as LF), so CRLF files have one before and after.
        ends = (len(old) > 1 or (old and old_eof)) and (len(new) > 1 or (new and new_eof))
        crlf = draw(st.booleans()) and bool(ends) and not drift
        cases.append(FileCase(path, old, new, old_eof, new_eof, crlf, drift))
    return cases


def _range(start: int, stop: int) -> str:
    length = stop - start
    first = start + 1 if length else start
    return f"{first}" if length == 1 else f"{first},{length}"


def _items(lines: list[str], eof: bool) -> list[str]:
    """Lines with their newline, the last without one when the file lacks it, so that a line
    whose newline comes or goes counts as changed (as it does for diff)."""
    return [f"{text}\n" if i < len(lines) - 1 or eof else text for i, text in enumerate(lines)]


def unified(case: FileCase, context: int) -> str:
    """A unified diff of one file, with the no-newline markers GNU diff writes."""
    old, new = _items(case.old, case.old_eof), _items(case.new, case.new_eof)
    out = [f"--- a/{case.path}\n", f"+++ b/{case.path}\n"]
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for group in matcher.get_grouped_opcodes(context):
        i1, i2, j1, j2 = group[0][1], group[-1][2], group[0][3], group[-1][4]
        out.append(f"@@ -{_range(i1, i2)} +{_range(j1, j2)} @@\n")
        for tag, a1, a2, b1, b2 in group:
            if tag == "equal":
                out += [_line(" ", item) for item in old[a1:a2]]
                continue
            out += [_line("-", item) for item in old[a1:a2]]
            out += [_line("+", item) for item in new[b1:b2]]
    return "".join(out)


def _line(tag: str, item: str) -> str:
    if item.endswith("\n"):
        return f"{tag}{item}"
    return f"{tag}{item}\n\\ No newline at end of file\n"


def tree_bytes(case: FileCase) -> bytes:
    eol = "\r\n" if case.crlf else "\n"
    text = eol.join(case.old) + (eol if case.old_eof and case.old else "")
    return case.drift + text.encode("utf-8", "surrogateescape")


def expected_bytes(case: FileCase) -> bytes:
    eol = "\r\n" if case.crlf else "\n"
    return (eol.join(case.new) + (eol if case.new_eof and case.new else "")).encode()


PATCH_TOML = """\
id = "fuzz"
title = "fuzz"
description = "generated by tests/test_fuzz.py"
kind = "{kind}"
revision = 1
vllm = ">=0.1"
apply = "build"
targets = [{targets}]
origin = "hypothesis"
credit = ["tests"]

[upstream]
state = "unsubmitted"
"""


@contextmanager
def workspace() -> Iterator[tuple[Path, Path, Path]]:
    """A registry folder, a target holding vllm/, and a folder beside it that must not change."""
    with tempfile.TemporaryDirectory(prefix="patchset-fuzz-") as tmp:
        root = Path(tmp)
        registry, target, outside = root / "patches", root / "target", root / "outside"
        (registry / "fuzz").mkdir(parents=True)
        (target / "vllm" / "sub").mkdir(parents=True)
        (target / "vllm" / "__init__.py").write_text("")
        (target / "vllm" / "_version.py").write_text("__version__ = '0.19.1'\n")
        outside.mkdir()
        (outside / "secret.py").write_text("a\nb\n")
        yield registry, target, outside


def write_patch(registry: Path, kind: str, payload: bytes, targets: list[str]) -> None:
    quoted = ", ".join(f'"{t}"' for t in targets)
    (registry / "fuzz" / "patch.toml").write_text(PATCH_TOML.format(kind=kind, targets=quoted))
    name = "patch.diff" if kind == "diff" else "sites.toml"
    (registry / "fuzz" / name).write_bytes(payload)


def apply_and_revert(
    registry: Path, target: Path, outside: Path, group: str, case: str
) -> ApplyReport | None:
    """Apply, then revert what was written; check the invariants and record the case.

    A clean apply must be reverted byte for byte, or the revert must refuse and write nothing
    because the change now fits in two places (which one to take out cannot be known). An
    apply that warned (both ways fit; a site anchor matched only with whitespace folded) told
    the user to look; its revert must still fail cleanly or write.
    """
    before, outside_before = snapshot(target), snapshot(outside)
    report = None
    with suppress(PatchsetError):
        report = apply(load_registry(registry), target)
    after = snapshot(target, ignore=(LOCK,))
    written = report is not None and report.written
    warned = report is not None and any(
        "reverse of this diff fits too" in w or "whitespace folded" in w
        for r in report.results
        for w in r.warnings
    )
    restored = refused = True
    if written:
        back = revert(load_registry(registry), target)  # a PatchsetError here fails the test
        now = snapshot(target, ignore=(LOCK,))
        refused = not back.written and now == after and _fits_twice(back)
        restored = (back.written and now == before) or refused or warned
        if refused:
            group = "hypothesis: revert refused, the change fits twice"
    untouched = snapshot(outside) == outside_before
    intact = untouched and (written or after == before) and restored
    event(
        "refused" if report is None else f"exit {report.exit_code}"
    )  # --hypothesis-show-statistics
    record(HOSTILE, group, case, intact=intact)
    assert untouched, "something outside the target changed"
    assert written or after == before, changed(before, after)
    assert restored, "the revert did not give back the very bytes"
    return report


def _fits_twice(report: ApplyReport) -> bool:
    return all(
        r.outcome != "conflict" or any("it fits at lines" in d for d in r.details)
        for r in report.results
    )


@given(cases=file_cases(), context=st.integers(0, 3), mode=st.sampled_from(["plain", "link"]))
def test_random_diffs_apply_and_revert_exactly(
    cases: list[FileCase], context: int, mode: str
) -> None:
    diff = "".join(unified(c, context) for c in cases)
    with workspace() as (registry, target, outside):
        write_patch(registry, "diff", diff.encode(), [c.path for c in cases])
        for c in cases:
            (target / c.path).write_bytes(tree_bytes(c))
        if mode == "link":  # the first file a symlink out of the target: refused, untouched
            first = target / cases[0].path
            (outside / "linked.py").write_bytes(first.read_bytes())
            first.unlink()
            first.symlink_to(outside / "linked.py")
        apply_and_revert(registry, target, outside, "hypothesis: random diffs", diff)


def test_applied_bytes_are_the_new_side() -> None:
    """Without drift, an exact apply writes the diff's new side in the tree's line ends. The
    comparison must run for some examples, not only the refusals: counted, and asserted."""
    seen: Counter[str] = Counter()

    @given(cases=file_cases(), context=st.integers(0, 3))
    def exact(cases: list[FileCase], context: int) -> None:
        cases = [FileCase(c.path, c.old, c.new, c.old_eof, c.new_eof, c.crlf, b"") for c in cases]
        diff = "".join(unified(c, context) for c in cases)
        with workspace() as (registry, target, _):
            write_patch(registry, "diff", diff.encode(), [c.path for c in cases])
            for c in cases:
                (target / c.path).write_bytes(tree_bytes(c))
            try:
                report = apply(load_registry(registry), target)
            except PatchsetError:
                event("refused (e.g. a hunk with no context)")
                seen["refused"] += 1
                return
            if report.written and not any(r.warnings for r in report.results):
                event("written exactly: bytes compared")
                seen["compared"] += 1
                for c in cases:
                    assert (target / c.path).read_bytes() == expected_bytes(c)
            else:
                event(f"not compared: {sorted({r.outcome for r in report.results})}")
                seen["other"] += 1

    exact()
    assert seen["compared"] > 0, seen  # the branch that asserts ran
    # and not a rare one (about 2 in 5 examples here; refusals and no-op diffs are the rest)
    assert seen["compared"] * 5 >= sum(seen.values()), seen


GARBAGE = st.sampled_from(
    [
        "--- a/vllm/a.py",
        "+++ b/vllm/a.py",
        "--- /dev/null",
        "+++ /dev/null",
        "--- a/../x",
        "+++ b//etc/passwd",
        "diff --git a/vllm/a.py b/vllm/c.py",
        "rename from vllm/a.py",
        "rename to vllm/c.py",
        "new file mode 100644",
        "Binary files a/vllm/a.py and b/vllm/a.py differ",
        "GIT binary patch",
        "@@ -1 +1 @@",
        "@@ -1,2 +1,2 @@",
        "@@ -0,0 +1 @@",
        "@@ -3,0 +4,2 @@ def f(x):",
        "@@ -99999999,1 +1 @@",
        "@@ -1 +1 @",
        "\\ No newline at end of file",
        "-- ",
    ]
)
GARBAGE_LINE = st.one_of(
    GARBAGE,
    st.builds(lambda tag, body: tag + body, st.sampled_from(" +-"), line),
    st.text(max_size=12),
)


@given(
    text=st.lists(GARBAGE_LINE, max_size=24).map("\n".join),
    crlf=st.booleans(),
    raw=st.binary(max_size=8),
)
def test_garbage_diffs_fail_cleanly(text: str, crlf: bool, raw: bytes) -> None:
    """Diff-shaped noise: refused with a PatchsetError, or applied and reverted exactly."""
    payload = (text.replace("\n", "\r\n") if crlf else text).encode("utf-8", "surrogatepass")
    payload += raw if raw.startswith(b"\n") else b""
    with workspace() as (registry, target, outside):
        write_patch(registry, "diff", payload, list(FILES))
        for path in FILES:
            (target / path).write_bytes(b"a\nb\na\n\ndef f(x):\n    return x\n")
        apply_and_revert(registry, target, outside, "hypothesis: diff-shaped noise", text)


@st.composite
def site_payloads(draw: st.DrawFn) -> tuple[str, list[str]]:
    body = draw(st.lists(line, min_size=1, max_size=12))
    sites = []
    for n in range(draw(st.integers(1, 3))):
        start = draw(st.integers(0, len(body) - 1))
        anchor = body[start : start + draw(st.integers(1, 3))]
        if not any(a.strip() for a in anchor):
            anchor = [*anchor, "a"]
        text = draw(st.lists(line, min_size=1, max_size=3))
        action = draw(st.sampled_from(["replace", "insert-after", "insert-before"]))
        sites.append(
            "[[site]]\n"
            f'name = "s{n}"\nfile = "vllm/a.py"\naction = "{action}"\n'
            f'marker = "patchset: fuzz {n}"\n'
            f"anchor = {_toml_string(chr(10).join(anchor))}\n"
            f"text = {_toml_string(chr(10).join(text))}\n"
        )
    return "\n".join(sites), body


def _toml_string(value: str) -> str:
    escaped = "".join(
        ch if ch.isprintable() and ch not in '"\\' else f"\\u{ord(ch):04x}" for ch in value
    )
    return f'"{escaped}"'


@given(payload=site_payloads(), crlf=st.booleans(), indent=st.sampled_from(["", "    ", "\t"]))
def test_random_sites_apply_and_revert_exactly(
    payload: tuple[str, list[str]], crlf: bool, indent: str
) -> None:
    sites, body = payload
    eol = "\r\n" if crlf else "\n"
    text = eol.join(f"{indent}{b}" if b else b for b in body) + eol
    with workspace() as (registry, target, outside):
        write_patch(registry, "runtime", sites.encode(), ["vllm/a.py"])
        (target / "vllm/a.py").write_bytes(text.encode())
        apply_and_revert(registry, target, outside, "hypothesis: runtime sites", sites)


def test_unified_helper_round_trips() -> None:
    """The generator's own diffs are what GNU-style tools write (a fixed, readable example)."""
    case = FileCase("vllm/a.py", ["a", "b"], ["a", "c"], True, False, False, b"")
    assert unified(case, 3) == textwrap.dedent(
        """\
        --- a/vllm/a.py
        +++ b/vllm/a.py
        @@ -1,2 +1,2 @@
         a
        -b
        +c
        \\ No newline at end of file
        """
    )
