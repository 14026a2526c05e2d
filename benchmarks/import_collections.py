"""Benchmark: `patchset import` of the two public collections' local checkouts.

    PATCHSET_GENESIS_DIR=... PATCHSET_CLUB3090_DIR=... python3 benchmarks/import_collections.py

Each collection is imported into a fresh project (club-3090 with --run-scripts, Genesis with
--source index; releases from the package index's cache); then:
- counts: imported (with or without loss), not imported, out of scope; the import time;
- validate: `patchset validate` of the imported registry (its exit code);
- check: `patchset check --since 0.17.0` of the whole imported registry, warm (the second run,
  with a memo of the benchmark's own);
- Genesis agreement: for every imported runtime patch and every release in its range,
  Genesis's own code run on a scratch copy of the release's target files (the checkout's
  patch module imported in a child process, its TextPatcher factories' patchers applied by
  its `sndr.kernel.text_patch`, and its own `apply()` on a second copy; see `_reference_child`
  for the few stubs) against patchset's check verdict; where both apply, whether patchset's
  apply gives the same bytes as Genesis's patchers (marker comments aside) on the newest
  release in range. Each difference is printed with its documented case (docs/import.md):
  "better: ...", "loss: ..." (said by the import), "bytes: ...", or "unexplained".

PATCHSET_BENCH_KEEP=1 keeps the scratch folder (printed) to look at the trees.

While the registry does not load the issue-24 keys ([switch], [applies], [lifecycle],
[provenance], requires_modules), the import leaves every patch out as "does not load"; the
benchmark then also writes the drafts without those keys to a second registry (`stripped`)
and runs the check and the agreement on it: the sites and ranges are the same.

- definitions: `runtime export` of every build definition the two imports wrote.

Last line: genesis_imported=<n>/<entries> club_imported=<n>/<distinct> genesis_s=<s>
club_s=<s> validate=<genesis rc>,<club rc> check_warm_s=<s> agree=<n>/<pairs>
documented_better=<n> documented_loss=<n> bytes=<n>/<pairs> bytes_documented=<n>
unexplained=<n> definitions_exported=<n>/<written> probes_matching_unfixed_releases=<n>
probes_kept_later=<n>

probes_matching_unfixed_releases: the upstream probe strings the two imports dropped because the
release the patch was written against holds the string where the patch still applies and its
change is absent; probes_kept_later: those only a later such release holds, kept (maybe the
fix made another way; the check reports a disagreement there). Both from the imports' report
notes, one line each, printed above the last line.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

import patchset  # noqa: E402
from patchset.engine.order import required_chain  # noqa: E402
from patchset.importers import genesis, import_collection  # noqa: E402
from patchset.importers.genesis import registry as genesis_registry  # noqa: E402
from patchset.importers.genesis import text as genesis_text  # noqa: E402
from patchset.importers.model import Draft  # noqa: E402
from patchset.importers.pystatic import Package  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from patchset.registry.model import Patch  # noqa: E402
from patchset.registry.write import write_patch_folder  # noqa: E402
from patchset.release_check.memo import Memo  # noqa: E402
from patchset.sources import parse_source  # noqa: E402
from tests.helpers.cli import cli  # noqa: E402

NEW_KEYS = {"switch", "applies", "lifecycle", "provenance", "requires_modules", "failure", "verify"}
SINCE = Version("0.17.0")
DROPPED_PROBE = "dropped its upstream probe string"
KEPT_PROBE = "kept its upstream probe string"


def _validate(registry: Path) -> int:
    return cli("validate", "--registry", registry).code


def _stripped(drafts: list[Draft], root: Path) -> Path:
    registry = root / "stripped" / "patches"
    registry.mkdir(parents=True)
    for draft in drafts:
        meta = {k: v for k, v in draft.meta.items() if k not in NEW_KEYS}
        write_patch_folder(registry / draft.id, meta, draft.payloads)
    return registry


# The reference is Genesis's own code, run from the checkout in a child process (so nothing of
# it stays in this one): each imported runtime patch's `apply_module` is imported and its
# `apply()` called on a scratch copy of a release's target files. Stubbed, and only these:
# the dispatcher's `should_apply` (says yes: the switch and the served model are not the
# question here) and `log_decision`; `guards.vllm_install_root` (its documented test hook)
# points at the scratch copy; Genesis's persistent caches are off and their file is scratch.
_CHILD = "--genesis-reference"
_MODULE_COPY = "-module"  # beside each scratch tree: the copy the module's apply() runs on


def _reference_child(jobs_file: str, out_file: str) -> None:
    """In the child: run each job's module's own apply() on each of its scratch trees."""
    import importlib  # noqa: PLC0415 - the child's own imports
    import json  # noqa: PLC0415
    import logging  # noqa: PLC0415

    sys.path.insert(0, os.environ["PATCHSET_GENESIS_DIR"])
    dispatcher = importlib.import_module("sndr.dispatcher")
    guards = importlib.import_module("sndr.engines.vllm.detection.guards")
    text_patch = importlib.import_module("sndr.kernel.text_patch")
    setattr(dispatcher, "should_apply", lambda _pid: (True, "benchmark"))  # noqa: B010
    setattr(dispatcher, "log_decision", lambda *_a, **_k: None)  # noqa: B010
    merged: list[str] = []

    class _Merged(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            if "upstream-merged" in str(record.msg):
                merged.append(str(record.args[1]) if record.args else "")  # type: ignore[index]

    logger = logging.getLogger("genesis.wiring.text_patch")
    logger.addHandler(_Merged())
    logger.setLevel(logging.INFO)
    logger.propagate = False
    calls: list[dict[str, object]] = []
    original = text_patch.TextPatcher.apply

    def recorded(self: object) -> object:
        merged.clear()
        result, failure = original(self)
        calls.append(
            {
                "file": str(getattr(self, "target_file", "")),
                "result": result.value,
                "reason": failure.reason if failure else None,
                "subs": len(getattr(self, "sub_patches", [])),
                "merged": len(merged),
            }
        )
        return result, failure

    text_patch.TextPatcher.apply = recorded

    def run(tree: str, modules: list[str], *, own_patchers: bool) -> dict[str, object]:
        setattr(guards, "vllm_install_root", lambda: str(Path(tree) / "vllm"))  # noqa: B010
        for module in modules:  # the patches it requires first, as patchset stacks them
            calls.clear()
            # afresh for each tree: a module may remember that it ran (`_APPLIED = True`)
            mod = importlib.reload(importlib.import_module(module))
            factories = _factories(mod, text_patch.TextPatcher) if own_patchers else []
            try:
                if factories:
                    status, reason = "applied", ""
                    for factory in factories:
                        made = factory()
                        for patcher in made if isinstance(made, list | tuple) else [made]:
                            if patcher is None:  # its resolve_vllm_file found no file
                                calls.append({"result": "skipped", "reason": "target_file_missing"})
                            elif isinstance(patcher, text_patch.TextPatcher):
                                patcher.apply()
                else:
                    status, reason = mod.apply()
            except Exception as exc:
                status, reason = "raised", f"{type(exc).__name__}: {exc}"
        how = "patchers" if factories else "module"
        return {"how": how, "status": status, "reason": str(reason), "calls": calls[:]}

    out = []
    for tree, modules in json.loads(Path(jobs_file).read_text()):
        out.append(
            {
                "tree": tree,
                "patchers": run(tree, modules, own_patchers=True),
                "module": run(tree + _MODULE_COPY, modules, own_patchers=False),
            }
        )
    Path(out_file).write_text(json.dumps(out))


def _factories(mod: object, patcher_class: type) -> list[Callable[[], object]]:
    """The module's own functions that build its TextPatchers and take no argument, in source
    order (its manifest and test-fixture helpers aside)."""
    import ast  # noqa: PLC0415
    import inspect  # noqa: PLC0415

    tree = ast.parse(inspect.getsource(mod))  # type: ignore[arg-type]
    found = []
    for node in tree.body:
        if not isinstance(node, ast.FunctionDef) or node.name == "apply":
            continue
        if "manifest" in node.name or "fixture" in node.name:
            continue
        builds = any(
            isinstance(c, ast.Call) and getattr(c.func, "id", None) == patcher_class.__name__
            for c in ast.walk(node)
        )
        func = getattr(mod, node.name, None)
        if not builds or func is None:
            continue
        params = inspect.signature(func).parameters.values()
        if all(p.default is not inspect.Parameter.empty for p in params):
            found.append(func)
    return found


def _run_reference(
    checkout: Path, jobs: list[tuple[str, list[str]]], root: Path
) -> dict[str, dict[str, Any]]:
    import json  # noqa: PLC0415
    import subprocess  # noqa: PLC0415

    jobs_file, out_file = root / "reference-jobs.json", root / "reference-out.json"
    jobs_file.write_text(json.dumps(jobs))
    entries, _, _ = genesis_registry.read_registry(checkout / genesis_registry.REGISTRY_FILE)
    switches = {str(e["env_flag"]): "1" for e in entries.values() if e.get("env_flag")}
    env = {
        **os.environ,
        **switches,  # every switch on: whether one is set is not the question either
        "PATCHSET_GENESIS_DIR": str(checkout),
        "GENESIS_NO_PATCH_CACHE": "1",
        "GENESIS_FILE_CACHE_PATH": str(root / "genesis-file-cache.json"),
        "XDG_CACHE_HOME": str(root / "cache"),
    }
    subprocess.run(
        [sys.executable, __file__, _CHILD, str(jobs_file), str(out_file)],
        check=True,
        cwd=root,
        env=env,
    )
    return {r["tree"]: r for r in json.loads(out_file.read_text())}


_UPSTREAM_REASONS = ("upstream_merged", "sub_upstream_merged_abort_bundle")


def _their_verdict(run: dict[str, Any]) -> str:
    """Genesis's outcome as a check verdict: each TextPatcher.apply() the module made, or, when
    it made none, the module's own reason for stopping first."""
    status, reason, calls = run["status"], run["reason"].lower(), run["calls"]
    if status == "raised":
        return "error"
    if not calls or (status != "applied" and all(c["result"] == "applied" for c in calls)):
        # the module stopped before (or rolled back after) its patchers: its own reason
        if status == "applied":
            return "needed"
        # a module's "failed" is never the fix upstream (PN351's "NONE of the launch anchor
        # variants matched (current-pin / upstream-main / ...)" names a shape, not a merge)
        if status != "failed" and ("upstream" in reason or "drift marker" in reason):
            return "upstream"
        if any(w in reason for w in ("not found", "missing", "disappeared", "not resolvable")):
            return "missing-target"
        return "conflict"
    verdicts = []
    for call in calls:
        result, why = call["result"], call["reason"]
        if result == "applied":
            verdicts.append("needed")
        elif result == "idempotent" or why in _UPSTREAM_REASONS:
            verdicts.append("upstream")
        elif why == "target_file_missing":
            verdicts.append("missing-target")
        elif why == "no_applicable_sub_patches" and call["merged"] == call["subs"]:
            verdicts.append("upstream")  # every sub-patch skipped by its own upstream marker
        else:
            verdicts.append("conflict")
    for worst in ("missing-target", "conflict", "needed"):
        if worst in verdicts:
            return worst
    return "upstream"


def _plain(text: str) -> str:
    """A file's text without either side's marker comments (Genesis's wiring-marker line at
    the top, patchset's `# Genesis <id> ...` site markers)."""
    return "\n".join(
        line
        for line in text.split("\n")
        if not line.strip().startswith(("# Genesis ", "# [Genesis wiring marker: "))
    )


def _scratch(target: Path, files: dict[str, bytes | None], version: str) -> None:
    for file, data in files.items():
        if data is not None:
            (target / file).parent.mkdir(parents=True, exist_ok=True)
            (target / file).write_bytes(data)
    (target / "vllm").mkdir(parents=True, exist_ok=True)
    (target / "vllm" / "__init__.py").touch()
    (target / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")


def _folded(text: str) -> str:
    return "\n".join(" ".join(line.split()) for line in text.split("\n"))


def _why(
    ours: str, theirs: str, reasons: list[str], anchors: list[str], files: list[bytes | None]
) -> str:
    """Which documented case a difference is (docs/import.md), or "unexplained"."""
    texts = [_folded(f.decode(errors="replace")) for f in files if f is not None]
    raw = [f.decode(errors="replace") for f in files if f is not None]
    if (
        ours == "needed"
        and theirs == "conflict"
        and any(
            not any(a in t for t in raw) and any(_folded(a) in t for t in texts) for a in anchors
        )
    ):
        return "better: whitespace-folded match"
    if ours == "missing-target" and any("falls back to" in r for r in reasons):
        return "loss: a fallback file (said by the import)"
    if any("whichever the release has" in r for r in reasons):
        return "loss: one of two files (said by the import)"
    return "unexplained"


def _agreement(  # noqa: PLR0915 - one walk over patches and releases
    checkout: Path, registry: Path, root: Path, reasons: dict[str, list[str]]
) -> tuple[int, int, int, int, float, list[str]]:
    source = parse_source(None)
    versions = [
        v for v in source.versions() if not Version(v).is_prerelease and Version(v) >= SINCE
    ]
    reg = load_registry(registry, tolerant=True)
    # A memo of its own: the user cache's is shared (and cleared by other benchmarks' cold runs).
    patchset.check(reg, versions, source=source, memo=Memo(root / "memo"))  # cold: fills it
    start = time.perf_counter()
    report = patchset.check(reg, versions, source=source, memo=Memo(root / "memo"))
    warm = time.perf_counter() - start
    package = Package(checkout)
    entries, _, _ = genesis_registry.read_registry(checkout / genesis_registry.REGISTRY_FILE)
    trees = {}
    jobs: list[tuple[str, list[str]]] = []
    pairs_of: list[tuple[str, str, str, dict[str, bytes | None]]] = []
    by_id = {p.id: p for p in reg.patches}

    def module_of(patch: Patch) -> str:
        return str(entries[str(patch.x.get("genesis_id"))].get("apply_module"))

    for patch in reg.patches:
        if patch.kind != "runtime":
            continue
        chain = [r for r in required_chain(patch, by_id) if r.kind == "runtime"]
        files: list[str] = []
        for one in (*chain, patch):
            scope = package.scope(module_of(one))
            assert scope is not None
            patchers, _ = genesis_text.read_patchers(scope)
            files += [f for p in patchers for f in (p.file, *p.other_files)]
        files = list(dict.fromkeys(files))
        for version in versions:
            if Version(version) not in SpecifierSet(str(patch.vllm)):
                continue
            if version not in trees:
                trees[version] = source.open(version).__enter__()
            read = {f: trees[version].read(f) for f in files}
            scratch = root / "genesis-ref" / patch.id / version
            _scratch(scratch, read, version)
            _scratch(Path(f"{scratch}{_MODULE_COPY}"), read, version)
            jobs.append((str(scratch), [module_of(r) for r in (*chain, patch)]))
            pairs_of.append((patch.id, version, str(scratch), read))
    runs = _run_reference(checkout, jobs, root)
    agree = same = compared = 0
    differ: list[str] = []
    both: dict[str, tuple[str, str, dict[str, bytes | None]]] = {}
    for pid, version, tree, read in pairs_of:
        run = runs[tree]
        theirs, module = _their_verdict(run["patchers"]), _their_verdict(run["module"])
        ours = report.result(version, pid).verdict
        ours = "conflict" if ours == "partial" else ours
        agree += ours in (theirs, module)
        if ours not in (theirs, module):
            anchors = [s.anchor for v in by_id[pid].variants for s in v.sites]
            why = _why(ours, theirs, reasons.get(pid, []), anchors, list(read.values()))
            differ.append(why)
            print(
                f"differ: {pid} {version} genesis={theirs} module={module} patchset={ours}"
                f" ({why}): {report.result(version, pid).detail} || {run}"
            )
        if theirs == ours == "needed":
            both[pid] = (version, tree, read)  # the newest release (versions ascend)
    for pid, (version, ref, read) in sorted(both.items()):
        target = root / "apply" / pid
        _scratch(target, read, version)
        below = [r.id for r in required_chain(by_id[pid], by_id) if r.kind == "runtime"]
        done = patchset.apply(reg, target, patches=[*below, pid], version=version, force=True)
        if any(r.outcome != "applied" for r in done.results):
            print(f"not applied: {pid} {version} (its [applies] unknown without a GPU)")
            continue
        compared += 1
        theirs_files = {f: Path(ref, f).read_bytes() for f, data in read.items() if data}
        alike = all(
            _plain((target / f).read_text()) == _plain(t.decode()) for f, t in theirs_files.items()
        )
        same += alike
        if not alike:
            blank = all(
                _plain(Path(target, f).read_text()).replace("\n\n", "\n")
                == _plain(t.decode()).replace("\n\n", "\n")
                for f, t in theirs_files.items()
            )
            why = "bytes: a blank line after an anchor" if blank else "bytes: unexplained"
            differ.append(why)
            print(f"bytes differ: {pid} {version} ({why})")
    return agree, len(pairs_of), same, compared, warm, differ


def _exported(root: Path, genesis_builds: list[str], club_builds: list[str]) -> tuple[int, int]:
    """`runtime export` of every definition the two imports wrote, on its release (the
    index's files): how many export, of how many."""
    done = 0
    pairs = [("genesis", n) for n in genesis_builds] + [("club", n) for n in club_builds]
    for folder, name in pairs:
        result = cli(
            "runtime",
            "export",
            root / folder / "rt" / name.removesuffix(".toml"),
            "--build",
            root / folder / "builds" / name,
            "--registry",
            root / folder / "patches",
        )
        done += result.code == 0
        print(f"definition {folder}/{name}: runtime export exit {result.code}")
        if result.code:
            print(f"  {result.err.strip()[:300]}")
    return done, len(pairs)


def main() -> None:
    genesis_dir = Path(os.environ.get("PATCHSET_GENESIS_DIR", ""))
    club_dir = Path(os.environ.get("PATCHSET_CLUB3090_DIR", ""))
    root = Path(tempfile.mkdtemp(prefix="patchset-import-bench-"))
    try:
        g_registry = root / "genesis" / "patches"
        # the releases (index cache) let patchers that pick their file at run time be variants
        report = import_collection(
            "genesis",
            genesis_dir,
            g_registry,
            sources=["index"],
            builds=root / "genesis" / "builds",
        )
        g_total = len({e.source_id for e in report.entries})
        g_drafts = genesis.collect(genesis_dir, sources=[parse_source(None)]).drafts
        g_imported = report.count("imported", "imported-with-loss")
        print(
            f"genesis: {report.to_dict()['imported']} imported, "
            f"{report.count('imported-with-loss')} with loss, "
            f"{report.count('not-imported')} not imported, {report.seconds:.1f} s; "
            f"drafts {len(g_drafts)}"
        )
        g_rc = _validate(g_registry)
        c_registry = root / "club" / "patches"
        c_report = import_collection(
            "club-3090", club_dir, c_registry, run_scripts=True, builds=root / "club" / "builds"
        )
        c_imported = len(  # distinct patches of the club (one may come in as two)
            {e.source_id for e in c_report.entries if e.status.startswith("imported")}
        )
        c_distinct = c_imported + sum(
            1 for e in c_report.entries if e.reasons and e.reasons[0].startswith("identical to")
        )
        print(
            f"club-3090: {c_imported} imported, {c_report.count('not-imported')} not "
            f"imported, {c_report.count('out-of-scope')} out of scope, {c_report.seconds:.1f} s"
        )
        c_rc = _validate(c_registry)
        exported, written = _exported(root, report.builds, c_report.builds)
        registry = g_registry
        if g_imported < len(g_drafts) // 2:  # the issue-24 keys do not load yet
            registry = _stripped(g_drafts, root)
            g_imported = len(load_registry(registry, tolerant=True).patches)
            print(f"genesis (stripped of the issue-24 keys): {g_imported} load")
        reasons = {e.patch: e.reasons for e in report.entries if e.patch}
        agree, pairs, same, compared, warm, differ = _agreement(
            genesis_dir, registry, root, reasons
        )
        notes = [*report.notes, *c_report.notes]
        dropped = [n for n in notes if DROPPED_PROBE in n]
        kept = [n for n in notes if KEPT_PROBE in n]
        for line in [*dropped, *kept]:
            print(f"probe: {line[:300]}")
        cases = Counter(differ)
        for why, n in sorted(cases.items()):
            print(f"  {n:4d} {why}")
        better = sum(n for w, n in cases.items() if w.startswith("better"))
        loss = sum(n for w, n in cases.items() if w.startswith("loss"))
        unexplained = sum(n for w, n in cases.items() if w.endswith("unexplained"))
        print(
            f"genesis_imported={g_imported}/{g_total} club_imported={c_imported}/{c_distinct}"
            f" genesis_s={report.seconds:.1f} club_s={c_report.seconds:.1f}"
            f" validate={g_rc},{c_rc} check_warm_s={warm:.2f} agree={agree}/{pairs}"
            f" documented_better={better} documented_loss={loss} bytes={same}/{compared}"
            f" bytes_documented={compared - same - cases['bytes: unexplained']}"
            f" unexplained={unexplained} definitions_exported={exported}/{written}"
            f" probes_matching_unfixed_releases={len(dropped)} probes_kept_later={len(kept)}"
        )
    finally:
        if os.environ.get("PATCHSET_BENCH_KEEP"):
            print(f"kept: {root}")
        else:
            shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    if len(sys.argv) == 4 and sys.argv[1] == _CHILD:
        _reference_child(sys.argv[2], sys.argv[3])
    else:
        main()
