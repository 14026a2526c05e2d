"""club-3090's metadata and build definitions: the constants and releases every form reads,
patches.yml's entry mapped to patch.toml's keys, the composes' serve arguments, and the
build definitions of the models' stock images.

The facts of the collection this relies on are in `patchset.importers.club`.
"""

from __future__ import annotations

import contextlib
import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from patchset.importers.common import version_key
from patchset.importers.model import Collection, Draft
from patchset.importers.tomlout import dumps

PATCHES_YML = "scripts/lib/profiles/patches.yml"
ARCH_YML = "scripts/lib/profiles/arch_patches.yml"
CLUB = Collection("club-3090", "club-3090", "noonghunna/club-3090", "club")
STOCK_CUDA = "cu129"  # the compose names only vllm/vllm-openai:vX.Y.Z
_MOUNT = re.compile(
    r"-\s*['\"]?([^\s:'\"]+/patches/[^\s:'\"]+):[^\s:'\"]*?/(vllm/[^\s:'\"]+?)(?::ro)?['\"]?\s*$",
    re.M,
)
_IMAGE = re.compile(r"vllm/vllm-openai:v(\d+\.\d+\.\d+)")


@dataclass
class Making:
    """The patch a club folder is becoming: its id in the collection, its patch.toml data so
    far, and what of the collection's patch does not carry over."""

    raw: str
    meta: dict[str, object]
    lost: list[str] = field(default_factory=list)


class _Skip(Exception):  # noqa: N818 - a reason, not an error
    def __init__(self, message: str, *, scope: bool = False) -> None:
        super().__init__(message)
        self.scope = scope


def _composes(
    root: Path, broken: dict[str, str]
) -> tuple[dict[str, str], dict[str, dict[str, list[str]]]]:
    """Overlay mounts (patch file in the repository -> path under vllm/) and the releases
    each model's composes pin (with the serve arguments of the first compose pinning it)."""
    mounts: dict[str, str] = {}
    pins: dict[str, dict[str, list[str]]] = {}
    for compose in sorted(root.glob("models/*/vllm/compose/**/*.yml")):
        try:
            text = compose.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            broken[str(compose.relative_to(root))] = f"cannot read: {exc}"
            continue
        model = compose.relative_to(root).parts[1]
        if "_archive" not in compose.parts:
            for version in _IMAGE.findall(text):
                pins.setdefault(model, {}).setdefault(version, _serve_args(text))
        for source, dest in _MOUNT.findall(text):
            resolved = (compose.parent / source).resolve()
            with contextlib.suppress(ValueError):
                mounts[str(resolved.relative_to(root.resolve()))] = dest
            # an archived compose's relative path may be stale: its folder and name still say
            mounts.setdefault("/".join(Path(source).parts[-2:]), dest)
    return mounts, pins


def _serve_args(text: str) -> list[str]:
    """The `command:` list of the compose's first service, its `${VAR:-default}` as the
    defaults (what the compose serves when nothing is set)."""
    try:
        data = _yaml_text(text)
    except Exception:  # a compose that does not parse gives no arguments
        return []
    services = data.get("services") if isinstance(data, dict) else None
    for service in (services or {}).values() if isinstance(services, dict) else ():
        command = service.get("command") if isinstance(service, dict) else None
        if isinstance(command, list) and all(isinstance(c, str | int | float) for c in command):
            return [_defaults(str(c)) for c in command]
    return []


def _defaults(text: str) -> str:
    pattern = re.compile(r"\$\{\w+(?::?-([^${}]*))?\}")
    for _ in range(5):
        text, n = pattern.subn(lambda m: m.group(1) or "", text)
        if not n:
            break
    return text


def _yaml_text(text: str) -> object:
    import yaml  # noqa: PLC0415 - only this importer reads YAML

    return yaml.safe_load(text)


def _metadata(
    raw: str, meta: dict[str, object], repository: str, commit: str | None, rel: str
) -> dict[str, object]:
    upstream = meta.get("upstream") if isinstance(meta.get("upstream"), dict) else {}
    assert isinstance(upstream, dict)
    ref = str(upstream.get("ref") or "")
    status = str(upstream.get("status") or "")
    number = re.search(r"(?:#|pr)(\d{2,6})", ref + " " + raw)
    state = {"open": "open", "merged": "merged", "closed": "closed"}.get(
        status.split("-", maxsplit=1)[0]
    )
    # Every status is kept (`x.upstream_status`, and in the note); a PR is never dropped: a
    # status that is no PR state (local-vendored, local-workaround, negative-local-result,
    # diagnostic-overlay...) leaves the PR's own state unsaid, so it is watched as open.
    up: dict[str, object]
    if number:
        up = {"pr": f"vllm-project/vllm#{number.group(1)}", "state": state or "open"}
        if state is None or status != state:
            assumed = "" if state else "; the PR's state is not given: open assumed"
            up["note"] = f"club-3090 status {status or '(none)'}{assumed}"
    else:
        up = {"state": "unsubmitted"}
        if status:
            up["note"] = f"club-3090 status {status}" + (
                " (no PR named)" if state is not None else ""
            )
    x: dict[str, object] = {"club_id": raw, "upstream_status": status, "upstream_ref": ref}
    for key in ("drop_when",):
        if upstream.get(key):
            x[key] = str(upstream[key])
    for key in (
        "load_bearing_when",
        "model",
        "deprecated_on",
        "deprecation_reason",
        "delivery_mechanism",
        "status",
    ):
        value = meta.get(key)
        if value not in (None, [], ""):
            x[key] = value if isinstance(value, str | list) else str(value)
    guard = meta.get("drift_guard")
    if isinstance(guard, dict):
        x["drift_guard"] = {str(k): str(v) for k, v in guard.items()}
    elif guard:
        x["drift_guard"] = str(guard)
    lifecycle = {"state": "deprecated" if meta.get("deprecated_on") else "stable"}
    out: dict[str, object] = {
        "id": CLUB.id_of(raw),
        "title": f"club-3090 {raw}",
        "description": f"Imported from club-3090 ({repository}) patch {raw}.\n",
        "revision": 1,
        "vllm": ">=0.0",
        "apply": "build",
        "origin": f"club-3090 {raw} ({repository} {rel})",
        "credit": ["noonghunna (club-3090)"],
        "lifecycle": lifecycle,
        "upstream": up,
        "provenance": {
            "collection": CLUB.name,
            "repository": repository,
            **({"commit": commit} if commit else {}),
            "file": PATCHES_YML,
            "line": 1,
        },
        "x": x,
    }
    return out


def _builds(
    pins: dict[str, dict[str, list[str]]], drafts: list[Draft], listed: dict[str, dict[str, object]]
) -> dict[str, str]:
    out: dict[str, str] = {}
    for model, versions in sorted(pins.items()):
        ids = [
            d.id
            for d in drafts
            if model in _models(listed.get(d.source_id, {})) and d.meta.get("kind") != "python"
        ]
        for version in sorted(versions, key=version_key):
            fitting = [i for i in ids if _fits(drafts, i, version)]
            if not fitting:
                continue  # none of the collection's patches is for this model and release
            name = f"club-{model}-{version}.toml".replace("/", "-")
            data: dict[str, object] = {
                "vllm": version,
                "cuda": STOCK_CUDA,
                "base": f"vllm/vllm-openai:v{version}",
                "repository": f"club3090/{model}".lower(),
                "tags": ["{vllm}", "{vllm}-ps{registry}"],
                "patches": fitting,
                "serve": {"args": versions[version]},
            }
            header = (
                f"club-3090 {model}: its composes pin vLLM {version} (serve arguments from the"
                f" first such compose, its variables at their defaults).\nThe compose does not"
                f" name the image's CUDA: {STOCK_CUDA} is assumed; set cuda if it differs."
            )
            out[name] = dumps(data, header=header)
    return out


def _models(meta: dict[str, object]) -> list[str]:
    model = meta.get("model")
    return [str(m) for m in model] if isinstance(model, list) else [str(model)] if model else []


def _fits(drafts: list[Draft], pid: str, version: str) -> bool:
    from packaging.specifiers import SpecifierSet  # noqa: PLC0415

    for draft in drafts:
        if draft.id == pid:
            return Version(version) in SpecifierSet(str(draft.meta.get("vllm", "")))
    return False
