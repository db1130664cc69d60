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
*verifies* it (Docker's record, and the cgroup files read back where they are readable); then the
cores return. Quarantined containers are listed in ``statistics()["quarantined"]``. A *grant* whose
update failed in a way the daemon may still carry out (a timeout, a dropped connection, an error
after the daemon was reached: a frozen dockerd applies a timed-out update once it runs again) is
treated the same way: the action fails, and its cores stay quarantined until the container is
verifiably parked. Only a call that never reached the daemon (no socket, connection refused)
gives the cores back at once.

Memory: an action that declares ``memory`` gets it as its container's memory limit (memory + swap
= memory: no swap) for as long as it holds the lease, then the container's *parked* limit (what
Docker recorded for it when the manager first saw it) comes back. A command the kernel kills for
memory raises :class:`~tangram_sdk.errors.ActionOOMError` from ``lease.exec`` with the limit and
the peak; the container lives on. Two actions in one container share the sum of their memory; an
action that declares none leaves the container at its parked limit. The limit a container's grants
add up to, and the peaks learnt per kind, are worked out in ``_cpu_memory.py``.

Sandbox quotas: ``max_sandboxes`` caps the containers SandboxPools create through this manager
that exist at once, ``create_rate`` (containers/s, ``create_burst``) paces their creation; both
apply to ``SandboxPool.create`` and on-demand ``SandboxPool.add``, with bounded, cancel-safe waits.
The pool itself lives in :mod:`~tangram_sdk.managers.sandbox_pool` (re-exported here).
"""

from __future__ import annotations

import asyncio
import functools
import logging
import os
import time
from collections.abc import Awaitable, Sequence
from typing import TYPE_CHECKING, Any, Literal

import attrs

from .._cpuset import _MAX_CPU, format_cpuset, parse_cpuset
from .._deadline import check_timeout
from ..errors import ActionOOMError, CgroupError, DockerError, QuarantineError, SpecError, UsageError
from . import _cgroup
from ._cgroup import MemoryBusyError, MemoryLimits
from ._cpu_memory import learn_peak, limit_refused, memory_target, mib, watch_peak
from ._docker import KILLED, MIN_MEMORY, DockerClient, is_memory_busy, is_not_found, never_sent, validate_ref
from ._limits import CreationGate
from ..pool import _id_list
from ..snapshot import Snapshot
from .base import ManagerContext, Offer
from .sandbox_pool import Sandbox, SandboxPool  # re-exported: the pool lived here first

if TYPE_CHECKING:
    from ..lease import ExecResult, Lease
    from ..scheduler.decisions import Grant
    from ..spec import ActionSpec

__all__ = ["DockerCpuManager", "DockerStatistics", "Sandbox", "SandboxPool"]

log = logging.getLogger(__name__)

Backend = Literal["auto", "api", "cgroup"]


_MEM_UNKNOWN = MemoryLimits(-1, -1)  # _Box.mem_now after an update whose outcome is not known
# a quarantined container's re-park is read back twice, this far apart, before its cores return:
# updates a frozen daemon queued are carried out within milliseconds of its thaw, in any order with
# the re-park's, so one read can come before the last of them lands
_REPARK_SETTLE_S = 0.5


class _Box:
    """What the manager knows about one container: full id, located cgroup, active grants."""

    __slots__ = ("active", "backend", "cgroup", "id", "lock", "mem", "mem_now", "parked_mem", "peak", "shared")

    def __init__(self, full_id: str, backend: Literal["api", "cgroup"]) -> None:
        self.id = full_id
        self.cgroup: _cgroup.ContainerCgroup | None = None
        self.lock = asyncio.Lock()
        self.active: dict[int, tuple[int, ...]] = {}  # action id -> cores (usually one action)
        self.backend = backend
        self.mem: dict[int, int] = {}  # action id -> memory bytes it declared (0: none)
        self.parked_mem: MemoryLimits | None = None  # Docker's record before we touched it
        # what we set; None: the parked limit holds; _MEM_UNKNOWN: an update that failed or was
        # cancelled mid-call (the daemon may still carry it out), so the next settle sets it again
        self.mem_now: MemoryLimits | None = None
        self.peak: _cgroup.PeakWatch | None = None  # peak since the first live grant (cgroup backend)
        self.shared = False  # two actions overlapped: the peak is not one action's


class _Quarantine:
    """A container whose park failed (or whose grant failed after reaching the daemon): the cores
    it may still hold, and the re-park in flight."""

    __slots__ = ("actions", "attempts", "box", "cpus", "error", "since", "task", "until")

    def __init__(self, box: _Box, cpus: tuple[int, ...], error: BaseException) -> None:
        self.box = box
        self.actions: set[int] = set()  # failed grants waiting for their release to report this
        self.cpus = set(cpus)
        self.error = str(error)
        self.attempts = 1
        self.since = time.monotonic()
        self.until: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.task: asyncio.Task[None] | None = None


def _gone(exc: DockerError) -> bool:
    """The container no longer exists or no longer runs: nothing is left to park."""
    return is_not_found(exc) or "not running" in str(exc)


def _unchanged(exc: BaseException) -> bool:
    """A failed grant update that certainly changed nothing: the daemon was never reached, or the
    container is gone. Anything else (a timeout, a dropped connection, a cancel mid-call, a cgroup
    write that failed half-way) may have given, or may still give, the container the cores."""
    return isinstance(exc, DockerError) and (never_sent(exc) or _gone(exc))


@attrs.frozen(eq=False)
class DockerStatistics(Snapshot):
    """:meth:`DockerCpuManager.statistics`. ``backend`` "api" | "cgroup"; ``containers`` known,
    ``granted`` of them holding cores now; ``park_cpus`` the cores parked containers share;
    ``quarantined``: per container whose park (or a grant that may have reached the daemon) failed,
    its ``cpus``, ``since_s``, ``attempts``, ``error``; ``memory_limited``: bytes per container
    holding an action's limit; ``memory_peaks``: per action kind; ``sandboxes``: the creation
    gate; ``counters`` (applies, releases, resizes, api_updates, cgroup_writes, fallbacks, park_failures...)
    read flat in the dict access."""

    _flatten = ("counters",)

    backend: str
    containers: int
    granted: int
    park_cpus: str
    quarantined: dict[str, dict[str, Any]]
    memory_limited: dict[str, int | None]
    memory_peaks: dict[str, dict[str, int]]
    sandboxes: dict[str, Any]
    counters: dict[str, int]


class DockerCpuManager:
    """The Manager for specs with ``container=``: grant cores on apply, park on release.

    ``backend``: "auto" | "api" | "cgroup". ``park_cpus``: cores parked containers share (a
    cpuset string or ids). ``park_quota_us``/``period_us``: the parked CFS bandwidth (kernel
    minimum 1000 us). ``docker_url``: e.g. ``unix:///var/run/docker.sock``; None uses
    ``DOCKER_HOST`` when set, else the default socket. ``api_timeout``: the total deadline of every
    Docker call (a frozen or overloaded daemon gives DockerError after it, never a hang).
    ``max_sandboxes`` / ``create_rate`` (containers/s) / ``create_burst``: quotas on the containers
    SandboxPools create through this manager (None: none); ``create_timeout`` is how long a
    creation may wait for them by default (TimeoutError after it).
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
        max_sandboxes: int | None = None,
        create_rate: float | None = None,
        create_burst: int | None = None,
        create_timeout: float | None = 60.0,
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
            self._park_given = (parse_cpuset(park_cpus) if isinstance(park_cpus, str)
                                else tuple(sorted(_id_list("park_cpus", "core ids", park_cpus, _MAX_CPU))))
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
                       "park_failures": 0, "grant_failures": 0, "memory_updates": 0, "memory_restore_failures": 0,
                       "oom_kills": 0, "resizes": 0}
        self._gate = CreationGate(max_sandboxes, create_rate, create_burst)
        self.create_timeout = check_timeout(create_timeout, "create_timeout")
        self._peaks: dict[str, dict[str, int]] = {}  # kind -> {"max", "last", "n"} (bytes, actions)
        self._quarantined: dict[str, _Quarantine] = {}  # by full container id
        self._unsure: dict[int, _Quarantine] = {}  # action id -> the quarantine its failed grant began
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

    def describe(self) -> Offer:
        """The containers this manager knows (every name and id it has seen for each)."""
        return Offer(containers=tuple(sorted(self._boxes)))

    def statistics(self) -> DockerStatistics:
        """A frozen snapshot (:class:`DockerStatistics`; ``asdict()`` for JSON, ``s["key"]`` still
        works)."""
        boxes = {b.id: b for b in self._boxes.values()}
        now = time.monotonic()
        return DockerStatistics(
            backend=self._active_backend,
            containers=len(boxes),
            granted=sum(1 for b in boxes.values() if b.active),
            park_cpus=format_cpuset(self.park_cpus),
            # containers whose park failed: their cores stay out of the pool until re-parked
            quarantined={cid: {"cpus": sorted(q.cpus), "since_s": round(now - q.since, 3),
                               "attempts": q.attempts, "error": q.error}
                         for cid, q in self._quarantined.items()},
            # memory limits held by containers right now (bytes), and the peak per action kind
            memory_limited={b.id: b.mem_now.memory for b in boxes.values()
                            if b.mem_now is not None and b.mem_now is not _MEM_UNKNOWN},
            memory_peaks={k: dict(v) for k, v in self._peaks.items()},
            sandboxes=self._gate.statistics(),
            counters=dict(self._stats),
        )

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
        try:
            await self._start(ctx)
        except BaseException:
            await self.client.close()  # the runtime closes only managers that started
            raise

    async def _start(self, ctx: ManagerContext) -> None:
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
        if 0 < spec.memory < MIN_MEMORY:  # the api backend's update would fail with HTTP 400; the same rule on both
            raise SpecError(f"an action in container {spec.container!r} needs memory 0 (no limit) or >= 6 MiB "
                            f"(Docker's minimum), got {spec.memory} bytes")

    def resolve(self, spec: ActionSpec) -> Awaitable[Any] | None:
        """The lookup to await at acquire, before the action queues, of a container this manager
        has not met (a misspelt or stopped one is a DockerError at once, not after waiting for
        cores it could never use): one inspect, and a park, per new name. None when there is
        nothing to look up, so a known name or no container costs the acquire nothing."""
        ref = spec.container
        if ref is None or ref in self._boxes:
            return None
        return self._box(ref)

    async def apply(self, grant: Grant, lease: Lease) -> None:
        """Give the container exactly ``grant.cpus`` (quota = cores x period) before the action runs."""
        ref = lease.spec.container
        if ref is None:
            return
        if not grant.cpus:
            raise SpecError(f"grant for container {ref!r} has no cores")
        box = await self._box(ref)
        aid = grant.action_id
        async with box.lock:
            if box.active:
                box.shared = True
            box.active[aid] = tuple(grant.cpus)
            box.mem[aid] = max(0, int(grant.memory or 0))
            try:
                # memory first: a limit the container cannot meet refuses the action before its
                # cores change, and the cores are the part that must never be left granted
                await self._settle_memory(box)
            except BaseException as exc:
                box.active.pop(aid, None)
                box.mem.pop(aid, None)
                await self._restore_memory_quietly(box)
                self._forget_if_gone(box, exc)
                raise
            try:
                await self._set(box, self._granted_cpus(box), len(self._granted_cpus(box)) * self.period_us)
            except BaseException as exc:
                box.active.pop(aid, None)
                box.mem.pop(aid, None)
                if _unchanged(exc):
                    await self._restore_memory_quietly(box)
                    self._forget_if_gone(box, exc)
                    raise
                # the daemon may have given (or, frozen, may still give) the container these
                # cores: they stay out of the pool until it is verifiably parked; the release
                # the runtime runs after a failed apply reports that (QuarantineError)
                self._stats["grant_failures"] += 1
                self._quarantine(box, tuple(grant.cpus), exc if isinstance(exc, Exception) else
                                 DockerError(f"the grant was interrupted ({type(exc).__name__})", resource=box.id),
                                 "may hold a grant that failed")
                q = self._quarantined[box.id]
                q.actions.add(aid)
                self._unsure[aid] = q
                raise
            if len(box.active) == 1:
                watch_peak(box)
        self._stats["applies"] += 1
        lease.attach("container", box.id)
        lease.attach("exec", functools.partial(self._exec, box, grant.action_id))

    async def resize(self, old: Grant, new: Grant, lease: Lease) -> None:
        """A running malleable action now holds ``new.cpus`` (was ``old.cpus``): write the
        container's cpuset and quota (cores x period) the way ``apply`` does (the cgroup fast path
        or the API), so its ``lease.exec`` commands run on the new cores. An action this manager
        does not hold (another manager's, already released) is ignored. Errors are DockerError or
        CgroupError naming the container; the record keeps the new cores either way, so the next
        write to the container (another grant's, the park) gives it what the pool says."""
        ref = lease.spec.container
        if ref is None or ref not in self._boxes:
            return
        if not new.cpus:
            raise SpecError(f"resize of container {ref!r} to no cores")
        box = self._boxes[ref]
        aid = new.action_id
        async with box.lock:
            if aid not in box.active:
                return
            box.active[aid] = tuple(new.cpus)
            cpus = self._granted_cpus(box)
            try:
                await self._set(box, cpus, len(cpus) * self.period_us)
            except CgroupError as exc:
                raise CgroupError(f"container {box.id[:12]}: resizing to cores {format_cpuset(cpus)} failed: {exc}",
                                  resource=box.id) from exc
            except DockerError as exc:
                raise DockerError(f"container {box.id[:12]}: resizing to cores {format_cpuset(cpus)} failed: {exc}",
                                  resource=box.id, status=exc.status, connection=exc.connection) from exc
        self._stats["resizes"] += 1

    async def release(self, grant: Grant, lease: Lease) -> None:
        """Park the container again (or shrink to the cores of its other live grants).

        A container that vanished meanwhile is forgotten silently: there is nothing left to park.
        A park that fails otherwise raises QuarantineError: the runtime keeps these cores out of
        the pool until the background re-park has verifiably parked the container."""
        ref = lease.spec.container
        if ref is None:
            return
        unsure = self._unsure.pop(grant.action_id, None)
        if unsure is not None:  # its grant failed but may have reached the container (see apply)
            unsure.actions.discard(grant.action_id)
            raise QuarantineError(
                f"container {unsure.box.id[:12]}: the grant of cores {format_cpuset(grant.cpus)} failed but the "
                f"daemon may carry it out ({unsure.error}); the cores stay out of the pool until the container "
                f"is verifiably parked (re-parking in the background)", resource=unsure.box.id, until=unsure.until)
        if ref not in self._boxes:
            return
        box = self._boxes[ref]
        async with box.lock:
            cores = box.active.pop(grant.action_id, None)
            declared = box.mem.pop(grant.action_id, 0)
            if cores is None:
                return
            self._stats["releases"] += 1
            learn_peak(self._peaks, box, lease.spec.kind, declared)
            try:
                await self._settle(box)
            except DockerError as exc:
                if _gone(exc):
                    self._forget(box)
                    return
                failure: Exception = exc
            except CgroupError as exc:  # backend="cgroup" refuses the API fallback
                failure = exc
            else:
                await self._restore_memory_quietly(box)
                return
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
        boxes = list({b.id: b for b in self._boxes.values()
                      if b.active or b.id in self._quarantined or b.mem_now is not None}.values())
        results = await asyncio.gather(*(self._park_api(b) for b in boxes), return_exceptions=True)
        for b, r in zip(boxes, results):
            b.active.clear()
            b.mem.clear()
            if b.peak is not None:
                b.peak.close()
                b.peak = None
            held = self._quarantined.pop(b.id, None)
            if held is not None:
                self._drop_unsure(held)
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

    def _quarantine(self, box: _Box, cores: tuple[int, ...], error: Exception,
                    what: str = "could not be parked") -> asyncio.Future[None]:
        q = self._quarantined.get(box.id)
        if q is None:
            q = self._quarantined[box.id] = _Quarantine(box, cores, error)
            q.task = asyncio.get_running_loop().create_task(self._repark(q), name=f"repark-{box.id[:12]}")
            log.error("container %s %s (%s): cores %s quarantined until it is parked",
                      box.id[:12], what, error, format_cpuset(cores))
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
                    # and again a moment later: a late update the thawed daemon still had queued
                    # can land after the first read (its kernel write after the re-park's, while
                    # the record ends parked: one CI run at e8b8594)
                    await asyncio.sleep(_REPARK_SETTLE_S)
                    await self._verify(box, cpus, quota)
                    await self._restore_memory_quietly(box)
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
        self._drop_unsure(q)
        log.warning("container %s parked after %d attempts: cores %s back", box.id[:12], q.attempts,
                    format_cpuset(sorted(q.cpus)))
        if not q.until.done():
            q.until.set_result(None)

    def _drop_unsure(self, q: _Quarantine) -> None:
        """A quarantine ended: failed grants whose release never came (a caller that does not
        release a manager whose apply raised) stop waiting for it."""
        for aid in q.actions:
            self._unsure.pop(aid, None)
        q.actions.clear()

    async def _verify(self, box: _Box, cpus: Sequence[int], quota: int) -> None:
        """Read back what the container holds: the cgroup files, and Docker's record for the API
        backend. With the API backend the files are read too where they are readable (a local
        daemon): two updates in flight at once (a late one from a frozen daemon, and the re-park)
        can leave the record and the kernel disagreeing, and the kernel is what the cores obey."""
        got: Any
        if box.backend == "cgroup" and box.cgroup is not None:
            got = (box.cgroup.cpus(), box.cgroup.quota())
            want: Any = (tuple(cpus), (quota, self.period_us))
        else:
            info = await self.client.inspect(box.id)
            got = (info.cpuset, info.cpu_quota, info.cpu_period)
            want = (format_cpuset(cpus), quota, self.period_us)
            live = self._live(box, info.pid)
            if got == want and live is not None and live != (tuple(cpus), (quota, self.period_us)):
                got = live
                want = (tuple(cpus), (quota, self.period_us))
        if got != want:
            raise DockerError(f"container {box.id[:12]} holds {got} after the update, not {want}", resource=box.id)

    def _live(self, box: _Box, pid: int) -> tuple[tuple[int, ...], tuple[int | None, int]] | None:
        """The container's cpuset and CFS bandwidth as the kernel holds them (None: not readable)."""
        layout = self._layout or self._read_layout
        if layout is None:
            return None
        try:
            if box.cgroup is None:
                box.cgroup = _cgroup.locate(layout, box.id, pid=pid or None)
            return box.cgroup.cpus(), box.cgroup.quota()
        except CgroupError:
            box.cgroup = None
            return None

    def _located(self, box: _Box) -> _cgroup.ContainerCgroup | None:
        """The container's cgroup, found once (None when not readable from here)."""
        if box.cgroup is None:
            layout = self._layout or self._read_layout
            if layout is None:
                return None
            try:
                box.cgroup = _cgroup.locate(layout, box.id)
            except CgroupError:
                return None
        return box.cgroup

    def _pids(self, box: _Box) -> set[int] | None:
        """The container's host pids (None when its cgroup is not readable from here)."""
        cg = self._located(box)
        if cg is None:
            return None
        try:
            return cg.pids()
        except CgroupError:
            box.cgroup = None
            return None

    def _cpu_time(self, box: _Box) -> float | None:
        """The container's CPU seconds so far, when they can be this one command's: a container
        shared by several grants (``share=``) runs other actions' commands too."""
        if len(box.active) != 1:
            return None
        cg = self._located(box)
        return None if cg is None else cg.cpu_usage_s()

    @staticmethod
    def _granted_cpus(box: _Box) -> tuple[int, ...]:
        return tuple(sorted({c for cpus in box.active.values() for c in cpus}))

    def _forget_if_gone(self, box: _Box, exc: BaseException) -> None:
        """A container that is gone is forgotten, by every name it was known by: a container
        created again under the same name is looked up (and parked) afresh on its next use,
        instead of every later action failing on the old id."""
        if isinstance(exc, DockerError) and _gone(exc) and not box.active:
            self._forget(box)

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
            # recorded before it is parked, and its lock taken at once (nobody else has it yet, so
            # the acquire does not suspend): a concurrent first use (two acquires looking one new
            # name up) finds this record and its apply waits for the park, which therefore can
            # never land after a grant and leave the action off its cores
            box = self._boxes[info.id] = _Box(info.id, self._active_backend)
            want = (format_cpuset(self.park_cpus), self.park_quota_us, self.period_us)
            async with box.lock:
                if (info.cpuset, info.cpu_quota, info.cpu_period) != want and not box.active:
                    try:
                        await self._park_api(box)
                    except BaseException:
                        if self._boxes.get(info.id) is box and not box.active:
                            del self._boxes[info.id]  # not parked: the next use looks it up again
                        raise
        self._boxes[ref] = box
        return box

    async def _park_api(self, box: _Box) -> None:
        await self.client.update_cpu(box.id, format_cpuset(self.park_cpus), self.park_quota_us, self.period_us)
        self._stats["api_updates"] += 1
        if box.mem_now is not None and box.parked_mem is not None:
            await self.client.update_memory(box.id, box.parked_mem.memory, box.parked_mem.memory_swap)
            self._stats["api_updates"] += 1
            box.mem_now = None

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

    async def _locate(self, box: _Box) -> _cgroup.ContainerCgroup:
        """The container's cgroup (located once, from its init pid); its record's memory limits
        are taken as the parked ones on the way, before we ever change them."""
        assert self._layout is not None
        if box.cgroup is None:
            info = await self.client.inspect(box.id)
            if not info.running:
                raise DockerError(f"container {box.id[:12]} is {info.status}, not running", resource=box.id)
            if box.parked_mem is None and box.mem_now is None:
                box.parked_mem = MemoryLimits(info.memory, info.memory_swap)
            box.cgroup = _cgroup.locate(self._layout, box.id, pid=info.pid)
        return box.cgroup

    async def _set_cgroup(self, box: _Box, cpus: Sequence[int], quota_us: int) -> None:
        """Two (or three) synchronous writes: far cheaper than a thread hop, so no executor."""
        assert self._layout is not None
        for attempt in (0, 1):
            try:
                cg = await self._locate(box)
                cg.set_cpu(cpus, quota_us, self.period_us)
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


    # -- memory -------------------------------------------------------------------------------
    async def _parked_memory(self, box: _Box) -> MemoryLimits:
        if box.parked_mem is None:
            info = await self.client.inspect(box.id)
            box.parked_mem = MemoryLimits(info.memory, info.memory_swap)
        return box.parked_mem

    async def _settle_memory(self, box: _Box) -> None:
        """Give ``box`` the memory limit its live grants say (or its parked one), if it differs
        from what it holds. ActionOOMError (killed=False) when the container already holds more
        than the new limit and cannot free it; nothing is changed then."""
        target = memory_target(box)
        if target == box.mem_now:
            return
        parked = await self._parked_memory(box)
        want = parked if target is None else target
        before, box.mem_now = box.mem_now, _MEM_UNKNOWN  # a timed-out or cancelled update may land
        try:
            await self._set_memory(box, want)
        except MemoryBusyError as exc:
            box.mem_now = before  # refused: nothing changed
            raise limit_refused(box, want, exc.usage) from exc
        except DockerError as exc:
            if not is_memory_busy(exc):
                raise
            box.mem_now = before
            raise limit_refused(box, want, None) from exc
        box.mem_now = target
        self._stats["memory_updates"] += 1

    async def _set_memory(self, box: _Box, want: MemoryLimits) -> None:
        if box.backend == "cgroup":
            cg = await self._locate(box)
            try:
                if cg.memory is None:
                    raise CgroupError(f"container {box.id[:12]} has no memory cgroup to write", resource=box.id)
                cg.memory.set_limits(want)
                self._stats["cgroup_writes"] += 1
                return
            except MemoryBusyError:
                raise
            except CgroupError:
                if self.backend == "cgroup":
                    raise
                self._stats["fallbacks"] += 1  # auto: the daemon sets this one (not writable from here)
        await self.client.update_memory(box.id, want.memory, want.memory_swap)
        self._stats["api_updates"] += 1

    async def _restore_memory_quietly(self, box: _Box) -> None:
        """Settle memory after a release (or a failed apply) without failing it: the cores are
        what the pool accounts for; a limit that cannot come back yet is logged, counted, and
        retried at the container's next release."""
        if memory_target(box) == box.mem_now:
            return
        try:
            await self._settle_memory(box)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # noqa: BLE001 - logged and counted; the next settle retries
            if isinstance(exc, DockerError) and _gone(exc):
                return
            self._stats["memory_restore_failures"] += 1
            log.warning("container %s: memory limit not restored to its parked value yet: %s", box.id[:12], exc)

    async def _exec(self, box: _Box, aid: int, cmd: Sequence[str], **kw: Any) -> ExecResult:
        """``lease.exec``: run the command; if the kernel killed it for memory, raise
        ActionOOMError (the cgroup's oom_kill counter, or the daemon's ``oom`` event on the
        ``api`` backend) with the limit and the peak. A lease kept past its release is refused:
        its command would run in the parked container, on cores another action now holds."""
        if aid not in box.active:
            raise UsageError(f"lease.exec of action {aid} after its lease was released: container "
                             f"{box.id[:12]} is parked (its cores may be another action's); exec inside the "
                             "`async with` block, or before Tangram.release")
        kw.pop("thread_caps", None)  # consumed by Lease.exec (the env already says it)
        mem = box.cgroup.memory if box.backend == "cgroup" and box.cgroup is not None else None
        before = _quiet(mem.oom_kills) if mem is not None else None
        t0 = time.time()
        used0 = self._cpu_time(box)
        result = await self.client.exec(box.id, cmd, procs=functools.partial(self._pids, box), **kw)
        if used0 is not None and not result.timed_out:
            used1 = self._cpu_time(box)
            if used1 is not None and used1 >= used0:  # what the command got: lease.parallelism
                result = attrs.evolve(result, cpu_s=used1 - used0)
        if result.exit_code == 0 or result.timed_out:
            return result
        limit: int | None
        peak: int | None
        if mem is not None and before is not None:
            after = _quiet(mem.oom_kills)
            if after is None or after <= before:
                return result
            limits = _quiet(mem.limits)
            limit = None if limits is None else limits.memory
            peak = box.peak.read() if box.peak is not None else None
            where = f"peak {mib(peak)}" + ("" if box.peak is None or box.peak.since_reset else " (lifetime)")
        elif result.exit_code == KILLED:
            try:
                if await self.client.oom_events(box.id, t0 - 0.05, time.time() + 0.3) == 0:
                    return result
                stats = await self.client.memory_stats(box.id)
            except DockerError:
                return result  # the daemon cannot tell us: the plain result stands
            held = box.mem_now if box.mem_now not in (None, _MEM_UNKNOWN) else box.parked_mem
            limit = held.memory if held is not None else None
            peak = int(stats["max_usage"]) if stats.get("max_usage") else None
            where = f"peak {mib(peak)} (the container's lifetime peak: the Docker API cannot reset it)"
        else:
            return result
        self._stats["oom_kills"] += 1
        raise ActionOOMError(
            f"container {box.id[:12]}: {list(cmd)[:3]} was killed for memory (limit {mib(limit)}, {where}); "
            f"the container lives on", resource=box.id, limit=limit, peak=peak, killed=True, result=result)


def _quiet(fn: Any) -> Any:
    """A cgroup read that may fail (container gone): None instead of an error."""
    try:
        return fn()
    except CgroupError:
        return None
