"""Run the hardening tests and rewrite the table in docs/reliability.md from what they recorded.

    python3 benchmarks/reliability_report.py           # 200 random examples per property
    python3 benchmarks/reliability_report.py --long    # 2,000
    python3 benchmarks/reliability_report.py --sizes 20,40,60   # only item 19's timing
    python3 benchmarks/reliability_report.py --big 6,12,24      # only E22's two timings

With --sizes, `patchset add --from-tree --file` of a new module of each size (MB) is timed
in a fresh process (wall and CPU seconds; issue 23 item 19: linear in the size) and the table
between the size markers in docs/reliability.md is rewritten; the tests count the work
instead (tests/authoring/test_hostile_authoring.py::test_a_big_new_file_costs_linear_work).

With --big, issue 37's E22 is timed for each size (MB), each in a fresh process: `apply` of a
diff patch that creates a new file of that size, and `validate` of a `python` patch whose
plugin.py is that size (one 50-byte statement per line in `apply()`); the table between the
big markers is rewritten.

Every hostile input and injected fault is recorded by the test that tries it
(tests/helpers/reliability.py), with whether anything was lost or half-written; the reused download
and index tests count through the same module loaded as a pytest plugin. The raw records go to
.reliability.jsonl (git-ignored); the table between the markers in docs/reliability.md is
replaced, the rest of the page is left alone.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOC = ROOT / "docs" / "reliability.md"
LOG = ROOT / ".reliability.jsonl"
BEGIN, END = "<!-- reliability:begin -->", "<!-- reliability:end -->"
SIZES_BEGIN, SIZES_END = "<!-- sizes:begin -->", "<!-- sizes:end -->"
BIG_BEGIN, BIG_END = "<!-- big:begin -->", "<!-- big:end -->"
LINE = "x = 'a short line of a generated module'\n"
TEST_FILES = [
    "tests/test_hostile_corpus.py",
    "tests/test_hostile_text.py",
    "tests/test_fuzz.py",
    "tests/test_faults.py",
    "tests/engine/test_trust.py",
    "tests/test_hostile_scripts.py",
    "tests/test_hostile_forge.py",
    "tests/test_import_faults.py",
    "tests/test_hostile_big.py",
]


def run_tests(*, long: bool) -> tuple[int, float]:
    sys.path.insert(0, str(ROOT))
    from tests.helpers.reliability import LOG_ENV, REUSED  # noqa: PLC0415 -- importable once ROOT is on the path

    LOG.unlink(missing_ok=True)
    env = {**os.environ, LOG_ENV: str(LOG)}
    if long:
        env["HYPOTHESIS_PROFILE"] = "long"
    args = ["-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "tests.helpers.reliability"]
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


def time_sizes(sizes: list[int]) -> list[str]:
    """`add --from-tree --file` of a new module of each size: a table of wall and CPU s."""
    import tempfile  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from tests.helpers.synthetic import BODY, make_tree  # noqa: PLC0415 -- once ROOT is on the path
    from tests.helpers.timing import run_patchset  # noqa: PLC0415

    lines = ["| new file | wall s | CPU s | CPU s per 20 MB |", "|---:|---:|---:|---:|"]
    with tempfile.TemporaryDirectory() as tmp:
        release = make_tree(Path(tmp, "release"), {"vllm/mod.py": BODY})
        for size in sizes:
            registry = Path(tmp, f"reg{size}")
            registry.mkdir()
            tree = make_tree(Path(tmp, f"tree{size}"), {"vllm/mod.py": BODY})
            (tree / "vllm" / "big.py").write_text(LINE * (size * 1_000_000 // len(LINE)))
            words = ["--registry", str(registry), "add", "big", "--from-tree", str(tree)]
            words += ["--vllm", "0.19.1", "--source", str(release), "--file", "vllm/big.py"]
            wall, cpu, _ = run_patchset(words, {})
            print(f"{size} MB: {wall:.1f} s wall, {cpu:.1f} s CPU", flush=True)
            lines.append(f"| {size} MB | {wall:.1f} | {cpu:.1f} | {cpu * 20 / size:.1f} |")
            shutil.rmtree(tree)
            shutil.rmtree(registry)
    return lines


STATEMENT = "    x = 'a line of a big plugin, more text here'\n"


def _measured(words: list[str]) -> tuple[float, float, float]:
    """`python -m patchset WORDS` in a fresh process: wall s, CPU s, its peak memory in MB."""
    start = time.perf_counter()
    child = subprocess.Popen(
        [sys.executable, "-m", "patchset", *words],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    assert child.stderr is not None
    said = child.stderr.read()
    child.stderr.close()
    _, status, usage = os.wait4(child.pid, 0)
    took = time.perf_counter() - start
    child.returncode = os.waitstatus_to_exitcode(status)
    if child.returncode not in (0, 1):
        raise SystemExit(f"patchset exited {child.returncode}: {said.decode(errors='replace')}")
    return took, usage.ru_utime + usage.ru_stime, usage.ru_maxrss / 1024


def time_big(sizes: list[int]) -> list[str]:
    """E22: `apply` of a new file's diff and `validate` of a plugin.py, each size in MB."""
    import tempfile  # noqa: PLC0415

    sys.path.insert(0, str(ROOT))
    from tests.helpers.synthetic import (  # noqa: PLC0415 -- ROOT on the path
        BIG_PLUGIN_TOML,
        BODY,
        add_patch,
        make_tree,
    )

    lines = [
        "| size | apply of a new file: wall s | CPU s | peak MB"
        " | validate of a plugin.py: wall s | CPU s | peak MB |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    with tempfile.TemporaryDirectory() as tmp:
        for size in sizes:
            count = size * 1_000_000 // len(LINE)
            diff = f"--- /dev/null\n+++ b/vllm/big.py\n@@ -0,0 +1,{count} @@\n"
            diff += ("+" + LINE) * count
            registry = Path(tmp, f"diff{size}")
            add_patch(registry, "big-new", diff=diff, targets=["vllm/big.py"])
            tree = make_tree(Path(tmp, f"tree{size}"), {"vllm/mod.py": BODY})
            words = ["--registry", str(registry), "apply", "--target", str(tree)]
            apply_wall, apply_cpu, apply_peak = _measured(words)
            plugins = Path(tmp, f"plugin{size}")
            folder = plugins / "big-plugin"
            folder.mkdir(parents=True)
            (folder / "patch.toml").write_text(BIG_PLUGIN_TOML)
            body = STATEMENT * (size * 1_000_000 // len(STATEMENT))
            (folder / "plugin.py").write_text("def apply():\n    import vllm.envs\n" + body)
            wall, cpu, peak = _measured(["--registry", str(plugins), "validate"])
            print(
                f"{size} MB: apply {apply_wall:.1f} s wall ({apply_cpu:.1f} CPU, {apply_peak:.0f}"
                f" MB), validate {wall:.1f} s wall ({cpu:.1f} CPU, {peak:.0f} MB)",
                flush=True,
            )
            lines.append(
                f"| {size} MB | {apply_wall:.1f} | {apply_cpu:.1f} | {apply_peak:.0f}"
                f" | {wall:.1f} | {cpu:.1f} | {peak:.0f} |"
            )
            for done in (registry, tree, plugins):
                shutil.rmtree(done)
    return lines


def _commit() -> str:
    return subprocess.run(
        ["git", "rev-parse", "--short", "HEAD"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    ).stdout.strip()


def _replace_block(begin: str, end: str, block: list[str]) -> None:
    text = DOC.read_text(encoding="utf-8")
    head, _, rest = text.partition(begin)
    _, _, tail = rest.partition(end)
    DOC.write_text(head + "\n".join([begin, *block, end]) + tail, encoding="utf-8")


def rewrite_sizes(lines: list[str]) -> None:
    load = os.getloadavg()[0]
    command = "python3 benchmarks/reliability_report.py --sizes"
    _replace_block(
        SIZES_BEGIN,
        SIZES_END,
        [
            f"From `{command}` at commit `{_commit() or '?'}` ({time.strftime('%Y-%m-%d')};"
            f" load average {load:.1f} on 2 shared cores).",
            "",
            *lines,
        ],
    )


def rewrite(lines: list[str], *, code: int, seconds: float, long: bool) -> None:
    commit = _commit()
    outcome = "all passed" if code == 0 else f"FAILED (pytest exit {code})"
    profile = " --long" if long else ""
    block = [
        f"From `python3 benchmarks/reliability_report.py{profile}` at commit `{commit or '?'}`"
        f" ({time.strftime('%Y-%m-%d')}, {seconds:.0f} s on this machine; tests: {outcome}).",
        "",
        *lines,
    ]
    _replace_block(BEGIN, END, block)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--long", action="store_true", help="ten times the random examples")
    parser.add_argument(
        "--sizes", metavar="MB,MB", help="only time `add` of new files of these sizes (item 19)"
    )
    parser.add_argument(
        "--big", metavar="MB,MB", help="only time E22: apply of a new file, validate of a plugin"
    )
    options = parser.parse_args()
    if options.big:
        lines = time_big([int(n) for n in options.big.split(",")])
        command = f"python3 benchmarks/reliability_report.py --big {options.big}"
        load = os.getloadavg()[0]
        head = f"From `{command}` at commit `{_commit() or '?'}` ({time.strftime('%Y-%m-%d')};"
        _replace_block(BIG_BEGIN, BIG_END, [f"{head} load average {load:.1f}).", "", *lines])
        print(f"{DOC.relative_to(ROOT)}: big-file table rewritten")
        return 0
    if options.sizes:
        rewrite_sizes(time_sizes([int(n) for n in options.sizes.split(",")]))
        print(f"{DOC.relative_to(ROOT)}: size table rewritten")
        return 0
    code, seconds = run_tests(long=options.long)
    records = [json.loads(line) for line in LOG.read_text().splitlines()] if LOG.exists() else []
    lines = table(records)
    print("\n".join(lines))
    rewrite(lines, code=code, seconds=seconds, long=options.long)
    print(f"{DOC.relative_to(ROOT)}: table rewritten from {len(records)} records")
    return code


if __name__ == "__main__":
    raise SystemExit(main())
