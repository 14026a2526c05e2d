"""Build definitions: one `builds/<name>.toml` per image target, validated when it loads."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from patchset.errors import RegistryError
from patchset.registry import Registry
from patchset.registry.toml import Table, load_toml

_CUDA = re.compile(r"^cu\d{3}$")
_REPO = re.compile(r"^[a-z0-9]+([._/-][a-z0-9]+)*(:\d+)?(/[a-z0-9]+([._-][a-z0-9]+)*)*$")
_TAG_FIELDS = {"vllm", "cuda", "registry"}


@dataclass(frozen=True)
class BuildDefinition:
    name: str  # the file's stem, e.g. "0.19.1"; the nox session is build-<name>
    file: Path
    vllm: str
    cuda: str
    base: str
    repository: str
    tags: tuple[str, ...]  # templates over {vllm}, {cuda}, {registry}
    patches: tuple[str, ...]
    env: dict[str, str]
    serve_args: tuple[str, ...]
    # [switches]: a patch's switch variable -> on (true) or off (false) in this image, its
    # default at container start (the variable, set there, still wins)
    switches: dict[str, bool] = field(default_factory=dict)

    def tag_names(self, registry_digest: str) -> tuple[str, ...]:
        short = registry_digest.removeprefix("sha256:")[:12]
        return tuple(
            f"{self.repository}:{t.format(vllm=self.vllm, cuda=self.cuda, registry=short)}"
            for t in self.tags
        )

    def check_patches(self, registry: Registry) -> None:
        """Every listed patch exists, its declared range admits this build's release, and the
        patches it requires are listed too (a build patch cannot stand on a startup one);
        every `[switches]` name is the switch of a listed patch."""
        known = {p.switch.env for p in registry.select(self.patches) if p.switch is not None}
        for env in self.switches:
            if env not in known:
                raise RegistryError(
                    f"switches.{env}: no patch of this definition has that switch"
                    f" (theirs: {', '.join(sorted(known)) or 'none'})",
                    path=self.file,
                )
        for patch_id in self.patches:
            patch = registry.get(patch_id)
            if not patch.in_range(self.vllm):
                raise RegistryError(
                    f"patches: {patch_id} is meant for vLLM {patch.vllm}, not {self.vllm}",
                    path=self.file,
                )
            for required in patch.requires:
                if required not in self.patches:
                    raise RegistryError(
                        f"patches: {patch_id} requires {required}, which this definition does"
                        f" not list: add {required} to patches",
                        path=self.file,
                    )
                if patch.apply == "build" and registry.get(required).apply != "build":
                    raise RegistryError(
                        f"patches: {patch_id} is applied at build but requires {required},"
                        " applied at startup: make both build (or both startup) patches",
                        path=self.file,
                    )


def load_definition(path: Path | str) -> BuildDefinition:
    path = Path(path)
    if not path.is_file():
        raise RegistryError("build definition not found", path=path)
    top = Table(load_toml(path), file=path)
    vllm = top.version("vllm", required=True)
    assert vllm is not None
    if Version(vllm).is_devrelease:
        raise top.error("dev releases have no official image", "vllm")
    cuda = top.req_str("cuda")
    if not _CUDA.match(cuda):
        raise top.error(f"{cuda!r}: expected cuNNN, e.g. cu130", "cuda")
    repository = top.req_str("repository")
    if not _REPO.match(repository):
        raise top.error(f"{repository!r} is not an image repository name", "repository")
    tags = top.str_list("tags")
    for tag in tags:
        fields = set(re.findall(r"{(\w*)}", tag))
        if fields - _TAG_FIELDS:
            raise top.error(
                f"{tag!r}: unknown field {sorted(fields - _TAG_FIELDS)[0]!r}"
                f" (use {{vllm}}, {{cuda}}, {{registry}})",
                "tags",
            )
    serve = top.table("serve")
    assert serve is not None
    args = serve.str_list("args", required=False)
    serve.finish()
    switches = top.table("switches", required=False)
    on_off = {}
    if switches is not None:
        for env in switches.names():
            on_off[env] = switches.flag(env, default=True)
        switches.finish()
    definition = BuildDefinition(
        name=path.stem,
        file=path,
        vllm=vllm,
        cuda=cuda,
        base=top.req_str("base"),
        repository=repository,
        tags=tags,
        patches=top.str_list("patches"),
        env=top.str_map("env"),
        serve_args=args,
        switches=on_off,
    )
    top.finish()
    return definition


def load_definitions(folder: Path | str) -> list[BuildDefinition]:
    return [load_definition(p) for p in sorted(Path(folder).glob("*.toml"))]
