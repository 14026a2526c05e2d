"""The order patches go in, and which of them cannot go together.

`requires` puts a patch after the patches it names (a stacked series, as in quilt); patches
that name nothing keep the registry's order. `conflicts`, and two patches changing the same
lines of a file while neither requires the other, refuse the pair before anything is written:
applied one after the other, the second would read the first's lines as its own context, or
insert the same edit twice.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Iterable, Mapping, Sequence

from patchset.engine.evaluate import evaluate
from patchset.errors import UsageError
from patchset.kernel import order as kernel_order
from patchset.registry import Patch


def closure(ids: Iterable[str], by_id: Mapping[str, Patch]) -> list[str]:
    """`ids` and every patch they require, transitively (requires first is not promised)."""
    seen: list[str] = []
    todo = list(ids)
    while todo:
        patch_id = todo.pop(0)
        if patch_id in seen:
            continue
        seen.append(patch_id)
        if patch_id in by_id:
            todo.extend(by_id[patch_id].requires)
    return seen


def dependents(ids: Iterable[str], by_id: Mapping[str, Patch]) -> list[str]:
    """`ids` and every patch that requires one of them, transitively."""
    wanted = list(dict.fromkeys(ids))
    wanted += [p for p in by_id if p not in wanted and set(closure([p], by_id)[1:]) & set(wanted)]
    return wanted


def in_order(patches: Sequence[Patch]) -> tuple[Patch, ...]:
    """`patches` with every patch after those it requires (among them); otherwise as given.
    The registry has refused cycles when it loaded. The rule is the kernel's, which the image
    entrypoint runs too."""
    return tuple(kernel_order.in_order(patches, lambda p: p.id, lambda p: p.requires))


def required_chain(patch: Patch, by_id: Mapping[str, Patch]) -> tuple[Patch, ...]:
    """The patches `patch` requires, transitively, in the order they go in (those `by_id`
    knows): what a stacked patch is read on top of."""
    return in_order([by_id[i] for i in closure([patch.id], by_id)[1:] if i in by_id])


def related(a: Patch, b: Patch, by_id: Mapping[str, Patch]) -> bool:
    """Whether one of the two requires the other, directly or through others."""
    return b.id in closure([a.id], by_id)[1:] or a.id in closure([b.id], by_id)[1:]


def declared_conflicts(patches: Sequence[Patch]) -> list[tuple[Patch, Patch]]:
    """Pairs of `patches` where one names the other in `conflicts`."""
    return [
        (a, b)
        for i, a in enumerate(patches)
        for b in patches[i + 1 :]
        if b.id in a.conflicts or a.id in b.conflicts
    ]


Span = tuple[int, int]  # [start, end) of old lines; start == end: an insertion before start


def changed_spans(old: bytes | None, new: bytes) -> list[Span]:
    """The spans of `old`'s lines that `new` replaces, deletes or inserts at."""
    if old is None:
        return [(0, 0)]  # the whole (new) file
    a = old.decode("utf-8", errors="surrogateescape").splitlines()
    b = new.decode("utf-8", errors="surrogateescape").splitlines()
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    return [(i1, i2) for tag, i1, i2, _, _ in matcher.get_opcodes() if tag != "equal"]


def spans_meet(x: Sequence[Span], y: Sequence[Span]) -> Span | None:
    """The first place where a span of `x` and one of `y` touch the same lines."""
    for a in x:
        for b in y:
            if _meet(a, b):
                return a
    return None


def _meet(a: Span, b: Span) -> bool:
    if a[0] == a[1] and b[0] == b[1]:
        return a[0] == b[0]  # two insertions at one place
    if a[0] == a[1]:
        return b[0] < a[0] < b[1]
    if b[0] == b[1]:
        return a[0] < b[0] < a[1]
    return a[0] < b[1] and b[0] < a[1]


def on_top_of_required(
    patch: Patch,
    by_id: Mapping[str, Patch],
    read: Callable[[str], bytes | None],
    version: str | None,
    *,
    max_fuzz: int = 0,
    refuse: bool = False,
) -> Callable[[str], bytes | None]:
    """A reader of the tree with the patches `patch` requires applied first, in order (each
    one that applies; one already there, or that does not fit, is left as the tree has it).
    This is how a stacked patch is checked: B's context holds A's lines. With `refuse`, a
    required patch none of whose payloads applies or is already there raises UsageError (a
    refresh cannot carry B onto a release A does not fit)."""
    chain = required_chain(patch, by_id)
    if not chain:
        return read
    overlay: dict[str, bytes | None] = {}

    def stacked(rel: str) -> bytes | None:
        return overlay[rel] if rel in overlay else read(rel)

    for required in chain:
        meant = required.variant_for(version) if version else None
        tried = [meant] if meant is not None else list(required.variants)
        if not refuse:
            tried = tried[:1]
        states = []
        for variant in tried:
            ev = evaluate(required, variant, stacked, max_fuzz=max_fuzz, nearest=False)
            states.append(ev.state)
            if ev.state == "applies":
                overlay.update(ev.changes)
                overlay.update(dict.fromkeys(ev.removed))
                break
            if ev.state == "already-applied":
                break
        else:
            if refuse:
                raise UsageError(
                    f"{patch.id} requires {required.id}, which does not fit vllm {version}"
                    f" ({', '.join(dict.fromkeys(states))}): carry {required.id} onto it first"
                )
    return stacked
