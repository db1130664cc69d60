"""Evict-on-execution (EOE) for GPU services: weights live in host memory, a service is put on a GPU
only while actions need it, and idle copies are evicted least-recently-used first.

Why: reward and teacher models sit on dedicated GPUs that are busy a few percent of the time. Here
every registered service is materialised ONCE into a (pinned) host buffer; a grant restores it onto the
granted GPUs with one bulk copy, and after the action it stays resident as a cache until another
restore needs the memory. An *instance* is ``(service, gpus)``: 1, 2 or 4 GPUs are separate instances
(data-parallel replicas, one per GPU; ``lease.call`` splits the batch across them).

Concurrency contract:

* Decisions (which instance to evict, how much to reserve) are made with no ``await`` in between, then
  acted on; restores and evictions run off the event loop (``anyio.to_thread``).
* ``refs`` counts actions holding an instance; an instance with ``refs > 0`` is never evicted. A
  restore that needs memory held by instances in use waits until they are released.
* Concurrent applies of one instance restore it once: the second waits for the first's transition.
* Out of memory during a restore (``torch.OutOfMemoryError``, ``MemoryError``, a measured footprint
  over the budget): evict every idle instance on those GPUs, retry once, then :class:`DeviceError`.

Only :mod:`._torch_store` imports torch (lazily), so importing this module does not.
"""

from __future__ import annotations

import asyncio

import json
import logging
import time
import urllib.parse
import urllib.request
from collections.abc import Callable, Mapping
from typing import Any, Literal, Protocol, runtime_checkable

import anyio
import attrs

from ..errors import DeviceError, InfeasibleSpecError, ManagerError, SpecError
from ..lease import Lease
from ..scheduler.decisions import Grant
from .._shield import finish
from ..scheduler.events import ServiceResidency
from ..spec import _NAME_RE, ActionSpec
from . import _torch_store as ts
from .base import ManagerContext

__all__ = ["HttpSleepWake", "OffloadableService", "TorchGpuManager"]

log = logging.getLogger(__name__)

RestoreHook = Callable[[str, tuple[str, ...]], None]
State = Literal["cold", "restoring", "resident", "evicting"]


@runtime_checkable
class OffloadableService(Protocol):
    """An external server that can release and re-acquire its GPU memory (vLLM sleep/wake style).

    ``footprint``: bytes it occupies on each device while awake. ``wake(devices)`` must return only
    once the server is ready to serve; ``sleep()`` only once the memory is free. A server is a single
    process, so it has at most one awake instance at a time. If it defines ``async call(...)``, that
    becomes ``lease.call``; ``lease.service`` is the adapter itself.
    """

    footprint: int

    async def wake(self, devices: tuple[str, ...]) -> None: ...

    async def sleep(self) -> None: ...


class _TorchService:
    """A torch module kept in a HostStore; instances hold per-device replicas."""

    exclusive = False

    def __init__(self, name: str, store: ts.HostStore) -> None:
        self.name = name
        self.store = store
        self.estimate = store.footprint  # bytes per device; raised to the largest measured restore

    async def restore(self, inst: _Instance, hook: RestoreHook | None) -> dict[int, int]:
        def work() -> dict[int, int]:
            if inst.replicas is None:
                inst.replicas = [self.store.make_replica(d) for d in inst.devices]
            call = None if hook is None else (lambda: hook(self.name, inst.devices))
            self.store.restore(inst.replicas, hook=call)
            return {g: r.measured for g, r in zip(inst.gpus, inst.replicas)}

        return await anyio.to_thread.run_sync(work)

    async def evict(self, inst: _Instance, empty_cache: bool) -> None:
        reps = inst.replicas or []
        await anyio.to_thread.run_sync(lambda: self.store.evict(reps, empty_cache=empty_cache))

    def attach(self, lease: Lease, inst: _Instance) -> None:
        reps = inst.replicas or []
        lease.attach("service", reps[0].module)
        lease.attach("replicas", tuple(r.module for r in reps))
        lease.attach("devices", inst.devices)

        async def call(*args: Any, **kwargs: Any) -> Any:
            if inst.state != "resident":
                raise ManagerError(f"service {self.name!r} on {inst.devices} is no longer resident "
                                   "(lease.call used after the lease was released?)", resource=self.name)
            chunks = ts.split_batch(len(reps), args, kwargs)
            outs: list[Any] = [None] * len(chunks)

            async def one(i: int) -> None:
                a, k = chunks[i]
                outs[i] = await anyio.to_thread.run_sync(ts.run_replica, reps[i], self.store.inference, a, k)

            if len(chunks) == 1:
                await one(0)
                return outs[0]
            async with anyio.create_task_group() as tg:
                for i in range(len(chunks)):
                    tg.start_soon(one, i)
            return ts.gather(outs, reps[0].device)

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

    async def evict(self, inst: _Instance, empty_cache: bool) -> None:
        await self.adapter.sleep()

    def attach(self, lease: Lease, inst: _Instance) -> None:
        lease.attach("service", self.adapter)
        lease.attach("devices", inst.devices)
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


class TorchGpuManager:
    """Evict-on-execution manager for GPU services (torch modules and offloadable servers).

    ``devices``: pool GPU index -> torch device string (``{0: "cuda:0"}``, or ``{0: "cpu", 1: "cpu"}``
    to run the whole machinery on the CPU). Default: ``cuda:i`` when CUDA is available, else ``cpu``.
    ``memory_budget``: bytes per pool GPU (one int for all, or a mapping); default on CUDA
    ``memory_fraction`` of the device's total memory, on CPU unlimited. ``empty_cache_on_evict``
    returns freed blocks to the driver (useful when other processes share the GPU).
    ``restore_hook(service, devices)`` runs before every restore attempt (in the worker thread for
    torch services); raising from it simulates a failure - for tests and failure drills.
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
    ) -> None:
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
        self._held: dict[int, _Instance] = {}
        self._devices: dict[int, str] = dict(devices or {})
        self._budget: dict[int, int | None] = {}
        self._ctx: ManagerContext | None = None
        self._tick = 0
        self._memory = anyio.Event()
        self._stats = {"restores": 0, "evictions": 0, "hits": 0, "retries": 0, "failures": 0}
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
        A failing factory raises ManagerError and registers nothing."""
        if not isinstance(name, str) or not _NAME_RE.match(name):
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
        if factory is not None:
            try:
                module = factory()
            except Exception as exc:
                raise ManagerError(f"factory for GPU service {name!r} raised {exc!r}; nothing was registered",
                                   resource=name) from exc
        try:
            store = ts.HostStore(module, inference=inference)
        except SpecError:
            raise
        except Exception as exc:
            raise ManagerError(f"could not pack GPU service {name!r} into host memory: {exc!r}",
                               resource=name) from exc
        self._services[name] = _TorchService(name, store)

    def footprint(self, name: str) -> int:
        """Bytes one instance of ``name`` occupies on each of its devices (as measured so far)."""
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
        self._budget = {g: self._default_budget(g) for g in gpus}
        if any(i.state != "cold" for i in self._instances.values()):
            raise ManagerError("TorchGpuManager.start() while services are still resident; aclose() first")
        self._instances.clear()
        self._held.clear()
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
        inst = self._instance(svc, tuple(grant.gpus))
        inst.refs += 1
        try:
            hit = await self._ensure_resident(inst)
        except BaseException:
            inst.refs -= 1
            self._notify()
            raise
        if hit and grant.restore:  # the scheduler thought it cold: correct its belief
            self._post(ServiceResidency(name, inst.gpus, True, None))
        self._touch(inst)
        self._held[grant.action_id] = inst
        svc.attach(lease, inst)

    async def release(self, grant: Grant, lease: Lease) -> None:
        inst = self._held.pop(grant.action_id, None)
        if inst is None:  # apply failed or the spec had no service
            return
        inst.refs -= 1
        self._touch(inst)
        self._notify()

    async def aclose(self) -> None:
        """Evict every resident instance (sleep offloadable servers); registrations are kept."""
        for inst in list(self._instances.values()):
            if inst.state != "resident":
                continue
            inst.state = "evicting"
            try:
                with anyio.CancelScope(shield=True):
                    await inst.service.evict(inst, self._empty_cache)
            except Exception:
                log.exception("evicting %s on %s at close failed", inst.service.name, inst.devices)
            inst.state, inst.charge = "cold", {}
            inst.changed.set()
        self._ctx = None

    # -- restore / evict -----------------------------------------------------------------------
    async def _ensure_resident(self, inst: _Instance) -> bool:
        """Make ``inst`` resident; True when it already was (a warm hit)."""
        while True:
            if inst.state == "resident":
                self._stats["hits"] += 1
                return True
            if inst.state != "cold":
                await inst.changed.wait()
                continue
            inst.state, inst.changed = "restoring", anyio.Event()
            try:
                await self._restore(inst)
                inst.state = "resident"
            except BaseException:
                inst.state = "cold"
                raise
            finally:
                inst.changed.set()
                self._notify()
            return False

    async def _restore(self, inst: _Instance) -> None:
        svc, retried = inst.service, False
        while True:
            await self._make_room(inst)
            t0 = time.perf_counter()
            failure: BaseException | None = None
            try:
                measured = await svc.restore(inst, self._hook)
            except Exception as exc:  # noqa: BLE001 - classified below (OOM: retry; else DeviceError)
                failure = exc
                if await self._discard(inst):
                    inst.charge = {}
                    raise asyncio.CancelledError from exc
            except BaseException:  # cancelled: the copy may have landed anyway; do not leak it
                await self._discard(inst)
                inst.charge = {}
                raise
            if failure is None:
                inst.charge = dict(measured)
                svc.estimate = max(svc.estimate, *measured.values())
                over = [g for g in inst.gpus if self._over_budget(g)]
                if not over:
                    break
                with anyio.CancelScope(shield=True):
                    await svc.evict(inst, self._empty_cache)
                failure = MemoryError(f"measured footprint {max(measured.values())} bytes exceeds the budget "
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
        task, cancelled = await finish(inst.service.evict(inst, self._empty_cache))
        if task.exception() is not None:
            log.warning("cleaning up a failed restore of %s on %s failed", inst.service.name, inst.devices,
                        exc_info=task.exception())
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
                if b is not None and need > b:
                    raise DeviceError(f"service {svc.name!r} needs {need} bytes but {self._devices[g]} "
                                      f"(pool GPU {g}) has a budget of {b}", resource=f"{svc.name}@{self._devices[g]}")
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
            for v in idle:
                if self._used(g) - freed.get(g, 0) + need <= b:
                    break
                if g in v.gpus and v not in chosen:
                    take(v)
            if self._used(g) - freed.get(g, 0) + need > b:
                return None
        return chosen

    async def _evict(self, v: _Instance) -> None:
        """Evict ``v`` (already marked 'evicting') to the end even if the caller is cancelled — a
        half-evicted copy is unusable — and settle its state either way before anything propagates."""
        task, cancelled = await finish(v.service.evict(v, self._empty_cache))
        exc = task.exception()
        if exc is not None:
            v.state = "resident"
            v.changed.set()
            self._notify()
            if cancelled:
                raise asyncio.CancelledError
            raise DeviceError(f"evicting service {v.service.name!r} from {','.join(v.devices)} failed: {exc!r}",
                              resource=f"{v.service.name}@{','.join(v.devices)}") from exc
        v.state, v.charge = "cold", {}
        v.changed.set()
        self._stats["evictions"] += 1
        self._notify()
        self._post(ServiceResidency(v.service.name, v.gpus, False, None))
        if cancelled:
            raise asyncio.CancelledError

    async def _evict_all_idle(self, inst: _Instance) -> None:
        await self._evict_many([i for i in self._instances.values() if i is not inst and i.state == "resident"
                                and i.refs == 0 and set(i.gpus) & set(inst.gpus)])

    async def _evict_many(self, victims: list[_Instance]) -> None:
        """Mark all victims at once (so no other planner picks them), then evict them in turn; if one
        fails, the ones not yet evicted go back to 'resident' untouched."""
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

    def _default_budget(self, g: int) -> int | None:
        arg = self._budget_arg
        if isinstance(arg, Mapping):
            if g in arg:
                return int(arg[g])
        elif arg is not None:
            return int(arg)
        dev = self._devices[g]
        if dev.startswith("cuda"):
            return int(ts.device_total_memory(dev) * self._fraction)
        return None

    def _budgets_known(self) -> dict[int, int | None]:
        if self._budget:
            return self._budget
        arg = self._budget_arg
        if isinstance(arg, Mapping):
            return {g: int(b) for g, b in arg.items()}
        return {} if arg is None else {-1: int(arg)}

    def _used(self, g: int) -> int:
        return sum(i.charge.get(g, 0) for i in self._instances.values())

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
    def statistics(self) -> dict[str, Any]:
        """A snapshot: per-GPU budget/used/resident services, per-instance state, counters."""
        devices = {
            g: {"device": d, "budget": self._budget.get(g), "used": self._used(g),
                "resident": sorted(i.service.name for i in self._instances.values()
                                   if g in i.gpus and i.state == "resident")}
            for g, d in self._devices.items()
        }
        instances = [
            {"service": i.service.name, "gpus": i.gpus, "state": i.state, "refs": i.refs,
             "bytes": dict(i.charge), "restore_s": i.restore_s, "last_used": i.last_used}
            for i in self._instances.values()
        ]
        return {"services": sorted(self._services), "devices": devices, "instances": instances,
                **self._stats, "restore_s_total": self._restore_s_total}

    def __repr__(self) -> str:
        parts = [f"{len(self._services)} services"]
        for g, d in self._devices.items():
            b = self._budget.get(g)
            cap = "inf" if b is None else f"{b / 1e6:.1f}"
            names = ",".join(sorted(i.service.name for i in self._instances.values()
                                    if g in i.gpus and i.state == "resident")) or "-"
            parts.append(f"gpu{g} {d} {self._used(g) / 1e6:.1f}/{cap}MB {names}")
        return f"<TorchGpuManager {' | '.join(parts)}>"


class HttpSleepWake:
    """OffloadableService for vLLM-style servers: ``POST /sleep?level=N`` and ``POST /wake_up``
    (vLLM exposes them with ``--enable-sleep-mode`` and ``VLLM_SERVER_DEV_MODE=1``). The server owns
    its GPUs; ``devices`` is only logged. Uses the stdlib in a worker thread, so no extra dependency.
    ``call(path, payload)`` POSTs JSON (e.g. ``/v1/completions``) and returns the decoded reply."""

    def __init__(self, base_url: str, footprint: int, *, level: int = 1, timeout: float = 60.0) -> None:
        url = urllib.parse.urlsplit(base_url)
        if url.scheme not in ("http", "https") or not url.netloc:
            raise SpecError(f"base_url must be an http(s) URL, got {base_url!r}")
        self.base_url = base_url.rstrip("/")
        self.footprint = footprint
        self.level = level
        self.timeout = timeout

    async def wake(self, devices: tuple[str, ...]) -> None:
        log.debug("waking %s for %s", self.base_url, devices)
        await self._post("/wake_up", None)

    async def sleep(self) -> None:
        await self._post(f"/sleep?level={self.level}", None)

    async def call(self, path: str, payload: Mapping[str, Any]) -> Any:
        return await self._post(path, payload)

    async def _post(self, path: str, payload: Mapping[str, Any] | None) -> Any:
        data = b"" if payload is None else json.dumps(payload).encode()

        def do() -> Any:
            req = urllib.request.Request(self.base_url + path, data=data, method="POST",
                                         headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=self.timeout) as resp:  # scheme checked in __init__
                body = resp.read()
            return json.loads(body) if body.strip() else None

        try:
            return await anyio.to_thread.run_sync(do)
        except OSError as exc:
            raise DeviceError(f"{self.base_url}{path} failed: {exc!r}", resource=self.base_url) from exc

    def __repr__(self) -> str:
        return f"<HttpSleepWake {self.base_url} {self.footprint / 1e9:.1f}GB>"
