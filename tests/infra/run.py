"""One test run's identity, and the names of what it makes on the Docker engine.

A run is one pytest process. Its id, ``patchset-test-<host>-<pid>-<start>``, says where it
runs (a digest of the host name), its pid and the pid's start time (from /proc), so it is
unique between two checkouts running at once on one engine, and a later run can tell that
the run is dead (no such pid, or the pid started at another time) and its leftovers may go.

Everything a run makes on the engine is named under its id: images ``<run id>/<name>:<tag>``
(the stand-ins, the images tests build or tag), containers, networks and compose projects
``<run id>-<name>``; the registries it starts carry ``PATCHSET_TEST_RUN=<run id>`` in their
environment. :func:`remove_run` removes one run's things (at its end); :func:`dead_runs` finds
killed runs' leftovers (at the next run's start). Names of the old scheme
(``patchset-test/...``) belong to no run here and are never used.

The id is made once per process and passed to children in ``$PATCHSET_TEST_RUN`` (a
benchmark or a subprocess of a test names its images under the same run).
"""

from __future__ import annotations

import contextlib
import gc
import hashlib
import os
import re
import signal
import socket
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ENV = "PATCHSET_TEST_RUN"
PREFIX = "patchset-test-"
REMOVE_TIMEOUT = 300  # seconds an engine call of the removal may take
_ID = re.compile(r"patchset-test-([0-9a-f]{6})-(\d+)-(\d+)")


def _start_time(pid: int) -> str | None:
    """The pid's start time in clock ticks after boot (/proc/<pid>/stat field 22)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return stat.rpartition(")")[2].split()[19]


def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:6]


def _new_id() -> str:
    pid = os.getpid()
    return f"{PREFIX}{_host()}-{pid}-{_start_time(pid) or 0}"


def start_run() -> str:
    """A new run for this process (a pytest session is one run, even one started by a test
    of another): its id, set as $PATCHSET_TEST_RUN."""
    os.environ[ENV] = _new_id()
    return os.environ[ENV]


def run_id() -> str:
    """This run's id: $PATCHSET_TEST_RUN (set by the session, inherited by its children),
    else a new one for this process (a benchmark)."""
    value = os.environ.get(ENV, "")
    return value if _ID.fullmatch(value) else start_run()


def owns(run: str) -> bool:
    """Whether this process started `run` (only its owner removes it at the end)."""
    match = _ID.fullmatch(run)
    return match is not None and int(match[2]) == os.getpid()


def image_repo(name: str) -> str:
    """An image repository of this run: ``<run id>/<name>``."""
    return f"{run_id()}/{name}"


def object_name(name: str) -> str:
    """A container, network or compose project name of this run: ``<run id>-<name>``."""
    return f"{run_id()}-{name}"


def is_dead(run: str) -> bool:
    """Whether `run` (an id of this scheme, made on this host) has ended. A run of another
    host, or a name of another scheme, is never called dead: it is left alone."""
    match = _ID.fullmatch(run)
    if match is None or match[1] != _host():
        return False
    return _start_time(int(match[2])) != match[3]


def run_of(name: str) -> str | None:
    """The run a name (an image tag, a container, a temporary folder) belongs to; a tag of
    an image pushed to a test registry (``127.0.0.1:PORT/<run id>/...``) too."""
    name = name.lstrip("/")
    host, _, rest = name.partition("/")
    if rest and (":" in host or "." in host or host == "localhost"):
        name = rest
    match = _ID.match(name)
    return match[0] if match else None


def _listed(client: Any) -> tuple[list[dict[str, Any]], list[dict[str, Any]], list[str]]:
    """The engine's images, containers (all) and network names, each in one call: listing
    through docker's models inspects each one after, and another run may remove it between."""
    images = list(client.api.images(all=True))
    containers = list(client.api.containers(all=True))
    networks = [str(n.get("Name", "")) for n in client.api.networks()]
    return images, containers, networks


def _tags(image: dict[str, Any]) -> list[str]:
    return [t for t in image.get("RepoTags") or [] if t != "<none>:<none>"]


def _container_name(container: dict[str, Any]) -> str:
    return str((container.get("Names") or ["/"])[0]).lstrip("/")


def dead_runs(client: Any) -> set[str]:
    """Ids of dead runs that left images, containers, networks or registries behind."""
    images, containers, networks = _listed(client)
    names = [tag for image in images for tag in _tags(image)]
    names += [_container_name(c) for c in containers] + networks
    runs = {run for name in names if (run := run_of(name))}
    runs |= set(_registry_processes())
    return {run for run in runs if is_dead(run)}


def _registry_processes() -> dict[str, list[int]]:
    """run id -> pids of the registries (docker-registry processes) a run started: they
    carry $PATCHSET_TEST_RUN in their environment."""
    found: dict[str, list[int]] = {}
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or int(proc.name) == os.getpid():
            continue
        try:
            if b"docker-registry" not in (proc / "cmdline").read_bytes():
                continue
            environ = (proc / "environ").read_bytes()
        except OSError:
            continue
        for entry in environ.split(b"\0"):
            name, _, value = entry.partition(b"=")
            if name == ENV.encode() and _ID.fullmatch(run := value.decode(errors="replace")):
                found.setdefault(run, []).append(int(proc.name))
    return found


def _untagged_descendants(images: list[dict[str, Any]], ids: set[str]) -> list[str]:
    """Untagged images of `ids` and of images built on them (a build's steps, a build cut
    short, an image whose tags just went), newest first: what a run's builds left."""
    parent = {i["Id"]: i.get("ParentId") or "" for i in images}
    created = {i["Id"]: i.get("Created", 0) for i in images}

    def descends(image_id: str) -> bool:
        seen: set[str] = set()
        while image_id and image_id not in seen:
            if image_id in ids:
                return True
            seen.add(image_id)
            image_id = parent.get(image_id, "")
        return False

    found = [i["Id"] for i in images if not _tags(i) and descends(i["Id"])]
    return sorted(found, key=lambda i: created[i], reverse=True)


def remove_run(client: Any, run: str) -> list[str]:
    """Remove everything of `run` from the engine (containers, networks, images) and stop
    its registries; what was removed, by name. Another run removing its own things at the
    same time is no error: what is gone already is skipped."""
    import docker.errors

    gone = (docker.errors.NotFound, docker.errors.APIError)
    removed: list[str] = []
    images, containers, networks = _listed(client)
    ids = {i["Id"] for i in images if any(run_of(tag) == run for tag in _tags(i))}
    for container in containers:
        name = _container_name(container)
        if run_of(name) == run or container.get("ImageID") in ids:
            with contextlib.suppress(*gone):
                client.api.remove_container(container["Id"], force=True, v=True)
                removed.append(f"container {name}")
    for network in networks:
        if run_of(network) == run:
            with contextlib.suppress(*gone):
                client.api.remove_network(network)
                removed.append(f"network {network}")
    for image in images:
        for tag in _tags(image):
            if run_of(tag) == run:  # a tag of another run or of the user stays
                with contextlib.suppress(*gone):
                    client.api.remove_image(tag, noprune=False)
                    removed.append(f"image {tag}")
    images = list(client.api.images(all=True))  # what the tags' removal left untagged
    for image_id in _untagged_descendants(images, ids):
        with contextlib.suppress(*gone):
            client.api.remove_image(image_id, noprune=False)
            removed.append(f"image {image_id[:19]}")
    for pid in _registry_processes().get(run, []):
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGTERM)
            removed.append(f"process {pid}")
    return removed


@contextlib.contextmanager
def engine_if_up() -> Iterator[Any]:
    """A ``docker.DockerClient`` when an engine answers at once, else None (nothing to clean
    where no engine runs; the docker fixtures provision one when a test needs it)."""
    client = None
    with warnings.catch_warnings():
        # docker-py leaves the socket of a first request that failed (no engine) open: it is
        # collected here, quietly, not at some later test's setup as a ResourceWarning
        warnings.simplefilter("ignore", ResourceWarning)
        try:
            import docker

            client = docker.from_env(timeout=10)
            client.ping()
        except Exception:  # no engine, no socket, no permission: nothing of a run's to remove
            if client is not None:
                client.close()
            client = None
        gc.collect()
    if client is None:
        yield None
        return
    # answering at once is the test; removing a run's images on a loaded machine (two runs
    # on one engine, two cores) takes longer than that: a slow answer is not a failed one
    client.api.timeout = REMOVE_TIMEOUT
    try:
        yield client
    finally:
        client.close()


def remove_run_or_warn(client: Any, run: str) -> None:
    """`remove_run`, and where the engine fails or stalls on it, one warning line instead of
    a failed test run: what is left is the run's by name, and the next run's start removes it
    (its pid is gone by then)."""
    try:
        remove_run(client, run)
    except Exception as exc:  # docker's and requests' errors alike
        last = str(exc).splitlines()[-1] if str(exc) else type(exc).__name__
        print(f"warning: {run}: not all removed ({last}); the next run removes it", file=sys.stderr)
