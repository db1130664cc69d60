"""Evict-on-execution (EOE) for GPU services: weights live in host memory, a service is put on a GPU
only while actions need it, and idle copies are evicted least-recently-used first.

Why: reward and teacher models sit on dedicated GPUs that are busy a few percent of the time. Here
every registered service is materialised ONCE into an exact-size (page-locked where CUDA exists) host
buffer; a grant restores it onto the granted GPUs with one bulk copy per GPU, and after the action it
stays resident as a cache until another restore needs the memory.

Instances: a torch service has at most one copy per GPU, shared by every elastic width. A grant of
1, 2 or 4 GPUs holds the single-GPU instances ``(service, (g,))`` of its GPUs (data-parallel
replicas; ``lease.call`` splits the batch across them), restoring only the ones that are cold, all at
once. An offloadable server is one process: its instance is the whole grant, one awake at a time.

Concurrency contract:

* Decisions (which instance to evict, how much to reserve) are made with no ``await`` in between, then
  acted on; restores and evictions run off the event loop (``anyio.to_thread``).
* ``refs`` counts actions holding an instance; an instance with ``refs > 0`` is never evicted. A
  restore that needs memory held by instances in use waits until they are released.
* Concurrent applies of one instance restore it once: the second waits for the first's transition.
* Out of memory during a restore (``torch.OutOfMemoryError``, ``MemoryError``, a charge over the
  budget): evict every idle instance on those GPUs, retry once, then :class:`DeviceError`. The same
  for an OOM inside ``lease.call`` (activations are not in the ledger).
* The ledger charges what a restore really holds (the restored storages, rounded as the CUDA caching
  allocator rounds them); an eviction credits only memory really freed: a buffer user code still
  references stays charged until it dies.

Only :mod:`._torch_store` imports torch (lazily), so importing this module does not.
"""

from __future__ import annotations

import asyncio
import functools
import logging
import math
import time
from collections.abc import Awaitable, Callable, Coroutine, Mapping
from typing import Any, Literal, TypeVar

import anyio
import attrs

from .._deadline import within
from .._shield import finish, finish_within
from ..errors import DeviceError, InfeasibleSpecError, ManagerError, QuarantineError, SpecError
from ..lease import Lease
from ..scheduler.decisions import Grant
from ..scheduler.events import ServiceResidency
from .._validate import NAME_RE
from ..snapshot import Snapshot
from ..spec import ActionSpec
from . import _torch_store as ts
from .._optional import require
from .base import ManagerContext, Offer
from .services import HttpSleepWake, OffloadableService

__all__ = ["DeviceStatistics", "GpuStatistics", "HttpSleepWake", "InstanceStatistics", "OffloadableService", "TorchGpuManager"]

log = logging.getLogger(__name__)

RestoreHook = Callable[[str, tuple[str, ...]], None]
# "stuck": a restore or evict that outran transfer_timeout still runs in its thread; the copy is
# unusable and its GPUs stay out of the pool until it ends (then it is discarded: "cold")
State = Literal["cold", "restoring", "resident", "evicting", "stuck"]
OnOom = Callable[["_Instance"], Awaitable[int]]
_CUDA_INIT_S = 120.0  # start(): creating the CUDA contexts to read free memory
_CANCEL_GRACE_S = 5.0  # a cancelled action waits this long at most for a copy in flight
Held = list[tuple[int, ts.HeldBuffer]]  # (pool GPU, buffer still referenced after an eviction)
T = TypeVar("T")


async def _gather(fns: list[Callable[[], Awaitable[T]]]) -> list[T]:
    """Run ``fns`` concurrently to their ends; raise the first failure itself (not an exception
    group, so callers see the typed error), after every one has finished."""
    if len(fns) == 1:
        return [await fns[0]()]
    outs: list[Any] = [None] * len(fns)
    errors: list[Exception] = []

    async def run(i: int) -> None:
        try:
            outs[i] = await fns[i]()
        except Exception as exc:  # noqa: BLE001 - collected, the first is re-raised below
            errors.append(exc)

    async with anyio.create_task_group() as tg:
        for i in range(len(fns)):
            tg.start_soon(run, i)
    for extra in errors[1:]:
        log.debug("also failed: %r", extra)
    if errors:
        raise errors[0]
    return outs


def _drop_frames(exc: BaseException) -> None:
    """Free what a failed forward's frames hold (activations) before retrying or re-raising."""
    ts.clear_frames(exc.__traceback__)


class _TorchService:
    """A torch module kept in a HostStore; its single-GPU instances hold one replica each."""

    exclusive = False

    def __init__(self, name: str, store: ts.HostStore) -> None:
        self.name = name
        self.store = store
        self.estimate = store.charge  # bytes per device; follows the last measured restore

    async def restore(self, inst: _Instance, hook: RestoreHook | None) -> dict[int, int]:
        def work() -> dict[int, int]:
            if inst.replicas is None:
                inst.replicas = [self.store.make_replica(d) for d in inst.devices]
            call = None if hook is None else (lambda: hook(self.name, inst.devices))
            self.store.restore(inst.replicas, hook=call)
            return {g: r.measured for g, r in zip(inst.gpus, inst.replicas)}

        return await anyio.to_thread.run_sync(work)

    async def evict(self, inst: _Instance) -> Held:
        reps = inst.replicas or []

        def work() -> Held:
            return [(g, h) for g, r in zip(inst.gpus, reps) for h in self.store.evict([r])]

        return await anyio.to_thread.run_sync(work)

    def attach(self, lease: Lease, parts: list[_Instance], on_oom: OnOom, held: Callable[[], bool]) -> None:
        reps = [p.replicas[0] for p in parts if p.replicas]
        devices = tuple(p.devices[0] for p in parts)
        lease.attach("service", reps[0].module)
        lease.attach("replicas", tuple(r.module for r in reps))
        lease.attach("devices", devices)
        name, inference = self.name, self.store.inference

        async def run(part: _Instance, rep: ts.DeviceReplica, a: tuple[Any, ...], k: dict[str, Any]) -> Any:
            try:
                return await anyio.to_thread.run_sync(ts.run_replica, rep, inference, a, k)
            except Exception as exc:
                if not ts.is_oom(exc):
                    raise
                _drop_frames(exc)
            evicted = await on_oom(part)
            try:
                return await anyio.to_thread.run_sync(ts.run_replica, rep, inference, a, k)
            except Exception as exc:
                if not ts.is_oom(exc):
                    raise
                _drop_frames(exc)
                raise DeviceError(
                    f"service {name!r} ran out of memory on {rep.device} in lease.call, after evicting "
                    f"{evicted} idle services there and retrying once: {exc!r}",
                    resource=f"{name}@{rep.device}") from exc

        async def call(*args: Any, **kwargs: Any) -> Any:
            if not held() or any(p.state != "resident" for p in parts):  # a released copy may be evicted mid-call
                raise ManagerError(f"service {name!r} on {devices} is no longer held by this lease "
                                   "(lease.call used after the lease was released?)", resource=name)
            chunks = ts.split_batch(len(reps), args, kwargs)
            outs = await _gather([functools.partial(run, parts[i], reps[i], *chunks[i])
                                  for i in range(len(chunks))])
            return outs[0] if len(outs) == 1 else ts.gather(outs, reps[0].device)

        lease.attach("call", call)


class _OffloadService:
    """An OffloadableService adapter; restore = wake, evict = sleep, one awake instance at a time."""

    exclusive = True

    def __init__(self, name: str, adapter: OffloadableService) -> None:
        self.name = name
        self.adapter = adapter
        self.estimate = int(adapter.footprint)

    async def restore(self, inst: _Instance, hook: RestoreHook | None) -> dict[int, int]:
        if hook is not None:
            hook(self.name, inst.devices)
        await self.adapter.wake(inst.devices)
        return {g: self.estimate for g in inst.gpus}

    async def evict(self, inst: _Instance) -> Held:
        await self.adapter.sleep()
        return []

    def attach(self, lease: Lease, parts: list[_Instance], on_oom: OnOom, held: Callable[[], bool]) -> None:
        lease.attach("service", self.adapter)
        lease.attach("devices", parts[0].devices)
        fn = getattr(self.adapter, "call", None)
        if fn is not None:
            lease.attach("call", fn)


_Service = _TorchService | _OffloadService


@attrs.define(eq=False)
class _Instance:
    service: _Service
    gpus: tuple[int, ...]
    devices: tuple[str, ...]
    state: State = "cold"
    refs: int = 0
    last_used: int = 0
    charge: dict[int, int] = attrs.Factory(dict)  # bytes held or reserved per pool GPU
    replicas: list[ts.DeviceReplica] | None = None
    changed: anyio.Event = attrs.Factory(anyio.Event)
    restore_s: float | None = None


def _stuck(inst: _Instance) -> bool:
    return inst.state == "stuck"  # (a function: mypy narrows inst.state across the awaits before it)


@attrs.define(eq=False)
class _HeldCharge:
    gpu: int
    service: str
    buffer: ts.HeldBuffer


@attrs.frozen(eq=False)
class DeviceStatistics(Snapshot):
    """One pool GPU: its torch ``device``, ``budget`` (bytes; None: unlimited), bytes ``used`` by
    resident copies and ``held`` by running actions, the ``resident`` services."""

    device: str
    budget: int | None
    used: int
    held: int
    resident: list[str]


@attrs.frozen(eq=False)
class InstanceStatistics(Snapshot):
    """One copy of a service on a set of GPUs: ``state`` cold/restoring/resident/evicting, ``refs``
    actions using it, ``bytes`` charged per GPU, the last restore's seconds and last use."""

    service: str
    gpus: tuple[int, ...]
    state: str
    refs: int
    bytes: dict[int, int]
    restore_s: float | None
    last_used: int  # a use counter (LRU order), not a time


@attrs.frozen(eq=False)
class GpuStatistics(Snapshot):
    """:meth:`TorchGpuManager.statistics` (``asdict()`` for JSON; ``s["evictions"]`` still works)."""

    services: list[str]
    devices: dict[int, DeviceStatistics]
    instances: list[InstanceStatistics]
    restores: int
    evictions: int
    hits: int
    retries: int
    failures: int
    call_retries: int
    held_evictions: int
    restore_s_total: float
    host_bytes: int
    stuck: int = 0  # restores / evicts that outran transfer_timeout (their GPUs were quarantined)


class TorchGpuManager:
    """Evict-on-execution manager for GPU services (torch modules and offloadable servers).

    ``devices``: pool GPU index -> torch device string (``{0: "cuda:0"}``, or ``{0: "cpu", 1: "cpu"}``
    to run the whole machinery on the CPU). Default: ``cuda:i`` when CUDA is available, else ``cpu``.
    ``memory_budget``: bytes per pool GPU (one int for all, or a mapping); default on CUDA
    ``memory_fraction`` of the memory free on the device at ``start()`` (``torch.cuda.mem_get_info``
    plus torch's cached free blocks), split evenly between pool GPUs mapped to one device; the rest is
    left for activations. On CPU unlimited. ``empty_cache_on_evict`` returns freed blocks to the driver
    after each batch of evictions (useful when other processes share the GPU).
    ``restore_hook(service, devices)`` runs before every restore attempt (in the worker thread for
    torch services); raising from it simulates a failure - for tests and failure drills.
    ``transfer_timeout``: seconds a restore or evict (a torch copy, an offloadable server's wake or
    sleep) may take. One that takes longer fails the action with a DeviceError naming the service
    and device; the copy is "stuck", and the GPUs of the actions it fails stay out of the pool
    (``quarantined``) until the work ends and is undone. A cancelled action (a task cancel) waits
    for an unfinished copy at most ``min(transfer_timeout, 5)`` seconds more; an anyio scope's
    cancel is seen only at the bound. ``aclose()`` evicts under the same bound.
    """

    name = "gpu"

    def __init__(
        self,
        devices: Mapping[int, str] | None = None,
        memory_budget: int | Mapping[int, int] | None = None,
        *,
        memory_fraction: float = 0.9,
        empty_cache_on_evict: bool = False,
        restore_hook: RestoreHook | None = None,
        transfer_timeout: float = 600.0,
    ) -> None:
        if isinstance(transfer_timeout, bool) or not isinstance(transfer_timeout, (int, float)) \
                or not 0 < transfer_timeout < math.inf:
            raise SpecError(f"transfer_timeout must be a finite number of seconds > 0, got {transfer_timeout!r}")
        self._transfer_s = float(transfer_timeout)
        # pool GPU -> the task that undoes a stuck copy there once its work ends
        self._stuck: dict[int, asyncio.Task[None]] = {}
        self._stuck_for: dict[int, list[asyncio.Task[None]]] = {}  # action id -> what holds its GPUs back
        if devices is not None:
            for g, d in devices.items():
                if isinstance(g, bool) or not isinstance(g, int) or g < 0 or not isinstance(d, str) or not d:
                    raise SpecError(f"devices must map pool GPU indices to device strings, got {g!r}: {d!r}")
        if isinstance(memory_budget, Mapping):
            items = list(memory_budget.values())
        else:
            items = [] if memory_budget is None else [memory_budget]
        for b in items:
            if isinstance(b, bool) or not isinstance(b, int) or b < 0:
                raise SpecError(f"memory_budget must be bytes >= 0, got {b!r}")
        if not (0.0 < memory_fraction <= 1.0):
            raise SpecError(f"memory_fraction must be in (0, 1], got {memory_fraction!r}")
        self._devices_arg = dict(devices) if devices is not None else None
        self._budget_arg = memory_budget
        self._fraction = memory_fraction
        self._empty_cache = empty_cache_on_evict
        self._hook = restore_hook
        self._services: dict[str, _Service] = {}
        self._instances: dict[tuple[str, tuple[int, ...]], _Instance] = {}
        self._held: dict[int, list[_Instance]] = {}
        self._posted: set[tuple[str, tuple[int, ...]]] = set()  # multi-GPU grants believed resident
        self._held_charges: list[_HeldCharge] = []
        self._devices: dict[int, str] = dict(devices or {})
        self._budget: dict[int, int | None] = {}
        self._ctx: ManagerContext | None = None
        self._tick = 0
        self._memory = anyio.Event()
        self._stats = {"restores": 0, "evictions": 0, "hits": 0, "retries": 0, "failures": 0,
                       "call_retries": 0, "held_evictions": 0, "stuck": 0}
        self._restore_s_total = 0.0

    # -- registration ---------------------------------------------------------------------------
    def register(
        self,
        name: str,
        *,
        factory: Callable[[], Any] | None = None,
        module: Any = None,
        offloadable: OffloadableService | None = None,
        inference: bool = True,
    ) -> None:
        """Register a service once: ``factory()`` (called here, once) or ``module`` (a torch
        ``nn.Module``), or an ``offloadable`` server adapter. The module is packed into host memory
        now; ``inference=True`` puts it in eval mode and runs calls under ``torch.inference_mode``.
        A failing factory raises ManagerError, a module holding tensor subclasses (quantised weights,
        DTensor) SpecError naming the tensor; either way nothing is registered."""
        if not isinstance(name, str) or not NAME_RE.match(name):
            raise SpecError(f"service name must be a short identifier, got {name!r}")
        if name in self._services:
            raise SpecError(f"service {name!r} is already registered")
        if sum(x is not None for x in (factory, module, offloadable)) != 1:
            raise SpecError("register() needs exactly one of factory=, module= or offloadable=")
        if offloadable is not None:
            if not isinstance(offloadable, OffloadableService):
                raise SpecError(f"offloadable must have footprint, async wake(devices) and sleep(), "
                                f"got {offloadable!r}")
            fp = offloadable.footprint
            if isinstance(fp, bool) or not isinstance(fp, int) or fp < 0:
                raise SpecError(f"offloadable footprint must be bytes >= 0, got {fp!r}")
            self._services[name] = _OffloadService(name, offloadable)
            return
        # a torch service without torch installed: the promised IntegrationUnavailable (an
        # ImportError naming the extra to install), not a ManagerError wrapping ModuleNotFoundError
        require("torch", needed_by=f"GPU service {name!r} (a torch module)")
        if factory is not None:
            try:
                module = factory()
            except Exception as exc:
                raise ManagerError(f"factory for GPU service {name!r} raised {exc!r}; nothing was registered",
                                   resource=name) from exc
        try:
            store = ts.HostStore(module, inference=inference, name=name)
        except SpecError:
            raise
        except Exception as exc:
            raise ManagerError(f"could not pack GPU service {name!r} into host memory: {exc!r}",
                               resource=name) from exc
        self._services[name] = _TorchService(name, store)

    def footprint(self, name: str) -> int:
        """Bytes one copy of ``name`` is charged on each of its devices (as last measured)."""
        return self._service(name).estimate

    # -- Manager protocol ----------------------------------------------------------------------
    async def start(self, ctx: ManagerContext) -> None:
        gpus = tuple(ctx.pool.gpus)
        if self._devices_arg is None:
            cuda = ts.cuda_available()
            n = ts.device_count() if cuda else 0
            for g in gpus:
                if cuda and g >= n:
                    raise SpecError(f"pool GPU {g} has no cuda:{g} ({n} visible); pass devices={{...}}")
            self._devices = {g: (f"cuda:{g}" if cuda else "cpu") for g in gpus}
        else:
            missing = [g for g in gpus if g not in self._devices_arg]
            if missing:
                raise SpecError(f"devices has no entry for pool GPUs {missing}")
            self._devices = {g: self._devices_arg[g] for g in gpus}
        if any(i.state != "cold" for i in self._instances.values()):
            raise ManagerError("TorchGpuManager.start() while services are still resident; aclose() first")
        free: dict[str, int] = {}
        if any(d.startswith("cuda") for d in self._devices.values()):
            # reading free memory creates the CUDA context (seconds; a wedged driver hangs it):
            # off the event loop, bounded
            try:
                self._budget = await within(
                    asyncio.to_thread(lambda: {g: self._default_budget(g, free) for g in gpus}),
                    _CUDA_INIT_S, lambda: f"reading the GPUs' free memory took over {_CUDA_INIT_S:g} s "
                                          "(a wedged driver or device?)")
            except TimeoutError as exc:
                raise DeviceError(str(exc), resource=",".join(sorted(set(self._devices.values())))) from None
        else:
            self._budget = {g: self._default_budget(g, free) for g in gpus}
        self._instances.clear()
        self._held.clear()
        self._posted.clear()
        self._memory = anyio.Event()
        self._ctx = ctx

    def check(self, spec: ActionSpec) -> None:
        if spec.service is None:
            return
        svc = self._service(spec.service)
        budgets = [b for b in self._budgets_known().values()]
        if budgets and None not in budgets:
            largest = max(b for b in budgets if b is not None)
            if svc.estimate > largest:
                raise InfeasibleSpecError(
                    f"service {svc.name!r} needs {svc.estimate} bytes on each device but the largest "
                    f"device budget is {largest}")

    async def apply(self, grant: Grant, lease: Lease) -> None:
        name = lease.spec.service
        if name is None:
            return
        if not grant.gpus:
            raise DeviceError(f"service {name!r} was granted no GPUs", resource=name)
        svc = self._service(name)
        gpus = tuple(grant.gpus)
        if isinstance(svc, _TorchService) and len(gpus) > 1:
            parts = [self._instance(svc, (g,)) for g in gpus]  # one shared copy per GPU
        else:
            parts = [self._instance(svc, gpus)]
        for p in parts:
            p.refs += 1
        t0 = time.perf_counter()
        try:
            hits = await _gather([functools.partial(self._ensure_resident, p) for p in parts])
        except BaseException:
            for p in parts:
                p.refs -= 1
            stuck = [t for g in gpus if (t := self._stuck.get(g)) is not None and not t.done()]
            if stuck:  # release() holds this action's GPUs back until the stuck work has ended
                self._stuck_for[grant.action_id] = stuck
            self._notify()
            if len(parts) > 1:  # the scheduler marked the grant resident when it granted
                self._posted.discard((name, gpus))
                self._post(ServiceResidency(name, gpus, False, None))
            raise
        if len(parts) == 1:
            if hits[0] and grant.restore:  # the scheduler thought it cold: correct its belief
                self._post(ServiceResidency(name, gpus, True, None))
        else:
            restored = not all(hits)
            if restored or grant.restore:
                self._post(ServiceResidency(name, gpus, True, time.perf_counter() - t0 if restored else None))
            self._posted.add((name, gpus))
        for p in parts:
            self._touch(p)
        aid = grant.action_id
        self._held[aid] = parts
        svc.attach(lease, parts, self._on_call_oom, lambda: self._held.get(aid) is parts)

    async def release(self, grant: Grant, lease: Lease) -> None:
        stuck = self._stuck_for.pop(grant.action_id, None) or []
        # an evict that lease.call's out-of-memory retry started on these GPUs and that outran its
        # bound (a grant holds its GPUs alone, so any stuck work on them is this action's)
        stuck += [t for g in grant.gpus if (t := self._stuck.get(g)) is not None and not t.done() and t not in stuck]
        if stuck:
            where = ",".join(self._devices.get(g, str(g)) for g in grant.gpus)
            raise QuarantineError(f"a restore or evict on {where} outran transfer_timeout and still runs: "
                                  f"these GPUs return to the pool once it has ended and been undone",
                                  resource=where,
                                  # shielded: the runtime cancels what it holds back when it closes,
                                  # which must not cut the undo of a copy that may still land
                                  until=asyncio.shield(asyncio.gather(*stuck, return_exceptions=True)))
        parts = self._held.pop(grant.action_id, None)
        if parts is None:  # apply failed or the spec had no service
            return
        for p in parts:
            p.refs -= 1
            self._touch(p)
        self._notify()

    async def aclose(self) -> None:
        """Evict every resident instance (sleep offloadable servers); registrations are kept."""
        evicted: list[str] = []
        for inst in list(self._instances.values()):
            if inst.state != "resident":
                continue
            inst.state = "evicting"
            task, _cancelled, late = await finish_within(inst.service.evict(inst), self._transfer_s,
                                                         min(self._transfer_s, _CANCEL_GRACE_S))
            if late:  # stays stuck (a later start() refuses) until the evict ends and is undone
                self._wedge(inst, task, restoring=False)
                continue
            exc = task.exception()
            if exc is None:
                self._keep_held(inst, task.result())
                evicted.extend(inst.devices)
            else:
                log.error("evicting %s on %s at close failed", inst.service.name, inst.devices, exc_info=exc)
            inst.state, inst.charge = "cold", {}
            inst.changed.set()
        if self._empty_cache and evicted:
            await anyio.to_thread.run_sync(ts.release_cached, evicted)
        self._posted.clear()
        self._ctx = None

    # -- restore / evict -----------------------------------------------------------------------
    async def _ensure_resident(self, inst: _Instance) -> bool:
        """Make ``inst`` resident; True when it already was (a warm hit)."""
        while True:
            if inst.state == "resident":
                self._stats["hits"] += 1
                return True
            if inst.state == "stuck":
                where = ",".join(inst.devices)
                raise DeviceError(f"service {inst.service.name!r} on {where} is stuck in a restore or evict "
                                  f"that outran transfer_timeout ({self._transfer_s:g} s)",
                                  resource=f"{inst.service.name}@{where}")
            if inst.state != "cold":
                await inst.changed.wait()
                continue
            inst.state, inst.changed = "restoring", anyio.Event()
            changed = inst.changed
            try:
                await self._restore(inst)
                inst.state = "resident"
            except BaseException:
                if not _stuck(inst):  # a stuck copy turns cold once its work has ended
                    inst.state = "cold"
                raise
            finally:
                changed.set()
                self._notify()
            return False

    async def _restore(self, inst: _Instance) -> None:
        svc, retried = inst.service, False
        while True:
            await self._make_room(inst)
            t0 = time.perf_counter()
            failure: BaseException | None = None
            # the copy runs in a worker thread that a cancel cannot stop: wait for it to end
            # (finish) before discarding, or a copy landing after the discard would sit on the
            # device outside the ledger, and a failing one would detach a later lease's replica
            task, cancelled = await self._bounded(inst, svc.restore(inst, self._hook), restoring=True)
            if cancelled:
                await self._discard(inst)
                inst.charge = {}
                raise asyncio.CancelledError
            exc = task.exception()
            if exc is not None and not isinstance(exc, Exception):
                await self._discard(inst)
                inst.charge = {}
                raise exc
            if exc is not None:  # classified below (OOM: retry; else DeviceError)
                failure = exc
                if await self._discard(inst):
                    inst.charge = {}
                    raise asyncio.CancelledError from exc
            else:
                measured = task.result()
            if failure is None:
                inst.charge = dict(measured)
                if measured:
                    svc.estimate = max(measured.values())
                over = [g for g in inst.gpus if self._over_budget(g)]
                if not over:
                    break
                if await self._discard(inst):
                    inst.charge = {}
                    raise asyncio.CancelledError
                failure = MemoryError(f"measured charge {max(measured.values())} bytes exceeds the budget "
                                      f"on {[self._devices[g] for g in over]}")
            inst.charge = {}
            if not ts.is_oom(failure) or retried:
                self._stats["failures"] += 1
                where = ",".join(inst.devices)
                raise DeviceError(
                    f"restoring service {svc.name!r} on {where} failed"
                    f"{' after evicting idle services and retrying once' if retried else ''}: {failure!r}",
                    resource=f"{svc.name}@{where}") from failure
            retried = True
            self._stats["retries"] += 1
            await self._evict_all_idle(inst)
        inst.restore_s = time.perf_counter() - t0
        self._stats["restores"] += 1
        self._restore_s_total += inst.restore_s
        self._post(ServiceResidency(svc.name, inst.gpus, True, inst.restore_s))

    async def _discard(self, inst: _Instance) -> bool:
        """Free whatever a failed or cancelled restore left behind (idempotent, errors logged), and
        tell the scheduler the copy is not there (it marked it resident when it granted). Returns
        whether the caller was cancelled meanwhile (it must re-raise once its state is settled)."""
        task, cancelled = await finish(inst.service.evict(inst))
        exc = task.exception()
        if exc is not None:
            log.warning("cleaning up a failed restore of %s on %s failed", inst.service.name, inst.devices,
                        exc_info=exc)
        else:
            self._keep_held(inst, task.result())
        self._post(ServiceResidency(inst.service.name, inst.gpus, False, None))
        return cancelled

    async def _make_room(self, inst: _Instance) -> None:
        """Reserve ``estimate`` bytes on every GPU of ``inst``, evicting idle instances LRU-first and
        waiting while the memory is held by instances in use or in transition."""
        svc = inst.service
        while True:
            need = svc.estimate
            for g in inst.gpus:
                b = self._budget.get(g)
                if b is None:
                    continue
                where = f"{svc.name}@{self._devices[g]}"
                if need > b:
                    raise DeviceError(f"service {svc.name!r} needs {need} bytes but {self._devices[g]} "
                                      f"(pool GPU {g}) has a budget of {b}", resource=where)
                held = self._held_bytes(g)
                if held and need + held > b:  # waiting cannot help: only user code can free it
                    owners = sorted({h.service for h in self._held_charges if h.gpu == g})
                    raise DeviceError(
                        f"service {svc.name!r} needs {need} bytes on {self._devices[g]} (pool GPU {g}) but "
                        f"{held} of its budget of {b} are held by user code: tensors of evicted copies of "
                        f"{', '.join(map(repr, owners))} are still referenced after their lease", resource=where)
            victims = self._plan(inst, need)
            if victims is not None:
                break
            waiter = self._memory
            await waiter.wait()
        inst.charge = {g: need for g in inst.gpus}
        try:
            await self._evict_many(victims)
        except BaseException:
            inst.charge = {}
            raise

    def _plan(self, inst: _Instance, need: int) -> list[_Instance] | None:
        """Pick victims (no await): idle resident instances on ``inst``'s GPUs, least recently used
        first, until ``need`` fits everywhere. None when in-use or transitioning memory blocks it."""
        chosen: list[_Instance] = []
        freed: dict[int, int] = {}

        def take(v: _Instance) -> None:
            chosen.append(v)
            for h, n in v.charge.items():
                freed[h] = freed.get(h, 0) + n

        if inst.service.exclusive:
            for other in self._instances.values():
                if other is not inst and other.service is inst.service and other.state != "cold":
                    if other.state != "resident" or other.refs:
                        return None
                    take(other)
        idle = sorted((i for i in self._instances.values()
                       if i is not inst and i.state == "resident" and i.refs == 0 and i not in chosen),
                      key=lambda i: i.last_used)
        for g in inst.gpus:
            b = self._budget.get(g)
            if b is None:
                continue
            used = self._used(g)
            for v in idle:
                if used - freed.get(g, 0) + need <= b:
                    break
                if g in v.gpus and v not in chosen:
                    take(v)
            if used - freed.get(g, 0) + need > b:
                return None
        return chosen

    async def _evict(self, v: _Instance) -> None:
        """Evict ``v`` (already marked 'evicting') to the end even if the caller is cancelled — a
        half-evicted copy is unusable — and settle its state either way before anything propagates."""
        task, cancelled = await self._bounded(v, v.service.evict(v), restoring=False)
        exc = task.exception()
        if exc is not None:
            v.state = "resident"
            v.changed.set()
            self._notify()
            if cancelled:
                raise asyncio.CancelledError
            raise DeviceError(f"evicting service {v.service.name!r} from {','.join(v.devices)} failed: {exc!r}",
                              resource=f"{v.service.name}@{','.join(v.devices)}") from exc
        self._keep_held(v, task.result())
        v.state, v.charge = "cold", {}
        v.changed.set()
        self._stats["evictions"] += 1
        self._notify()
        self._posted_gone(v)
        if cancelled:
            raise asyncio.CancelledError

    async def _bounded(self, inst: _Instance, work: Coroutine[Any, Any, T], *, restoring: bool
                       ) -> tuple[asyncio.Future[T], bool]:
        """:func:`finish` ``work`` (a restore or evict of ``inst``) within ``transfer_timeout``:
        ``(task, cancelled)`` when it ended; past the bound the copy is stuck (:meth:`_wedge`) and
        a DeviceError naming it is raised (the caller's cancel, if one came, instead)."""
        task, cancelled, late = await finish_within(work, self._transfer_s, min(self._transfer_s, _CANCEL_GRACE_S))
        if not late:
            return task, cancelled
        self._wedge(inst, task, restoring=restoring)
        if cancelled:
            raise asyncio.CancelledError
        where = ",".join(inst.devices)
        doing = f"restoring service {inst.service.name!r} on" if restoring else \
            f"evicting service {inst.service.name!r} from"
        raise DeviceError(f"{doing} {where} did not end within transfer_timeout ({self._transfer_s:g} s); its "
                          f"GPUs stay out of the pool until it does", resource=f"{inst.service.name}@{where}")

    def _posted_gone(self, v: _Instance) -> None:
        """Tell the scheduler ``v``'s copy is gone, and every wider grant that used it."""
        self._post(ServiceResidency(v.service.name, v.gpus, False, None))
        for key in [k for k in self._posted if k[0] == v.service.name and set(k[1]) & set(v.gpus)]:
            self._posted.discard(key)  # a wider grant using this copy is not resident any more
            self._post(ServiceResidency(key[0], key[1], False, None))

    def _wedge(self, inst: _Instance, work: asyncio.Future[Any], *, restoring: bool) -> None:
        """``work`` (a restore or evict of ``inst``) outran its bound and still runs: mark the copy
        stuck (waiters fail fast), and once the work ends undo it (a late restore's copy would
        sit on the device outside the ledger) and make the copy cold again."""
        self._stats["stuck"] += 1
        inst.state = "stuck"
        old, inst.changed = inst.changed, anyio.Event()
        old.set()
        self._notify()
        log.error("%s %s on %s outran transfer_timeout (%g s); its GPUs stay out of the pool until it ends",
                  "restoring" if restoring else "evicting", inst.service.name, inst.devices, self._transfer_s)

        async def undo() -> None:
            try:
                await asyncio.wait({work})
                exc = None if work.cancelled() else work.exception()
                if restoring or exc is not None:  # whatever landed is freed, whatever the work did
                    await self._discard(inst)
                else:
                    self._keep_held(inst, work.result())
                    self._stats["evictions"] += 1
                    self._posted_gone(inst)
            finally:
                inst.state, inst.charge = "cold", {}
                inst.changed.set()
                for g in inst.gpus:
                    if self._stuck.get(g) is task:
                        del self._stuck[g]
                self._notify()

        task = asyncio.get_running_loop().create_task(undo(), name=f"tangram-gpu-stuck-{inst.service.name}")
        for g in inst.gpus:
            self._stuck[g] = task

    def _keep_held(self, v: _Instance, held: Held) -> None:
        """Keep charging device buffers an eviction could not free (user code holds their tensors)."""
        for g, buf in held:
            self._stats["held_evictions"] += 1
            self._held_charges.append(_HeldCharge(g, v.service.name, buf))
            log.warning("evicted %s from %s, but user code still references its tensors: %d bytes stay "
                        "charged there until they are dropped", v.service.name, buf.device, buf.nbytes)

    async def _evict_all_idle(self, inst: _Instance) -> int:
        # by physical device, not pool GPU: pool GPUs mapped to one CUDA device share its memory
        # (on the CPU path every pool GPU stands for a device of its own)
        mem = {self._memory_of(g) for g in inst.gpus}
        victims = [i for i in self._instances.values() if i is not inst and i.state == "resident"
                   and i.refs == 0 and any(self._memory_of(g) in mem for g in i.gpus)]
        await self._evict_many(victims)
        return len(victims)

    def _memory_of(self, g: int) -> str | int:
        dev = self._devices[g]
        return dev if dev.startswith("cuda") else g

    async def _on_call_oom(self, inst: _Instance) -> int:
        """``lease.call`` ran out of device memory on ``inst``'s GPU: evict the idle services there."""
        self._stats["call_retries"] += 1
        return await self._evict_all_idle(inst)

    async def _evict_many(self, victims: list[_Instance]) -> None:
        """Mark all victims at once (so no other planner picks them), then evict them in turn; if one
        fails, the ones not yet evicted go back to 'resident' untouched. With ``empty_cache_on_evict``
        the freed blocks go back to the driver once per batch (the call synchronises every GPU)."""
        for v in victims:
            v.state, v.changed = "evicting", anyio.Event()
        for k, v in enumerate(victims):
            try:
                await self._evict(v)
            except BaseException:
                for rest in victims[k + 1 :]:
                    rest.state = "resident"
                    rest.changed.set()
                self._notify()
                raise
        if self._empty_cache and victims:
            devices = [d for v in victims for d in v.devices]
            task, cancelled = await finish(anyio.to_thread.run_sync(ts.release_cached, devices))
            if task.exception() is not None:
                log.warning("empty_cache after eviction failed", exc_info=task.exception())
            if cancelled:
                raise asyncio.CancelledError

    # -- bookkeeping ---------------------------------------------------------------------------
    def _service(self, name: str) -> _Service:
        try:
            return self._services[name]
        except KeyError:
            known = ", ".join(sorted(self._services)) or "none"
            raise SpecError(f"unknown GPU service {name!r} (registered: {known})") from None

    def _instance(self, svc: _Service, gpus: tuple[int, ...]) -> _Instance:
        key = (svc.name, gpus)
        inst = self._instances.get(key)
        if inst is None:
            missing = [g for g in gpus if g not in self._devices]
            if missing:
                raise DeviceError(f"GPUs {missing} have no device mapping (was start() called?)",
                                  resource=svc.name)
            inst = _Instance(svc, gpus, tuple(self._devices[g] for g in gpus))
            self._instances[key] = inst
        return inst

    def _default_budget(self, g: int, free: dict[str, int]) -> int | None:
        arg = self._budget_arg
        if isinstance(arg, Mapping):
            if g in arg:
                return int(arg[g])
        elif arg is not None:
            return int(arg)
        dev = self._devices[g]
        if not dev.startswith("cuda"):
            return None
        if dev not in free:
            try:
                free[dev] = ts.device_free_memory(dev)
            except Exception as exc:  # no driver, a busy or lost device, OOM creating the context
                raise DeviceError(f"reading the free memory of {dev} (pool GPU {g}) failed: {exc!r}",
                                  resource=f"gpu{g}@{dev}") from exc
        sharing = sum(1 for d in self._devices.values() if d == dev)
        return int(free[dev] * self._fraction) // sharing

    def _budgets_known(self) -> dict[int, int | None]:
        if self._budget:
            return self._budget
        arg = self._budget_arg
        if isinstance(arg, Mapping):
            return {g: int(b) for g, b in arg.items()}
        return {} if arg is None else {-1: int(arg)}

    def _held_bytes(self, g: int) -> int:
        if not self._held_charges:
            return 0
        self._held_charges = [h for h in self._held_charges if h.buffer.alive]
        return sum(h.buffer.nbytes for h in self._held_charges if h.gpu == g)

    def _used(self, g: int) -> int:
        return sum(i.charge.get(g, 0) for i in self._instances.values()) + self._held_bytes(g)

    def _over_budget(self, g: int) -> bool:
        b = self._budget.get(g)
        return b is not None and self._used(g) > b

    def _touch(self, inst: _Instance) -> None:
        self._tick += 1
        inst.last_used = self._tick

    def _notify(self) -> None:
        self._memory.set()
        self._memory = anyio.Event()

    def _post(self, event: ServiceResidency) -> None:
        if self._ctx is None:
            return
        try:
            self._ctx.post(event)
        except Exception:  # the runtime may be closing; residency is only a hint
            log.debug("could not post %r", event, exc_info=True)

    # -- introspection -------------------------------------------------------------------------
    def describe(self) -> Offer:
        """The services registered so far: an action naming another one is not routed here."""
        return Offer(services=tuple(sorted(self._services)))

    def statistics(self) -> GpuStatistics:
        """A frozen snapshot (:class:`GpuStatistics`): per-GPU budget/used/held/resident services,
        per-instance state, counters, and the host bytes the registered torch services keep."""
        devices = {
            g: DeviceStatistics(device=d, budget=self._budget.get(g), used=self._used(g), held=self._held_bytes(g),
                                resident=sorted(i.service.name for i in self._instances.values()
                                                if g in i.gpus and i.state == "resident"))
            for g, d in self._devices.items()
        }
        instances = [
            InstanceStatistics(service=i.service.name, gpus=i.gpus, state=i.state, refs=i.refs,
                               bytes=dict(i.charge), restore_s=i.restore_s, last_used=i.last_used)
            for i in self._instances.values()
        ]
        host = sum(s.store.footprint for s in self._services.values() if isinstance(s, _TorchService))
        return GpuStatistics(services=sorted(self._services), devices=devices, instances=instances,
                             restore_s_total=self._restore_s_total, host_bytes=host, **self._stats)

    def __repr__(self) -> str:
        parts = [f"{len(self._services)} services"]
        for g, d in self._devices.items():
            b = self._budget.get(g)
            cap = "inf" if b is None else f"{b / 1e6:.1f}"
            names = ",".join(sorted(i.service.name for i in self._instances.values()
                                    if g in i.gpus and i.state == "resident")) or "-"
            parts.append(f"gpu{g} {d} {self._used(g) / 1e6:.1f}/{cap}MB {names}")
        return f"<TorchGpuManager {' | '.join(parts)}>"
