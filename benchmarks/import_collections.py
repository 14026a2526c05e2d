"""Benchmark: `patchset import` of the two public collections' local checkouts.

    PATCHSET_GENESIS_DIR=... PATCHSET_CLUB3090_DIR=... python3 benchmarks/import_collections.py

Each collection is imported into a fresh project (club-3090 with --run-scripts, its releases
from the package index); then:
- counts: imported (with or without loss), not imported, out of scope; the import time;
- validate: `patchset validate` of the imported registry (its exit code);
- check: `patchset check --since 0.17.0` of the whole imported registry, warm (the second run);
- Genesis agreement: for every imported runtime patch and every release in its range, the
  verdict Genesis's own patcher would reach with that release's files (TextPatcher's
  documented rules, modelled here: a file missing -> missing-target; a drift marker in the
  file -> upstream; a required anchor missing or any anchor ambiguous -> conflict; no
  sub-patch applied -> conflict; else needed), against patchset's check verdict; and, where
  both apply, whether patchset's apply gives the same bytes as Genesis's replacement
  (Genesis's marker line aside) on the newest release in range.

While the registry does not load the issue-24 keys ([switch], [applies], [lifecycle],
[provenance], requires_modules), the import leaves every patch out as "does not load"; the
benchmark then also writes the drafts without those keys to a second registry (`stripped`)
and runs the check and the agreement on it: the sites and ranges are the same.

Last line: genesis_imported=<n>/<entries> club_imported=<n>/<distinct> genesis_s=<s>
club_s=<s> validate=<genesis rc>,<club rc> check_warm_s=<s> agree=<n>/<pairs> bytes=<n>/<pairs>
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from packaging.specifiers import SpecifierSet  # noqa: E402
from packaging.version import Version  # noqa: E402

import patchset  # noqa: E402
from patchset.importers import genesis, genesis_registry, genesis_text, import_collection  # noqa: E402
from patchset.importers.land import _write_patch  # noqa: E402
from patchset.importers.model import Draft  # noqa: E402
from patchset.importers.pystatic import Package  # noqa: E402
from patchset.registry import load_registry  # noqa: E402
from patchset.sources import parse_source  # noqa: E402
from tests.helpers.cli import cli  # noqa: E402

NEW_KEYS = {"switch", "applies", "lifecycle", "provenance", "requires_modules", "failure", "verify"}
SINCE = Version("0.17.0")


def _validate(registry: Path) -> int:
    return cli("validate", "--registry", registry).code


def _stripped(drafts: list[Draft], root: Path) -> Path:
    registry = root / "stripped" / "patches"
    registry.mkdir(parents=True)
    for draft in drafts:
        meta = {k: v for k, v in draft.meta.items() if k not in NEW_KEYS}
        _write_patch(registry / draft.id, meta, draft.payloads)
    return registry


def _genesis_verdict(patchers: list[genesis_text.Patcher], read: dict[str, str | None]) -> str:
    """What Genesis's TextPatcher rules make of a release's files (its documented layers)."""
    verdicts = []
    for patcher in patchers:
        text = read.get(patcher.file)
        if text is None:
            verdicts.append("missing-target")
            continue
        if any(m in text for m in patcher.drift):
            verdicts.append("upstream")
            continue
        applied = merged = 0
        state = "needed"
        for sub in patcher.subs:
            if any(m in text for m in sub.markers):
                merged += 1
                continue
            count = text.count(sub.anchor)
            if count == 0:
                if sub.required:
                    state = "conflict"
                    break
                continue
            if count > 1:
                state = "conflict"
                break
            text = text.replace(sub.anchor, sub.replacement, 1)
            applied += 1
        if state == "needed" and not applied:
            # every sub-patch skipped: upstream when each was by its own marker
            state = "upstream" if merged == len(patcher.subs) else "conflict"
        verdicts.append(state)
    for worst in ("missing-target", "conflict", "needed"):
        if worst in verdicts:
            return worst
    return "upstream"


def _genesis_text(
    patchers: list[genesis_text.Patcher], read: dict[str, str | None]
) -> dict[str, str]:
    out = {}
    for patcher in patchers:
        text = read.get(patcher.file)
        if text is None:
            continue
        for sub in patcher.subs:
            if not any(m in text for m in sub.markers) and text.count(sub.anchor) == 1:
                text = text.replace(sub.anchor, sub.replacement, 1)
        out[patcher.file] = text
    return out


def _plain(text: str) -> str:
    """A file's text with patchset's marker comments taken out (lines ending the marker)."""
    return "\n".join(line for line in text.split("\n") if not line.strip().startswith("# Genesis "))


def _agreement(  # noqa: PLR0915 - one walk over patches and releases
    checkout: Path, registry: Path, root: Path
) -> tuple[int, int, int, int, float]:
    source = parse_source(None)
    versions = [
        v for v in source.versions() if not Version(v).is_prerelease and Version(v) >= SINCE
    ]
    reg = load_registry(registry, tolerant=True)
    patchset.check(reg, versions, source=source)  # cold: fills the memo
    start = time.perf_counter()
    report = patchset.check(reg, versions, source=source)
    warm = time.perf_counter() - start
    package = Package(checkout)
    entries, _, _ = genesis_registry.read_registry(checkout / genesis_registry.REGISTRY_FILE)
    agree = pairs = same = compared = 0
    trees = {}
    for patch in reg.patches:
        if patch.kind != "runtime":
            continue
        gid = str(patch.x.get("genesis_id"))
        module = str(entries[gid].get("apply_module"))
        scope = package.scope(module)
        assert scope is not None
        patchers, _ = genesis_text._patchers(scope)
        in_range = [v for v in versions if Version(v) in SpecifierSet(str(patch.vllm))]
        both_apply: tuple[str, dict[str, str | None]] | None = None
        for version in in_range:
            if version not in trees:
                trees[version] = source.open(version).__enter__()
            tree = trees[version]
            read = {}
            for p in patchers:
                data = tree.read(p.file)
                read[p.file] = None if data is None else data.decode(errors="replace")
            theirs = _genesis_verdict(patchers, read)
            ours = report.result(version, patch.id).verdict
            ours = "conflict" if ours == "partial" else ours
            pairs += 1
            agree += theirs == ours
            if theirs != ours:
                print(f"differ: {patch.id} {version} genesis={theirs} patchset={ours}")
            if theirs == ours == "needed":
                both_apply = (version, read)
        if both_apply is not None:
            version, read = both_apply
            target = root / "apply" / patch.id
            for file, text in read.items():
                if text is not None:
                    (target / file).parent.mkdir(parents=True, exist_ok=True)
                    (target / file).write_text(text)
            (target / "vllm" / "__init__.py").write_text("")
            (target / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
            done = patchset.apply(reg, target, patches=[patch.id], version=version, force=True)
            if any(r.outcome != "applied" for r in done.results):
                print(f"not applied: {patch.id} {version} (its [applies] unknown without a GPU)")
                continue
            expected = _genesis_text(patchers, read)
            compared += 1
            alike = all(_plain((target / f).read_text()) == _plain(t) for f, t in expected.items())
            same += alike
            if not alike:
                print(f"bytes differ: {patch.id} {version}")
    return agree, pairs, same, compared, warm


def main() -> None:
    genesis_dir = Path(os.environ.get("PATCHSET_GENESIS_DIR", ""))
    club_dir = Path(os.environ.get("PATCHSET_CLUB3090_DIR", ""))
    root = Path(tempfile.mkdtemp(prefix="patchset-import-bench-"))
    try:
        g_registry = root / "genesis" / "patches"
        report = import_collection("genesis", genesis_dir, g_registry)
        g_total = len({e.source_id for e in report.entries})
        g_drafts = genesis.collect(genesis_dir).drafts
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
        registry = g_registry
        if g_imported < len(g_drafts) // 2:  # the issue-24 keys do not load yet
            registry = _stripped(g_drafts, root)
            g_imported = len(load_registry(registry, tolerant=True).patches)
            print(f"genesis (stripped of the issue-24 keys): {g_imported} load")
        agree, pairs, same, compared, warm = _agreement(genesis_dir, registry, root)
        print(
            f"genesis_imported={g_imported}/{g_total} club_imported={c_imported}/{c_distinct}"
            f" genesis_s={report.seconds:.1f} club_s={c_report.seconds:.1f}"
            f" validate={g_rc},{c_rc} check_warm_s={warm:.2f} agree={agree}/{pairs}"
            f" bytes={same}/{compared}"
        )
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    main()
