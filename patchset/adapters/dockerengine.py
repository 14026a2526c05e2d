"""The one wrapper around the Docker engine (the ``docker`` SDK; never the docker CLI).

Everything else in patchset reaches Docker through :func:`connect` and :class:`Engine`.
The SDK is untyped and reports some failures as records in a stream rather than as
exceptions (a failed build step, a refused push): both are turned into :class:`DockerError`
here, with one line that names what failed and why.
"""

from __future__ import annotations

import gc
import io
import json
import logging
import os
import tarfile
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, cast

import docker
import docker.errors
import requests
import urllib3.exceptions

from patchset.adapters.closing import Closing
from patchset.errors import DockerError

LOG = logging.getLogger(__name__)

LogSink = Callable[[str], None]
"""Receives the engine's log one line at a time (build steps, push progress)."""

DEFAULT_TIMEOUT = 600.0  # seconds for one API call; streams (build, pull) have none
USER_ENV = "PATCHSET_REGISTRY_USER"
PASSWORD_ENV = "PATCHSET_REGISTRY_PASSWORD"  # noqa: S105 -- a variable name, not a secret
_TAIL = 800  # characters of a failing command's stderr kept in the error line


@dataclass(frozen=True)
class ImageInfo:
    """What patchset needs to know about a local image."""

    id: str  # "sha256:..."
    repo_digests: tuple[str, ...]  # "name@sha256:..." for each registry it came from or went to
    labels: Mapping[str, str] = field(default_factory=dict)
    size: int = 0  # bytes, as the engine reports it
    env: Mapping[str, str] = field(default_factory=dict)
    entrypoint: tuple[str, ...] | None = None
    cmd: tuple[str, ...] | None = None
    tags: tuple[str, ...] = ()


@dataclass(frozen=True)
class CopiedFile:
    """A file copied out of an image: its bytes and its permission bits (0o644, 0o755...)."""

    data: bytes
    mode: int


def _one_line(text: object, limit: int = _TAIL) -> str:
    line = " ".join(str(text).split())
    return line if len(line) <= limit else "..." + line[-limit:]


def _reason(exc: BaseException) -> str:
    """The engine's own words for a failure, without the SDK's request URL noise."""
    if isinstance(exc, docker.errors.APIError):
        explanation = exc.explanation
        if explanation:
            text = (
                explanation.decode(errors="replace")
                if isinstance(explanation, bytes)
                else explanation
            )
            return _one_line(text)
    return _one_line(exc)


@contextmanager
def _engine_call(what: str) -> Iterator[None]:
    """Turn SDK and transport errors raised inside into one DockerError line."""
    try:
        yield
    except DockerError:
        raise
    except (docker.errors.DockerException, requests.RequestException) as exc:
        raise DockerError(f"{what}: {_reason(exc)}") from exc
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        # A stream cut mid-way (the engine died or restarted) surfaces from urllib3.
        raise DockerError(f"{what}: the connection to the engine broke ({_reason(exc)})") from exc


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _strs(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(str(item) for item in value)


def _dict(value: object) -> dict[str, Any]:
    return cast(dict[str, Any], value) if isinstance(value, dict) else {}


def _tar_of(files: Mapping[str, bytes]) -> bytes:
    """A tar archive of `files` (absolute paths) rooted at /, with their folders."""
    buffer = io.BytesIO()
    folders = sorted({str(parent) for path in files for parent in Path(path).parents} - {"/"})
    with tarfile.open(fileobj=buffer, mode="w") as archive:
        for folder in folders:
            info = tarfile.TarInfo(folder.lstrip("/"))
            info.type, info.mode = tarfile.DIRTYPE, 0o755
            archive.addfile(info)
        for path, data in sorted(files.items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.size, info.mode = len(data), 0o644
            archive.addfile(info, io.BytesIO(data))
    return buffer.getvalue()


def split_ref(ref: str) -> tuple[str, str]:
    """``repo[:tag|@digest]`` -> (repo, tag or digest); no tag means ``latest``."""
    if "@" in ref:
        repo, _, digest = ref.rpartition("@")
        return repo, digest
    repo, sep, tag = ref.rpartition(":")
    if sep and "/" not in tag:
        return repo, tag
    return ref, "latest"


def registry_of(ref: str) -> str:
    """The registry host a reference points at, or ``the default registry``."""
    first, sep, _ = ref.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        return first
    return "the default registry"


def registry_auth(auth: Mapping[str, str] | None = None) -> dict[str, str] | None:
    """Credentials to send: `auth` if given, else $PATCHSET_REGISTRY_USER/_PASSWORD if set,
    else None so the SDK takes them from the Docker config (~/.docker/config.json)."""
    if auth is not None:
        return dict(auth)
    user = os.environ.get(USER_ENV)
    if user:
        return {"username": user, "password": os.environ.get(PASSWORD_ENV, "")}
    return None


def _where(base_url: str | None) -> str:
    return base_url or os.environ.get("DOCKER_HOST") or "unix:///var/run/docker.sock"


def connect(base_url: str | None = None, *, timeout: float = DEFAULT_TIMEOUT) -> Engine:
    """An Engine talking to `base_url`, else $DOCKER_HOST, else the local socket."""
    where = _where(base_url)
    if where.startswith("unix://") and not Path(where.removeprefix("unix://")).exists():
        raise DockerError(
            f"cannot reach a Docker engine at {where}: no such socket;"
            " start dockerd or set DOCKER_HOST"
        )
    reason = ""
    try:
        if base_url:
            client = docker.DockerClient(base_url=base_url, version="auto", timeout=int(timeout))
        else:
            client = docker.from_env(version="auto", timeout=int(timeout))
        client.ping()
    except (docker.errors.DockerException, requests.RequestException) as exc:
        reason = _reason(exc)
    if reason:
        # docker-py's unix-socket connection does not close its socket when connect() fails;
        # collect it here, quietly, rather than warn about it somewhere later.
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", ResourceWarning)
            gc.collect()
        raise DockerError(
            f"cannot reach a Docker engine at {where}: {reason}; start dockerd or set DOCKER_HOST"
        )
    return Engine(client)


class _ChunkReader(io.RawIOBase):
    """A read-only file over an iterator of byte chunks, so tarfile can stream it."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._buffer = b""

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: Any) -> int:
        view = memoryview(buffer).cast("B")
        while not self._buffer:
            try:
                self._buffer = next(self._chunks)
            except StopIteration:
                return 0
        size = min(len(view), len(self._buffer))
        view[:size] = self._buffer[:size]
        self._buffer = self._buffer[size:]
        return size


class Engine(Closing):
    """A connected Docker engine. Methods raise DockerError with one line on any failure."""

    def __init__(self, client: Any) -> None:
        self.client: Any = client  # docker.DockerClient; use the methods below instead
        self.api: Any = client.api  # docker.APIClient, for the streaming calls

    def close(self) -> None:
        self.client.close()

    # -- images ------------------------------------------------------------------------------

    def image_exists(self, ref: str) -> bool:
        try:
            self.api.inspect_image(ref)
        except docker.errors.ImageNotFound:
            return False
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise DockerError(f"cannot inspect image {ref}: {_reason(exc)}") from exc
        return True

    def inspect(self, ref: str) -> ImageInfo:
        """The local image `ref`; DockerError if there is none."""
        try:
            data = _dict(self.api.inspect_image(ref))
        except docker.errors.ImageNotFound as exc:
            raise DockerError(f"no local image {ref}") from exc
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise DockerError(f"cannot inspect image {ref}: {_reason(exc)}") from exc
        config = _dict(data.get("Config"))
        env = {}
        for item in _strs(config.get("Env")):
            key, _, value = item.partition("=")
            env[key] = value
        labels = {str(k): str(v) for k, v in _dict(config.get("Labels")).items()}
        entrypoint = config.get("Entrypoint")
        cmd = config.get("Cmd")
        size = data.get("Size")
        return ImageInfo(
            id=_str(data.get("Id")),
            repo_digests=_strs(data.get("RepoDigests")),
            labels=labels,
            size=size if isinstance(size, int) else 0,
            env=env,
            entrypoint=_strs(entrypoint) if isinstance(entrypoint, list) else None,
            cmd=_strs(cmd) if isinstance(cmd, list) else None,
            tags=_strs(data.get("RepoTags")),
        )

    def ensure_image(self, ref: str, *, on_log: LogSink | None = None) -> ImageInfo:
        """The image `ref`, pulled first if it is not local (credentials as `push` finds them
        without `auth`: $PATCHSET_REGISTRY_USER/_PASSWORD, else the Docker config)."""
        if not self.image_exists(ref):
            what = f"cannot pull {ref} from {registry_of(ref)}"
            self._transfer(self.api.pull, ref, what, None, on_log)
        return self.inspect(ref)

    def tag(self, image_id: str, ref: str) -> None:
        repo, tag = split_ref(ref)
        with _engine_call(f"cannot tag {image_id} as {ref}"):
            if not self.api.tag(image_id, repo, tag=tag, force=True):
                raise DockerError(f"cannot tag {image_id} as {ref}: the engine refused")

    def untag(self, ref: str) -> None:
        """Remove the name `ref`; the image goes too when nothing else refers to it."""
        with _engine_call(f"cannot untag {ref}"):
            try:
                self.api.remove_image(ref, force=False, noprune=False)
            except docker.errors.ImageNotFound:
                return

    def remove_image(self, ref: str) -> None:
        """Remove the image `ref` names, with all its tags; nothing to do if it is gone."""
        with _engine_call(f"cannot remove image {ref}"):
            try:
                image_id = _str(_dict(self.api.inspect_image(ref)).get("Id"))
                self.api.remove_image(image_id, force=True, noprune=False)
            except docker.errors.ImageNotFound:
                return

    def image_size(self, ref: str) -> int:
        return self.inspect(ref).size

    # -- build and push ----------------------------------------------------------------------

    def build(
        self,
        context_dir: Path | str,
        tags: Sequence[str] = (),
        *,
        dockerfile: str = "Dockerfile",
        labels: Mapping[str, str] | None = None,
        buildargs: Mapping[str, str] | None = None,
        nocache: bool = False,
        network: bool = True,
        on_log: LogSink | None = None,
    ) -> str:
        """Build `context_dir` and return the image id; tag it with each of `tags` only
        once the whole build succeeded. The log is streamed to `on_log` line by line.
        `network=False` runs the RUN steps with no network at all."""
        context = Path(context_dir)
        what = f"docker build of {context} failed"
        if not context.is_dir():
            raise DockerError(f"{what}: no such folder")
        last_step = ""
        image_id = ""
        with _engine_call(what):
            stream = self.api.build(
                path=str(context),
                dockerfile=dockerfile,
                labels=dict(labels or {}),
                buildargs=dict(buildargs or {}),
                nocache=nocache,
                rm=True,
                forcerm=True,
                pull=False,
                network_mode=None if network else "none",
                decode=True,
            )
            failure = ""
            # An error record ends the build; reading on to the end of the stream (rather
            # than raising at once) lets the SDK close its connection.
            for record in stream:
                entry = _dict(record)
                error = self._error_of(entry)
                if error and not failure:
                    step = f" at {last_step!r}" if last_step else ""
                    failure = f"{what}{step}: {error}"
                if failure:
                    continue
                aux_id = _str(_dict(entry.get("aux")).get("ID"))
                if aux_id:
                    image_id = aux_id
                text = _str(entry.get("stream"))
                for line in text.splitlines():
                    if line.startswith("Step "):
                        last_step = line
                    if line.startswith("Successfully built ") and not image_id:
                        image_id = line.split()[-1]
                    if on_log is not None and line.strip():
                        on_log(line)
        if failure:
            raise DockerError(failure)
        if not image_id:
            raise DockerError(f"{what}: the engine reported no image id")
        full_id = self.inspect(image_id).id
        for ref in tags:
            self.tag(full_id, ref)
        return full_id

    def push(
        self,
        ref: str,
        *,
        auth: Mapping[str, str] | None = None,
        on_log: LogSink | None = None,
    ) -> str:
        """Push `ref` to its registry and return the manifest digest the registry reported
        ("sha256:..."). Credentials: `auth`, else $PATCHSET_REGISTRY_USER/_PASSWORD, else
        the Docker config."""
        what = f"{registry_of(ref)} refused the push of {ref}"
        records = self._transfer(self.api.push, ref, what, auth, on_log)
        for entry in reversed(records):
            digest = _str(_dict(entry.get("aux")).get("Digest"))
            if digest:
                return digest
        raise DockerError(f"{what}: the engine reported no digest")

    @staticmethod
    def _error_of(entry: Mapping[str, Any]) -> str:
        detail = _dict(entry.get("errorDetail"))
        message = _str(detail.get("message")) or _str(entry.get("error"))
        if message or "error" in entry or "errorDetail" in entry:
            return _one_line(message or json.dumps(dict(entry)))
        return ""

    def _transfer(
        self,
        call: Callable[..., Iterable[Any]],
        ref: str,
        what: str,
        auth: Mapping[str, str] | None,
        on_log: LogSink | None,
    ) -> list[dict[str, Any]]:
        """A pull or a push of `ref` (the engine's `call`) with the registry's credentials:
        its record stream read to the end, status lines logged; a DockerError saying `what`
        on an error record. Returns the records with an "aux" part."""
        repo, tag = split_ref(ref)
        with _engine_call(what):
            stream = call(repo, tag=tag, stream=True, decode=True, auth_config=registry_auth(auth))
            return self._follow(stream, what, on_log)

    def _follow(
        self, stream: Iterable[Any], what: str, on_log: LogSink | None
    ) -> list[dict[str, Any]]:
        kept: list[dict[str, Any]] = []
        failure = ""
        for record in stream:  # read to the end even after an error: see build()
            entry = _dict(record)
            error = self._error_of(entry)
            if error and not failure:
                failure = f"{what}: {error}"
            if failure:
                continue
            if "aux" in entry:
                kept.append(entry)
            status = _str(entry.get("status"))
            # Byte-by-byte progress records are noise in a log; keep the state changes.
            if on_log is not None and status and not _dict(entry.get("progressDetail")):
                layer = _str(entry.get("id"))
                on_log(f"{layer}: {status}" if layer else status)
        if failure:
            raise DockerError(failure)
        return kept

    # -- containers --------------------------------------------------------------------------

    @contextmanager
    def _container(self, image: str, what: str, **options: Any) -> Iterator[Any]:
        with _engine_call(what):
            container = self.client.containers.create(image, **options)
        try:
            yield container
        finally:
            try:
                container.remove(force=True)
            except (docker.errors.DockerException, requests.RequestException) as exc:
                LOG.warning("could not remove container %s: %s", container.id, _reason(exc))

    def run_python(
        self,
        image: str,
        code: str,
        *,
        network: bool = False,
        timeout: float = 300.0,
        environment: Mapping[str, str] | None = None,
        files: Mapping[str, bytes] | None = None,
    ) -> str:
        """Run ``python3 -c code`` in a throwaway container of `image` and return its stdout.
        With network=False the container has no network at all (``--network none``);
        `environment` is set in it, and `files` (absolute path: bytes, mode 644, their
        folders 755) are copied in before it starts."""
        what = f"python3 in {image} failed"
        with (
            self._container(
                image,
                what,
                entrypoint=["python3", "-c", code],
                environment=dict(environment or {}),
                **({} if network else {"network_mode": "none"}),
            ) as container,
            _engine_call(what),
        ):
            if files and not container.put_archive("/", _tar_of(files)):
                raise DockerError(f"{what}: the engine refused the files copied in")
            container.start()
            try:
                result = _dict(container.wait(timeout=timeout))
            except requests.RequestException as exc:
                raise DockerError(f"{what}: no exit within {timeout:.0f} s") from exc
            stdout = container.logs(stdout=True, stderr=False)
            stderr = container.logs(stdout=False, stderr=True)
        status = result.get("StatusCode")
        out = stdout.decode(errors="replace") if isinstance(stdout, bytes) else ""
        if status != 0:
            err = stderr.decode(errors="replace") if isinstance(stderr, bytes) else ""
            raise DockerError(
                f"{what} with exit status {status}: {_one_line(err) or '(no stderr)'}"
            )
        return out

    def copy_out(self, image: str, paths: Sequence[str]) -> dict[str, bytes | None]:
        """The bytes of each file in `paths` (absolute paths in `image`), None where the
        image has no such file. The container is created, never started, and removed."""
        return {
            path: None if found is None else found.data
            for path, found in self.copy_files(image, paths).items()
        }

    def copy_files(self, image: str, paths: Sequence[str]) -> dict[str, CopiedFile | None]:
        """Each file in `paths` (absolute paths in `image`) with its permission bits, None
        where the image has no such file (as `copy_out`)."""
        found: dict[str, CopiedFile | None] = {}
        with self._container(
            image, f"cannot copy files out of {image}", entrypoint=["/bin/true"]
        ) as container:
            for path in paths:
                files = self._members(container, path, image, keep=None)
                name = path.rstrip("/").rpartition("/")[2]
                found[path] = None if files is None else files.get(name)
        return found

    def copy_tree(
        self, image: str, folder: str, *, suffixes: Sequence[str] | None = None
    ) -> dict[str, bytes] | None:
        """Every regular file under `folder` in `image`, keyed by its path relative to the
        folder's parent (``vllm/__init__.py`` for folder ``/.../vllm``); only names ending
        in one of `suffixes` when given. None if the image has no such folder. The archive
        is streamed, so only the kept files are held in memory."""
        with self._container(
            image, f"cannot copy {folder} out of {image}", entrypoint=["/bin/true"]
        ) as container:
            return self._archive(container, folder, image, keep=tuple(suffixes or ()) or None)

    def _archive(
        self, container: Any, path: str, image: str, *, keep: tuple[str, ...] | None
    ) -> dict[str, bytes] | None:
        files = self._members(container, path, image, keep=keep)
        return None if files is None else {name: f.data for name, f in files.items()}

    def _members(
        self, container: Any, path: str, image: str, *, keep: tuple[str, ...] | None
    ) -> dict[str, CopiedFile] | None:
        what = f"cannot copy {path} out of {image}"
        try:
            chunks, _stat = container.get_archive(path)
        except docker.errors.NotFound:
            return None
        except (docker.errors.DockerException, requests.RequestException) as exc:
            raise DockerError(f"{what}: {_reason(exc)}") from exc
        files: dict[str, CopiedFile] = {}
        try:
            with tarfile.open(fileobj=_ChunkReader(chunks), mode="r|") as archive:
                for member in archive:
                    if not member.isfile() or (keep and not member.name.endswith(keep)):
                        continue
                    handle = archive.extractfile(member)
                    if handle is not None:
                        files[member.name] = CopiedFile(handle.read(), member.mode & 0o7777)
        except (tarfile.TarError, requests.RequestException) as exc:
            raise DockerError(f"{what}: {_one_line(exc)}") from exc
        return files
