"""club-3090's anchor scripts, run only under `--run-scripts`: they are the collection's code.

Each script (a `patch_*.py` that `install.sh` runs, or a `python3 - <<'PY'` block inside it)
edits installed vLLM files in place, at paths it hard-codes. It is run against a scratch copy
of one release at a time: a folder holding a stub `vllm/` package with the release's target
files, the script's site-packages path rewritten to that folder, `PYTHONPATH` pointing there
(for scripts that find vLLM with `importlib.util.find_spec`), a time bound, its working folder
inside the scratch tree.

The boundary is the operating system's, not the script's own interpreter: each script runs
in `patchset.importers.sandbox` (bubblewrap: its own user, mount, pid, network, ipc and uts
namespaces, only the scratch tree writable, no host `/proc`, no home, no environment, no
network, limits, killed whole at the time bound, output capped). What it leaves outside the
scratch tree is found by the parent in the sandbox's root and refused by name. A launcher of
patchset's own also installs an audit hook (`sys.addaudithook`) as a second line: a write
outside the scratch tree, or starting a process, is refused there and reported on a
descriptor the parent reads. What it changed under the scratch `vllm/` is the edit; a script
that fails on a release says that release does not fit; one refused by the hook is ended
there (exit 87, which the parent reads even when the script silenced the report); one that
hangs, or tries to write outside its scratch tree, is refused.
"""

from __future__ import annotations

import ast
import re
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from patchset.importers import sandbox

_SITE = re.compile(r"/usr/(?:local/)?lib/python3\.\d+/(?:dist|site)-packages")
_HEREDOC = re.compile(
    r"python3?\s+-\s*<<-?\s*['\"]?(\w+)['\"]?[^\n]*\n(.*?)\n\1[ \t]*$", re.M | re.S
)
_CALL = re.compile(r"python3?\s+\"?([^\s\"]*?([\w.-]+\.py))\"?")
_PATH = re.compile(r"[\"']([\w./{}$-]*?([\w-]+/)+[\w-]+\.py)[\"']")
_ABS = re.compile(r"[\"'](/[^\"'\s]{2,})[\"']")


_REFUSED = "patchset-sandbox-refused: "
_REFUSED_EXIT = 87  # the launcher ended the script at a refusal
# Run as `python LAUNCHER SCRATCH SCRIPT FD`: patchset's own code, never the collection's.
_LAUNCHER = """\
import os, runpy, sys

ROOT = os.path.realpath(sys.argv[1])
SCRIPT = sys.argv[2]
REPORT = int(sys.argv[3])
WRITES = os.O_WRONLY | os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_TRUNC
PATHS = {  # event: the indexes of its arguments that are paths it writes
    "os.rename": (0, 1), "os.remove": (0,), "os.rmdir": (0,), "os.mkdir": (0,),
    "os.symlink": (1,), "os.link": (1,), "os.chmod": (0,), "os.chown": (0,),
    "os.truncate": (0,), "os.utime": (0,), "shutil.copyfile": (1,), "shutil.copytree": (1,),
    "shutil.rmtree": (0,), "os.mkfifo": (0,), "os.mknod": (0,),
}
SPAWN = ("subprocess.Popen", "os.system", "os.exec", "os.posix_spawn", "os.spawn", "os.fork",
         "os.forkpty", "pty.spawn")


def refuse(what):
    line = ("%s%s\\n" % (REFUSED, what)).encode(errors="replace")
    for fd in (REPORT, 2):
        try:
            os.write(fd, line)
        except OSError:
            pass
    os._exit(REFUSED_EXIT)  # no script goes on past a refusal, reported or not


def inside(path):
    if isinstance(path, int):
        return True  # a descriptor it already holds
    path = os.fsdecode(path)
    full = os.path.realpath(os.path.join(os.getcwd(), path))
    return full == ROOT or full.startswith(ROOT + os.sep) or full in ("/dev/null",)


def hook(event, args):
    if event == "open":
        path, mode, flags = args
        writes = (flags & WRITES) if mode is None else any(c in mode for c in "wax+")
        if path is not None and writes and not inside(path):
            refuse(os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(path))))
    elif event in PATHS:
        for i in PATHS[event]:
            if i < len(args) and args[i] is not None and not inside(args[i]):
                refuse(os.path.realpath(os.path.join(os.getcwd(), os.fsdecode(args[i]))))
    elif event in SPAWN:
        refuse("a process (%s)" % event)


REFUSED = @REFUSED@
REFUSED_EXIT = @EXIT@
os.set_inheritable(REPORT, False)
sys.argv = [SCRIPT]
sys.path[0] = os.path.dirname(os.path.abspath(SCRIPT))
sys.addaudithook(hook)
runpy.run_path(SCRIPT, run_name="__main__")
""".replace("@REFUSED@", repr(_REFUSED)).replace("@EXIT@", str(_REFUSED_EXIT))


class ScriptRefused(Exception):  # noqa: N818 - the reason a script is not imported
    """The script hung or wrote outside its scratch tree: nothing is imported from it."""


@dataclass
class Piece:
    name: str
    text: str


@dataclass
class Run:
    version: str
    ok: bool
    reason: str = ""
    edits: dict[str, tuple[str, str]] = field(default_factory=dict)  # vllm/... -> (old, new)
    created: list[str] = field(default_factory=list)


def pieces(folder: Path, files: list[Path] | None = None) -> list[Piece]:
    """The scripts in the order `install.sh` runs them (else `files`, else every
    `patch*.py`)."""
    install = folder / "install.sh"
    found: list[tuple[int, Piece]] = []
    if files:
        return [Piece(f.name, f.read_text(errors="replace")) for f in files]
    if install.is_file():
        text = install.read_text(errors="replace")
        found.extend(
            (m.start(), Piece(f"install.sh:{text.count(chr(10), 0, m.start()) + 1}", m.group(2)))
            for m in _HEREDOC.finditer(text)
        )
        for match in _CALL.finditer(text):
            name = match.group(2)
            path = folder / name
            if path.is_file() and not name.startswith("_check"):
                found.append((match.start(), Piece(name, path.read_text(errors="replace"))))
    if not found:
        for i, path in enumerate(sorted(folder.glob("patch*.py"))):
            found.append((i, Piece(path.name, path.read_text(errors="replace"))))
    return [p for _, p in sorted(found, key=lambda item: item[0])]


def targets(scripts: list[Piece]) -> list[str]:
    """The files under vllm/ the scripts name (`.../vllm/x/y.py`, or a path joined onto
    vLLM's folder)."""
    out: list[str] = []
    for piece in scripts:
        for match in _PATH.finditer(piece.text):
            path = match.group(1)
            rel = path.split("/vllm/", 1)[1] if "/vllm/" in path else path.removeprefix("vllm/")
            if not rel.startswith("/") and "{" not in rel and "$" not in rel:
                out.append("vllm/" + rel)
    return list(dict.fromkeys(out))


def upstream_needles(scripts: list[Piece]) -> tuple[list[str], list[str]]:
    """The strings (and regular expressions) a script looks for to decide that the fix is
    already upstream: `if S in src:` or `if R.search(src):` whose branch says so (upstream,
    native, already present)."""
    needles: list[str] = []
    patterns: list[str] = []
    for piece in scripts:
        try:
            tree = ast.parse(piece.text)
        except SyntaxError:
            continue
        consts = {
            t.id: n.value.value
            for n in tree.body
            if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
            for t in n.targets
            if isinstance(t, ast.Name) and isinstance(n.value.value, str)
        }
        regexes = {
            t.id: n.value.args[0].value
            for n in tree.body
            if isinstance(n, ast.Assign)
            and isinstance(n.value, ast.Call)
            and getattr(n.value.func, "attr", "") == "compile"
            and n.value.args
            and isinstance(n.value.args[0], ast.Constant)
            and isinstance(n.value.args[0].value, str)
            for t in n.targets
            if isinstance(t, ast.Name)
        }
        for node in ast.walk(tree):
            if not isinstance(node, ast.If):
                continue
            if (
                isinstance(node.test, ast.Call)
                and isinstance(node.test.func, ast.Attribute)
                and node.test.func.attr == "search"
                and isinstance(node.test.func.value, ast.Name)
                and node.test.func.value.id in regexes
                and _says_upstream(node)
            ):
                patterns.append(str(regexes[node.test.func.value.id]))
                continue
            if not isinstance(node.test, ast.Compare):
                continue
            test = node.test
            if len(test.ops) != 1 or not isinstance(test.ops[0], ast.In):
                continue
            left = test.left
            value = (
                left.value
                if isinstance(left, ast.Constant)
                else consts.get(getattr(left, "id", ""))
            )
            name = getattr(left, "id", "")
            if not isinstance(value, str) or "SENTINEL" in name or "MARKER" in name:
                continue
            if _says_upstream(node):
                needles.append(value)
    return list(dict.fromkeys(needles)), list(dict.fromkeys(patterns))


def _says_upstream(node: ast.If) -> bool:
    said = " ".join(
        str(c.value).lower()
        for c in ast.walk(ast.Module(body=node.body, type_ignores=[]))
        if isinstance(c, ast.Constant) and isinstance(c.value, str)
    )
    return any(word in said for word in ("upstream", "native", "already present", "already in"))


def run(
    scripts: list[Piece],
    version: str,
    read: Callable[[str], bytes | None],
    *,
    timeout: float,
) -> Run:
    """Run the scripts, in order, against a scratch copy of one release's target files."""
    files = {p: read(p) for p in targets(scripts)}
    present = {p: d for p, d in files.items() if d is not None}
    if not present:
        return Run(version, ok=False, reason="none of the files it edits is in this release")
    with tempfile.TemporaryDirectory(prefix="patchset-script-") as tmp:
        scratch = Path(tmp) / "tree"
        site, work, home = scratch / "site", scratch / "work", scratch / "home"
        for folder in (site / "vllm", work, home):
            folder.mkdir(parents=True)
        (site / "vllm" / "__init__.py").write_text("")
        for path, data in present.items():
            dest = site / path
            dest.parent.mkdir(parents=True, exist_ok=True)
            dest.write_bytes(data)
        for i, piece in enumerate(scripts):
            text = _SITE.sub(str(site), piece.text)
            outside = _outside(text, scratch)
            before = {p: _stat(p) for p in outside}
            script = work / f"script_{i}.py"
            script.write_text(text)
            box = Path(tmp) / f"box{i}"
            box.mkdir()
            code, output, refused = _execute(script, scratch, box, timeout, piece.name)
            changed = [str(p) for p in outside if _stat(p) != before[p]]
            if refused or changed:
                what = (refused or changed)[0]
                if what.startswith("a process"):
                    raise ScriptRefused(f"{piece.name} started {what}: refused")
                raise ScriptRefused(f"{piece.name} wrote outside its scratch tree: {what}")
            if code != 0:
                return Run(version, ok=False, reason=f"{piece.name} failed: {output}")
        run_ = Run(version, ok=True)
        for path, old in present.items():
            new = (site / path).read_bytes()
            if new != old:
                run_.edits[path] = (old.decode(errors="replace"), new.decode(errors="replace"))
        for made in sorted((site / "vllm").rglob("*.py")):
            rel = made.relative_to(site).as_posix()
            if rel not in present and rel != "vllm/__init__.py":
                run_.created.append(rel)
        if not run_.edits:
            run_.ok, run_.reason = False, "changed nothing (already applied, or upstream)"
        return run_


def _outside(text: str, scratch: Path) -> list[Path]:
    """Absolute paths the script names outside its scratch tree (files it could write)."""
    paths = []
    for match in _ABS.finditer(text):
        path = Path(match.group(1))
        if scratch in path.parents or path == scratch or path.parts[1:2] in (("dev",), ("proc",)):
            continue
        paths.append(path)
    return list(dict.fromkeys(paths))


def _stat(path: Path) -> tuple[int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size)


def _execute(
    script: Path, scratch: Path, box: Path, timeout: float, name: str
) -> tuple[int, str, list[str]]:
    """Run `script` in the sandbox under the launcher (cwd: its own folder, inside `scratch`):
    its exit code, its last line of output, and what it was refused: the writes outside
    `scratch` the parent found in the sandbox's root first (it cannot hide those), then those
    the launcher's hook refused."""
    launcher = scratch / "launch.py"
    launcher.write_text(_LAUNCHER)
    site = scratch / "site"
    env = {
        "PATH": "/usr/bin:/bin",
        "PYTHONPATH": str(site),
        "HOME": str(scratch / "home"),
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONNOUSERSITE": "1",
        "TMPDIR": str(script.parent),
        "LANG": "C.UTF-8",
    }
    got = sandbox.run(
        [sandbox.interpreter(), str(launcher), str(scratch), str(script), "{report}"],
        tree=scratch,
        box=box,
        cwd=script.parent,
        env=env,
        timeout=timeout,
    )
    if got.code is None:
        raise ScriptRefused(f"{name} hung: stopped after {timeout:g} s")
    lines = [line for line in got.output.decode(errors="replace").splitlines() if line.strip()]
    said = [line for line in lines if not line.startswith(_REFUSED)]
    reported = got.report.decode(errors="replace").splitlines()
    refused = [
        *got.outside,
        *(line.removeprefix(_REFUSED) for line in reported if line.startswith(_REFUSED)),
    ]
    if got.code == _REFUSED_EXIT and not refused:
        refused = ["(a write or a process its launcher refused; it silenced the report)"]
    last = said[-1] if said else f"exit {got.code}"
    return got.code, last[:300], refused
