"""Runtime sites: one indentation rule, byte-exact reverts, the compile check, richer sites."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from patchset.engine.apply import apply, revert
from patchset.errors import ExitCode, RegistryError
from patchset.kernel.sites import (
    Alternative,
    FileLines,
    Site,
    SiteProbe,
    apply_site,
    check_site,
    parse_served,
    revert_site,
    served_from_args,
)
from patchset.registry import load_registry, load_sites
from tests.helpers.hardening import cli
from tests.helpers.synthetic import add_patch, make_tree

MODULE = """\
import os


class Engine:
    def __init__(self, config):
        self.config = config
        self.model = build(
            config.model,
            dtype=config.dtype,
        )

    def step(self):
        out = self.model.run()
        return out


def helper():
\tif os.environ.get("X"):
\t\treturn 1
\treturn 0
"""


def lines_of(text: str) -> list[str]:
    return text.split("\n")[:-1]


def site(anchor: str, text: str, action: str = "replace", **extra: object) -> Site:
    return Site(
        name="s",
        file="vllm/m.py",
        anchor=anchor,
        action=action,  # type: ignore[arg-type]
        text=text,
        marker="patchset: test s",
        **extra,  # type: ignore[arg-type]
    )


def without_marker(lines: list[str]) -> list[str]:
    return [line for line in lines if "patchset: test" not in line]


def roundtrip(s: Site, before: list[str]) -> list[str]:
    result, after = apply_site(s, before)
    assert result.status == "applies", result.describe()
    compile("\n".join(after) + "\n", "m.py", "exec")
    assert check_site(s, after).status == "already-applied"
    back, reverted = revert_site(s, after)
    assert back.status == "already-applied" and back.exact
    assert reverted == before
    return after


def test_end_of_function_plus_module_block_lands_as_written() -> None:
    """The anchor copied with its indentation; the text ends at module level."""
    before = lines_of(MODULE)
    anchor = "        out = self.model.run()\n        return out\n"
    text = (
        "        out = self.model.run()\n        return out\n\n\n"
        "def registered():\n    return Engine\n"
    )
    after = roundtrip(site(anchor, text), before)
    plain = MODULE.replace(anchor.rstrip("\n"), text.rstrip("\n"))
    assert without_marker(after) == lines_of(plain)
    assert after[after.index("def registered():") - 5] == "        # patchset: test s"


def test_column_zero_site_is_shifted_to_its_anchor() -> None:
    before = lines_of(MODULE)
    after = roundtrip(site("return out", "log(out)\nreturn out"), before)
    assert "        log(out)" in after and "        return out" in after


def test_anchor_starting_inside_call_arguments() -> None:
    before = lines_of(MODULE)
    anchor = "            dtype=config.dtype,\n        )\n\n    def step(self):"
    text = (
        "            dtype=config.dtype,\n            trust=True,\n        )\n\n    def step(self):"
    )
    after = roundtrip(site(anchor, text), before)
    assert "            trust=True," in after and "    def step(self):" in after


def test_tabs_and_insert_into_a_block() -> None:
    before = lines_of(MODULE)
    after = roundtrip(site('if os.environ.get("X"):', "print(1)", "insert-after"), before)
    assert "\t\tprint(1)" in after  # into the block, at its own indentation
    after = roundtrip(site("\treturn 0", "\tlog()\n\treturn 0"), before)
    assert "\tlog()" in after


def test_whitespace_folded_match_reverts_byte_for_byte() -> None:
    before = lines_of(MODULE.replace("out = self.model.run()", "out  =  self.model.run()  "))
    s = site("out = self.model.run()", "out = self.model.run(fast=True)")
    result, after = apply_site(s, before)
    assert result.status == "applies" and "byte for byte" in result.detail
    back, reverted = revert_site(s, after)
    assert back.exact and reverted == before


def test_optional_alternatives_after_and_when() -> None:
    before = lines_of(MODULE)
    optional = site("not in the file", "x = 1", optional=True)
    assert check_site(optional, before).status == "skipped"
    alternative = site(
        "return self.model.run()",
        "return self.model.run(fast=True)",
        alternatives=(Alternative("out = self.model.run()", "out = self.model.run(fast=True)"),),
    )
    result, after = apply_site(alternative, before)
    assert result.status == "applies" and result.alternative == 1
    assert "alternative 1" in result.describe()
    assert "        out = self.model.run(fast=True)" in after
    assert revert_site(alternative, after)[1] == before
    twice = ["def a():", "    return 0", "def b():", "    return 0"]
    assert check_site(site("return 0", "return 2"), twice).status == "ambiguous"
    scoped = site("return 0", "return 2", after="def b():")
    result, after = apply_site(scoped, twice)
    assert result.line == 4 and after[-1] == "    return 2"
    missing_after = site("return 0", "return 2", after="def nowhere():")
    found = check_site(missing_after, before)
    assert found.status == "anchor-not-found" and "'def nowhere():' is not found" in found.detail
    conditional = site("return out", "return out  # gptq", when=(("quantization", ("gptq",)),))
    assert check_site(conditional, before, {"quantization": "awq"}).status == "skipped"
    assert check_site(conditional, before, {}).status == "skipped"
    assert check_site(conditional, before, {"quantization": "gptq"}).status == "applies"
    assert check_site(conditional, before).status == "applies"  # unknown: looked at


def test_site_probe_with_any() -> None:
    before = lines_of(MODULE)
    probe = SiteProbe(contains=("class Engine",), any=("nowhere", "def helper"))
    assert check_site(site("return out", "x", probe=probe), before).status == "upstream"
    none = SiteProbe(any=("nowhere", "also nowhere"))
    assert check_site(site("return out", "x", probe=none), before).status == "applies"


def test_hint_never_prints_an_empty_line() -> None:
    before = ["", "", "def f():", "    return 1", ""]
    result = check_site(site("\n\ndef g():\n    return 1", "x"), before)
    assert result.status == "anchor-not-found"
    assert "nearest vllm/m.py:3" in result.describe()
    assert "''" not in result.describe()


def test_shared_lines_give_what_plain_lists_give() -> None:
    """A chain of sites on one `FileLines` (each edit folding only the lines it puts in, the
    others found through the lines it came from) gives, site by site, the very results and
    lines that fresh lists give: statuses, lines, ambiguity and markers included."""
    base = [*lines_of(MODULE), "x = 1", "    x  =  1", "# patchset: test s"]
    sites = [
        site("return out", "out = 1\nreturn out", after="def step(self):"),
        site("self.config = config", "pass", action="insert-after"),
        site("return 0", "y = 0", action="insert-before"),
        site("x = 1", "z = 1"),  # twice, once folded: ambiguous
        site("def helper():", "h = 1", action="insert-after"),
        site("_patchset_never_there()", "w = 1", optional=True),
    ]
    view, plain = FileLines(list(base)), list(base)
    statuses = []
    for n, written in enumerate(sites):
        s = Site(**{**written.__dict__, "name": f"s{n}", "marker": f"patchset: test s{n}"})
        got, view = apply_site(s, view)
        want, plain = apply_site(s, plain)
        assert (got, view.lines) == (want, plain)
        statuses.append(got.status)
        assert view.folded == [" ".join(line.split()) for line in plain]
        for line in set(view.folded):
            assert view.where(line) == [i for i, x in enumerate(view.folded) if x == line]
    assert statuses == ["applies", "applies", "applies", "ambiguous", "applies", "skipped"]
    assert check_site(sites[0], FileLines(base)).status == "tampered"  # its marker, no edit


def test_nearest_lines_only_when_asked() -> None:
    before = lines_of(MODULE)
    missing = site("out = self.model.walk()", "x")
    assert check_site(missing, before).candidates
    quiet = check_site(missing, before, nearest=False)
    assert quiet.status == "anchor-not-found" and not quiet.candidates
    assert "nearest" not in quiet.describe()


def test_served_configuration() -> None:
    served = served_from_args(
        ["Qwen/Qwen3", "--quantization", "GPTQ", "--kv-cache-dtype=fp8",
         "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 1}']
    )  # fmt: skip
    assert served == {
        "model": "qwen/qwen3",
        "quantization": "gptq",
        "kv_cache_dtype": "fp8",
        "speculative": "mtp",
    }
    assert parse_served("quantization=auto_round,speculative=mtp") == {
        "quantization": "auto_round",
        "speculative": "mtp",
    }
    with pytest.raises(ValueError, match="not one of"):
        parse_served("quantisation=gptq")


SITES_TOML = """\
[[site]]
name = "{name}"
file = "vllm/m.py"
action = "replace"
marker = "patchset: {name}"
anchor = "return out"
text = "return out"
{extra}
"""


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        ("when = {{ quantisation = ['gptq'] }}", "unknown condition"),
        ("[site.probe]\ncontains = []\nany = []", "give 'contains', 'any' or 'regex'"),
        ("optional = 'yes'", "expected true or false"),
        ("[[site.alternatives]]\ntext = 'x'", r"alternatives\[0\]\.anchor: required key"),
        ("after = '  '", "must hold at least one non-blank line"),
    ],
)
def test_bad_rich_sites_are_refused_on_load(tmp_path: Path, extra: str, message: str) -> None:
    path = tmp_path / "sites.toml"
    path.write_text(SITES_TOML.format(name="bad", extra=extra.format()))
    with pytest.raises(RegistryError, match=message) as info:
        load_sites(path)
    assert str(path) in str(info.value)


def test_rich_sites_load(tmp_path: Path) -> None:
    path = tmp_path / "sites.toml"
    extra = (
        "optional = true\nafter = 'def step(self):'\n"
        "when = { quantization = ['GPTQ', 'awq'], speculative = 'mtp' }\n"
        "[site.probe]\nany = ['a', 'b']\n"
        "[[site.alternatives]]\nanchor = 'return x'\n"
    )
    path.write_text(SITES_TOML.format(name="ok", extra=extra))
    (loaded,) = load_sites(path)
    assert loaded.optional and loaded.after == "def step(self):"
    assert loaded.when == (("quantization", ("gptq", "awq")), ("speculative", ("mtp",)))
    assert loaded.probe == SiteProbe(any=("a", "b"))
    assert loaded.alternatives == (Alternative("return x"),)


def test_compile_check_refuses_naming_patch_site_file_and_line(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    sites = SITES_TOML.format(name="breaks", extra="").replace(
        'text = "return out"', 'text = "return out)"'
    )
    add_patch(registry, "breaker", sites=sites, targets=["vllm/m.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": MODULE})
    report = apply(load_registry(registry), tree)
    assert report.exit_code == ExitCode.ATTENTION and not report.written
    (result,) = report.results
    assert result.outcome == "conflict"
    assert any("site breaks: vllm/m.py:15 would not compile" in d for d in result.details), (
        result.details
    )
    assert (tree / "vllm" / "m.py").read_text() == MODULE


def test_apply_honours_the_upstream_probe(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    sites = SITES_TOML.format(name="fix", extra="").replace(
        'text = "return out"', 'text = "return out or None"'
    )
    folder = add_patch(registry, "fixed-upstream", sites=sites, targets=["vllm/m.py"])
    toml = folder / "patch.toml"
    toml.write_text(
        toml.read_text() + '[upstream.probe]\nfile = "vllm/m.py"\nany = ["def helper():"]\n'
    )
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": MODULE})
    report = apply(load_registry(registry), tree)
    assert report.exit_code == ExitCode.UPSTREAM and not report.written
    assert int(ExitCode.UPSTREAM) == 8
    assert report.results[0].outcome == "upstream"
    assert (tree / "vllm" / "m.py").read_text() == MODULE
    forced = apply(load_registry(registry), tree, force=True)
    assert forced.written and forced.results[0].outcome == "applied"
    assert any("--force" in w for w in forced.results[0].warnings)
    assert forced.exit_code == ExitCode.OK  # ends present; the warning is shown
    strict = apply(load_registry(registry), tree, force=True, strict=True, dry_run=True)
    assert strict.exit_code == ExitCode.ALREADY_APPLIED  # --strict: nothing left to do
    back = revert(load_registry(registry), tree)
    assert back.written and (tree / "vllm" / "m.py").read_text() == MODULE


def test_optional_sites_only_missing_still_apply(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    sites = SITES_TOML.format(name="main", extra="").replace(
        'text = "return out"', 'text = "return out or None"'
    ) + SITES_TOML.format(name="extra", extra="optional = true").replace(
        'anchor = "return out"', 'anchor = "not there"'
    )
    add_patch(registry, "with-optional", sites=sites, targets=["vllm/m.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": MODULE})
    report = apply(load_registry(registry), tree)
    assert report.exit_code == ExitCode.OK and report.written
    assert any("1 optional site(s) skipped" in d for d in report.results[0].details)
    back = revert(load_registry(registry), tree)
    assert back.written and (tree / "vllm" / "m.py").read_text() == MODULE


def test_cli_served_force_and_upstream(tmp_path: Path) -> None:
    registry = tmp_path / "patches"
    sites = SITES_TOML.format(name="gptq-only", extra="when = { quantization = ['gptq'] }").replace(
        'text = "return out"', 'text = "return out or None"'
    )
    folder = add_patch(registry, "gptq-fix", sites=sites, targets=["vllm/m.py"])
    tree = make_tree(tmp_path / "tree", {"vllm/m.py": MODULE})
    base = ("--registry", str(registry), "apply", "--target", str(tree))
    bad = cli(*base, "--served", "quantisation=gptq")
    assert bad.returncode == ExitCode.BAD_INPUT and "quantisation" in bad.stderr
    skipped = cli(*base, "--dry-run", "--format", "json")
    assert "when quantization in ['gptq']; served: nothing" in skipped.stdout
    # Its only site is for another served configuration: the patch is skipped, not failed.
    assert skipped.returncode == ExitCode.OK, skipped.stdout + skipped.stderr
    (result,) = json.loads(skipped.stdout)["results"]
    assert result["outcome"] == "skipped"
    assert "every site's `when` leaves it out of the served configuration" in result["details"]
    assert (tree / "vllm" / "m.py").read_text() == MODULE
    toml = folder / "patch.toml"
    toml.write_text(toml.read_text() + '[upstream.probe]\nfile = "vllm/m.py"\nany = ["Engine"]\n')
    upstream = cli(*base, "--served", "quantization=GPTQ")
    assert upstream.returncode == ExitCode.UPSTREAM, upstream.stdout + upstream.stderr
    assert (tree / "vllm" / "m.py").read_text() == MODULE
    forced = cli(*base, "--served", "quantization=gptq", "--force")
    assert forced.returncode == ExitCode.OK, forced.stdout + forced.stderr  # not --strict
    assert "warning: --force: applied although the upstream fix" in forced.stdout
    assert "return out or None" in (tree / "vllm" / "m.py").read_text()
