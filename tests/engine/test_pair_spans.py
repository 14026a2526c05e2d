"""The lines a runtime patch changes, for `apply`'s refusal of two patches changing the same
lines: known from where its sites edit, they are the spans a line diff of the whole file
gives, and the pairs found from them are the pairs the diff found."""

from __future__ import annotations

import itertools
from pathlib import Path

from patchset.engine import evaluate as evaluation
from patchset.engine import order, pairs
from patchset.engine.apply import apply
from patchset.engine.evaluate import evaluate
from patchset.registry import Patch, load_registry
from tests.helpers.synthetic import add_patch, make_tree

FILE = "vllm/mod.py"
BODY = "".join(
    f"def f{i}(x):\n    y = x + {i}\n    if y:\n        return y\n    return {i}\n\n"
    for i in range(8)
)


def _site(name: str, action: str, anchor: str, text: str, after: str = "") -> str:
    scoped = f"after = '''{after}'''\n" if after else ""
    return (
        f'[[site]]\nname = "{name}"\nfile = "{FILE}"\naction = "{action}"\n'
        f"marker = \"patchset: {name}\"\nanchor = '''{anchor}'''\ntext = '''{text}'''\n{scoped}\n"
    )


# Each patch: its sites (name, action, anchor, text[, after]). Some meet, some are apart.
PATCHES: dict[str, list[tuple[str, ...]]] = {
    "rep-f1": [("r1", "replace", "    y = x + 1", "    y = x + 100")],
    "rep-f1-again": [("r2", "replace", "    y = x + 1", "    y = x - 1")],
    "rep-f1-keeps": [("k1", "replace", "    y = x + 1", "    z = 0\n    y = x + 1")],
    "ins-after-f1": [("a1", "insert-after", "    y = x + 1", "    y += 1")],
    "ins-before-f1": [("b1", "insert-before", "    y = x + 1", "    pass")],
    "ins-before-f2": [("b2", "insert-before", "def f2(x):", "# two")],
    "rep-f3-two": [
        ("t1", "replace", "    y = x + 3", "    y = x * 3"),
        ("t2", "insert-after", "    return 3", "    # after three"),
    ],
    "after-f5": [("s5", "replace", "    if y:", "    if y > 0:", "def f5(x):")],
    "after-f5-return": [
        ("s6", "insert-before", "        return y", "        y -= 1", "def f5(x):")
    ],
    "nested-f6": [
        ("n1", "insert-after", "def f6(x):", "    w = 6\n    w += 1"),
        ("n2", "replace", "    w += 1", "    w += 2\n    w += 3"),
        ("n3", "replace", "    return 6", "    return w"),
    ],
    "f6-return": [("m6", "insert-before", "    return 6", "    x = 0")],
    "apart-f7": [("p7", "replace", "    return 7", "    return -7")],
}


def _registry(tmp_path: Path) -> tuple[list[Patch], Path]:
    root = tmp_path / "patches"
    for patch_id, sites in PATCHES.items():
        add_patch(root, patch_id, sites="".join(_site(*s) for s in sites), targets=[FILE])
    return list(load_registry(root).patches), root


def test_site_spans_are_the_line_diffs_spans(tmp_path: Path) -> None:
    patches, _ = _registry(tmp_path)
    data = BODY.encode()
    by_id = {p.id: p for p in patches}
    read = {FILE: data}.get
    from_sites: dict[str, dict[str, list[order.Span]]] = {}
    from_diff: dict[str, dict[str, list[order.Span]]] = {}
    for patch in patches:
        ev = evaluate(patch, patch.variants[0], read)
        assert ev.state == "applies", (patch.id, ev.failures)
        diffed = order.changed_spans(data, ev.changes[FILE])
        if patch.id == "nested-f6":  # a site editing another's text: left to the line diff
            assert FILE not in ev.spans
        else:
            assert list(ev.spans[FILE]) == diffed, patch.id
        from_sites[patch.id] = {FILE: list(ev.spans.get(FILE, diffed))}
        from_diff[patch.id] = {FILE: diffed}
    found = pairs._meeting(patches, dict(from_sites), by_id)
    by_diff = pairs._meeting(patches, dict(from_diff), by_id)
    met = {(a.id, b.id) for a, b, _, _ in found}
    assert met == {(a.id, b.id) for a, b, _, _ in by_diff}
    # Both kinds occur: what meets and what stands apart.
    assert {("rep-f1", "rep-f1-again"), ("ins-before-f1", "rep-f1-keeps")} <= met
    assert not any("apart-f7" in pair for pair in met)
    assert not any("ins-before-f2" in pair for pair in met)
    assert len(met) < len(list(itertools.combinations(patches, 2)))


def test_apply_refuses_the_pairs_that_meet_and_only_them(tmp_path: Path) -> None:
    patches, root = _registry(tmp_path)
    tree = make_tree(tmp_path / "t", {FILE: BODY})
    report = apply(load_registry(root), tree, dry_run=True)
    conflicted = {r.patch for r in report.results if r.outcome == "conflict"}
    data = BODY.encode()
    diffed = {
        p.id: {
            FILE: order.changed_spans(
                data, evaluate(p, p.variants[0], {FILE: data}.get).changes[FILE]
            )
        }
        for p in patches
    }
    met = pairs._meeting(patches, diffed, {p.id: p for p in patches})
    assert conflicted == {p.id for a, b, _, _ in met for p in (a, b)}
    assert "apart-f7" not in conflicted and {"rep-f1", "rep-f1-again"} <= conflicted


def test_spans_of_lines_put_beside_an_anchor_are_the_line_diffs() -> None:
    """The short way (lines only put in beside the anchor) gives what the line diff gives."""
    import difflib
    import random

    from patchset.engine.spans import of_site

    rng = random.Random(5)  # noqa: S311 - a fixed test sequence
    for _ in range(2000):
        old = [rng.choice("abcx") for _ in range(rng.randint(1, 8))]
        at = rng.randint(0, len(old) - 1)
        size = rng.randint(1, len(old) - at)
        put = [rng.choice("abmn") for _ in range(rng.randint(1, 3))]
        was = old[at : at + size]
        now = [*was, *put] if rng.random() < 0.5 else [*put, *was]
        new = [*old[:at], *now, *old[at + size :]]
        matcher = difflib.SequenceMatcher(None, was, now, False)
        want = [(at + i1, at + i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]
        assert of_site(old, new, (at, size, len(now)), []) == want, (was, now)


def test_the_next_patch_shares_the_lines_a_change_was_rendered_from(tmp_path: Path) -> None:
    """An evaluation's change, read as the very bytes object it gave (an apply's next patch
    on the file), is read through the lines it was rendered from; equal bytes from elsewhere
    (a file read again, a check's next release) are read afresh, and give the same lines."""
    evaluation.clear_caches()
    root = tmp_path / "reg"
    site = _site("s", "insert-after", "    y = x + 3", "    z = 1")
    add_patch(root, "one-site", sites=site, targets=[FILE])
    patch = load_registry(root).patches[0]
    tree = {FILE: BODY.encode()}
    ev = evaluate(patch, patch.variants[0], tree.get)
    data = ev.changes[FILE]
    _, view, _, _ = evaluation._site_file(data)
    assert view.splice is not None  # the edited lines themselves: their folding kept
    evaluation.clear_caches()
    ev = evaluate(patch, patch.variants[0], tree.get)
    copy = bytes(bytearray(ev.changes[FILE]))
    _, fresh, _, _ = evaluation._site_file(copy)
    assert fresh.splice is None
    assert fresh.lines == view.lines
