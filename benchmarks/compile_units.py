"""Benchmark: the compile check by units (`patchset.kernel.pycompile.edit_error`) against
compiling the whole file, on random edits of vLLM's own release files.

Each round takes a release file (from patchset's release cache, as `check` reads it: the
files the runtime matrix's corpus patches, or any `vllm/**/*.py` of the release given) and
makes a chain of two or three versions of it, each a random edit of the one before (lines
put in, replaced, removed or turned into comments, at the file's own indentation or not,
valid Python or not, the last line break dropped), as a patch and the next release make
them. Every step is judged by `edit_error(before, after, name)` (which judges the next
version as an edit of the one before it) and by `broken_by(before, after)` (the whole file
compiled); the two must give the same answer, error line and message included (an edit of
a version that does not compile is not blamed, by either).

Last line: edits=<n> agree=<same>/<n> by_units=<share> units_s=<s> whole_s=<s>
(by_units: the share of edits that compile judged without compiling the edited file whole;
units_s and whole_s: process time of the two ways over the same edits.)

    python benchmarks/compile_units.py [--vllm 0.20.0] [--files 120] [--rounds 1500] [--seed 1]
"""

from __future__ import annotations

import argparse
import itertools
import random
import sys
import time

from patchset.errors import SourceError
from patchset.kernel import pycompile, pyunits
from patchset.sources.package_index import IndexSource

SNIPPETS = (
    "x = 1", "return 1", "pass", "y = (", ")", '"""', "'''", "global zz", "nonlocal q",
    "def q():", "    return 2", "else:", "if a:", "class Z:", "@dec", "yield 3", "await w",
    "break", "from m import *", "(v := 2)", "[(w := 1) for w in r]", "t = [u := 1 for v in r]",
    "# c", "", "z = f(a,", "    b)", "\tt = 1", "import os", "from __future__ import annotations",
    "async def r():", "x: int = 1", "...", "@property", "def m(self):", "lambda: (yield)",
    "try:", "except E:", "finally:", "with o:", "for i in r:", "continue", "*a, = b", "f'{x'",
    "match x:", "    case 1:", "\\",
)  # fmt: skip


def release_files(version: str, count: int, rng: random.Random) -> list[tuple[str, bytes]]:
    """Up to `count` of the release's Python files that compile, of those in the release
    cache (the files checks have read)."""
    with IndexSource(offline=True).open(version) as tree:
        names = sorted(n for n in tree.paths() if n.startswith("vllm/") and n.endswith(".py"))
        rng.shuffle(names)
        found: list[tuple[str, bytes]] = []
        for name in names:
            try:
                data = tree.read(name)
            except SourceError:  # not in the cache (offline): only files a check read are
                continue
            if data and len(data) > 2000 and pycompile.compiles(data):
                found.append((name, data))
            if len(found) == count:
                break
    return found


def edit(source: bytes, rng: random.Random) -> bytes:
    lines = source.decode("utf-8", "surrogateescape").split("\n")
    for _ in range(rng.choice([1, 1, 2, 3, 4])):
        at = rng.randrange(len(lines))
        indent = lines[at][: len(lines[at]) - len(lines[at].lstrip())]
        indent = rng.choice([indent, indent, indent, indent + "    ", indent[:-4], "", " " * 8])
        new = [
            indent + (rng.choice(SNIPPETS) if rng.random() < 0.35 else "_patchset_x = 1")
            for _ in range(rng.choice([1, 1, 2]))
        ]
        kind = rng.random()
        if kind < 0.1:
            lines[at : at + rng.choice([1, 2, 5])] = [indent + "# gone"]
        elif kind < 0.15:
            lines.extend(new)
        elif kind < 0.2:
            del lines[at : at + rng.choice([1, 3, 10])]
        else:
            lines[at : at + rng.choice([0, 0, 1, 2])] = new
        lines = lines or [""]
    out = "\n".join(lines).encode("utf-8", "surrogateescape")
    return out.rstrip(b"\n") if rng.random() < 0.05 else out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vllm", default="0.20.0", help="the release whose files are edited")
    parser.add_argument("--files", type=int, default=120)
    parser.add_argument("--rounds", type=int, default=1500)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    rng = random.Random(args.seed)  # noqa: S311 - a repeatable sequence, not a secret
    files = release_files(args.vllm, args.files, rng)
    if not files:
        sys.exit(f"no cached files of vllm {args.vllm}: run `patchset check --vllm {args.vllm}`")
    print(f"{len(files)} files of vllm {args.vllm}", flush=True)
    pairs: list[tuple[str, bytes, bytes]] = []
    for _ in range(args.rounds):
        name, data = rng.choice(files)
        chain = [data]
        for _ in range(rng.choice([1, 2, 3])):
            chain.append(edit(chain[-1], rng) if rng.random() < 0.5 else chain[-1] + b"\n_r = 1\n")
        pairs.extend((name, b, a) for b, a in itertools.pairwise(chain))
    same = alone = compiling = 0
    units_s = whole_s = 0.0
    last = ""
    for name, before, after in pairs:
        if name != last:
            pycompile.clear_cache()  # each chain from nothing known
            last = name
        start = time.process_time()
        want = pycompile.broken_by(before, after)
        whole_s += time.process_time() - start
        start = time.process_time()
        got = pycompile.edit_error(before, after, name)
        units_s += time.process_time() - start
        same += got == want
        if got != want:
            print(f"  differs: {name}: whole {want}, units {got}")
        if want is None:
            compiling += 1
            known = pycompile._known(before)  # what the units saw
            alone += pyunits.units(known, before, after) is not None
    print(
        f"edits={len(pairs)} agree={same}/{len(pairs)} by_units={alone / max(compiling, 1):.2f}"
        f" units_s={units_s:.3f} whole_s={whole_s:.3f}"
    )


if __name__ == "__main__":
    main()
