"""A thin async Docker Engine client: the ONLY module that imports aiodocker.

Why a wrapper at all: (1) one place translates every aiodocker/aiohttp/OS/timeout failure into
:class:`~tangram_sdk.errors.DockerError` naming the container and the operation; (2) every API call
has a deadline, so a hung or dead daemon yields a clear error instead of a hang; (3) after a
connection failure the next call opens a fresh session, so the client recovers when the daemon is
restarted; (4) the private ``POST /containers/{id}/update`` call lives in exactly one function,
:meth:`DockerClient.update` (``update_cpu``/``update_memory`` call it; the one-shot stats sample
and the bounded ``oom`` events query also use aiodocker's ``_query``, which has no wrapper taking
``one-shot``/``until``); (5) container ids and names are validated before they reach a URL.

Deadlines: every call has a *total* deadline of ``api_timeout`` (a retry after a refused connection
only uses what is left of it; a call that timed out is not retried). ``exec(timeout=T)`` returns
``timed_out=True`` within about T + 1 s and kills its command even when the daemon is frozen: the
command's processes are found through the container's cgroup, not through the daemon. An exec
without a timeout pings the daemon while the command runs and fails with DockerError once a ping
goes unanswered for ``api_timeout`` (the command is killed the same way). Every wait uses
:mod:`tangram_sdk._deadline` (never ``asyncio.wait_for``), so a cancel is never swallowed.

A failed call's DockerError says (:func:`never_sent`) whether it certainly never reached the
daemon (no socket, connection refused): only then did it change nothing. A call that timed out
may still be carried out (a frozen dockerd applies it once it runs again), and one whose
connection dropped may have been (a daemon dying between doing an update and answering it).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import logging
import os
import re
import signal
import time
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import aiodocker
import aiohttp
import attrs

from .._deadline import check_timeout, settle, within
from ..errors import DockerError, SpecError
from ..process import ExecResult
from ..process import check_argv as _check_argv
from ..process import check_env, check_max_output, check_stdin

__all__ = ["LABEL", "MIN_MEMORY", "UNLIMITED", "ContainerInfo", "DockerClient", "is_connection_error",
           "is_memory_busy", "is_not_found", "kill_tree", "never_sent", "validate_ref"]

LABEL = "tangram_sdk"  # every container we create carries ``tangram_sdk=1`` so leaks can be found
# The Engine API refuses Memory=-1 ("Minimum memory limit allowed is 6MB") and reads 0 as
# "unchanged", so "no limit" is sent as the kernel's own unlimited value (PAGE_COUNTER_MAX pages).
UNLIMITED = 9223372036854771712
MIN_MEMORY = 6 * 2**20  # the smallest memory limit the Docker Engine API accepts (bytes)
_REF_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,127}")
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:@+-]{0,254}")
_FULL_ID_RE = re.compile(r"[0-9a-f]{64}")
KILLED = 137  # the exit code of a SIGKILLed command, as Docker reports it
# after an exec killed by SIGKILL: how long a stop/removal may take to show (0.3 s until stop 54,
# when a `docker stop` on a loaded CI machine was still "running" past it and the kill read as the
# command's own; a command's own SIGKILL or OOM kill waits this long before its result returns;
# 1.0 until stop 63, when CI on a machine running ~50 % slower than usual saw a `docker restart -t 0`
# still "running" with its old start time past it)
_STOP_SEEN_S = 2.0
_RESTART_SEEN_S = 2.0  # ... and how long a stopped container may take to start again (a restart)
_STAMP_RE = re.compile(r"(\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d)(?:\.(\d+))?(Z|z|[+-]\d\d:\d\d)")
_KILL_BOUND = 0.3  # seconds for the exec inspect that finds the command's pid after a timeout
_STDIN_POLL = 0.25  # seconds between checks that a command fed stdin still runs (see exec)
_START_BOUND = 1.0  # seconds to wait for a started exec's pid to appear (a start still in flight
                    # when the timeout or cancel came: the daemon may start it just after)
_DRAIN_BOUND = 0.3  # seconds for the output stream to end once the command is killed


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
    memory: int | None = None  # HostConfig.Memory; None: unlimited (0 or the kernel's unlimited value)
    memory_swap: int | None = None  # HostConfig.MemorySwap (memory + swap); None: unlimited or unset
    started_at: float | None = None  # State.StartedAt as Unix seconds (the daemon's clock); None: never started


def _rfc3339(stamp: Any) -> float | None:
    """Docker's ``2026-12-03T18:40:12.123456789Z`` (nanoseconds, any offset) as Unix seconds;
    None for its zero time or anything unreadable (Python 3.10 parses neither ``Z`` nor 9 digits)."""
    if not isinstance(stamp, str) or stamp.startswith("0001-"):
        return None
    m = _STAMP_RE.fullmatch(stamp)
    if m is None:
        return None
    base, frac, zone = m.groups()
    try:
        t = datetime.datetime.fromisoformat(base + ("+00:00" if zone in ("Z", "z") else zone))
    except ValueError:
        return None
    return t.timestamp() + (float("0." + frac) if frac else 0.0)


def _limit(value: Any) -> int | None:
    """Docker's memory numbers -> bytes, or None for unlimited (0, -1, or the kernel's maximum)."""
    v = int(value or 0)
    return None if v <= 0 or v >= UNLIMITED else v


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
        memory=_limit(hc.get("Memory")),
        memory_swap=_limit(hc.get("MemorySwap")),
        started_at=_rfc3339(state.get("StartedAt")),
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
        limit = check_timeout(api_timeout, "api_timeout")
        if limit is None or limit <= 0:
            raise SpecError(f"api_timeout must be a finite number of seconds > 0, got {api_timeout!r}")
        self.api_timeout = limit
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
                err = DockerError(f"cannot reach the Docker daemon ({self.url or 'default'}): {exc}")
                err._unsent = True  # type: ignore[attr-defined]
                raise err from exc
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
        except (aiohttp.ClientError, OSError, asyncio.TimeoutError, TimeoutError) as exc:
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

    async def _call(self, op: str, ref: str | None, fn: Any, *, retry: bool = False,
                    timeout: float | None = None) -> Any:
        """Run ``fn(docker)`` within one total deadline (``api_timeout`` unless ``timeout``); an
        idempotent call is retried once after a *refused or dropped* connection (a restarted daemon
        leaves dead keep-alive connections behind), in what is left of the deadline. A call that
        timed out is not retried: a frozen daemon costs one deadline, not two."""
        loop = asyncio.get_running_loop()
        bound = self.api_timeout if timeout is None else timeout
        deadline = loop.time() + bound
        reached = False  # some attempt may have reached the daemon (so it may carry the call out)
        for attempt in (0, 1):
            left = deadline - loop.time()
            try:
                async with self._session(op, ref) as docker:
                    return await within(fn(docker), max(0.0, left), lambda: f"no answer within {bound:g} s")
            except DockerError as exc:
                reached = reached or not never_sent(exc)
                if not (retry and attempt == 0 and exc.connection and not is_timeout(exc)
                        and deadline - loop.time() > 0.05):
                    if reached:
                        exc._unsent = False  # type: ignore[attr-defined]
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
    async def ping(self, timeout: float | None = None) -> str:
        """Return the daemon's version string; DockerError when unreachable or silent."""
        data = await self._call("version", None, lambda d: d.version(), retry=True, timeout=timeout)
        return str(data.get("Version", "?"))

    async def ncpu(self) -> int:
        """How many CPUs the daemon's host has (``docker info`` NCPU): cores 0..NCPU-1."""
        data = await self._call("info", None, lambda d: d.system.info(), retry=True)
        return int(data.get("NCPU") or 0)

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

    async def update(self, ref: str, body: Mapping[str, Any]) -> None:
        """The one private-API call: ``POST /containers/{id}/update`` with resource fields.

        aiodocker has no public wrapper for it, so it goes through ``_query_json`` here and
        nowhere else. The daemon both writes the cgroup files and records the new HostConfig."""
        validate_ref(ref)
        data = dict(body)
        await self._call(
            "update", ref,
            lambda d: d._query_json(f"containers/{ref}/update", method="POST", data=data),
            retry=True,
        )

    async def update_cpu(self, ref: str, cpuset: str, quota_us: int, period_us: int) -> None:
        """Set the cpuset and CFS bandwidth (see :meth:`update`)."""
        await self.update(ref, {"CpusetCpus": cpuset, "CpuQuota": quota_us, "CpuPeriod": period_us})

    async def update_memory(self, ref: str, memory: int | None, memory_swap: int | None) -> None:
        """Set the memory limit and memory + swap (None: unlimited, sent as :data:`UNLIMITED`).

        A limit below what the container holds and cannot free makes the daemon (runc) fail with
        "unable to set memory limit"; that DockerError is passed on (see :func:`is_memory_busy`)."""
        mem = UNLIMITED if memory is None else int(memory)
        swap = UNLIMITED if memory_swap is None else int(memory_swap)
        await self.update(ref, {"Memory": mem, "MemorySwap": max(mem, swap)})

    async def memory_stats(self, ref: str) -> dict[str, Any]:
        """One ``GET /containers/{id}/stats?stream=false&one-shot=true`` sample's ``memory_stats``
        (``usage``, ``limit``, and ``max_usage`` on cgroup v1: the container's lifetime peak)."""
        validate_ref(ref)
        data = await self._call(
            "stats", ref,
            lambda d: d._query_json(f"containers/{ref}/stats", params={"stream": "false", "one-shot": "true"}),
            retry=True,
        )
        return dict((data or {}).get("memory_stats") or {})

    async def oom_events(self, container_id: str, since: float, until: float) -> int:
        """How many ``oom`` events the daemon logged for the container in [since, until] (unix
        seconds). ``until`` may lie a little in the future: the call then waits for it, so an
        event still on its way from containerd is counted."""
        validate_ref(container_id)
        params = {"since": f"{since:.6f}", "until": f"{until:.6f}",
                  "filters": json.dumps({"container": [container_id], "event": ["oom"]})}

        async def count(d: aiodocker.Docker) -> int:
            async with d._query("events", params=params) as resp:
                body = await resp.text()
            return sum(1 for line in body.splitlines() if '"oom"' in line)

        return int(await self._call("events", container_id, count,
                                    timeout=max(self.api_timeout, until - time.time() + self.api_timeout)))

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
        stdin: bytes | str | None = None,
        procs: Callable[[], set[int] | None] | None = None,
    ) -> ExecResult:
        """Run ``cmd`` in the container; keep at most ``max_output`` bytes per stream. ``stdin``:
        bytes fed to the command, then end of file (None: no stdin, the command reads EOF).

        ``timeout`` bounds the whole call (creating the exec, running it, reading its output):
        after it the command's process tree is SIGKILLed from the host and the result has
        ``timed_out=True`` (exit code 137 when the daemon cannot tell), within about
        ``timeout + 1`` s even if the daemon is frozen. ``procs`` (the CPU manager passes it) lists
        the container's host pids from its cgroup: processes that appeared since the exec began
        are the command's when the daemon cannot say which pid is. On cancellation the command is
        killed the same way, then CancelledError propagates."""
        validate_ref(ref)
        argv = _check_argv(cmd)
        limit = check_timeout(timeout)
        feed = check_stdin(stdin)
        check_max_output(max_output)
        env = check_env(env)
        loop = asyncio.get_running_loop()
        started = time.monotonic()
        wall0 = time.time()  # a container started after this was restarted under the command
        deadline = None if limit is None else loop.time() + limit
        before = _pids(procs)
        cid = ref if _FULL_ID_RE.fullmatch(ref) else None

        def left(cap: float) -> float:
            return cap if deadline is None else max(0.0, min(cap, deadline - loop.time()))

        def timed_out_result(out: bytes = b"", err: bytes = b"", code: int = KILLED, truncated: bool = False) -> ExecResult:
            return ExecResult(exit_code=code, stdout=out, stderr=err, duration_s=time.monotonic() - started,
                              truncated=truncated, timed_out=True)

        async with self._session("exec", ref) as docker:
            try:
                ex = await within(
                    docker.containers.container(ref).exec(
                        argv, stdout=True, stderr=True, stdin=feed is not None, environment=env, workdir=workdir,
                        user=user),
                    left(self.api_timeout), lambda: "exec create: no answer")
            except TimeoutError:
                if deadline is not None and loop.time() >= deadline - 0.01:
                    await self._kill(None, ref, cid, before, procs)  # in case the daemon started it
                    return timed_out_result()
                raise
            out, err = bytearray(), bytearray()
            truncated = False
            stream = ex.start(detach=False)

            async def feed_stdin() -> bool:
                """Write ``feed`` beside the reads (a command that prints before it has read all
                its input must not wait on us), then end of file: the write side of the hijacked
                connection is shut, as the docker CLI does, and the output keeps coming on the
                read side. False when the command ended without reading all of it: the daemon
                then keeps the stream open until our input is in, which never comes."""
                assert feed is not None
                if feed:
                    write = asyncio.ensure_future(stream.write_in(feed))
                    try:
                        while True:
                            await asyncio.wait([write], timeout=_STDIN_POLL)
                            if write.done():
                                write.result()
                                break
                            try:
                                info = await within(ex.inspect(), _KILL_BOUND, lambda: "exec inspect: no answer")
                            except (aiodocker.DockerError, aiohttp.ClientError, OSError, TimeoutError):
                                continue  # the watchdog and the deadline handle a daemon that went away
                            if not info.get("Running") and info.get("ExitCode") is not None:
                                return False
                    finally:
                        if not write.done():
                            write.cancel()
                            await asyncio.wait([write])
                conn = stream._resp.connection if stream._resp is not None else None
                transport = conn.transport if conn is not None else None
                if transport is not None and transport.can_write_eof():
                    transport.write_eof()
                return True

            async def read_all() -> None:
                nonlocal truncated
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

            async def pump() -> None:
                async with stream:
                    if feed is None:
                        await read_all()
                        return
                    await stream._init()  # the connection the writer shuts (read_out would open it too)
                    reader = asyncio.ensure_future(read_all())
                    writer = asyncio.ensure_future(feed_stdin())
                    try:
                        await asyncio.wait([reader, writer], return_when=asyncio.FIRST_COMPLETED)
                        if not reader.done() and writer.done() and not writer.cancelled() \
                                and writer.exception() is None and writer.result() is False:
                            # exited with input unread: take the output still in flight, then end
                            await asyncio.wait([reader], timeout=_DRAIN_BOUND)
                            if not reader.done():
                                reader.cancel()
                                await asyncio.wait([reader])
                                return
                        await reader
                    finally:
                        for t in (reader, writer):
                            if not t.done():
                                t.cancel()
                        await asyncio.wait([reader, writer])
                        if not writer.cancelled() and writer.exception() is not None:
                            logging.getLogger(__name__).debug("exec stdin: %r", writer.exception())

            task = asyncio.ensure_future(pump())
            watchdog = asyncio.ensure_future(self._watch_daemon(ref))
            finished = killed = False
            try:
                wait = None if deadline is None else max(0.0, deadline - loop.time())
                await asyncio.wait([task, watchdog], timeout=wait, return_when=asyncio.FIRST_COMPLETED)
                if task.done():
                    task.result()  # the stream's own error (a daemon that died mid-command)
                    code = await self._exit_code(ex, ref, None if deadline is None else deadline + 1.0)
                    finished = code is not None
                    if code is None:
                        return timed_out_result(bytes(out), bytes(err), truncated=truncated)
                    if code == KILLED:  # its own SIGKILL (or an OOM kill), or the container's end?
                        await self._check_still_running(ref, wall0)
                    if _stopped_state(code, out, err):
                        raise DockerError(
                            f"Docker exec: container {ref!r} is not running (the runtime said "
                            f"{bytes(out).strip().decode(errors='replace')!r}); the command never ran",
                            resource=ref, status=409)
                    code, out, err = _start_failure(code, out, err)
                    return ExecResult(exit_code=code, stdout=bytes(out), stderr=bytes(err),
                                      duration_s=time.monotonic() - started, truncated=truncated)
                answered = await self._kill(ex, ref, cid, before, procs)
                killed = True
                if watchdog.done() and watchdog.result() == "paused":
                    raise DockerError(
                        f"Docker exec: container {ref!r} was paused while the command ran; the command "
                        f"was killed (it ends when the container is unpaused)", resource=ref, status=409)
                if watchdog.done():  # the daemon stopped answering while the command ran
                    raise DockerError(
                        f"Docker exec: container {ref!r}: the daemon did not answer within "
                        f"{self.api_timeout:g} s while the command ran; the command was killed",
                        resource=ref, connection=True)
                await asyncio.wait([task], timeout=_DRAIN_BOUND)  # the output after the kill
                code = await self._exit_code(ex, ref, loop.time() + _KILL_BOUND) if answered else None
                return timed_out_result(bytes(out), bytes(err), KILLED if code is None else code, truncated)
            except BaseException:
                if not (finished or killed):  # cancelled, or the stream broke: the command must die
                    kill = asyncio.ensure_future(self._kill(ex, ref, cid, before, procs))
                    if await settle(kill):  # the command dies before a cancel propagates
                        raise asyncio.CancelledError from None
                raise
            finally:
                for t in (task, watchdog):
                    if not t.done():
                        t.cancel()
                await asyncio.wait([task, watchdog])

    async def _watch_daemon(self, ref: str) -> str:
        """Runs beside every exec (cancelled when it ends): returns "frozen" once the daemon misses
        an inspect of the container for ``api_timeout``, "paused" once the container is found
        paused (its command then never ends, holding the action's cores). Refused connections and
        a container that went away are not its business: the exec stream itself ends then."""
        every = max(0.5, self.api_timeout / 2)
        while True:
            await asyncio.sleep(every)
            try:
                info = await self.inspect(ref)
            except DockerError as exc:
                if is_timeout(exc):
                    return "frozen"
                continue
            if info.status == "paused":
                return "paused"

    async def _check_still_running(self, ref: str, since: float) -> None:
        """An exec that ended SIGKILLed: DockerError naming the container when it was stopped,
        removed or restarted (started after ``since``, Unix seconds: the daemon's clock is taken
        to be the host's, as over its local socket) meanwhile (its processes were killed with it),
        not a result that looks like the command's own kill. The daemon marks the container a few
        tens of ms after the exec's stream ends, so a container still running is looked at for up
        to ``_STOP_SEEN_S``, and one seen stopped for up to ``_RESTART_SEEN_S`` (running again by
        then: restarted)."""
        loop = asyncio.get_running_loop()
        end = loop.time() + _STOP_SEEN_S
        stopped: str | None = None  # the status it was first seen stopped in
        waited = False
        while True:
            try:
                info = await self.inspect(ref)
            except DockerError as exc:
                if is_timeout(exc) and (not waited or loop.time() < end):
                    # the daemon holds a container's lock while it stops or restarts it, and an
                    # inspect waits on it: one that timed out right after the kill is asked again,
                    # until the restart's bound has passed (a restart that took > api_timeout on a
                    # busy machine read as "nothing happened")
                    if not waited:
                        waited = True
                        end = max(end, loop.time() + _RESTART_SEEN_S)
                    continue
                if not is_not_found(exc):
                    return  # the result stands; the next call meets the daemon's trouble
                raise DockerError(f"Docker exec: container {ref!r} was removed while the command ran (it was "
                                  f"killed)", resource=ref, status=404) from None
            if info.status in ("removing", "dead"):
                raise DockerError(f"Docker exec: container {ref!r} was removed while the command ran (it was "
                                  f"killed)", resource=info.id, status=404)
            if info.status not in ("running", "paused"):
                if stopped is None:  # a restart stops it first: give the start a moment to show
                    stopped, end = info.status, loop.time() + _RESTART_SEEN_S
            elif stopped is not None or (info.started_at is not None and info.started_at > since):
                raise DockerError(f"Docker exec: container {ref!r} was restarted while the command ran (it was "
                                  f"killed; the container runs again, its processes and memory state lost)",
                                  resource=info.id)
            if loop.time() >= end:
                if stopped is not None:
                    raise DockerError(f"Docker exec: container {ref!r} was stopped while the command ran (it was "
                                      f"killed; the container is {stopped})", resource=info.id)
                return
            await asyncio.sleep(0.03)

    async def _exit_code(self, ex: Any, ref: str, deadline: float | None) -> int | None:
        """The exec's exit code; the stream can end a moment before the daemon records it. None
        when ``deadline`` (loop time) passes first."""
        loop = asyncio.get_running_loop()
        end = loop.time() + self.api_timeout if deadline is None else deadline
        while True:
            try:
                info = await within(ex.inspect(), max(0.0, end - loop.time()), lambda: "exec inspect: no answer")
            except TimeoutError:
                if deadline is not None:
                    return None
                raise DockerError(f"Docker exec inspect: container {ref!r}: the daemon did not answer in time",
                                  resource=ref, connection=True) from None
            if not info.get("Running") and info.get("ExitCode") is not None:
                return int(info["ExitCode"])
            if loop.time() >= end:
                if deadline is not None:
                    return None
                raise DockerError(f"exec in container {ref!r}: no exit code after the output ended", resource=ref)
            await asyncio.sleep(0.01)

    async def _kill(self, ex: Any, ref: str, cid: str | None, before: set[int] | None,
                    procs: Callable[[], set[int] | None] | None) -> bool:
        """SIGKILL the exec's process tree; return whether the daemon answered. Its pid comes from
        ``exec inspect`` (bounded); if the daemon does not answer, the processes that appeared in
        the container's cgroup since the exec began are killed instead."""
        pid = 0
        answered = False
        if ex is not None:
            loop = asyncio.get_running_loop()
            until = loop.time() + _START_BOUND
            try:
                while True:
                    info = await within(ex.inspect(), _KILL_BOUND, lambda: "exec inspect: no answer")
                    pid = int(info.get("Pid") or 0)
                    answered = True
                    # no pid and no exit code: its start may still be on the way to the daemon
                    # (a timeout or cancel right after the exec began); killing nothing then let
                    # the command start afterwards and run on
                    if pid or info.get("ExitCode") is not None or loop.time() >= until:
                        break
                    await asyncio.sleep(0.02)
            except (aiodocker.DockerError, aiohttp.ClientError, OSError, asyncio.TimeoutError, TimeoutError):
                pass
        if cid is None and pid:
            try:
                cid = (await self._call("inspect", ref, lambda d: d.containers.container(ref).show(),
                                        timeout=_KILL_BOUND))["Id"]
            except DockerError:
                cid = None
        now = _pids(procs)
        if pid and cid:
            kill_tree(pid, cid)
            # what the command detached (a double fork re-parents to the container's init, out of
            # its tree) is still in its session: a docker exec's process leads its own session, so
            # the processes that appeared since the exec began in the session named by its pid
            # are the command's; the container's own processes (its init's session), those of
            # other execs and whatever was there before are left alone
            if now is not None and before is not None:
                for p in sorted(now - before):
                    if _session_of(p) == pid:
                        kill_tree(p, cid)
            return answered
        if now is not None and before is not None:  # no pid from the daemon: what appeared since
            for p in sorted(now - before):
                kill_tree(p, cid or "", require_container=cid is not None)
        return answered


def _session_of(pid: int, proc: Path = Path("/proc")) -> int | None:
    """The session id of ``pid`` as this host sees it (None: gone or unreadable)."""
    try:
        stat = (proc / str(pid) / "stat").read_text()
        return int(stat[stat.rindex(")") + 2:].split()[3])  # after the name: state ppid pgrp session
    except (OSError, ValueError, IndexError):
        return None


def _pids(procs: Callable[[], set[int] | None] | None) -> set[int] | None:
    if procs is None:
        return None
    try:
        return procs()
    except Exception:  # noqa: BLE001 - best effort: without it only the daemon's pid is used
        return None


def kill_tree(pid: int, container_id: str, proc: Path = Path("/proc"), *, require_container: bool = True) -> int:
    """SIGKILL ``pid`` and its descendants if ``pid`` still belongs to ``container_id``.

    Works when the daemon shares our pid namespace (the local-daemon case the fast path needs
    anyway); otherwise nothing is found and the caller just stops reading. Returns kill count.
    ``require_container=False`` (pids read from the container's own cgroup) skips the check."""
    if require_container:
        try:
            if not container_id or container_id not in (proc / str(pid) / "cgroup").read_text():
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




def is_memory_busy(exc: DockerError) -> bool:
    """True when an update failed because the container holds more memory than the new limit."""
    return "unable to set memory limit" in str(exc) or "device or resource busy" in str(exc).lower()


def is_not_found(exc: DockerError) -> bool:
    """True when the daemon answered 404 (no such container)."""
    return getattr(exc, "status", None) == 404


def is_connection_error(exc: DockerError) -> bool:
    """True when the daemon could not be reached or did not answer in time."""
    return bool(getattr(exc, "connection", False))


def is_timeout(exc: DockerError) -> bool:
    """True when the daemon was reached (or at least not refused) but did not answer in time."""
    return bool(getattr(exc, "_timed_out", False))


def never_sent(exc: BaseException) -> bool:
    """True when the call certainly never reached the daemon (no socket, connection refused), so
    it changed nothing. Not for a timeout, a dropped connection or an error the daemon answered:
    the daemon may have carried such a call out, or still will (a frozen one does once it runs).
    Exact for POSTs (update, create, exec), which aiohttp never resends; after a dropped GET or
    DELETE aiohttp retries once itself and only the retry's refusal is seen."""
    return bool(getattr(exc, "_unsent", False))


def _refused(exc: BaseException) -> bool:
    """The connection could not be opened: nothing was sent."""
    if isinstance(exc, aiodocker.DockerError):  # aiodocker raises it from the aiohttp error
        exc = exc.__cause__ or exc.__context__ or exc
    return isinstance(exc, (aiohttp.ClientConnectorError, ConnectionRefusedError, FileNotFoundError))


_START_FAILED = (b"OCI runtime exec failed", b"unable to find user")


def _stopped_state(code: int, out: bytearray, err: bytearray) -> bool:
    """An exec the runtime refused because the container's init is not running, while the daemon
    still took the container for running (a create it accepted): exit 126 and runc's "cannot exec
    in a stopped state" on stdout, alone or after "OCI runtime exec failed: exec failed: ". Seen
    once right after a frozen daemon was thawed (docs/reliability.md, stop 64). Returned as the
    command's result it read as a program that could not execute (a grader's false negative); it is
    the sandbox's fault, and the command never ran."""
    return code == 126 and not err and b"cannot exec in a stopped state" in out[:200]


def _start_failure(code: int, out: bytearray, err: bytearray) -> tuple[int, bytearray, bytearray]:
    """A command that never started (missing binary, bad workdir or user): the daemon reports it
    as exit 126 with its message on the *stdout* stream, where a grader comparing the program's
    output would read it as the answer. Moved to stderr; a missing binary is 127, as ``lease.run``
    and a shell report it."""
    if code not in (126, 127) or err or not out.startswith(_START_FAILED):
        return code, out, err
    if b"executable file not found" in out or (b"exec: " in out and b"no such file or directory" in out):
        code = 127
    return code, bytearray(), out


def _translate(op: str, ref: str | None, exc: BaseException) -> DockerError:
    where = f": container {ref!r}" if ref else ""
    status: int | None = None
    connection = False
    if isinstance(exc, aiodocker.DockerError):
        status = exc.status
        connection = status == 900
        if status == 404:
            msg = f"Docker {op}{where} not found ({exc.message})"
        elif status == 409:
            msg = f"Docker {op}{where} is not running or conflicts ({exc.message})"
        elif connection:
            msg = f"Docker {op}{where}: daemon unreachable ({exc.message})"
        else:
            msg = f"Docker {op}{where} failed with HTTP {status}: {exc.message}"
    elif isinstance(exc, (asyncio.TimeoutError, TimeoutError)):
        connection = True
        msg = f"Docker {op}{where}: the daemon did not answer in time"
    else:
        connection = True
        msg = f"Docker {op}{where}: daemon unreachable ({type(exc).__name__}: {exc})"
    err = DockerError(msg, resource=ref, status=status, connection=connection)
    err._timed_out = isinstance(exc, (asyncio.TimeoutError, TimeoutError))  # type: ignore[attr-defined]
    err._unsent = _refused(exc)  # type: ignore[attr-defined]
    return err


async def _close_quietly(docker: aiodocker.Docker) -> None:
    try:
        await within(docker.close(), 5.0, lambda: "closing the session took > 5 s")
    except (aiohttp.ClientError, OSError, RuntimeError, TimeoutError) as exc:  # a dead daemon's session may fail to close
        logging.getLogger(__name__).debug("closing a Docker session failed: %r", exc)
