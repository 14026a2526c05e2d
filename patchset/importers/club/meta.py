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

from patchset.importers.definitions import STOCK_CUDA
from patchset.importers.model import Collection, Draft, Plan
from patchset.registry.ranges import version_key
from patchset.registry.write import TomlData

PATCHES_YML = "scripts/lib/profiles/patches.yml"
ARCH_YML = "scripts/lib/profiles/arch_patches.yml"
CLUB = Collection("club-3090", "club-3090", "noonghunna/club-3090", "club")
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
    meta: TomlData
    lost: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Compose:
    """One compose file of a model: the releases it pins, its serve arguments, and the
    paths (in the repository) of the patch folders and files it mounts."""

    model: str
    file: str
    versions: tuple[str, ...]
    args: tuple[str, ...]
    mounted: tuple[str, ...]


_VOLUME = re.compile(r"^\s*-\s*['\"]?([^\s:'\"]*/patches/[^\s:'\"]+):", re.M)


def read_composes(
    root: Path, broken: dict[str, str]
) -> tuple[dict[str, str], dict[str, dict[str, list[str]]], list[Compose]]:
    """Overlay mounts (patch file in the repository -> path under vllm/), the releases
    each model's composes pin (with the serve arguments of the first compose pinning it),
    and each compose (archived ones aside) with what it mounts."""
    mounts: dict[str, str] = {}
    pins: dict[str, dict[str, list[str]]] = {}
    composes: list[Compose] = []
    top = root.resolve()
    for compose in sorted(root.glob("models/*/vllm/compose/**/*.yml")):
        try:
            text = compose.read_text()
        except (OSError, UnicodeDecodeError) as exc:
            broken[str(compose.relative_to(root))] = f"cannot read: {exc}"
            continue
        model = compose.relative_to(root).parts[1]
        if "_archive" not in compose.parts:
            args = _serve_args(text)
            versions = tuple(dict.fromkeys(_IMAGE.findall(text)))
            for version in versions:
                pins.setdefault(model, {}).setdefault(version, args)
            mounted = []
            for source in _VOLUME.findall(text):
                with contextlib.suppress(ValueError, OSError):
                    mounted.append(str((compose.parent / source).resolve().relative_to(top)))
            rel = str(compose.relative_to(root / "models" / model / "vllm" / "compose"))
            composes.append(Compose(model, rel, versions, tuple(args), tuple(mounted)))
        for source, dest in _MOUNT.findall(text):
            resolved = (compose.parent / source).resolve()
            with contextlib.suppress(ValueError):
                mounts[str(resolved.relative_to(root.resolve()))] = dest
            # an archived compose's relative path may be stale: its folder and name still say
            mounts.setdefault("/".join(Path(source).parts[-2:]), dest)
    return mounts, pins, composes


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


def metadata(
    raw: str, meta: dict[str, object], repository: str, commit: str | None, rel: str
) -> TomlData:
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
    out: TomlData = {
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


def plan_builds(composes: list[Compose], drafts: list[Draft]) -> tuple[list[Plan], list[str]]:
    """Per model and pin, the patches that pin's composes mount: one definition when they
    mount one set (or sets within one another), one per compose otherwise (alternatives are
    never listed together). Whether each patch fits the pin is planned once landed."""
    out: list[Plan] = []
    notes: list[str] = []
    folders = {d.id: str(_at(d.meta, "provenance", "file")) for d in drafts}
    models = sorted({c.model for c in composes})
    for model in models:
        versions = sorted(
            {v for c in composes if c.model == model for v in c.versions}, key=version_key
        )
        for version in versions:
            sets: list[tuple[tuple[str, ...], Compose]] = []
            for compose in (c for c in composes if c.model == model and version in c.versions):
                ids = tuple(
                    pid
                    for pid, folder in folders.items()
                    if any(_holds(m, folder) for m in compose.mounted)
                )
                if ids and all(set(ids) != set(s) for s, _ in sets):
                    sets.append((ids, compose))
            widest = [
                (ids, c) for ids, c in sets if not any(set(ids) < set(other) for other, _ in sets)
            ]
            if not widest:
                notes.append(
                    f"club-3090 {model} at vLLM {version}: its composes mount none of the"
                    " imported patches: no build definition (the stock image as it is)"
                )
            for ids, compose in widest:
                stem = f"club-{model}-{version}"
                if len(widest) > 1:
                    stem += "-" + re.sub(r"[^A-Za-z0-9.]+", "-", compose.file.removesuffix(".yml"))
                out.append(_plan(stem, model, version, ids, compose))
    return out, notes


def _holds(mount: str, folder: str) -> bool:
    """Whether a compose mounting `mount` mounts (some of) the patch kept in `folder`."""
    return mount == folder or mount.startswith(folder + "/") or folder.startswith(mount + "/")


def _at(data: object, *keys: str) -> object:
    for key in keys:
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _plan(stem: str, model: str, version: str, ids: tuple[str, ...], compose: Compose) -> Plan:
    data: dict[str, object] = {
        "vllm": version,
        "cuda": STOCK_CUDA,
        "base": f"vllm/vllm-openai:v{version}",
        "repository": f"club3090/{model}".lower(),
        "tags": ["{vllm}", "{vllm}-ps{registry}"],
        "serve": {"args": list(compose.args)},
    }
    header = (
        f"club-3090 {model}: its compose {compose.file} pins vLLM {version}; the patches it"
        f" mounts that fit it (serve arguments from that compose, its variables at their"
        f" defaults).\nThe compose does not name the image's CUDA: {STOCK_CUDA} is assumed;"
        " set cuda if it differs."
    )
    return Plan(f"{stem}.toml".replace("/", "-"), version, ids, data, header)


def models_of(meta: dict[str, object]) -> list[str]:
    model = meta.get("model")
    return [str(m) for m in model] if isinstance(model, list) else [str(model)] if model else []
