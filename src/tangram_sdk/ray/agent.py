"""The per-node agent: a Ray actor pinned to one node (NodeAffinitySchedulingStrategy, hard) that
runs that node's resource managers.

The scheduler actor creates one agent per node it manages (so agents share its fate), asks it for
the node's :class:`~tangram_sdk.pool.Pool`, and then, for every grant on that node, calls
``apply``/``release`` (and ``resize`` when a malleable action is grown or shrunk) here: the cpuset
write happens on the machine whose containers it touches and the GPU restore on the machine whose
devices it fills. Clients reach ``lease.exec``/``lease.call`` through ``exec``/``call`` here. The scheduler keeps one ``watch()`` call open: when the agent or its
node dies, that call fails and the node leaves the pool.
"""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable, Sequence
from typing import Any

from .._shield import finish
from ..errors import ManagerError, SpecError, TangramError
from ..lease import Lease, grow_ceiling
from ..managers.base import Applied, Manager, ManagerContext, offer_of
from ..pool import Pool
from ..scheduler.decisions import Grant
from ..scheduler.events import Event
from ..spec import ActionSpec
from ._ray import require

__all__ = ["NodeAgent", "default_node_pool"]

log = logging.getLogger("tangram_sdk.ray")


def default_node_pool() -> Pool:
    """This machine's pool as the agent sees it: the cores it may run on, the GPUs Ray counts."""
    cpus: Sequence[int]
    try:
        cpus = sorted(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        cpus = range(os.cpu_count() or 1)
    gpus = 0
    try:
        ray = require()
        node_id = ray.get_runtime_context().get_node_id()
        for n in ray.nodes():
            if n.get("NodeID") == node_id:
                gpus = int(n.get("Resources", {}).get("GPU", 0))
    except Exception as exc:  # noqa: BLE001 - best effort: a pool without GPUs is still right
        log.warning("could not count this node's GPUs through Ray: %r", exc)
    return Pool(cpus=list(cpus), gpus=gpus)


class _Held:
    """One action's grant on this node: its lease, the managers whose apply began, whether that
    apply has finished (a release or resize that overtakes a slow apply waits for it), and the
    lock its resizes take turns on."""

    __slots__ = ("applied", "lease", "resizing", "settled")

    def __init__(self, lease: Lease, applied: Applied) -> None:
        self.lease = lease
        self.applied = applied
        self.settled = asyncio.Event()
        self.resizing = asyncio.Lock()  # a malleable action's resizes, one at a time


class NodeAgent:
    """Ray actor body (wrapped with ``ray.remote`` by the scheduler actor; async, so one event loop)."""

    def __init__(
        self,
        node: str,
        pool: Pool | Callable[[], Pool] | None,
        managers: Callable[[], Sequence[Manager]] | None,
        containers: Sequence[str] = (),
        scheduler: Any = None,
    ) -> None:
        self.node = node
        self._pool_src = pool
        self._managers_src = managers
        self._containers = list(containers)
        self._scheduler = scheduler
        self.pool: Pool | None = None
        self.managers: list[Manager] = []
        self._leases: dict[int, _Held] = {}
        self._held_back: dict[int, asyncio.Future[Any]] = {}
        self._forever = asyncio.Event()

    async def start(self) -> dict[str, Any]:
        """Evaluate the pool and build/start the managers here, on the node. User code runs in
        both; what it raises becomes SpecError naming ``pool``/``managers`` (a manager's own
        TangramError, e.g. DockerError for an unreachable daemon, passes unchanged)."""
        src = self._pool_src
        try:
            pool = src() if callable(src) else (src if src is not None else default_node_pool())
        except Exception as exc:  # noqa: BLE001 - user code
            raise SpecError(f"node {self.node!r}: the pool callable raised {type(exc).__name__}: {exc}") from None
        if not isinstance(pool, Pool):
            raise SpecError(f"node {self.node!r}: pool must be a Pool (or a callable returning one), got {pool!r}")
        if pool.quotas:
            raise SpecError(f"node {self.node!r}: pool quotas are global; pass them to deploy(quotas=...)")
        self.pool = pool
        try:
            made = list(self._managers_src()) if self._managers_src is not None else []
        except Exception as exc:  # noqa: BLE001 - user code
            raise SpecError(f"node {self.node!r}: the managers factory raised {type(exc).__name__}: {exc}") from None
        ctx = ManagerContext(pool=pool, post=self._post)
        try:
            for m in made:
                try:
                    await m.start(ctx)
                except TangramError:
                    raise
                except Exception as exc:  # noqa: BLE001 - a foreign manager's failure
                    raise ManagerError(f"node {self.node!r}: manager {getattr(m, 'name', m)!r} failed to start: "
                                       f"{type(exc).__name__}: {exc}") from exc
                self.managers.append(m)
        except BaseException:
            await self.aclose()  # close the ones already started (the agent is killed next)
            raise
        containers = list(self._containers)
        services: list[str] | None = None
        try:
            for m in self.managers:  # what each manager declares it serves (Manager.describe)
                offer = offer_of(m)
                containers += offer.containers
                if offer.services is not None:
                    services = (services or []) + list(offer.services)
        except BaseException:
            await self.aclose()
            raise
        ctx_ = require().get_runtime_context()
        return {
            "node": self.node, "pool": pool, "has_managers": bool(self.managers),
            "containers": containers, "services": services, "ray_node_id": ctx_.get_node_id(),
            "pid": os.getpid(),
        }

    def _post(self, ev: Event) -> None:
        if self._scheduler is not None:
            self._scheduler.post_event.remote(self.node, ev)

    async def apply(self, action_id: int, grant: Grant, spec: ActionSpec) -> list[str]:
        """Apply the grant through this node's managers (the contract of ``managers/base.py``:
        in order, each recorded before its apply is awaited). The action is registered before the
        first await, so a :meth:`release` that arrives while a slow apply is still running (the
        client gave up) waits for it and then releases. A failed apply is released here, in
        reverse, before the error goes back to the scheduler."""
        lease = Lease(action_id, spec, cpus=grant.cpus, gpus=grant.gpus, units=grant.units,
                      memory=grant.memory, quotas=grant.quotas, counted=grant.counted, queued_s=0.0,
                      granted_at=asyncio.get_running_loop().time(),
                      ceiling=grow_ceiling(spec, grant.cpus, self.pool))
        held = _Held(lease, Applied(grant, lease))
        self._leases[action_id] = held
        try:
            await held.applied.apply(self.managers)
        except BaseException as exc:
            self._leases.pop(action_id, None)
            # the undo runs to its end even if this call is cancelled again meanwhile
            _, cancelled = await finish(held.applied.release(where=f"node {self.node}"))
            if cancelled and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc
            raise
        finally:
            held.settled.set()
        return list(lease.attached())

    async def release(self, action_id: int) -> dict[str, str] | None:
        """Undo the managers' work. When one holds the units back (QuarantineError: a container
        could not be parked) say so; the scheduler then waits on :meth:`restored` before it
        returns the units to the node's pool."""
        held = self._leases.pop(action_id, None)
        if held is None:
            return None
        await held.settled.wait()  # an apply still running: release once it is done
        errs = await held.applied.release(where=f"node {self.node}")
        why = [str(e) for e in errs]
        until: list[Any] = [e.until for e in errs if e.until is not None]
        if not until:
            return None
        self._held_back[action_id] = asyncio.gather(*until, return_exceptions=True)
        return {"quarantined": "; ".join(why)}

    async def resize(self, action_id: int, old: Grant, new: Grant) -> None:
        """A malleable action's Resize (the scheduler's node runtime forwards it, once the apply is
        done): this node's lease says the new cores at once (``lease.exec`` here caps threads to
        them), each manager that has ``resize`` applies them, in apply order, then the lease's own
        commands and callbacks follow. Every manager runs even when one raises; the first error
        is raised afterwards, typed (a foreign exception becomes ManagerError naming the
        manager), so the scheduler counts it in ``resize_failures``."""
        held = self._leases.get(action_id)
        if held is None:
            raise ManagerError(f"node {self.node!r} holds no lease #{action_id} to resize (released or lost)")
        await held.settled.wait()
        lease = held.lease
        async with held.resizing:  # one resize of an action at a time, in the order they came
            if self._leases.get(action_id) is not held:
                return  # released meanwhile: nothing left to resize
            held.applied.grant = new  # what a release undoes is what it holds now
            lease._resize(tuple(new.cpus), new.units)
            first: Exception | None = None
            for m in list(held.applied.managers):
                fn = getattr(m, "resize", None)
                if fn is None:
                    continue
                try:
                    await fn(old, new, lease)
                except Exception as exc:  # noqa: BLE001 - report it, and still resize the others
                    log.exception("node %s: manager %s failed to resize action %s from cpus %s to %s", self.node,
                                  getattr(m, "name", m), action_id, list(old.cpus), list(new.cpus))
                    if first is None:
                        first = exc if isinstance(exc, TangramError) else ManagerError(
                            f"{lease.spec.kind}: resizing failed in manager {getattr(m, 'name', m)!r}: {exc!r}",
                            resource=str(getattr(m, "name", m)))
            lease._resized()
        if first is not None:
            raise first

    async def restored(self, action_id: int) -> None:
        """Return once what held ``action_id`` back is restored (or its manager closed)."""
        fut = self._held_back.pop(action_id, None)
        if fut is not None:
            await fut

    def _lease(self, action_id: int) -> Lease:
        held = self._leases.get(action_id)
        if held is None:
            raise ManagerError(f"node {self.node!r} holds no lease #{action_id} (released or lost)")
        return held.lease

    async def exec(self, action_id: int, cmd: Sequence[str], kw: dict[str, Any]) -> Any:
        return await self._lease(action_id).exec(cmd, **kw)

    async def call(self, action_id: int, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        return await self._lease(action_id).call(*args, **kwargs)

    async def watch(self) -> None:
        """Never returns: the scheduler awaits it to learn that this agent (or its node) died."""
        await self._forever.wait()

    def ping(self) -> str:
        return self.node

    def statistics(self) -> dict[str, Any]:
        """What this node's managers report (each one's ``statistics()``, if it has one) and the
        actions whose grant is applied here: for operators, and for tests of a manager that runs
        on an agent."""
        managers: dict[str, Any] = {}
        for m in self.managers:
            stats = getattr(m, "statistics", None)
            managers[str(getattr(m, "name", type(m).__name__))] = stats() if callable(stats) else {}
        return {"node": self.node, "leases": sorted(self._leases), "managers": managers}

    async def aclose(self) -> None:
        for aid in list(self._leases):
            await self.release(aid)
        for m in reversed(self.managers):
            try:
                await m.aclose()
            except Exception:
                log.exception("node %s: manager %s failed to close", self.node, m.name)
        self.managers.clear()
        self._forever.set()
