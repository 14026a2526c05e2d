"""`patchset list`, `show ID`, `validate`: reading the registry."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from rich.text import Text

from patchset.cli.commands import validate as validate_build
from patchset.cli.commands import validate_probes
from patchset.cli.loading import load
from patchset.cli.options import add_command
from patchset.cli.output import FORMATS, console, err_console, print_json, table, text
from patchset.errors import ExitCode, RegistryError, UsageError
from patchset.kernel import vllm
from patchset.registry import (
    PATCH_FILE,
    LoadProblem,
    Patch,
    leftovers,
    load_registry,
    patch_problems,
)
from patchset.registry.support import ImportRule, import_problems, import_rule
from patchset.registry.toml import load_toml

VALIDATE_DESCRIPTION = """\
Load every patch and build definition as every command does, and check patch.toml,
sites.toml, builds/*.toml and [tool.patchset] against the JSON Schemas in patchset/schemas/."""


def add_parsers(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    listing = add_command(sub, "list", run_list)
    show = add_command(sub, "show", run_show)
    show.add_argument("id", metavar="ID")
    validate = add_command(sub, "validate", run_validate, VALIDATE_DESCRIPTION)
    validate.add_argument(
        "--target",
        type=Path,
        default=None,
        metavar="DIR",
        help="a site-packages holding vLLM's dist-info: its declared requirements may be"
        " imported by inserted code without a support package (default: the vLLM this Python"
        " would import; none: only the standard library and vllm, torch, triton, transformers)",
    )
    validate_probes.add_probe_options(validate)
    validate_build.add_build_options(validate)
    for p in (listing, show, validate):
        p.add_argument("--format", choices=FORMATS, default="table")


def run_list(args: argparse.Namespace) -> int:
    registry = load(args.registry)
    if args.format == "json":
        print_json(
            {
                "registry": registry.digest,
                "patches": [p.to_dict() for p in registry.patches],
                "support": [s.to_dict() for s in registry.support],
            }
        )
        return ExitCode.OK
    out = table(
        f"{registry.root}  ({registry.digest[:19]})",
        ["id", "kind", "when", "rev", "vLLM", "upstream", "lifecycle", "switch", "title"],
    )
    for p in registry.patches:
        upstream = f"{p.upstream.pr or '-'} ({p.upstream.state})"
        row = [p.id, p.kind, p.apply, str(p.revision), str(p.vllm), upstream]
        out.add_row(*row, p.lifecycle.describe(), switch_text(p), p.title)
    console().print(out)
    return ExitCode.OK


def switch_text(patch: Patch) -> str:
    """`GENESIS_ENABLE_PN351 (default off)`, or `-` without a switch."""
    if patch.switch is None:
        return "-"
    return f"{patch.switch.env} (default {'on' if patch.switch.default else 'off'})"


def safe_line(line: str) -> str:
    """A line of text from the registry that a CI log must not read as a GitHub workflow
    command (`::set-output ...`, `::add-mask::`; the runner ignores leading blanks): its
    first colon is escaped."""
    return line.replace("::", "\\::", 1) if line.lstrip().startswith("::") else line


def _fields(data: object, indent: str = "    ") -> list[str]:
    """A table of `show`'s JSON as `key: value` lines (None and empty left out)."""
    if not isinstance(data, dict):
        return []
    lines = []
    for key, value in data.items():
        if value is None or value in ([], {}):
            continue
        shown = ", ".join(str(v) for v in value) if isinstance(value, list) else value
        lines.append(f"{indent}{key}: {shown}")
    return lines


def run_show(args: argparse.Namespace) -> int:
    registry = load(args.registry, [args.id])
    patch = registry.get(args.id)
    data = patch.to_dict()
    if args.format == "json":
        print_json(data)
        return ExitCode.OK
    con = console()
    con.print(Text.assemble(text(patch.id, "bold"), text(f" rev {patch.revision}: {patch.title}")))
    plain = ["kind", "apply", "vllm", "targets", "origin", "credit"]
    plain += [k for k in ("requires", "conflicts", "requires_modules") if data[k]]
    lines = []
    for key in plain:
        value = data[key]
        lines.append(f"  {key}: {', '.join(value) if isinstance(value, list) else value}")
        if key == "targets" and patch.touches:
            lines.append(f"  touches: {', '.join(patch.touches)}")
    lines.append(f"  lifecycle: {patch.lifecycle.describe()}")
    if patch.switch is not None:
        lines.append(f"  switch: {switch_text(patch)}; {patch.switch.line()} turns it on")
    if patch.applies is not None:
        lines.append(f"  applies: {patch.applies.describe()}")
    for key in ("upstream", "hardware", "failure", "provenance", "x"):
        fields = _fields(data[key])
        if fields:
            lines += [f"  {key}:", *fields]
    for check in patch.verify:
        lines.append(f"  verify: {check.describe()} (timeout {check.timeout:g} s)")
    for line in lines:
        con.print(safe_line(line), markup=False)
    con.print()
    for line in patch.description.strip().splitlines():
        con.print(safe_line(line), markup=False)
    for variant in patch.variants:
        base = f", base {variant.base}" if variant.base else ""
        con.print()
        con.print(
            Text.assemble(
                text(f"payload {variant.name}", "bold"),
                text(f" (vLLM {variant.vllm}{base}, sha256 {variant.sha256[:12]})"),
            )
        )
        payload = (patch.folder / variant.name).read_text(encoding="utf-8")
        for line in payload.splitlines():
            con.print(safe_line(line), markup=False)
    return ExitCode.OK


def _more_problems(folder: Path, found: list[LoadProblem]) -> list[str]:
    """The problems of a patch.toml that did not load that only its JSON Schema sees (the
    loader's own name their key); none when the file does not parse."""
    from patchset.schemas import document_problems  # validate only

    file = folder / PATCH_FILE
    try:
        data = load_toml(file)
    except RegistryError:
        return []
    keys = {p.error.key for p in found if p.error.key}
    return [
        f"{file}: {line} (JSON Schema patch.json)"
        for line in document_problems("patch", data)
        if not _schema_keys(line) <= keys
    ]


_NAMED = re.compile(
    r"^(?:(?P<at>[\w.\[\]-]+): )?(?:'(?P<a>[\w-]+)' is a required property"
    r"|Additional properties are not allowed \((?P<b>'[\w-]+'(?:, '[\w-]+')*)"
    r" (?:was|were) unexpected\))"
)


def _schema_keys(line: str) -> set[str]:
    """The keys a JSON Schema problem line is about (missing or unknown keys' own names)."""
    named = _NAMED.match(line)
    if named is None:
        return {line.split(":", 1)[0]}
    names = [named["a"]] if named["a"] else [k.strip("'") for k in named["b"].split(", ")]
    return {".".join(k for k in (named["at"], name) if k) for name in names}


def _import_rule(target: Path | None) -> ImportRule:
    """What inserted code may import without a support package: vLLM's declared requirements
    where a release is at hand (`--target`, else this Python's vLLM), else today's rule."""
    if target is not None:
        if not target.is_dir():
            raise UsageError(f"--target {target}: no such folder")
        return import_rule(target)
    try:
        return import_rule(vllm.find_installed())
    except vllm.NotATargetError:
        return import_rule(None, "no --target given and no vLLM importable here")


def run_validate(args: argparse.Namespace) -> int:
    """Every problem of every patch in one run (each names its file and key, and the TOML
    line when there is one); exit 2 when there is any. The JSON Schemas are checked once all
    load."""
    from patchset.registry.builds import load_definitions  # validate only
    from patchset.schemas import check_project

    root = Path(args.registry)
    # Hidden files a killed write left (the loader skips them): removed once stale, and said.
    removed = leftovers.sweep(root) if root.is_dir() else []
    registry = load_registry(args.registry, tolerant=True)
    problems = {
        patch_id: (
            [LoadProblem(first)]
            if patch_id.startswith("_")  # a support package: its one problem
            else patch_problems(registry.root / patch_id, also=[first])
        )
        for patch_id, first in registry.problems.items()
    }
    rule = _import_rule(args.target)
    for patch in registry.patches:  # what the patches' inserted text imports
        found = [LoadProblem(e) for e in import_problems(patch, registry.support, rule)]
        if found:
            problems[patch.id] = found
    schema_only = {
        k: [] if k.startswith("_") else _more_problems(registry.root / k, found)
        for k, found in problems.items()
    }
    definitions = load_definitions(args.builds) if args.builds.is_dir() else []
    checked = 0
    probes = plans = None
    if not problems:
        checked = check_project(registry.root, builds=args.builds, pyproject=args.pyproject)
        probes = validate_probes.probe_findings(registry, args)
        plans = validate_build.build_plans(registry, args)
    if args.format == "json":
        print_json(
            {
                "registry": registry.digest,
                "valid": not problems,
                "patches": len(registry.patches),
                "problems": [
                    *(
                        {"patch": k, "problem": str(p.error), "key": p.error.key, "line": p.line}
                        for k, found in problems.items()
                        for p in found
                    ),
                    *(
                        {"patch": k, "problem": line, "key": None, "line": None}
                        for k, lines in schema_only.items()
                        for line in lines
                    ),
                ],
                "builds": len(definitions),
                "imports_allowed": {"vllm": rule.vllm, "from": rule.where},
                "schema_checked": checked,
                "removed": [str(item.path) for item in removed],
                **validate_probes.probes_json(probes),
                **validate_build.plans_json(plans),
            }
        )
    else:
        for item in removed:
            console().print(
                f"removed {item.path}: left by an interrupted write"
                f" {int(item.age // 60)} minutes ago",
                markup=False,
                soft_wrap=True,
            )
        for patch_id, found in problems.items():
            lines = [str(p) for p in found] + schema_only[patch_id]
            for line in lines:
                err_console().print(f"patchset: error: {line}", markup=False, soft_wrap=True)
        loaded_bad = len(problems.keys() & {p.id for p in registry.patches})
        total = len(registry.patches) + len(problems) - loaded_bad
        console().print(
            f"{registry.root}: {len(registry.patches) - loaded_bad} of {total} patches valid"
            + (f", {len(problems)} with problems" if problems else "")
            + f"; digest {registry.digest}"
            + (
                f" ({checked} file{'' if checked == 1 else 's'} checked against the JSON Schemas)"
                if not problems
                else ""
            ),
            markup=False,
        )
        validate_probes.show_probes(probes)
        validate_build.show_plans(plans)
    if problems:
        return ExitCode.BAD_INPUT
    return validate_probes.probes_exit(probes) or validate_build.plans_exit(plans)
