"""Loading what a patch means beyond its text: `[switch]`, `[applies]`, `[failure]`,
`requires_modules`, `[[verify]]`, `[lifecycle]`, `[provenance]` (docs/registry.md).

Each reader takes the patch.toml's top table and returns the typed value; a problem is a
RegistryError naming the file and the key path (``applies.all[1].torch``).
"""

from __future__ import annotations

import re
from typing import cast

from patchset.kernel.predicates import ENV_NAME, Node, PredicateError, parse
from patchset.kernel.touches import parse_touch
from patchset.registry.model import (
    LIFECYCLE_STATES,
    POLICIES,
    Failure,
    Lifecycle,
    LifecycleState,
    Policy,
    Provenance,
    Switch,
    Verify,
)
from patchset.registry.problems import relpath
from patchset.registry.toml import Table

_MODULE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
_ID = re.compile(r"^[a-z0-9][a-z0-9-]{1,62}[a-z0-9]$")
_REPOSITORY = re.compile(r"^[\w.-]+/[\w.-]+$")
_COMMIT = re.compile(r"^[0-9a-f]{40}$")
VERIFY_KINDS = ("attribute", "file", "module")
MAX_VERIFY_TIMEOUT = 300.0  # seconds: a start waits no longer for one proof


def env_name(table: Table, key: str, *, required: bool) -> str | None:
    """A variable name (``^[A-Za-z_][A-Za-z0-9_]*$``)."""
    value = table.opt_str(key, required=required)
    if value is not None and not ENV_NAME.match(value):
        raise table.error(
            f"{value!r} is not an environment variable name (letters, digits and _,"
            " not starting with a digit)",
            key,
        )
    return value


def read_switch(top: Table) -> Switch | None:
    table = top.table("switch", required=False)
    if table is None:
        return None
    env = env_name(table, "env", required=True)
    default = table.flag("default", default=True)
    aliases = table.matching_list("aliases", ENV_NAME, "an environment variable name")
    table.finish()
    assert env is not None
    if env in aliases:
        raise table.error(f"{env} is the switch's own env, not an alias of it", "aliases")
    return Switch(env=env, default=default, aliases=aliases)


def read_applies(top: Table) -> Node | None:
    data = top.raw("applies")
    if data is None:
        return None
    try:
        return parse(data, "applies")
    except PredicateError as exc:
        raise top.error(exc.message, exc.where) from None


def read_failure(top: Table) -> Failure:
    table = top.table("failure", required=False)
    if table is None:
        return Failure()
    policy = table.opt_str("policy", required=False)
    if policy is not None:
        policy = table.choice("policy", POLICIES)
    env = env_name(table, "env", required=False)
    table.finish()
    return Failure(policy=cast(Policy | None, policy), env=env)


def read_modules(table: Table, key: str) -> tuple[str, ...]:
    """Dotted module names (``sndr.engines.vllm.middleware``)."""
    return table.matching_list(key, _MODULE, "a dotted module name")


def read_verify(top: Table) -> tuple[Verify, ...]:
    return tuple(_one_verify(table) for table in top.tables("verify"))


def _one_verify(table: Table) -> Verify:
    attribute = table.opt_str("attribute", required=False)
    file = table.opt_str("file", required=False)
    contains = table.opt_str("contains", required=False)
    module = table.opt_str("module", required=False)
    expr = table.opt_str("expr", required=False)
    timeout = table.number("timeout", default=10.0, minimum=0.1, maximum=MAX_VERIFY_TIMEOUT)
    table.finish()
    kinds = [k for k, v in (("attribute", attribute), ("file", file), ("module", module)) if v]
    if len(kinds) != 1:
        raise table.error(
            "give exactly one of attribute = 'module:name', file = ... with contains = ...,"
            " or module = ... with expr = ..." + (f" (found {', '.join(kinds)})" if kinds else "")
        )
    if attribute is not None:
        try:
            parse_touch(attribute)
        except ValueError as exc:
            raise table.error(str(exc), "attribute") from None
        if contains is not None or expr is not None:
            raise table.error("goes with file, not attribute", "contains" if contains else "expr")
    if file is not None:
        relpath(table, "file", file)
        if not contains:
            raise table.error("a file check needs the text it must hold", "contains")
        if expr is not None:
            raise table.error("goes with module, not file", "expr")
    if module is not None:
        if not _MODULE.match(module):
            raise table.error(f"{module!r} is not a dotted module name", "module")
        if not expr:
            raise table.error("a module check needs an expression over `m`", "expr")
        if contains is not None:
            raise table.error("goes with file, not module", "contains")
        try:
            compile(expr, "<verify>", "eval")
        except SyntaxError as exc:
            raise table.error(f"not a Python expression: {exc.msg}", "expr") from None
    return Verify(attribute, file, contains, module, expr, timeout)


def read_lifecycle(top: Table) -> Lifecycle:
    table = top.table("lifecycle", required=False)
    if table is None:
        return Lifecycle()
    state = cast(LifecycleState, table.choice("state", LIFECYCLE_STATES, default="stable"))
    retire_after = table.version("retire_after")
    superseded_by = table.opt_str("superseded_by", required=False)
    if superseded_by is not None and not _ID.match(superseded_by):
        raise table.error(f"{superseded_by!r} is not a patch id", "superseded_by")
    table.finish()
    return Lifecycle(state=state, retire_after=retire_after, superseded_by=superseded_by)


def read_provenance(top: Table) -> Provenance | None:
    table = top.table("provenance", required=False)
    if table is None:
        return None
    collection = table.opt_str("collection", required=False)
    repository = table.opt_str("repository", required=False)
    if repository is not None and not _REPOSITORY.match(repository):
        raise table.error(f"{repository!r}: expected owner/name", "repository")
    commit = table.opt_str("commit", required=False)
    if commit is not None and not _COMMIT.match(commit):
        raise table.error(f"{commit!r}: expected a 40-digit hex commit", "commit")
    file = table.opt_str("file", required=False)
    line = table.integer("line", minimum=1) if "line" in table.names() else None
    table.finish()
    return Provenance(collection, repository, commit, file, line)
