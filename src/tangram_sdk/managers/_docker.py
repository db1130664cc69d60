"""A thin async Docker Engine client: the ONLY module that imports aiodocker.

Why a wrapper at all: (1) one place translates every aiodocker/aiohttp/OS/timeout failure into
:class:`~tangram_sdk.errors.DockerError` naming the container and the operation; (2) every API call
has a deadline, so a hung or dead daemon yields a clear error instead of a hang; (3) after a
connection failure the next call opens a fresh session, so the client recovers when the daemon is
restarted; (4) the private ``POST /containers/{id}/update`` call lives in exactly one function,
:meth:`DockerClient.update_cpu`; (5) container ids and names are validated before they reach a URL.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
import attrs

from ..errors import DockerError, SpecError
from ..lease import ExecResult
from .process import check_argv as _check_argv

__all__ = ["LABEL", "ContainerInfo", "DockerClient", "is_connection_error", "is_not_found", "kill_tree", "validate_ref"]

LABEL = "tangram_sdk"  # every container we create carries ``tangram_sdk=1`` so leaks can be found
_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:@+-]{0,254}")


def validate_ref(ref: str) -> str:
    """A container id or name as Docker accepts them; nothing else may reach an URL path."""
    if not isinstance(ref, str) or not _REF_RE.fullmatch(ref):
        raise SpecError(f"container must be a Docker id or name, got {ref!r}")
    return ref


@attrs.frozen
class ContainerInfo:
    """The parts of ``docker inspect`` the CPU manager needs."""

    id: str
    name: str
    running: bool
    status: str
    pid: int
    cpuset: str
    cpu_quota: int
    cpu_period: int
    labels: Mapping[str, str]


def _info(data: Mapping[str, Any]) -> ContainerInfo:
    state = data.get("State") or {}
    hc = data.get("HostConfig") or {}
    return ContainerInfo(
        id=str(data["Id"]),
        name=str(data.get("Name", "")).lstrip("/"),
        running=bool(state.get("Running")) and not bool(state.get("Paused")),
        status=str(state.get("Status", "unknown")),
        pid=int(state.get("Pid") or 0),
        cpuset=str(hc.get("CpusetCpus") or ""),
        cpu_quota=int(hc.get("CpuQuota") or 0),
        cpu_period=int(hc.get("CpuPeriod") or 0),
        labels=dict((data.get("Config") or {}).get("Labels") or {}),
    )


class _Conn:
    """One aiodocker session plus a count of calls using it, so a stale session is closed only
    after its last in-flight call (a timeout in one call must not abort another's exec stream)."""

    __slots__ = ("docker", "inflight", "stale")

    def __init__(self, docker: aiodocker.Docker) -> None:
        self.docker = docker
        self.inflight = 0
        self.stale = False


class DockerClient:
    """Async Docker client with per-call deadlines and automatic session renewal.

    ``url`` is a Docker host (``unix:///var/run/docker.sock``); None uses aiodocker's discovery
    (``DOCKER_HOST``, then the default socket). ``api_timeout`` bounds every non-streaming call.
    """

    def __init__(self, url: str | None = None, *, api_timeout: float = 30.0) -> None:
        self.url = url
        self.api_timeout = api_timeout
        self._conn: _Conn | None = None
        self._stale: list[_Conn] = []
        self._api_version = "auto"

    def __repr__(self) -> str:
        return f"<DockerClient {self.url or 'default'} api={self._api_version}>"

    # -- session handling -----------------------------------------------------------------------
    def _open(self) -> _Conn:
        if self._conn is None:
            try:
                docker = aiodocker.Docker(url=self.url, api_version=self._api_version)
            except (ValueError, OSError) as exc:
                raise DockerError(f"cannot reach the Docker daemon ({self.url or 'default'}): {exc}") from exc
            self._conn = _Conn(docker)
        return self._conn

    async def _retire(self, conn: _Conn) -> None:
        """Drop a session after a connection failure; the next call opens a fresh one."""
        if self._conn is conn:
            self._conn = None
        conn.stale = True
        if conn.inflight == 0:
            await _close_quietly(conn.docker)
        elif conn not in self._stale:
            self._stale.append(conn)

    @asynccontextmanager
    async def _session(self, op: str, ref: str | None) -> AsyncIterator[aiodocker.Docker]:
        """Yield a session; translate failures into DockerError naming ``op`` and ``ref``."""
        conn = self._open()
        conn.inflight += 1
        broken = False
        try:
            yield conn.docker
            if self._api_version == "auto" and conn.docker.api_version != "auto":
                self._api_version = conn.docker.api_version  # skip the version probe next session
        except aiodocker.DockerError as exc:
            broken = exc.status == 900  # aiodocker's "cannot connect"
            raise _translate(op, ref, exc) from exc
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError) as exc:
            broken = True
            raise _translate(op, ref, exc) from exc
        finally:
            conn.inflight -= 1
            if broken:
                await self._retire(conn)
            elif conn.stale and conn.inflight == 0:
                await _close_quietly(conn.docker)
                if conn in self._stale:
                    self._stale.remove(conn)

    async def _call(self, op: str, ref: str | None, fn: Any, *, retry: bool = False) -> Any:
        """Run ``fn(docker)`` with the API deadline; retry once on a broken connection when the
        operation is idempotent (a restarted daemon leaves dead keep-alive connections behind)."""
        for attempt in (0, 1):
            try:
                async with self._session(op, ref) as docker:
                    return await asyncio.wait_for(fn(docker), self.api_timeout)
            except DockerError as exc:
                if not (retry and attempt == 0 and is_connection_error(exc)):
                    raise
        raise AssertionError("unreachable")

    async def close(self) -> None:
        """Close every session (idempotent; a later call reopens one)."""
        conns = [c for c in [self._conn, *self._stale] if c is not None]
        self._conn = None
        self._stale.clear()
        for c in conns:
            await _close_quietly(c.docker)

    # -- operations -----------------------------------------------------------------------------
    async def ping(self) -> str:
        """Return the daemon's version string; DockerError when unreachable."""
        data = await self._call("version", None, lambda d: d.version(), retry=True)
        return str(data.get("Version", "?"))

    async def inspect(self, ref: str) -> ContainerInfo:
        validate_ref(ref)
        data = await self._call("inspect", ref, lambda d: d.containers.container(ref).show(), retry=True)
        return _info(data)

    async def create(
        self,
        image: str,
        cmd: Sequence[str],
        *,
        name: str | None = None,
        cpuset: str | None = None,
        cpu_quota: int | None = None,
        cpu_period: int | None = None,
        memory: int | None = None,
        env: Mapping[str, str] | None = None,
        labels: Mapping[str, str] | None = None,
        init: bool = False,
    ) -> str:
        """Create (not start) a container with no network and our label; return its full id."""
        if not isinstance(image, str) or not _IMAGE_RE.fullmatch(image):
            raise SpecError(f"image must be a Docker image reference, got {image!r}")
        if name is not None:
            validate_ref(name)
        host: dict[str, Any] = {"NetworkMode": "none"}
        if cpuset is not None:
            host["CpusetCpus"] = cpuset
        if cpu_quota is not None:
            host["CpuQuota"] = cpu_quota
        if cpu_period is not None:
            host["CpuPeriod"] = cpu_period
        if memory:
            host["Memory"] = memory
        if init:
            host["Init"] = True  # docker-init reaps zombies left by killed execs
        config: dict[str, Any] = {
            "Image": image,
            "Cmd": list(cmd),
            "Labels": {**(labels or {}), LABEL: "1"},
            "NetworkDisabled": True,
            "HostConfig": host,
        }
        if env:
            config["Env"] = [f"{k}={v}" for k, v in env.items()]
        container = await self._call(
            "create", name or image, lambda d: d.containers.create(config, name=name)
        )
        return str(container.id)

    async def start(self, ref: str) -> None:
        validate_ref(ref)
        await self._call("start", ref, lambda d: d.containers.container(ref).start())

    async def remove(self, ref: str) -> None:
        """Force-remove (SIGKILL first); a container that is already gone is not an error."""
        validate_ref(ref)
        try:
            await self._call("remove", ref, lambda d: d.containers.container(ref).delete(force=True, v=True))
        except DockerError as exc:
            if not is_not_found(exc):
                raise

    async def list_labeled(self) -> list[str]:
        """Ids of every container (running or not) that carries our label: for leak checks."""
        filters = json.dumps({"label": [f"{LABEL}=1"]})
        items = await self._call("list", None, lambda d: d.containers.list(all=True, filters=filters), retry=True)
        return [str(c.id) for c in items]

    async def update_cpu(self, ref: str, cpuset: str, quota_us: int, period_us: int) -> None:
        """The one private-API call: ``POST /containers/{id}/update`` with the CPU fields.

        aiodocker has no public wrapper for it, so it goes through ``_query_json`` here and
        nowhere else. The daemon both writes the cgroup files and records the new HostConfig."""
        validate_ref(ref)
        body = {"CpusetCpus": cpuset, "CpuQuota": quota_us, "CpuPeriod": period_us}
        await self._call(
            "update", ref,
            lambda d: d._query_json(f"containers/{ref}/update", method="POST", data=body),
            retry=True,
        )

    async def exec(
        self,
        ref: str,
        cmd: Sequence[str],
        *,
        timeout: float | None = None,
        max_output: int = 1 << 20,
        env: Mapping[str, str] | None = None,
        workdir: str | None = None,
        user: str = "",
    ) -> ExecResult:
        """Run ``cmd`` in the container; keep at most ``max_output`` bytes per stream.

        On timeout or cancellation the exec's process tree is SIGKILLed from the host (its host
        pid comes from ``exec inspect``; the pid is checked to still belong to this container)."""
        validate_ref(ref)
        argv = _check_argv(cmd)
        started = time.monotonic()
        async with self._session("exec", ref) as docker:
            try:
                ex = await asyncio.wait_for(
                    docker.containers.container(ref).exec(
                        argv, stdout=True, stderr=True, environment=env, workdir=workdir, user=user
                    ),
                    self.api_timeout,
                )
            except asyncio.TimeoutError as exc:
                raise _translate("exec create", ref, exc) from exc
            out, err = bytearray(), bytearray()
            truncated = timed_out = False
            stream = ex.start(detach=False)

            async def pump() -> None:
                nonlocal truncated
                async with stream:
                    while True:
                        msg = await stream.read_out()
                        if msg is None:
                            return
                        buf = out if msg.stream == 1 else err
                        room = max_output - len(buf)
                        if room > 0:
                            buf += msg.data[:room]
                        if len(msg.data) > room:
                            truncated = True

            task = asyncio.ensure_future(pump())
            try:
                try:
                    await asyncio.wait_for(asyncio.shield(task), timeout)
                except asyncio.TimeoutError:
                    timed_out = True
                    await self._kill_exec(ex, ref)
                    try:
                        await asyncio.wait_for(asyncio.shield(task), 10.0)
                    except asyncio.TimeoutError:
                        task.cancel()
                code = await self._exit_code(ex, ref)
            except BaseException:
                if not task.done():
                    await asyncio.shield(self._kill_exec(ex, ref))
                    task.cancel()
                raise
        return ExecResult(
            exit_code=code, stdout=bytes(out), stderr=bytes(err), duration_s=time.monotonic() - started,
            truncated=truncated, timed_out=timed_out,
        )

    async def _exit_code(self, ex: Any, ref: str) -> int:
        """The exec's exit code; the stream can end a moment before the daemon records it."""
        for _ in range(100):
            info = await asyncio.wait_for(ex.inspect(), self.api_timeout)
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            await asyncio.sleep(0.01)
        raise DockerError(f"exec in container {ref!r}: no exit code after the output ended", resource=ref)

    async def _kill_exec(self, ex: Any, ref: str) -> None:
        try:
            info = await asyncio.wait_for(ex.inspect(), self.api_timeout)
            container = await self.inspect(ref)
        except (DockerError, aiodocker.DockerError, aiohttp.ClientError, OSError, asyncio.TimeoutError):
            return
        pid = int(info.get("Pid") or 0)
        if pid > 0:
            kill_tree(pid, container.id)


def kill_tree(pid: int, container_id: str, proc: Path = Path("/proc")) -> int:
    """SIGKILL ``pid`` and its descendants if ``pid`` still belongs to ``container_id``.

    Works when the daemon shares our pid namespace (the local-daemon case the fast path needs
    anyway); otherwise nothing is found and the caller just stops reading. Returns kill count."""
    try:
        if container_id not in (proc / str(pid) / "cgroup").read_text():
            return 0  # pid reused by another process, or a remote daemon
    except OSError:
        return 0
    killed = 0
    for _ in range(3):  # a forking process can add children between scans
        victims = _descendants(pid, proc)
        if not victims:
            break
        for v in victims:
            try:
                os.kill(v, signal.SIGKILL)
                killed += 1
            except (ProcessLookupError, PermissionError):
                pass
    return killed


def _descendants(root: int, proc: Path) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[-1].split()
        if len(fields) > 1:
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, todo = [], [root]
    while todo:
        p = todo.pop()
        if (proc / str(p)).exists():
            out.append(p)
        todo.extend(children.get(p, []))
    return out




class _CallError(DockerError):
    """A DockerError that remembers the HTTP status and whether the connection broke (private:
    callers see a plain DockerError; the client uses these to retry and to treat 404 as gone)."""

    def __init__(self, message: str, *, resource: str | None, status: int | None, connection: bool) -> None:
        super().__init__(message, resource=resource)
        self.status = status
        self.connection = connection


def is_not_found(exc: DockerError) -> bool:
    """True when the daemon answered 404 (no such container)."""
    return isinstance(exc, _CallError) and exc.status == 404


def is_connection_error(exc: DockerError) -> bool:
    """True when the daemon could not be reached or did not answer in time."""
    return isinstance(exc, _CallError) and exc.connection


def _translate(op: str, ref: str | None, exc: BaseException) -> DockerError:
    where = f" container {ref!r}" if ref else ""
    status: int | None = None
    connection = False
    if isinstance(exc, aiodocker.DockerError):
        status = exc.status
        connection = status == 900
        if status == 404:
            msg = f"Docker {op}:{where} not found ({exc.message})"
        elif status == 409:
            msg = f"Docker {op}:{where} is not running or conflicts ({exc.message})"
        elif connection:
            msg = f"Docker {op}:{where}: daemon unreachable ({exc.message})"
        else:
            msg = f"Docker {op}:{where} failed with HTTP {status}: {exc.message}"
    elif isinstance(exc, asyncio.TimeoutError):
        connection = True
        msg = f"Docker {op}:{where}: the daemon did not answer in time"
    else:
        connection = True
        msg = f"Docker {op}:{where}: daemon unreachable ({type(exc).__name__}: {exc})"
    return _CallError(msg, resource=ref, status=status, connection=connection)


async def _close_quietly(docker: aiodocker.Docker) -> None:
    try:
        await docker.close()
    except (aiohttp.ClientError, OSError, RuntimeError) as exc:  # a dead daemon's session may fail to close
        logging.getLogger(__name__).debug("closing a Docker session failed: %r", exc)
