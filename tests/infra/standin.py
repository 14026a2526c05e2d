"""A stand-in for the official ``vllm/vllm-openai`` image, built here from public parts.

No container registry is reachable from the test machines, so the official image cannot be
pulled. The stand-in has what patchset looks at: python3, the real vLLM Python sources of
one release at the official layout (``/usr/local/lib/python3.X/dist-packages/vllm`` plus
its ``.dist-info``) and the official ``ENTRYPOINT ["vllm", "serve"]``. It is tagged
``<run id>/vllm-openai-standin:v<version>-cu130`` (tests/infra/run.py), never by the official
name (a run on a machine holding the real image must leave its tag alone) and never by
another run's name; tests name it in build definitions through :func:`for_tests`. Its
``vllm`` is a small script that records its argv and environment to /tmp/vllm-args.json and
prints them instead of serving anything.

Layers: a Debian rootfs made by mmdebstrap and imported (``<run id>/standin-rootfs``), then a
Dockerfile layer with the sources. Both are the run's own: built once per run, found by
their tag only (an image a test builds on the stand-in inherits its labels, so a label
never finds one), removed with the run. Benchmarks call :func:`build_standin_base` too.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import urljoin

from filelock import FileLock

from patchset.adapters.dockerengine import Engine
from tests.infra.run import image_repo

LOG = logging.getLogger(__name__)

STANDIN_LABEL = "org.patchset.standin"
INPUTS_LABEL = "org.patchset.standin.inputs"
FORMAT = "3"  # bump when the recipe below changes in a way the inputs digest cannot see

SUITE = "bookworm"
MMDEBSTRAP_OPTIONS = (
    "--variant=essential",
    "--include=python3",
    "--dpkgopt=path-exclude=/usr/share/doc/*",
    "--dpkgopt=path-exclude=/usr/share/man/*",
    "--dpkgopt=path-exclude=/usr/share/locale/*",
)
PATH_ENV = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

# sha256 of sdists the tests use, so a cached copy is checked without asking the index.
KNOWN_SHA256 = {
    "0.19.1": "9fb88ce6b50991eba41d183584f65f51d7f6015d86a42cdabf79c1c8bd5d66fa",
    "0.20.0": "a6d50152936ee292455af3ffbe359f7a284ac43bf3b68caccf29f368e196cc72",
}

VLLM_SCRIPT = '''\
#!/usr/bin/python3
"""Stand-in for vLLM's CLI: records how it was started instead of serving a model."""
import json
import os
import sys

record = {"argv": sys.argv[1:], "env": dict(os.environ)}
with open(os.environ.get("VLLM_STANDIN_RECORD", "/tmp/vllm-args.json"), "w") as fh:
    json.dump(record, fh, indent=1, sort_keys=True)
print(json.dumps(record, sort_keys=True), flush=True)
'''

DOCKERFILE = """\
FROM {rootfs}
COPY vllm /usr/local/lib/python3.{minor}/dist-packages/vllm
COPY {dist_info} /usr/local/lib/python3.{minor}/dist-packages/{dist_info}
COPY vllm-standin /usr/local/bin/vllm
RUN ["python3", "-c", "import importlib.util as u; s = u.find_spec('vllm'); \
assert s and s.origin == '/usr/local/lib/python3.{minor}/dist-packages/vllm/__init__.py', s"]
ENTRYPOINT ["vllm", "serve"]
CMD []
"""


MINOR_LABEL = "org.patchset.standin.python3-minor"


OFFICIAL = "vllm/vllm-openai"  # the official image's repository: never tagged by a test


def standin_tag(version: str) -> str:
    """The stand-in's tag: in this run's repository, never the official image's name (a run
    on a machine holding the real image must not move its tag to a stand-in without CUDA)."""
    return f"{image_repo('vllm-openai-standin')}:v{version}-cu130"


def rootfs_tag() -> str:
    """The Debian rootfs the stand-ins are built on, this run's."""
    return f"{image_repo('standin-rootfs')}:{SUITE}"


def built_repository() -> str:
    """Where build definitions under test tag their images (for the user-facing one)."""
    return image_repo("vllm-openai-built")


def for_tests(text: str) -> str:
    """`text` (a build definition, a source argument) with the official base image named
    by this run's stand-in's tag, and the user-facing build repository by this run's."""
    text = re.sub(
        re.escape(OFFICIAL) + r":v([0-9][0-9a-z.]*)-cu130", lambda m: standin_tag(m[1]), text
    )
    return text.replace('"patchset/vllm-openai"', f'"{built_repository()}"')


def standin_site_packages(engine: Engine, ref: str) -> str:
    """Where the stand-in `ref` holds vllm/: ``/usr/local/lib/python3.X/dist-packages``."""
    minor = engine.inspect(ref).labels[MINOR_LABEL]
    return f"/usr/local/lib/python3.{minor}/dist-packages"


# -- the sdist ----------------------------------------------------------------------------------


def cache_root() -> Path:
    """Where the sdists are cached; the same rule and layout as the package-index cache."""
    if explicit := os.environ.get("PATCHSET_CACHE_DIR"):
        return Path(explicit).expanduser()
    if xdg := os.environ.get("XDG_CACHE_HOME"):
        return Path(xdg) / "patchset"
    return Path.home() / ".cache" / "patchset"


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _index_sdist(version: str) -> tuple[str, str]:
    """(url, sha256) of vLLM's sdist for `version`, from the package index's JSON API."""
    from pip._internal.models.index import PyPI  # the index pip uses, without naming it here

    api = f"{PyPI.pypi_url}/vllm/json"
    with urllib.request.urlopen(api, timeout=60) as response:  # noqa: S310 -- https from pip
        data: dict[str, Any] = json.load(response)
    files = data.get("releases", {}).get(version)
    if not files:
        raise RuntimeError(f"the package index has no vLLM release {version}")
    for entry in files:
        if entry.get("packagetype") == "sdist":
            return urljoin(api, entry["url"]), entry["digests"]["sha256"]
    raise RuntimeError(f"the package index has no sdist for vLLM {version}")


def fetch_sdist(version: str) -> Path:
    """vLLM's sdist for `version`, from the cache (``sdists/vllm-X.tar.gz``) or the index,
    sha256-checked either way."""
    path = cache_root() / "sdists" / f"vllm-{version}.tar.gz"
    if path.is_file():
        expected = KNOWN_SHA256.get(version)
        if expected is None or file_sha256(path) == expected:
            return path
        LOG.warning("%s does not match its known sha256; downloading it again", path)
    url, expected = _index_sdist(version)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=120) as response:  # noqa: S310
            shutil.copyfileobj(response, out, 1 << 20)
        actual = file_sha256(tmp)
        if actual != expected:
            raise RuntimeError(f"{url}: sha256 {actual} but the index says {expected}")
        tmp.chmod(0o644)
        tmp.replace(path)
    finally:
        tmp.unlink(missing_ok=True)
    return path


# -- the Debian rootfs --------------------------------------------------------------------------


def _apt_entries() -> list[dict[str, list[str]]]:
    """The host's enabled apt sources as deb822-like dicts (one-line entries converted)."""
    entries: list[dict[str, list[str]]] = []
    root = Path("/etc/apt")
    one_line = [root / "sources.list", *sorted((root / "sources.list.d").glob("*.list"))]
    for path in one_line:
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            line = re.sub(r"\[[^]]*\]", " ", raw.split("#", 1)[0]).split()
            if len(line) >= 3:
                entries.append(
                    {
                        "types": [line[0]],
                        "uris": [line[1]],
                        "suites": [line[2]],
                        "components": line[3:],
                    }
                )
    for path in sorted((root / "sources.list.d").glob("*.sources")):
        for stanza in re.split(r"\n\s*\n", path.read_text(errors="replace")):
            fields: dict[str, list[str]] = {}
            for raw in stanza.splitlines():
                if raw.startswith("#") or ":" not in raw or raw[:1].isspace():
                    continue
                key, _, value = raw.partition(":")
                fields[key.strip().lower()] = value.split()
            if fields.get("enabled", ["yes"])[0].lower() != "no":
                entries.append(fields)
    return entries


def debian_mirror() -> str:
    """The Debian archive the host's apt uses ($PATCHSET_DEBIAN_MIRROR overrides): the first
    enabled ``deb`` source whose suites include the host's own codename."""
    if explicit := os.environ.get("PATCHSET_DEBIAN_MIRROR"):
        return explicit
    codename = ""
    os_release = Path("/etc/os-release")
    if os_release.is_file():
        match = re.search(r"^VERSION_CODENAME=\"?([a-z]+)", os_release.read_text(), re.MULTILINE)
        codename = match.group(1) if match else ""
    for entry in _apt_entries():
        if (
            "deb" in entry.get("types", [])
            and codename in entry.get("suites", [])
            and "main" in entry.get("components", [])
            and entry.get("uris")
        ):
            return entry["uris"][0]
    raise RuntimeError(
        f"no Debian mirror for {codename or 'this host'} in /etc/apt/sources.list*;"
        " set PATCHSET_DEBIAN_MIRROR to a Debian archive URL"
    )


def _digest(*parts: str) -> str:
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def _cached(client: Any, tag: str, inputs: str) -> str | None:
    """The id of the image `tag` if this run built it from `inputs`. Found by its tag only:
    an image built on a stand-in inherits its labels, so a label search could find one."""
    import docker.errors

    try:
        image = client.images.get(tag)
    except docker.errors.ImageNotFound:
        return None
    labels = image.labels or {}
    if labels.get(STANDIN_LABEL) and labels.get(INPUTS_LABEL) == inputs and not _derived(image):
        return str(image.id)
    return None


def _derived(image: Any) -> bool:
    """An image built on a stand-in (a patched image: patchset's labels, its entrypoint)."""
    labels = image.labels or {}
    entrypoint = (image.attrs.get("Config") or {}).get("Entrypoint")
    if any(key.startswith("io.patchset.") for key in labels):
        return True
    return entrypoint is not None and entrypoint not in (["vllm", "serve"], ["/bin/sh"])


def build_rootfs(client: Any, *, log: Callable[[str], None] = LOG.info) -> tuple[str, int]:
    """The imported Debian rootfs image: (tag, python3 minor version)."""
    inputs = _digest(FORMAT, SUITE, *MMDEBSTRAP_OPTIONS)
    tag = rootfs_tag()
    if _cached(client, tag, inputs):
        minor = client.images.get(tag).labels.get(MINOR_LABEL, "")
        if minor.isdigit():
            return tag, int(minor)
    mirror = debian_mirror()
    with tempfile.TemporaryDirectory(prefix="patchset-rootfs-") as tmp:
        tarball = Path(tmp) / "rootfs.tar"
        command = [
            "mmdebstrap",
            "--quiet",
            *MMDEBSTRAP_OPTIONS,
            SUITE,
            str(tarball),
            f"deb {mirror} {SUITE} main",
        ]
        log(f"standin: {' '.join(command)}")
        done = subprocess.run(command, capture_output=True, text=True, check=False)
        if done.returncode != 0:
            tail = "\n".join(done.stderr.splitlines()[-15:])
            raise RuntimeError(f"mmdebstrap failed with exit status {done.returncode}:\n{tail}")
        minors = set()
        with tarfile.open(tarball) as archive:
            for name in archive.getnames():
                if match := re.fullmatch(r"\./usr/bin/python3\.(\d+)", name):
                    minors.add(int(match.group(1)))
        if len(minors) != 1:
            raise RuntimeError(f"expected one python3.X in the rootfs, found {sorted(minors)}")
        minor = minors.pop()
        labels = {
            STANDIN_LABEL: f"Debian {SUITE} rootfs for the vLLM stand-in image",
            INPUTS_LABEL: inputs,
            MINOR_LABEL: str(minor),
        }
        changes = [f"ENV PATH={PATH_ENV}", 'CMD ["python3"]'] + [
            f"LABEL {key}={json.dumps(value)}" for key, value in labels.items()
        ]
        log(f"standin: importing {tarball.stat().st_size >> 20} MiB rootfs as {tag}")
        repository, _, name = tag.rpartition(":")
        client.api.import_image(src=str(tarball), repository=repository, tag=name, changes=changes)
    return tag, minor


# -- the stand-in -------------------------------------------------------------------------------


def _stage_context(sdist: Path, version: str, context: Path) -> str:
    """Write vllm/, its dist-info and the vllm script into `context`; the dist-info name."""
    prefix = f"vllm-{version}/"
    dist_info = f"vllm-{version}.dist-info"
    with tarfile.open(sdist) as archive:
        for member in archive:
            if not member.isfile():
                continue
            if member.name.startswith(prefix + "vllm/"):
                rel = member.name[len(prefix) :]
            elif member.name == prefix + "PKG-INFO":
                rel = f"{dist_info}/METADATA"
            else:
                continue
            target = context / rel
            if ".." in Path(rel).parts:
                raise RuntimeError(f"{sdist}: unsafe member {member.name}")
            target.parent.mkdir(parents=True, exist_ok=True)
            handle = archive.extractfile(member)
            if handle is not None:
                target.write_bytes(handle.read())
    (context / dist_info / "INSTALLER").write_text("patchset-standin\n")
    script = context / "vllm-standin"
    script.write_text(VLLM_SCRIPT)
    script.chmod(0o755)
    return dist_info


def build_standin_base(
    client: Any,
    version: str = "0.19.1",
    tag: str | None = None,
    *,
    log: Callable[[str], None] = LOG.info,
) -> str:
    """Build (or reuse) the stand-in of the official vLLM `version` image; its image id.

    `client` is a ``docker.DockerClient``. Cached: an image already tagged `tag` with the
    stand-in label and the same inputs digest is returned as it is."""
    tag = tag or standin_tag(version)
    lock_path = cache_root() / "locks" / f"standin-{version}.lock"
    lock_path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(lock_path), timeout=1800):
        sdist = fetch_sdist(version)
        sdist_sha = file_sha256(sdist)
        rootfs_inputs = _digest(FORMAT, SUITE, *MMDEBSTRAP_OPTIONS)
        inputs = _digest(FORMAT, rootfs_inputs, sdist_sha, DOCKERFILE, VLLM_SCRIPT)
        if image_id := _cached(client, tag, inputs):
            return image_id
        rootfs, minor = build_rootfs(client, log=log)
        with tempfile.TemporaryDirectory(prefix="patchset-standin-") as tmp:
            context = Path(tmp)
            dist_info = _stage_context(sdist, version, context)
            (context / "Dockerfile").write_text(
                DOCKERFILE.format(rootfs=rootfs, minor=minor, dist_info=dist_info)
            )
            labels = {
                STANDIN_LABEL: (
                    f"stand-in for the official vLLM {version} image: Debian {SUITE}, python3,"
                    " vLLM's Python sources from the sdist; no CUDA, no torch; vllm only"
                    " records its arguments"
                ),
                INPUTS_LABEL: inputs,
                "org.patchset.standin.sdist-sha256": sdist_sha,
            }
            log(f"standin: building {tag} from {sdist.name}")
            return Engine(client).build(context, [tag], labels=labels, network=False, on_log=log)
