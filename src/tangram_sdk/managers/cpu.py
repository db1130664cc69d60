"""Allocate-on-execution for CPU sandboxes: containers stay warm but *parked*, and get exclusive
cores only while an action runs.

Why: an agentic-coding trajectory keeps one container for its whole life, but the container
computes only about half the time (the rest is the model thinking). Reserving cores per
trajectory wastes that half; stopping containers loses processes, memory and files. Parking keeps
everything alive at ~zero CPU, and a grant is two cgroup writes.

Parked state (the choice, and why): ``cpuset = park_cpus`` (one housekeeping core) plus a CFS
quota of ``park_quota_us`` per ``period_us`` (default 1 ms per 100 ms = 1% of one core). The
processes keep running — a language server or a background build can still heartbeat, memory and
open files stay — but they cannot take more than 1% of the park core each, and never touch a
granted core. The freezer (``docker pause``) was rejected: frozen containers cannot be ``exec``ed
into, timers inside them jump on thaw, and unfreezing costs more than a cpuset write.

``park_cpus=None`` picks the last host core *outside* the pool when there is one (no interference
with grants at all), otherwise the pool's last core (interference bounded by the quota).

Backends: ``"cgroup"`` writes cgroupfs directly (~0.1 ms, needs root and a local daemon),
``"api"`` calls ``POST /containers/{id}/update`` (~20 ms), ``"auto"`` picks cgroup when writable.
Docker's recorded HostConfig always holds the *parked* values (set at create/first sight through
the API); with the cgroup backend the live cgroup differs from the record only while a grant is
held, and ``aclose`` re-parks any still-granted container through the API so they agree again.

A park that fails (the daemon died between grant and park) does not return the cores: ``release``
raises :class:`~tangram_sdk.errors.QuarantineError` and the runtime keeps the action's cores out
of the pool while this manager re-parks the container in the background (backoff up to 5 s) and
*verifies* it (Docker's record or the cgroup files read back); then the cores return. Quarantined
containers are listed in ``statistics()["quarantined"]``.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Iterator, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, Literal

from .._cpuset import format_cpuset, parse_cpuset
from ..errors import CgroupError, DockerError, QuarantineError, SpecError
from . import _cgroup
from ._docker import DockerClient, is_not_found, validate_ref
from .base import ManagerContext

if TYPE_CHECKING:
    from ..lease import Lease
    from ..scheduler.decisions import Grant
    from ..spec import ActionSpec

__all__ = ["DockerCpuManager", "Sandbox", "SandboxPool"]

log = logging.getLogger(__name__)

Backend = Literal["auto", "api", "cgroup"]


class _Box:
    """What the manager knows about one container: full id, located cgroup, active grants."""

    __slots__ = ("active", "backend", "cgroup", "id", "lock")

    def __init__(self, full_id: str, backend: Literal["api", "cgroup"]) -> None:
        self.id = full_id
        self.cgroup: _cgroup.ContainerCgroup | None = None
        self.lock = asyncio.Lock()
        self.active: dict[int, tuple[int, ...]] = {}  # action id -> cores (usually one action)
        self.backend = backend


class _Quarantine:
    """A container whose park failed: the cores it may still hold, and the re-park in flight."""

    __slots__ = ("attempts", "box", "cpus", "error", "since", "task", "until")

    def __init__(self, box: _Box, cpus: tuple[int, ...], error: BaseException) -> None:
        self.box = box
        self.cpus = set(cpus)
        self.error = str(error)
        self.attempts = 1
        self.since = time.monotonic()
        self.until: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None


def _gone(exc: DockerError) -> bool:
    """The container no longer exists or no longer runs: nothing is left to park."""
    return is_not_found(exc) or "not running" in str(exc)


class DockerCpuManager:
    """The Manager for specs with ``container=``: grant cores on apply, park on release.

    ``backend``: "auto" | "api" | "cgroup". ``park_cpus``: cores parked containers share (a
    cpuset string or ids). ``park_quota_us``/``period_us``: the parked CFS bandwidth (kernel
    minimum 1000 us). ``docker_url``: e.g. ``unix:///var/run/docker.sock``; None uses
    ``DOCKER_HOST`` when set, else the default socket. ``api_timeout``: the total deadline of every
    Docker call (a frozen or overloaded daemon gives DockerError after it, never a hang).
    """

    name = "docker-cpu"

    def __init__(
        self,
        backend: Backend = "auto",
        park_cpus: str | Sequence[int] | None = None,
        park_quota_us: int = 1000,
        period_us: int = 100_000,
        docker_url: str | None = None,
        *,
        api_timeout: float = 30.0,
    ) -> None:
        if backend not in ("auto", "api", "cgroup"):
            raise SpecError(f"backend must be 'auto', 'api' or 'cgroup', got {backend!r}")
        if not (1000 <= period_us <= 1_000_000):
            raise SpecError(f"period_us must be in [1000, 1000000] (kernel limits), got {period_us!r}")
        if not (1000 <= park_quota_us <= period_us):
            raise SpecError(f"park_quota_us must be in [1000, period_us], got {park_quota_us!r}")
        self.backend: Backend = backend
        self._park_given: tuple[int, ...] | None = None
        if park_cpus is not None:
            self._park_given = parse_cpuset(park_cpus) if isinstance(park_cpus, str) else tuple(sorted(park_cpus))
            if not self._park_given:
                raise SpecError("park_cpus must name at least one core")
        self.park_quota_us = park_quota_us
        self.period_us = period_us
        self.client = DockerClient(docker_url, api_timeout=api_timeout)
        self._ctx: ManagerContext | None = None
        self._layout: _cgroup.CgroupLayout | None = None
        self._active_backend: Literal["api", "cgroup"] = "api"
        self._boxes: dict[str, _Box] = {}  # keyed by every ref seen (name, short id, full id)
        self._stats = {"applies": 0, "releases": 0, "api_updates": 0, "cgroup_writes": 0, "fallbacks": 0,
                       "park_failures": 0}
        self._quarantined: dict[str, _Quarantine] = {}  # by full container id
        self._read_layout: _cgroup.CgroupLayout | None = None  # for reading cgroup.procs (any backend)
        self._closed = False

    # -- introspection --------------------------------------------------------------------------
    @property
    def active_backend(self) -> Literal["api", "cgroup"]:
        """The backend chosen at start ("auto" resolves to one of these)."""
        return self._active_backend

    @property
    def park_cpus(self) -> tuple[int, ...]:
        """Cores parked containers share (resolved against the pool once started)."""
        if self._park_given is not None:
            return self._park_given
        host = set(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else set(range(os.cpu_count() or 1))
        pool = set(self._ctx.pool.cpus) if self._ctx is not None else set()
        outside = sorted(host - pool)
        if outside:
            return (outside[-1],)
        return (max(pool),) if pool else (max(host),)

    def statistics(self) -> dict[str, Any]:
        boxes = {b.id: b for b in self._boxes.values()}
        now = time.monotonic()
        return {
            **self._stats,
            "backend": self._active_backend,
            "containers": len(boxes),
            "granted": sum(1 for b in boxes.values() if b.active),
            "park_cpus": format_cpuset(self.park_cpus),
            # containers whose park failed: their cores stay out of the pool until re-parked
            "quarantined": {cid: {"cpus": sorted(q.cpus), "since_s": round(now - q.since, 3),
                                  "attempts": q.attempts, "error": q.error}
                            for cid, q in self._quarantined.items()},
        }

    def __repr__(self) -> str:
        s = self.statistics()
        return (
            f"<DockerCpuManager {s['backend']} park={s['park_cpus']} | {s['granted']}/{s['containers']}"
            f" containers granted>"
        )

    # -- Manager protocol -----------------------------------------------------------------------
    async def start(self, ctx: ManagerContext) -> None:
        """Reach the daemon (DockerError if not), choose the backend, re-park known containers."""
        self._ctx = ctx
        self._closed = False
        await self.client.ping()
        ncpu = await self.client.ncpu()
        if ncpu > 0:  # a pool naming cores the host lacks would fail later, at create/update (HTTP 400)
            for what, cores in (("the pool names", ctx.pool.cpus), ("park_cpus names", self.park_cpus)):
                missing = [c for c in cores if c >= ncpu]
                if missing:
                    raise SpecError(
                        f"{what} cores {format_cpuset(missing)} that the Docker host "
                        f"({self.client.url or os.environ.get('DOCKER_HOST') or 'default socket'}) does not have: "
                        f"it has {ncpu} (0-{ncpu - 1})")
        self._read_layout = _cgroup.detect_layout()
        if self.backend != "api":
            self._layout = self._read_layout
            writable = self._layout is not None and self._layout.writable()
            if self.backend == "cgroup" and not writable:
                where = self._layout.cpuset_root if self._layout else "/sys/fs/cgroup"
                raise CgroupError(f"backend='cgroup' but {where} is not writable (need root and a local daemon)",
                                  resource=str(where))
            self._active_backend = "cgroup" if writable else "api"
        else:
            self._active_backend = "api"
        for box in {b.id: b for b in self._boxes.values()}.values():
            box.backend = self._active_backend
            if not box.active:
                await self._park_api(box)  # park_cpus may have changed now that the pool is known

    def check(self, spec: ActionSpec) -> None:
        if spec.container is None:
            return
        validate_ref(spec.container)
        if spec.cpus < 1:
            raise SpecError(f"an action in container {spec.container!r} needs cpus >= 1 (got {spec.cpus})")

    async def apply(self, grant: Grant, lease: Lease) -> None:
        """Give the container exactly ``grant.cpus`` (quota = cores x period) before the action runs."""
        ref = lease.spec.container
        if ref is None:
            return
        if not grant.cpus:
            raise SpecError(f"grant for container {ref!r} has no cores")
        box = await self._box(ref)
        async with box.lock:
            box.active[grant.action_id] = tuple(grant.cpus)
            try:
                await self._set(box, self._granted_cpus(box), len(self._granted_cpus(box)) * self.period_us)
            except BaseException:
                box.active.pop(grant.action_id, None)
                raise
        self._stats["applies"] += 1
        lease.attach("container", box.id)
        lease.attach("exec", functools.partial(self.client.exec, box.id, procs=functools.partial(self._pids, box)))

    async def release(self, grant: Grant, lease: Lease) -> None:
        """Park the container again (or shrink to the cores of its other live grants).

        A container that vanished meanwhile is forgotten silently: there is nothing left to park.
        A park that fails otherwise raises QuarantineError: the runtime keeps these cores out of
        the pool until the background re-park has verifiably parked the container."""
        ref = lease.spec.container
        if ref is None or ref not in self._boxes:
            return
        box = self._boxes[ref]
        async with box.lock:
            cores = box.active.pop(grant.action_id, None)
            if cores is None:
                return
            self._stats["releases"] += 1
            try:
                await self._settle(box)
                return
            except DockerError as exc:
                if _gone(exc):
                    self._forget(box)
                    return
                failure: Exception = exc
            except CgroupError as exc:  # backend="cgroup" refuses the API fallback
                failure = exc
        self._stats["park_failures"] += 1
        until = self._quarantine(box, cores, failure)
        raise QuarantineError(
            f"container {box.id[:12]} could not be parked ({failure}); cores {format_cpuset(cores)} stay out of "
            f"the pool until it is (re-parking in the background)", resource=box.id, until=until) from failure

    async def aclose(self) -> None:
        """Re-park (through the API) containers still granted or quarantined, so Docker's record and
        the cgroup agree; then close the daemon session. Containers are removed by their SandboxPool.
        A container that still cannot be parked is logged (and its quarantine ends: the pool closes)."""
        quarantined = list(self._quarantined.values())
        for q in quarantined:
            if q.task is not None:
                q.task.cancel()
        await asyncio.gather(*(q.task for q in quarantined if q.task is not None), return_exceptions=True)
        boxes = list({b.id: b for b in self._boxes.values() if b.active or b.id in self._quarantined}.values())
        results = await asyncio.gather(*(self._park_api(b) for b in boxes), return_exceptions=True)
        for b, r in zip(boxes, results):
            b.active.clear()
            held = self._quarantined.pop(b.id, None)
            if isinstance(r, BaseException):
                log.warning("could not re-park container %s at close: %s", b.id[:12], r)
            if held is not None and not held.until.done():
                if isinstance(r, BaseException):
                    held.until.set_exception(QuarantineError(
                        f"container {b.id[:12]} was still not parked when the manager closed: {r}", resource=b.id))
                else:
                    held.until.set_result(None)
        self._closed = True
        await self.client.close()

    # -- internals ------------------------------------------------------------------------------
    async def _settle(self, box: _Box) -> tuple[tuple[int, ...], int]:
        """Give ``box`` what its live grants say: their cores, or the parked values. Returns them."""
        if box.active:
            cpus = self._granted_cpus(box)
            quota = len(cpus) * self.period_us
        else:
            cpus, quota = self.park_cpus, self.park_quota_us
        await self._set(box, cpus, quota)
        return cpus, quota

    def _quarantine(self, box: _Box, cores: tuple[int, ...], error: Exception) -> asyncio.Future[None]:
        q = self._quarantined.get(box.id)
        if q is None:
            q = self._quarantined[box.id] = _Quarantine(box, cores, error)
            q.task = asyncio.get_running_loop().create_task(self._repark(q), name=f"repark-{box.id[:12]}")
            log.error("container %s could not be parked (%s): cores %s quarantined until it is",
                      box.id[:12], error, format_cpuset(cores))
        else:
            q.cpus.update(cores)
            q.error = str(error)
        return q.until

    async def _repark(self, q: _Quarantine) -> None:
        """Retry until the container verifiably holds only what its live grants say (or is gone)."""
        box = q.box
        delay = 0.2
        while True:
            await asyncio.sleep(delay)
            delay = min(delay * 2, 5.0)
            async with box.lock:
                try:
                    cpus, quota = await self._settle(box)
                    await self._verify(box, cpus, quota)
                except DockerError as exc:
                    if not _gone(exc):
                        q.attempts += 1
                        q.error = str(exc)
                        continue
                    self._forget(box)
                except CgroupError as exc:
                    q.attempts += 1
                    q.error = str(exc)
                    continue
            break
        self._quarantined.pop(box.id, None)
        log.warning("container %s parked after %d attempts: cores %s back", box.id[:12], q.attempts,
                    format_cpuset(sorted(q.cpus)))
        if not q.until.done():
            q.until.set_result(None)

    async def _verify(self, box: _Box, cpus: Sequence[int], quota: int) -> None:
        """Read back what the container holds (cgroup files, or Docker's record for the API backend)."""
        got: Any
        if box.backend == "cgroup" and box.cgroup is not None:
            got = (box.cgroup.cpus(), box.cgroup.quota())
            want: Any = (tuple(cpus), (quota, self.period_us))
        else:
            info = await self.client.inspect(box.id)
            got = (info.cpuset, info.cpu_quota, info.cpu_period)
            want = (format_cpuset(cpus), quota, self.period_us)
        if got != want:
            raise DockerError(f"container {box.id[:12]} holds {got} after the update, not {want}", resource=box.id)

    def _pids(self, box: _Box) -> set[int] | None:
        """The container's host pids (None when its cgroup is not readable from here)."""
        layout = self._layout or self._read_layout
        if layout is None:
            return None
        try:
            if box.cgroup is None:
                box.cgroup = _cgroup.locate(layout, box.id)
            return box.cgroup.pids()
        except CgroupError:
            box.cgroup = None
            return None

    @staticmethod
    def _granted_cpus(box: _Box) -> tuple[int, ...]:
        return tuple(sorted({c for cpus in box.active.values() for c in cpus}))

    def _forget(self, box: _Box) -> None:
        for k in [k for k, b in self._boxes.items() if b is box]:
            del self._boxes[k]

    def register(self, full_id: str, *aliases: str) -> None:
        """Know a container created already parked (SandboxPool does this; saves an inspect)."""
        box = _Box(full_id, self._active_backend)
        for ref in (full_id, *aliases):
            self._boxes[ref] = box

    def unregister(self, ref: str) -> None:
        box = self._boxes.get(ref)
        if box is not None:
            self._forget(box)

    async def _box(self, ref: str) -> _Box:
        """Resolve ``ref`` once (inspect), making sure the container runs and its record is parked."""
        box = self._boxes.get(ref)
        if box is not None:
            return box
        info = await self.client.inspect(ref)
        if not info.running:
            raise DockerError(f"container {ref!r} is {info.status}, not running", resource=ref)
        box = self._boxes.get(info.id)
        if box is None:
            box = _Box(info.id, self._active_backend)
            want = (format_cpuset(self.park_cpus), self.park_quota_us, self.period_us)
            if (info.cpuset, info.cpu_quota, info.cpu_period) != want:
                await self._park_api(box)
            box = self._boxes.setdefault(info.id, box)  # a concurrent first use may have won
        self._boxes[ref] = box
        return box

    async def _park_api(self, box: _Box) -> None:
        await self.client.update_cpu(box.id, format_cpuset(self.park_cpus), self.park_quota_us, self.period_us)
        self._stats["api_updates"] += 1

    async def _set(self, box: _Box, cpus: Sequence[int], quota_us: int) -> None:
        if box.backend == "cgroup":
            try:
                await self._set_cgroup(box, cpus, quota_us)
                return
            except CgroupError:
                if self.backend == "cgroup":
                    raise
                # auto: this container's cgroup is not reachable from here (remote daemon, odd
                # layout, permissions); use the API for it from now on.
                self._stats["fallbacks"] += 1
                box.backend = "api"
                log.info("container %s: cgroup fast path unavailable, using the Docker API", box.id[:12])
        await self.client.update_cpu(box.id, format_cpuset(cpus), quota_us, self.period_us)
        self._stats["api_updates"] += 1

    async def _set_cgroup(self, box: _Box, cpus: Sequence[int], quota_us: int) -> None:
        """Two (or three) synchronous writes: far cheaper than a thread hop, so no executor."""
        assert self._layout is not None
        for attempt in (0, 1):
            try:
                if box.cgroup is None:
                    info = await self.client.inspect(box.id)
                    if not info.running:
                        raise DockerError(f"container {box.id[:12]} is {info.status}, not running", resource=box.id)
                    box.cgroup = _cgroup.locate(self._layout, box.id, pid=info.pid)
                box.cgroup.set_cpu(cpus, quota_us, self.period_us)
                self._stats["cgroup_writes"] += 1
                return
            except CgroupError:
                # The directory vanished: stopped (DockerError below) or restarted (re-locate once).
                box.cgroup = None
                info = await self.client.inspect(box.id)
                if not info.running:
                    raise DockerError(f"container {box.id[:12]} is {info.status}, not running", resource=box.id) from None
                if attempt:
                    raise


class Sandbox:
    """One warm container of a SandboxPool: pass ``sandbox.id`` as ``ActionSpec(container=...)``."""

    __slots__ = ("created", "id", "name")

    def __init__(self, id: str, name: str, created: bool) -> None:
        self.id = id
        self.name = name
        self.created = created

    def __repr__(self) -> str:
        return f"<Sandbox {self.name or self.id[:12]}{'' if self.created else ' adopted'}>"


class SandboxPool:
    """A set of parked containers, one per trajectory.

    ``await SandboxPool.create(manager, image=..., count=N)`` creates and starts N containers
    running ``cmd`` (a long sleep), already parked, with no network and the ``tangram_sdk=1``
    label; ``SandboxPool.adopt(manager, ids)`` takes existing ones (parked on first use).
    ``aclose()`` (or ``async with``) removes what it created — never adopted containers.
    """

    def __init__(self, manager: DockerCpuManager, sandboxes: Sequence[Sandbox]) -> None:
        self.manager = manager
        self.sandboxes = list(sandboxes)

    @classmethod
    async def create(
        cls,
        manager: DockerCpuManager,
        *,
        image: str,
        count: int,
        cmd: Sequence[str] = ("sleep", "infinity"),
        name_prefix: str | None = None,
        memory: int | None = None,
        env: dict[str, str] | None = None,
        init: bool = True,
        concurrency: int = 8,
    ) -> SandboxPool:
        """Create ``count`` containers concurrently; on any failure remove those made and raise."""
        if isinstance(count, bool) or not isinstance(count, int) or count < 0:
            raise SpecError(f"count must be an int >= 0, got {count!r}")
        if name_prefix is not None:
            validate_ref(name_prefix)
        pool = cls(manager, [])
        gate = asyncio.Semaphore(max(1, concurrency))
        slots: list[Sandbox | None] = [None] * count

        async def one(i: int) -> None:
            name = f"{name_prefix}-{i}" if name_prefix else None
            async with gate:
                cid = await manager.client.create(
                    image, cmd, name=name, cpuset=format_cpuset(manager.park_cpus),
                    cpu_quota=manager.park_quota_us, cpu_period=manager.period_us,
                    memory=memory, env=env, init=init,
                )
                sandbox = slots[i] = Sandbox(cid, name or "", True)
                pool.sandboxes.append(sandbox)  # so aclose() removes it even if start fails
                await manager.client.start(cid)
                if name is None:
                    sandbox.name = (await manager.client.inspect(cid)).name
            manager.register(cid, *([name] if name else []))

        try:
            results = await asyncio.gather(*(one(i) for i in range(count)), return_exceptions=True)
            for r in results:
                if isinstance(r, BaseException):
                    raise r
        except BaseException:
            await asyncio.shield(pool.aclose())
            raise
        pool.sandboxes = [s for s in slots if s is not None]  # index order, whatever finished first
        return pool

    @classmethod
    async def adopt(cls, manager: DockerCpuManager, ids: Sequence[str]) -> SandboxPool:
        """Take existing running containers (DockerError naming any that is unknown or stopped)."""
        out = []
        for ref in ids:
            box = await manager._box(validate_ref(ref))
            out.append(Sandbox(box.id, ref if ref != box.id else "", False))
        return cls(manager, out)

    @property
    def ids(self) -> list[str]:
        return [s.id for s in self.sandboxes]

    def __len__(self) -> int:
        return len(self.sandboxes)

    def __getitem__(self, i: int) -> Sandbox:
        return self.sandboxes[i]

    def __iter__(self) -> Iterator[Sandbox]:
        return iter(self.sandboxes)

    def __repr__(self) -> str:
        made = sum(s.created for s in self.sandboxes)
        return f"<SandboxPool {len(self.sandboxes)} containers ({made} created, {len(self) - made} adopted)>"

    async def aclose(self) -> None:
        """Remove every container this pool created (all attempted; the first failure re-raised)."""
        created = [s for s in self.sandboxes if s.created]
        results = await asyncio.gather(*(self.manager.client.remove(s.id) for s in created), return_exceptions=True)
        for s in created:
            self.manager.unregister(s.id)
        self.sandboxes = [s for s in self.sandboxes if not s.created]
        if self.manager._closed:
            await self.manager.client.close()  # the manager closed first; do not leak our session
        errors = [r for r in results if isinstance(r, BaseException)]
        if errors:
            raise errors[0]

    async def __aenter__(self) -> SandboxPool:  # noqa: PYI034 (typing.Self needs 3.11)
        return self

    async def __aexit__(
        self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            await asyncio.shield(self.aclose())
        except Exception:
            if et is None:
                raise
            log.warning("could not remove every sandbox while handling %s", et.__name__, exc_info=True)
