"""Small collections in the two collections' shapes, written by the tests (none of their
files are copied: these are written from the layout facts the importers document)."""

from __future__ import annotations

import subprocess
import textwrap
from pathlib import Path

GIT_ENV = {
    "GIT_AUTHOR_NAME": "t",
    "GIT_AUTHOR_EMAIL": "t@localhost",
    "GIT_COMMITTER_NAME": "t",
    "GIT_COMMITTER_EMAIL": "t@localhost",
    "GIT_CONFIG_GLOBAL": "/dev/null",
    "GIT_CONFIG_NOSYSTEM": "1",
    "PATH": "/usr/bin:/bin",
}

RELEASE_X = """\
import os


def forward(x):
    y = x + 1
    return y


def helper(z):
    return z * 2
"""


THING = "class Thing:\n    def run(self):\n        return 1\n"


def _write(root: Path, files: dict[str, str]) -> None:
    for rel, text in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))


def commit_all(root: Path, message: str = "c") -> str:
    if not (root / ".git").exists():
        subprocess.run(["git", "init", "-q", str(root)], check=True, env=GIT_ENV)
    subprocess.run(["git", "-C", str(root), "add", "-A"], check=True, env=GIT_ENV)
    subprocess.run(
        ["git", "-C", str(root), "commit", "-qm", message, "--allow-empty"], check=True, env=GIT_ENV
    )
    out = subprocess.run(
        ["git", "-C", str(root), "rev-parse", "HEAD"],
        check=True,
        env=GIT_ENV,
        capture_output=True,
        text=True,
    )
    return out.stdout.strip()


def genesis(root: Path, *, new_text: str = "y = x + 2") -> Path:
    """A Genesis-like checkout: a registry of four entries and their modules."""
    _write(
        root,
        {
            "sndr/__init__.py": "",
            "sndr/kernel/__init__.py": "",
            "sndr/engines/__init__.py": "",
            "sndr/engines/vllm/__init__.py": "",
            "sndr/engines/vllm/middleware.py": "VALUE = 1\n",
            "sndr/engines/vllm/patches/__init__.py": "",
            "sndr/engines/vllm/patches/core/__init__.py": "",
            "sndr/engines/vllm/patches/core/consts.py": 'TAG = "G1"\n',
            "sndr/dispatcher/__init__.py": "",
            "sndr/dispatcher/registry.py": """\
                PATCH_REGISTRY = {
                    "G1": {
                        "title": "forward adds two",
                        "env_flag": "GENESIS_ENABLE_G1",
                        "default_on": False,
                        "lifecycle": "experimental",
                        "credit": "someone (vllm#12345)",
                        "upstream_pr": 12345,
                        "upstream_pr_relationship": "backport",
                        "applies_to": {
                            "vllm_version_range": (">=0.19.0", "<0.30.0"),
                            "model_arch": ["Qwen3NextForCausalLM"],
                            "is_turboquant": True,
                        },
                        "composes_with": ["G2"],
                        "apply_module": "sndr.engines.vllm.patches.core.g1",
                    },
                    "G2": {
                        "title": "rebind Thing.run",
                        "env_flag": "GENESIS_ENABLE_G2",
                        "default_on": True,
                        "lifecycle": "legacy",
                        "credit": "",
                        "conflicts_with": ["G1"],
                        "apply_module": "sndr.engines.vllm.patches.core.g2",
                    },
                    "G3": {"title": "no module", "env_flag": "GENESIS_ENABLE_G3",
                           "default_on": False, "lifecycle": "retired", "credit": ""},
                    "G4": {"title": "broken", "env_flag": "GENESIS_ENABLE_G4",
                           "default_on": False, "lifecycle": "stable", "credit": "",
                           "apply_module": "sndr.engines.vllm.patches.core.g4"},
                    "G5": {"title": "imports what nothing has", "env_flag": "GENESIS_ENABLE_G1",
                           "default_on": False, "lifecycle": "stable", "credit": "",
                           "apply_module": "sndr.engines.vllm.patches.core.g5"},
                    "G6": {"title": "shares G1's switch", "env_flag": "GENESIS_ENABLE_G1",
                           "default_on": False, "lifecycle": "stable", "credit": "",
                           "apply_module": "sndr.engines.vllm.patches.core.g6"},
                }
                """,
            "sndr/engines/vllm/patches/core/g1.py": f"""\
                from sndr.engines.vllm.detection.guards import resolve_vllm_file
                from sndr.kernel import TextPatch, TextPatcher
                from sndr.engines.vllm.patches.core.consts import TAG

                MARKER = f"Genesis {{TAG}} forward v1"
                OLD = (
                    "def forward(x):\\n"
                    "    y = x + 1\\n"
                )
                NEW = (
                    "def forward(x):\\n"
                    "    from sndr.engines.vllm.middleware import VALUE  # noqa\\n"
                    "    {new_text}\\n"
                )


                def _make():
                    target = resolve_vllm_file("x.py")
                    if target is None:
                        return None
                    return TextPatcher(
                        patch_name="G1 x.py",
                        target_file=str(target),
                        marker=MARKER + " :: x.py",
                        sub_patches=[
                            TextPatch(name="g1_forward", anchor=OLD, replacement=NEW, required=True,
                                      upstream_merged_markers=["y = x + 1  # upstream"]),
                            TextPatch(name="g1_gone", anchor="    return absent\\n",
                                      replacement="    return absent2\\n"),
                        ],
                        upstream_drift_markers=["def forward(x, fixed=True):"],
                    )


                def apply():
                    return "applied", "ok"
                """,
            "sndr/engines/vllm/patches/core/g2.py": """\
                def apply():
                    from vllm.y import Thing

                    def run(self):
                        return 2

                    Thing.run = run
                    return "applied", "rebound"
                """,
            "sndr/engines/vllm/patches/core/g4.py": "def apply(:\n",
            "sndr/engines/vllm/patches/core/g5.py": """\
                from sndr.kernel import TextPatch, TextPatcher

                def _make():
                    return TextPatcher(
                        patch_name="G5", target_file=str(resolve_vllm_file("y.py")), marker="G5",
                        sub_patches=[TextPatch(name="g5", anchor="        return 1\\n",
                                               replacement="        import nosuchpkg\\n")],
                    )
                """,
            "sndr/engines/vllm/patches/core/g6.py": """\
                from sndr.kernel import TextPatch, TextPatcher

                def _make():
                    return TextPatcher(
                        patch_name="G6", target_file=str(resolve_vllm_file("y.py")), marker="G6",
                        sub_patches=[TextPatch(name="g6", anchor="class Thing:\\n",
                                               replacement="class Thing:  # six\\n")],
                    )
                """,
        },
    )
    commit_all(root)
    return root


def release(root: Path, version: str, files: dict[str, str] | None = None) -> Path:
    """A vLLM release laid out as a folder source reads it."""
    content = {
        "vllm/x.py": RELEASE_X,
        "vllm/y.py": "class Thing:\n    def run(self):\n        return 1\n",
    }
    content.update(files or {})
    (root / "vllm").mkdir(parents=True, exist_ok=True)
    (root / "vllm" / "__init__.py").write_text("")
    (root / "vllm" / "_version.py").write_text(f"__version__ = version = '{version}'\n")
    for rel, text in content.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


ANCHOR_SCRIPT = """\
import io
import sys

TARGET = "/usr/local/lib/python3.12/dist-packages/vllm/x.py"
UPSTREAM = "return z * 2  # fixed upstream"
src = io.open(TARGET, encoding="utf-8").read()
if UPSTREAM in src:
    print("already upstream; nothing to do")
    sys.exit(0)
if "    return z * 2\\n" not in src:
    sys.exit("anchor not found")
new = src.replace("    return z * 2\\n", "    return z * 4\\n", 1)
io.open(TARGET, "w", encoding="utf-8").write(new)
"""

CLUB_DIFF = """\
diff --git a/vllm/x.py b/vllm/x.py
--- a/vllm/x.py
+++ b/vllm/x.py
@@ -9,2 +9,2 @@
 def helper(z):
-    return z * 2
+    return z * 3
"""


def club(root: Path) -> Path:
    """A club-3090-like checkout: patches.yml, a PR diff with a helper file, an overlay, an
    anchor script, a sitecustomize hook, a chat template, and a compose pinning a release."""
    overlay = RELEASE_X.replace("y = x + 1", "y = x + 10")
    _write(
        root,
        {
            "scripts/lib/profiles/arch_patches.yml": "schema_version: 1\narches: []\n",
            "scripts/lib/profiles/patches.yml": """\
                schema_version: 1
                patches:
                  - id: m-vllm-pr111-diff
                    model: [m1]
                    files: [models/m1/vllm/patches/vllm-pr111-v0.20.0]
                    upstream: {ref: "vllm#111", status: open, drop_when: "upstream ships #111"}
                    load_bearing_when: [m1]
                    drift_guard: {check: "grep z * 3", on_fail: "re-vendor"}
                  - id: m-overlay
                    model: [m1]
                    files: [models/m1/vllm/patches/overlay-x]
                    upstream: {ref: "vllm#222", status: merged}
                  - id: m-same
                    model: [m1]
                    files: [models/m1/vllm/patches/overlay-same]
                    upstream: {ref: local, status: local-workaround}
                  - id: m-anchor
                    model: [m1]
                    files:
                      - models/m1/vllm/patches/anchor/install.sh
                      - models/m1/vllm/patches/anchor/patch_x.py
                    upstream: {ref: local, status: local-vendored}
                  - id: m-hook
                    model: [m1]
                    files: [models/m1/vllm/patches/hook/sitecustomize.py]
                    upstream: {ref: local, status: open}
                  - id: m-template
                    model: [m1]
                    files: [models/m1/vllm/patches/tpl/chat_template.jinja]
                    delivery_mechanism: chat_template
                  - id: genesis-p1
                    files: []
                    upstream: {ref: g, status: genesis-env-gated}
                """,
            "models/m1/vllm/patches/vllm-pr111-v0.20.0/pr111.patch": CLUB_DIFF,
            "models/m1/vllm/patches/vllm-pr111-v0.20.0/helper_mod.py": "HELP = 1\n",
            "models/m1/vllm/patches/vllm-pr111-v0.20.0/install.sh": """\
                set -e
                VLLM=/usr/local/lib/python3.12/dist-packages/vllm
                cp "$PATCHDIR/helper_mod.py" "$VLLM/helper_mod.py"
                cd "$SITE" && patch -p1 --forward < "$PATCHDIR/pr111.patch"
                """,
            "models/m1/vllm/patches/overlay-x/x.py": overlay,
            "models/m1/vllm/patches/overlay-same/y.py": THING,
            "models/m1/vllm/patches/anchor/install.sh": 'python3 "$DIR/patch_x.py"\n',
            "models/m1/vllm/patches/anchor/patch_x.py": ANCHOR_SCRIPT,
            "models/m1/vllm/patches/hook/sitecustomize.py": """\
                _TARGET = "vllm.y"

                def _hook(module):
                    cls = module.Thing
                    def run(self):
                        return 5
                    cls.run = run
                """,
            "models/m1/vllm/patches/tpl/chat_template.jinja": "{{ x }}\n",
            "models/m1/vllm/compose/single/a.yml": """\
                services:
                  vllm:
                    image: ${VLLM_IMAGE:-vllm/vllm-openai:v0.20.0}
                    command: ["--model", "${MODEL:-m1-weights}"]
                    volumes:
                      - ../../patches/overlay-x/x.py:/usr/lib/python3/site/vllm/x.py:ro
                      - ../../patches/overlay-same/y.py:/usr/lib/python3/site/vllm/y.py:ro
                """,
        },
    )
    commit_all(root)
    return root


def genesis_pins(root: Path, pins: tuple[str, ...], stable: str | None = None) -> None:
    """Genesis's pins: `KNOWN_GOOD_VLLM_PINS` in its guards module, and the successor's
    `sndr/pins.yaml` (a nightly `current` beside a `stable_release`) when `stable` is given."""
    _write(
        root,
        {
            "sndr/engines/vllm/detection/__init__.py": "",
            "sndr/engines/vllm/detection/guards.py": f"KNOWN_GOOD_VLLM_PINS = {pins!r}\n",
        },
    )
    if stable is not None:
        _write(
            root,
            {
                "sndr/pins.yaml": (
                    'current: "0.23.1rc1.dev748+g2dfaae752"\n'
                    f'stable_release: "{stable}"  # the LTS pin\n'
                )
            },
        )
    commit_all(root, "pins")


def club_alternative_compose(root: Path) -> None:
    """A second compose of m1 at the same pin mounting another set of patches (the PR diff
    and the hook): an alternative to the first compose's overlay."""
    _write(
        root,
        {
            "models/m1/vllm/compose/dual/b.yml": """\
                services:
                  vllm:
                    image: vllm/vllm-openai:v0.20.0
                    command: ["--model", "m1-other"]
                    volumes:
                      - ../../patches/vllm-pr111-v0.20.0:/etc/club3090/pr111:ro
                      - ../../patches/hook:/etc/club3090/hook:ro
                """,
            "models/m1/vllm/compose/single/old.yml": """\
                services:
                  vllm:
                    image: vllm/vllm-openai:v0.19.1
                    volumes:
                      - ../../patches/overlay-x/x.py:/usr/lib/python3/site/vllm/x.py:ro
                """,
        },
    )
    commit_all(root, "composes")


BACKPORT_DIFF = CLUB_DIFF.replace("+    return z * 3", "+    return z * 5")


def club_backport(root: Path) -> None:
    """A PR backport in a folder naming no release (its range is not stated), mounted by a
    compose pinning 0.19.1 (the oldest pin: where the evidence starts)."""
    listed = root / "scripts/lib/profiles/patches.yml"
    listed.write_text(
        listed.read_text()
        + "  - id: m-backport\n"
        + "    model: [m1]\n"
        + "    files: [models/m1/vllm/patches/vllm-backport]\n"
        + '    upstream: {ref: "vllm#555", status: local-vendored}\n'
    )
    _write(
        root,
        {
            "models/m1/vllm/patches/vllm-backport/backport.patch": BACKPORT_DIFF,
            "models/m1/vllm/compose/single/old.yml": """\
                services:
                  vllm:
                    image: vllm/vllm-openai:v0.19.1
                """,
        },
    )
    commit_all(root, "backport")
