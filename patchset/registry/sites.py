"""Loading a runtime patch's `sites.toml`: its `[[site]]` tables, each checked as it loads."""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

from patchset.errors import RegistryError
from patchset.kernel.sites import ACTIONS, WHEN_KEYS, Alternative, Site, SiteAction, SiteProbe
from patchset.registry.problems import Problems
from patchset.registry.problems import relpath as _relpath
from patchset.registry.semantics import read_modules
from patchset.registry.toml import Table, did_you_mean, load_toml


def load_sites(path: Path) -> tuple[Site, ...]:
    """The sites of a `sites.toml`; its first problem raises RegistryError."""
    sites = read_sites(path, Problems(collect=False))
    assert sites is not None  # without collecting, a problem raised
    return sites


def read_sites(path: Path, problems: Problems) -> tuple[Site, ...] | None:
    """The sites of a `sites.toml`; when `problems` collects (`validate`), every problem of
    every site is kept there and None returned."""
    mark = len(problems.errors)
    step = problems.step
    top = Table(load_toml(path), file=path)
    sites = []
    names: set[str] = set()
    for table in top.tables("site", required=True):
        site = _site(table, names, problems)
        if site is not None:
            sites.append(site)
    problems.finish(top)
    markers = [s.marker for s in sites]
    if len(set(markers)) != len(markers):
        step(lambda: _raise(top.error("every site needs its own marker", "site")), None)
    if problems.since(mark):
        return None
    return tuple(sites)


def _raise(error: RegistryError) -> None:
    raise error


def _site(table: Table, names: set[str], problems: Problems) -> Site | None:
    """One `[[site]]` (None when it has a problem: each is kept in `problems`)."""
    mark = len(problems.errors)
    step = problems.step
    name = step(lambda: table.req_str("name"), "")
    if name and name in names:
        problems.add(table.error(f"site name {name!r} is used twice", "name"))
    names.add(name)
    file = step(lambda: table.req_str("file"), "")
    if file:
        step(lambda: _relpath(table, "file", file), None)
    anchor = step(lambda: table.req_str("anchor"), "")
    action = step(lambda: cast(SiteAction, table.choice("action", ACTIONS)), None)
    text = step(lambda: table.req_str("text"), "")
    marker = step(lambda: table.req_str("marker"), "")
    optional = step(lambda: table.flag("optional", default=False), False)
    after = step(lambda: _after(table, name), None)
    no_alternatives: tuple[Alternative, ...] = ()
    alternatives = step(lambda: _alternatives(table, name), no_alternatives)
    probe = step(lambda: _site_probe(table, name), None)
    always: tuple[tuple[str, tuple[str, ...]], ...] = ()
    when = step(lambda: _when(table, name), always)
    modules: tuple[str, ...] = step(lambda: read_modules(table, "requires_modules"), ())
    site = Site(
        name=name,
        file=file,
        anchor=anchor,
        action=action or ACTIONS[0],
        text=text,
        marker=marker,
        optional=optional,
        after=after,
        alternatives=alternatives,
        probe=probe,
        when=when,
        requires_modules=modules,
    )
    if anchor and not site.anchor_lines:
        problems.add(table.error("must hold at least one non-blank line", "anchor"))
    if "\n" in marker:
        problems.add(table.error("must be one line", "marker"))
    problems.finish(table)
    return None if problems.since(mark) else site


def _after(table: Table, name: str) -> str | None:
    value = table.opt_str("after", required=False)
    if value is not None and not value.strip():
        raise table.error(f"site {name!r}: must hold at least one non-blank line", "after")
    return value


def _alternatives(table: Table, name: str) -> tuple[Alternative, ...]:
    found = []
    for alt in table.tables("alternatives"):
        anchor = alt.req_str("anchor")
        text = alt.opt_str("text", required=False)
        after = _after(alt, name)
        alt.finish()
        found.append(Alternative(anchor=anchor, text=text, after=after))
    return tuple(found)


MAX_PROBE_BYTES = 10 * 1024  # a probe string longer than this is a file, not a marker


def probe_strings(table: Table, name: str) -> tuple[tuple[str, ...], tuple[str, ...], str | None]:
    """`contains`, `any` and `regex` of a probe; at least one of them, none empty."""
    contains = table.str_list("contains", required=False)
    any_of = table.str_list("any", required=False)
    regex = table.opt_str("regex", required=False)
    for key, values in (("contains", contains), ("any", any_of)):
        if any(not v for v in values):
            raise table.error(f"{name}: an empty string matches every file", key)
        if any(not v.strip() for v in values):
            raise table.error(f"{name}: a string of whitespace only is no evidence of a fix", key)
        if any(len(v.encode("utf-8", "surrogateescape")) > MAX_PROBE_BYTES for v in values):
            raise table.error(f"{name}: a probe string over 10 KB (the probe is a few words)", key)
    if regex is not None and not regex.strip():
        raise table.error(f"{name}: a regex of whitespace only", "regex")
    if regex is not None and len(regex.encode("utf-8", "surrogateescape")) > MAX_PROBE_BYTES:
        raise table.error(f"{name}: a regex over 10 KB", "regex")
    if regex is not None:
        try:
            re.compile(regex)
        except re.error as exc:
            raise table.error(f"not a valid regular expression: {exc}", "regex") from None
    if not contains and not any_of and regex is None:
        raise table.error(f"{name}: give 'contains', 'any' or 'regex' (none may be empty)")
    return contains, any_of, regex


def _site_probe(table: Table, name: str) -> SiteProbe | None:
    probe = table.table("probe", required=False)
    if probe is None:
        return None
    contains, any_of, regex = probe_strings(probe, f"site {name!r}")
    probe.finish()
    return SiteProbe(contains, any_of, regex)


def _when(table: Table, name: str) -> tuple[tuple[str, tuple[str, ...]], ...]:
    when = table.table("when", required=False)
    if when is None:
        return ()
    conditions = []
    for key in when.names():
        if key not in WHEN_KEYS:
            raise when.error(
                f"site {name!r}: unknown condition; one of {', '.join(WHEN_KEYS)}"
                f"{did_you_mean(key, WHEN_KEYS)}",
                key,
            )
        values = when.str_list(key)
        conditions.append((key, tuple(v.lower() for v in values)))
    when.finish()
    return tuple(conditions)
