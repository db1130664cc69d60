"""The client side: :func:`deploy` (get-or-create the scheduler actor and its node agents) and
:class:`RemoteTangram` (the same ``acquire(spec)`` API as :class:`~tangram_sdk.runtime.Tangram`,
from any process on any node of the Ray cluster)."""

from __future__ import annotations

import asyncio
import itertools
import logging
import os
import pickle
import time
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

from typing_extensions import Self

from ..errors import SchedulerBrokenError, SpecError, TangramError
from ..lease import Lease
from ..managers.base import Manager
from ..pool import Pool, Quota
from ..spec import ActionSpec
from . import _wire
from ._errors import LeaseLostError
from ._ray import require

__all__ = ["RemoteTangram", "TangramCluster", "deploy"]

log = logging.getLogger("tangram_sdk.ray")

PoolSource = Pool | Callable[[], Pool] | None


def _fingerprint(quotas: Mapping[str, Quota], options: Mapping[str, Any], ttl: float, hb: float) -> str:
    return repr((sorted((k, repr(v)) for k, v in quotas.items()), sorted((k, repr(v)) for k, v in options.items()),
                 float(ttl), float(hb)))


def _ensure_ray(namespace: str) -> Any:
    ray = require()
    if not ray.is_initialized():
        ray.init(address=os.environ.get("RAY_ADDRESS", "auto"), namespace=namespace, log_to_driver=False)
    return ray


class TangramCluster:
    """A handle on a deployed scheduler actor (sync methods: call them from driver code)."""

    def __init__(self, actor: Any, name: str, namespace: str) -> None:
        self.actor = actor
        self.name = name
        self.namespace = namespace

    @classmethod
    def get(cls, name: str = "tangram", *, namespace: str = "tangram") -> TangramCluster:
        ray = _ensure_ray(namespace)
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise TangramError(f"no Tangram named {name!r} in namespace {namespace!r}; call deploy() first") from None
        return cls(actor, name, namespace)

    def statistics(self) -> dict[str, Any]:
        ray = require()
        out: dict[str, Any] = ray.get(self.actor.statistics.remote())
        return out

    def check_invariants(self) -> list[str]:
        ray = require()
        out: list[str] = ray.get(self.actor.check_invariants.remote())
        return out

    def add_node(self, label: str, ray_node_id: str | None = None, *, pool: PoolSource = None,
                 managers: Callable[[], Sequence[Manager]] | None = None,
                 containers: Sequence[str] = ()) -> dict[str, Any]:
        """Add (or re-add after loss) a node; ``ray_node_id`` defaults to ``label``."""
        ray = require()
        out: dict[str, Any] = ray.get(self.actor.add_node.remote(
            label, ray_node_id or label, pool, managers, list(containers)))
        return out

    def remove_node(self, label: str, reason: str = "removed by the operator") -> None:
        require().get(self.actor.remove_node.remote(label, reason))

    def register_containers(self, label: str, names: Sequence[str]) -> None:
        require().get(self.actor.register_containers.remote(label, list(names)))

    def shutdown(self) -> None:
        """Stop the scheduler: waiters fail, clients are dropped, agents close their managers."""
        ray = require()
        try:
            ray.get(self.actor.shutdown.remote(), timeout=30)
        finally:
            ray.kill(self.actor)

    def __repr__(self) -> str:
        return f"<TangramCluster {self.namespace}/{self.name}>"


def deploy(
    name: str = "tangram",
    *,
    namespace: str = "tangram",
    quotas: Mapping[str, Quota] | None = None,
    nodes: Sequence[str] | Mapping[str, str] | None = None,
    pool: PoolSource | Mapping[str, PoolSource] = None,
    managers: Callable[[], Sequence[Manager]] | None = None,
    containers: Mapping[str, Sequence[str]] | None = None,
    ttl: float = 10.0,
    heartbeat: float = 2.0,
    check_invariants: bool = False,
    scheduler_node: str | None = None,
    **scheduler_options: Any,
) -> TangramCluster:
    """Get or create the job's scheduler actor ``namespace/name`` (named, detached) and one agent per
    node.

    ``nodes``: Ray node ids (default: every alive node), or ``{label: ray_node_id}`` (several labels
    may share a Ray node, e.g. in tests). ``pool``: one Pool for every node, a zero-argument callable
    evaluated *on each node's agent* (default: the cores the agent may use, the GPUs Ray counts), or
    ``{label: pool}``. ``managers``: a zero-argument factory run on each agent (e.g.
    ``lambda: [DockerCpuManager()]``). ``containers``: ``{label: [container names]}`` so specs with
    ``container=`` go to the right node. ``quotas`` are global. ``ttl``: seconds of client silence
    after which its leases are released; clients heartbeat every ``heartbeat`` seconds.
    ``scheduler_node``: the Ray node id the scheduler actor is pinned to (default: the caller's;
    the head node is a good choice: the actor lives as long as its node). Scheduler options
    (``window``, ``elastic``...) pass to every runtime inside the actor.

    Deploying again with the same configuration returns the running actor (adding missing nodes);
    a different configuration raises TangramError (``shutdown()`` it first).
    """
    ray = _ensure_ray(namespace)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .actor import SchedulerActor

    if not (ttl > 0 and heartbeat > 0 and heartbeat < ttl):
        raise SpecError(f"need 0 < heartbeat < ttl, got heartbeat={heartbeat!r} ttl={ttl!r}")
    quotas = dict(quotas or {})
    for qn, q in quotas.items():
        if not isinstance(q, Quota):
            raise SpecError(f"quota {qn!r} must be a Quota(...), got {q!r}")
    fp = _fingerprint(quotas, scheduler_options, ttl, heartbeat)
    here = scheduler_node or ray.get_runtime_context().get_node_id()
    actor = ray.remote(SchedulerActor).options(
        name=name, namespace=namespace, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_concurrency=100_000, max_restarts=0,
        # hard: a soft affinity was seen to land on another node now and then
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(name, namespace, quotas, scheduler_options, ttl, heartbeat, check_invariants, fp)
    ep = ray.get(actor.endpoint.remote())
    if ep["fingerprint"] != fp:
        raise TangramError(
            f"a Tangram named {name!r} already runs in namespace {namespace!r} with another configuration; "
            f"shut it down first (TangramCluster.get(...).shutdown())")
    cluster = TangramCluster(actor, name, namespace)
    if nodes is None:
        labels = {n["NodeID"]: n["NodeID"] for n in ray.nodes() if n.get("Alive")}
    elif isinstance(nodes, Mapping):
        labels = dict(nodes)
    else:
        labels = {n: n for n in nodes}
    refs = []
    for label, rid in labels.items():
        p = pool.get(label) if isinstance(pool, Mapping) else pool
        refs.append(actor.add_node.remote(label, rid, p, managers, list((containers or {}).get(label, ()))))
    ray.get(refs)
    return cluster


class _Held:
    __slots__ = ("cancelled", "lost", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.lost: BaseException | None = None
        self.cancelled = False


class _Link:
    """One authenticated connection to the scheduler actor."""

    def __init__(self, rt: RemoteTangram) -> None:
        self.rt = rt
        self.proto = _wire.FrameProtocol(self._on_frame, self._on_lost)
        self.waiters: dict[int, asyncio.Future[Any]] = {}
        self.held: dict[int, _Held] = {}
        self.welcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.last_recv = time.monotonic()
        self.closed = False
        self.hb: asyncio.Task[None] | None = None
        self.config: dict[str, Any] = {}

    def send(self, msg: Any) -> None:
        self.proto.send(msg)

    def _on_frame(self, payload: bytes) -> None:
        self.last_recv = time.monotonic()
        msg = pickle.loads(payload)
        op = msg[0]
        if op in ("grant", "reply"):
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
        elif op == "err":
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_exception(msg[2])
        elif op == "lost":
            self._lose(msg[1], msg[2])
        elif op == "welcome" and not self.welcome.done():
            self.welcome.set_result(msg[1])

    def _lose(self, key: int, exc: BaseException) -> None:
        h = self.held.get(key)
        if h is None or h.lost is not None:
            return
        h.lost = exc
        if h.task is not None and not h.task.done():
            h.cancelled = True
            h.task.cancel(f"tangram lease lost: {exc}")

    def _on_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.hb is not None:
            self.hb.cancel()
        why = "closed" if exc is None else repr(exc)
        if not self.welcome.done():
            self.welcome.set_exception(SchedulerBrokenError(f"the Tangram scheduler actor hung up ({why})"))
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(LeaseLostError(f"connection to the Tangram scheduler actor lost ({why})"))
        self.waiters.clear()
        # the actor releases whatever this connection held: no action may keep running on it
        what = "this RemoteTangram was closed" if self.rt._closing else f"connection to the Tangram scheduler actor lost ({why})"
        for key in list(self.held):
            self._lose(key, LeaseLostError(f"{what}; the scheduler released this lease"))

    async def heartbeat(self, every: float, ttl: float) -> None:
        # give up one heartbeat *before* the actor's TTL: in a partition this side stops its
        # actions before the actor hands their units to someone else
        limit = ttl - every
        while not self.closed:
            await asyncio.sleep(every)
            self.send(("hb",))
            if time.monotonic() - self.last_recv > limit and self.proto.transport is not None:
                log.error("the Tangram scheduler actor was silent for more than %.1f s; dropping the link", limit)
                self.proto.transport.abort()

    def abort(self) -> None:
        if self.proto.transport is not None:
            self.proto.transport.abort()


class RemoteTangram:
    """The job-wide Tangram as seen from one process (any node of the Ray cluster)::

        async with RemoteTangram("tangram", namespace="tangram") as tangram:
            async with tangram.acquire(ActionSpec(kind="test", cpus=2)) as lease:
                ...  # lease.cpus, lease.units, lease.queued_s ... as with Tangram

    Connecting needs a Ray connection (``ray.init`` is called with ``address="auto"`` when the
    process has none) to find the actor; acquire/release then use one direct TCP connection. One
    instance per event loop. If the link breaks, held actions are cancelled and raise
    :class:`LeaseLostError` (their units were released); the next ``acquire`` reconnects.
    """

    def __init__(self, name: str = "tangram", *, namespace: str = "tangram") -> None:
        self.name = name
        self.namespace = namespace
        self._actor: Any = None
        self._link: _Link | None = None
        self._connecting: asyncio.Lock | None = None
        self._keys = itertools.count(1)
        self._caller: str | None = None
        self._closing = False
        self._agents: dict[str, Any] = {}

    @classmethod
    async def connect(cls, name: str = "tangram", *, namespace: str = "tangram") -> RemoteTangram:
        """``await RemoteTangram.connect(...)``: a connected instance (close it with ``aclose()``)."""
        self = cls(name, namespace=namespace)
        await self._ready()
        return self

    async def __aenter__(self) -> Self:
        await self._ready()
        return self

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        """Close the link: the actor releases whatever this process still holds."""
        self._closing = True
        link, self._link = self._link, None
        if link is not None:
            if link.hb is not None:
                link.hb.cancel()
            if link.proto.transport is not None:
                link.proto.transport.close()

    async def _ready(self) -> _Link:
        link = self._link
        if link is not None and not link.closed:
            return link
        if self._closing:
            from ..errors import RuntimeClosedError

            raise RuntimeClosedError("this RemoteTangram has been closed")
        if self._connecting is None:
            self._connecting = asyncio.Lock()
        async with self._connecting:
            link = self._link
            if link is not None and not link.closed:
                return link
            ray = _ensure_ray(self.namespace)
            if self._caller is None:
                self._caller = ray.get_runtime_context().get_node_id()
            try:
                actor = ray.get_actor(self.name, namespace=self.namespace)
            except ValueError:
                raise TangramError(f"no Tangram named {self.name!r} in namespace {self.namespace!r}; "
                                   f"call tangram_sdk.ray.deploy() first") from None
            try:
                ep = await actor.endpoint.remote()
            except Exception as exc:
                raise SchedulerBrokenError(f"the Tangram scheduler actor {self.name!r} is gone: {exc!r}") from exc
            self._actor = actor
            loop = asyncio.get_running_loop()
            link = _Link(self)
            await loop.create_connection(lambda: link.proto, ep["host"], ep["port"])
            link.proto.transport.write(_wire.frame(ep["token"]))  # type: ignore[union-attr]
            link.send(("hello", {"pid": os.getpid(), "node": self._caller}))
            link.config = await asyncio.wait_for(link.welcome, 30)
            link.hb = loop.create_task(link.heartbeat(float(ep["heartbeat"]), float(ep["ttl"])))
            self._link = link
            return link

    def acquire(self, spec: ActionSpec, *, timeout: float | None = None, node: str | None = None) -> _RemoteAcquire:
        """Wait for ``spec``'s resources anywhere in the job; an async context manager yielding a
        :class:`~tangram_sdk.lease.Lease` (same fields as the in-process runtime's). ``node``
        forces a node label; by default a ``container=`` spec goes to its container's node, others
        to the caller's node while it has room, else the emptiest feasible node.
        ``lease.attachment("node")`` says where it landed."""
        if not isinstance(spec, ActionSpec):
            raise SpecError(f"acquire() needs an ActionSpec, got {type(spec).__name__}")
        if timeout is not None and not (timeout >= 0):
            raise SpecError(f"timeout must be None or seconds >= 0, got {timeout!r}")
        return _RemoteAcquire(self, spec, timeout, node)

    async def statistics(self) -> dict[str, Any]:
        """The scheduler actor's snapshot: per node, per quota, clients, peaks, invariant errors."""
        link = await self._ready()
        key = next(self._keys)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.waiters[key] = fut
        link.send(("stats", key))
        out: dict[str, Any] = await fut
        return out

    def _agent(self, name: str) -> Any:
        a = self._agents.get(name)
        if a is None:
            a = self._agents[name] = require().get_actor(name, namespace=self.namespace)
        return a

    def __repr__(self) -> str:
        link = self._link
        state = "closed" if self._closing else ("connected" if link is not None and not link.closed else "idle")
        held = 0 if link is None else len(link.held)
        waiting = 0 if link is None else len(link.waiters)
        return f"<RemoteTangram {self.namespace}/{self.name} {state} | {held} held, {waiting} waiting>"


class _RemoteAcquire:
    __slots__ = ("_key", "_link", "_node", "_rt", "_spec", "_timeout")

    def __init__(self, rt: RemoteTangram, spec: ActionSpec, timeout: float | None, node: str | None) -> None:
        self._rt = rt
        self._spec = spec
        self._timeout = timeout
        self._node = node
        self._key = 0
        self._link: _Link | None = None

    async def __aenter__(self) -> Lease:
        rt = self._rt
        link = await rt._ready()
        loop = asyncio.get_running_loop()
        key = self._key = next(rt._keys)
        self._link = link
        if link.closed:
            raise LeaseLostError("connection to the Tangram scheduler actor lost before the request")
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        link.waiters[key] = fut
        t0 = loop.time()
        link.send(("acq", key, self._spec, self._timeout, self._node, rt._caller))
        try:
            f = await fut
        except BaseException:
            link.waiters.pop(key, None)
            link.send(("cancel", key))  # whatever the actor has for this key goes back (no-op if nothing)
            raise
        link.held[key] = _Held(asyncio.current_task())
        now = loop.time()
        lease = Lease(f["id"], self._spec, cpus=tuple(f["cpus"]), gpus=tuple(f["gpus"]), units=f["units"],
                      memory=f["memory"], quotas=tuple(f["quotas"]), queued_s=now - t0, granted_at=now)
        lease.attach("node", f["node"])
        lease.attach("ray_node_id", f["ray_node_id"])
        agent_name = f["agent"]
        if agent_name is not None:
            aid = f["node_aid"]
            keys = set(f["agent_keys"])
            if "exec" in keys:
                async def _exec(cmd: Sequence[str], **kw: Any) -> Any:
                    return await rt._agent(agent_name).exec.remote(aid, list(cmd), kw)

                lease.attach("exec", _exec)
            if "call" in keys:
                async def _call(*args: Any, **kwargs: Any) -> Any:
                    return await rt._agent(agent_name).call.remote(aid, args, kwargs)

                lease.attach("call", _call)
        return lease

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        link = self._link
        assert link is not None
        h = link.held.pop(self._key, None)
        if h is None or h.lost is None:
            link.send(("rel", self._key, exc_type is not None))
            return
        lost = h.lost
        task = h.task
        if h.cancelled and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            raise lost from None
        raise lost from exc
