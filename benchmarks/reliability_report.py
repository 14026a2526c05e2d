"""Run the hardening tests and rewrite the table in docs/reliability.md from what they recorded.

    python3 benchmarks/reliability_report.py           # 200 random examples per property
    python3 benchmarks/reliability_report.py --long    # 2,000

Every hostile input and injected fault is recorded by the test that tries it
(tests/reliability.py), with whether anything was lost or half-written; the reused download
and index tests count through the same module loaded as a pytest plugin. The raw records go to
.reliability.jsonl (git-ignored); the table between the markers in docs/reliability.md is
replaced, the rest of the page is left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
LOG = ROOT / ".reliability.jsonl"
BEGIN, END = "<!-- reliability:begin -->", "<!-- reliability:end -->"
TEST_FILES = [
    "tests/test_hostile_corpus.py",
    "tests/test_hostile_text.py",
    "tests/test_fuzz.py",
    "tests/test_faults.py",
    "tests/engine/test_trust.py",
]


def run_tests(*, long: bool) -> tuple[int, float]:
    sys.path.insert(0, str(ROOT))
    from tests.reliability import LOG_ENV, REUSED  # noqa: PLC0415 -- importable once ROOT is on the path

    LOG.unlink(missing_ok=True)
    env = {**os.environ, LOG_ENV: str(LOG)}
    if long:
        env["HYPOTHESIS_PROFILE"] = "long"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.reliability"]
    start = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, *args, *TEST_FILES, *REUSED], cwd=ROOT, env=env, check=False
    )
    return proc.returncode, time.perf_counter() - start


def table(records: list[dict[str, object]]) -> list[str]:
    cases: Counter[tuple[str, str]] = Counter()
    lost: Counter[tuple[str, str]] = Counter()
    for record in records:
        key = (str(record["kind"]), str(record["group"]))
        cases[key] += 1
        lost[key] += not record["intact"]
    lines = ["| kind | what | cases | lost or half-written |", "|---|---|---:|---:|"]
    for kind, group in sorted(cases):
        lines.append(f"| {kind} | {group} | {cases[kind, group]} | {lost[kind, group]} |")
    for kind in sorted({k for k, _ in cases}):
        total = sum(n for (k, _), n in cases.items() if k == kind)
        bad = sum(n for (k, _), n in lost.items() if k == kind)
        lines.append(f"| **{kind}** | **all** | **{total}** | **{bad}** |")
    return lines


def rewrite(lines: list[str], *, code: int, seconds: float, long: bool) -> None:
    commit = subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()
    outcome = "all passed" if code == 0 else f"FAILED (pytest exit {code})"
    profile = " --long" if long else ""
    block = [
        BEGIN,
        f"From `python3 benchmarks/reliability_report.py{profile}` at commit `{commit or '?'}`"
        f" ({time.strftime('%Y-%m-%d')}, {seconds:.0f} s on this machine; tests: {outcome}).",
        "",
        *lines,
        END,
    ]
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(BEGIN)
    _, _, tail = rest.partition(END)
    DOC.write_text(head + "\n".join(block) + tail, encoding="utf-8")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="ten times the random examples")
    options = parser.parse_args()
    code, seconds = run_tests(long=options.long)
    records = [json.loads(line) for line in LOG.read_text().splitlines()] if LOG.exists() else []
    lines = table(records)
    print("\n".join(lines))
    rewrite(lines, code=code, seconds=seconds, long=options.long)
    print(f"{DOC.relative_to(ROOT)}: table rewritten from {len(records)} records")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
