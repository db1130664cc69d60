"""The client side: :func:`deploy` (get-or-create the scheduler actor and its node agents) and
:class:`RemoteTangram` (the same ``acquire(spec)`` API as :class:`~tangram_sdk.runtime.Tangram`,
from any process on any node of the Ray cluster)."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import math
import os
import pickle
import secrets
import threading
import time
import weakref
from collections.abc import Callable, Mapping, Sequence
from types import TracebackType
from typing import Any

import attrs
from typing_extensions import Self

from .._deadline import check_deadline, check_expected, check_timeout, wait_future, within
from ..errors import ManagerError, NodeLostError, RuntimeClosedError, SchedulerBrokenError, SpecError, TangramError
from .._validate import check_tokens_used
from ..lease import Lease
from ..managers.base import Manager
from ..options import SchedulerOptions, merge_options
from ..snapshot import ClusterStatistics, NodeStatistics
from ..pool import Pool, Quota
from ..spec import ActionSpec
from . import _wire
from ._errors import LeaseLostError
from ._ray import require

__all__ = ["RemoteTangram", "TangramCluster", "deploy"]

log = logging.getLogger("tangram_sdk.ray")

PoolSource = Pool | Callable[[], Pool] | None


def _fingerprint(quotas: Mapping[str, Quota], options: Mapping[str, Any], ttl: float, hb: float,
                 agent_timeout: float | None = 120.0, check_invariants: bool = False) -> str:
    return repr((sorted((k, repr(v)) for k, v in quotas.items()), sorted((k, repr(v)) for k, v in options.items()),
                 float(ttl), float(hb), agent_timeout, bool(check_invariants)))


def _seconds(name: str, value: Any, *, positive: bool = True) -> float:
    """A finite number of seconds (> 0) or SpecError naming the argument."""
    out = check_timeout(value, name)
    if out is None or (positive and out <= 0):
        raise SpecError(f"{name} must be a finite number of seconds > 0, got {value!r}")
    return out


def _ray_get(ref: Any, timeout: float, what: str) -> Any:
    """``ray.get(ref)`` bounded by ``timeout``; Ray's errors become project errors: a timeout or a
    dead actor -> SchedulerBrokenError naming ``what``; an error raised inside the actor/agent ->
    that error when it is a TangramError (SpecError for a bad pool...), else SchedulerBrokenError."""
    ray = require()
    exc_mod = require("ray.exceptions")
    try:
        return ray.get(ref, timeout=timeout)
    except exc_mod.GetTimeoutError:
        raise SchedulerBrokenError(f"{what}: no answer within {timeout:g} s (the actor is frozen, "
                                   f"overloaded or its node is unreachable)") from None
    except exc_mod.RayTaskError as exc:
        cause = getattr(exc, "cause", None)
        while True:  # an agent's error re-raised by the actor, Ray's own wrapper: report the original
            if isinstance(cause, exc_mod.RayTaskError) and getattr(cause, "cause", None) is not None:
                cause = cause.cause
            elif isinstance(cause, exc_mod.RaySystemError) and isinstance(getattr(cause, "client_exc", None),
                                                                          BaseException):
                cause = cause.client_exc
            else:
                break
        if isinstance(cause, TangramError):
            raise cause from None
        if isinstance(cause, ImportError):  # an argument the actor/agent could not unpickle
            raise SpecError(f"{what}: {type(cause).__name__}: {cause}; what deploy() sends there (pool, managers) "
                            f"must be importable on every node or picklable by value (define it in a function)") from None
        raise SchedulerBrokenError(f"{what} failed: {type(cause or exc).__name__}: {cause or exc}") from None
    except exc_mod.RayError as exc:  # actor died, object lost, ...
        first = str(exc).splitlines()[0] if str(exc) else ""
        raise SchedulerBrokenError(f"{what}: {type(exc).__name__}: {first}") from None


_INIT_LOCK = threading.Lock()


def _ensure_ray(namespace: str) -> Any:
    """Ray, connected to the cluster (``RAY_ADDRESS``, else the local one); not reaching one is a
    SchedulerBrokenError naming the address (Ray raises a bare ConnectionError)."""
    ray = require()
    with _INIT_LOCK:  # a connect that timed out may still be in ray.init in its thread: one at a time
        if ray.is_initialized():
            return ray
        address = os.environ.get("RAY_ADDRESS", "auto")
        try:
            ray.init(address=address, namespace=namespace, log_to_driver=False)
        except (ConnectionError, TimeoutError) as exc:
            raise SchedulerBrokenError(f"could not connect to the Ray cluster at {address!r}: "
                                       f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}") from exc
    return ray


def _kill(actor: Any, name: str, namespace: str, timeout: float) -> bool:
    """Kill ``actor`` and wait (at most ``timeout`` s) until its name is free again.

    ``ray.kill`` only sends the request: for a moment after it ``ray.get_actor`` still returns
    the dying actor, and a ``deploy()`` with ``get_if_exists`` would attach to it and fail. True
    once the name is free or held by another actor (a later deploy's), False at the deadline."""
    ray = require()
    ray.kill(actor)
    mine = actor._ray_actor_id
    end = time.monotonic() + timeout
    while True:
        try:
            if ray.get_actor(name, namespace=namespace)._ray_actor_id != mine:
                return True
        except ValueError:
            return True
        if time.monotonic() >= end:
            return False
        time.sleep(0.02)


class TangramCluster:
    """A handle on a deployed scheduler actor (sync methods: call them from driver code).

    Every call waits at most ``timeout`` seconds for the actor and raises SchedulerBrokenError
    (naming the actor) when it does not answer or has died. From async code run them in a thread
    (``await asyncio.to_thread(cl.add_node, ...)``): a call blocks its thread, and a loop blocked
    longer than ``ttl - heartbeat`` stops the heartbeats of every :class:`RemoteTangram` on it,
    so the actor drops their links and takes their leases back (``add_node`` starts an agent
    process: seconds, more on a busy machine)."""

    def __init__(self, actor: Any, name: str, namespace: str, *, timeout: float = 30.0) -> None:
        self.actor = actor
        self.name = name
        self.namespace = namespace
        self.timeout = _seconds("timeout", timeout)

    @classmethod
    def get(cls, name: str = "tangram", *, namespace: str = "tangram", timeout: float = 30.0) -> TangramCluster:
        ray = _ensure_ray(namespace)
        try:
            actor = ray.get_actor(name, namespace=namespace)
        except ValueError:
            raise TangramError(f"no Tangram named {name!r} in namespace {namespace!r}; call deploy() first") from None
        return cls(actor, name, namespace, timeout=timeout)

    def _call(self, method: str, *args: Any) -> Any:
        ref = getattr(self.actor, method).remote(*args)
        return _ray_get(ref, self.timeout, f"the Tangram scheduler actor {self.namespace}/{self.name} ({method})")

    def statistics(self) -> ClusterStatistics:
        """The scheduler actor's snapshot (:class:`~tangram_sdk.snapshot.ClusterStatistics`)."""
        out: ClusterStatistics = self._call("statistics")
        return out

    def check_invariants(self) -> list[str]:
        out: list[str] = self._call("check_invariants")
        return out

    def add_node(self, label: str, ray_node_id: str | None = None, *, pool: PoolSource = None,
                 managers: Callable[[], Sequence[Manager]] | None = None,
                 containers: Sequence[str] = ()) -> NodeStatistics:
        """Add (or re-add after loss) a node; ``ray_node_id`` defaults to ``label``. Returns its
        statistics."""
        _check_pool_source("pool", pool)
        _check_managers(managers)
        out: NodeStatistics = self._call("add_node", label, ray_node_id or label, pool, managers, list(containers))
        return out

    def remove_node(self, label: str, reason: str = "removed by the operator") -> None:
        self._call("remove_node", label, reason)

    def register_containers(self, label: str, names: Sequence[str]) -> None:
        self._call("register_containers", label, list(names))

    def shutdown(self) -> None:
        """Stop the scheduler: waiters fail, clients are dropped, agents close their managers.

        The actor is killed in any case, and this returns once its name is free, so a
        ``deploy()`` right after makes a new one. When it did not finish its shutdown within
        ``timeout`` (frozen, or an agent hung closing its managers) this raises
        SchedulerBrokenError after the kill, saying so: containers or GPU copies may then not have
        been parked/evicted."""
        try:
            self._call("shutdown")
        except SchedulerBrokenError as exc:
            _kill(self.actor, self.name, self.namespace, self.timeout)
            raise SchedulerBrokenError(f"{exc}; killed it (agents may not have closed their managers)") from None
        if not _kill(self.actor, self.name, self.namespace, self.timeout):
            raise SchedulerBrokenError(f"the Tangram scheduler actor {self.namespace}/{self.name} was killed but "
                                       f"its name was still registered after {self.timeout:g} s")

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
    timeout: float = 60.0,
    agent_timeout: float | None = 120.0,
    ends_with_job: bool = False,
    options: SchedulerOptions | None = None,
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
    (``options=SchedulerOptions(...)``, or ``window``, ``elastic``... as keywords) pass to every
    runtime inside the actor. ``timeout``: seconds to
    wait for the actor and for each node's agent to start (SchedulerBrokenError after that; the
    returned cluster's calls use it too). ``agent_timeout``: seconds the actor waits for an agent's
    apply/release (a grant's cpuset write or GPU restore) before failing that action with
    ManagerError, and for an agent to start (at least 30 s; SchedulerBrokenError, the agent is killed). ``ends_with_job``: the actor (detached, so no worker's death takes the pool with
    it) shuts itself and its agents down once the Ray job that created it has ended; meant for an
    anonymous namespace (a plain ``ray.init()``), where no later job can reach it and it would
    otherwise stay on the cluster for good (the adapters set it there). Bad arguments are SpecError naming the argument, raised before anything starts;
    a first deploy that fails (a pool callable that raises on an agent...) leaves no actor behind.

    Deploying again with the same configuration returns the running actor (adding missing nodes);
    a different configuration (quotas, options, ``ttl``, ``heartbeat``, ``agent_timeout``,
    ``check_invariants``, or a ``Pool`` other than a running node's) raises SpecError (a
    TangramError; ``shutdown()`` it first); ``managers`` factories and pool callables cannot be compared and
    are not. Of two concurrent first calls, one makes the actor and the other attaches; the one
    that fails later never kills it.
    """
    for arg, value in (("name", name), ("namespace", namespace)):
        if not isinstance(value, str) or not value:
            raise SpecError(f"{arg} must be a non-empty str, got {value!r}")
    ttl = _seconds("ttl", ttl)
    heartbeat = _seconds("heartbeat", heartbeat)
    timeout = _seconds("timeout", timeout)
    if agent_timeout is not None:
        agent_timeout = _seconds("agent_timeout", agent_timeout)
    if heartbeat >= ttl:
        raise SpecError(f"need 0 < heartbeat < ttl, got heartbeat={heartbeat!r} ttl={ttl!r}")
    if quotas is not None and not isinstance(quotas, Mapping):
        raise SpecError(f"quotas must be a {{name: Quota(...)}} mapping, got {quotas!r}")
    quotas = dict(quotas or {})
    for qn, q in quotas.items():
        if not isinstance(q, Quota):
            raise SpecError(f"quota {qn!r} must be a Quota(...), got {q!r}")
    labels_given = _check_nodes(nodes)
    if isinstance(pool, Mapping):
        for label, p in pool.items():
            _check_pool_source(f"pool[{label!r}]", p)
    else:
        _check_pool_source("pool", pool)
    _check_managers(managers)
    if containers is not None and not isinstance(containers, Mapping):
        raise SpecError(f"containers must be a {{node label: [container names]}} mapping, got {containers!r}")
    scheduler_options = merge_options(options, scheduler_options)
    _check_scheduler_options(quotas, scheduler_options)

    ray = _ensure_ray(namespace)
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from .actor import SchedulerActor

    try:
        ray.get_actor(name, namespace=namespace)
        created = False
    except ValueError:
        created = True  # this call creates it: a failure below must not leave it registered
    fp = _fingerprint(quotas, scheduler_options, ttl, heartbeat, agent_timeout, check_invariants)
    token = secrets.token_hex(8)  # tells this call's actor from one a concurrent first deploy made
    here = scheduler_node or ray.get_runtime_context().get_node_id()
    actor = ray.remote(SchedulerActor).options(
        name=name, namespace=namespace, lifetime="detached", get_if_exists=True, num_cpus=0,
        max_concurrency=100_000, max_restarts=0,
        # hard: a soft affinity was seen to land on another node now and then
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
    ).remote(name, namespace, quotas, scheduler_options, ttl, heartbeat, check_invariants, fp, agent_timeout,
             bool(ends_with_job), token)
    what = f"the Tangram scheduler actor {namespace}/{name}"
    try:
        ep = _ray_get(actor.endpoint.remote(), timeout, what)
        # both of two concurrent first calls see no actor; get_if_exists gives them one, made by
        # one of them: the other must never kill it when it fails later (the first serves from it)
        created = created and ep.get("creator") == token
        if ep["fingerprint"] != fp:
            created = False  # someone else's actor: never kill it
            raise SpecError(  # a TangramError: a configuration clash, as two definitions in one process are
                f"a Tangram named {name!r} already runs in namespace {namespace!r} with another configuration; "
                f"shut it down first (TangramCluster.get(...).shutdown())")
        cluster = TangramCluster(actor, name, namespace, timeout=timeout)
        if labels_given is None:
            labels = {n["NodeID"]: n["NodeID"] for n in ray.nodes() if n.get("Alive")}
        else:
            labels = labels_given
        refs = []
        for label, rid in labels.items():
            p = pool.get(label) if isinstance(pool, Mapping) else pool
            try:
                refs.append(actor.add_node.remote(label, rid, p, managers, list((containers or {}).get(label, ()))))
            except Exception as exc:  # noqa: BLE001 - Ray could not serialise the pool/managers
                raise SpecError(f"pool/managers for node {label!r} cannot be sent to the agent "
                                f"({type(exc).__name__}: {exc})") from None
        for ref in refs:
            _ray_get(ref, timeout, f"{what}: adding a node")
        if not created:  # a running actor keeps its nodes' pools: asking for others is a clash
            nodes_now = cluster.statistics()["nodes"]
            for label in labels:
                want = pool.get(label) if isinstance(pool, Mapping) else pool
                have = nodes_now.get(label, {}).get("pool") if label in nodes_now else None
                if isinstance(want, Pool) and isinstance(have, Pool) and have != want:
                    raise SpecError(
                        f"a Tangram named {name!r} already runs in namespace {namespace!r} with node {label!r} "
                        f"holding {have.describe()}, not {want.describe()}; shut it down first "
                        f"(TangramCluster.get(...).shutdown())")
    except BaseException:
        if created:  # gone before the error reaches the caller: a retry makes a new actor
            _kill(actor, name, namespace, timeout)
        raise
    return cluster


def _check_nodes(nodes: Any) -> dict[str, str] | None:
    if nodes is None:
        return None
    if isinstance(nodes, Mapping):
        out = dict(nodes)
    elif isinstance(nodes, (list, tuple)):
        out = {n: n for n in nodes}
    else:
        raise SpecError(f"nodes must be None, a list of Ray node ids or {{label: node id}}, got {nodes!r}")
    for k, v in out.items():
        if not isinstance(k, str) or not k or not isinstance(v, str) or not v:
            raise SpecError(f"nodes must map non-empty str labels to Ray node ids, got {k!r}: {v!r}")
    return out


def _check_pool_source(arg: str, pool: Any) -> None:
    if pool is not None and not isinstance(pool, Pool) and not callable(pool):
        raise SpecError(f"{arg} must be a Pool, a zero-argument callable returning one, or None; got {pool!r}")


def _check_managers(managers: Any) -> None:
    if managers is not None and not callable(managers):
        raise SpecError(f"managers must be a zero-argument factory (lambda: [DockerCpuManager()]), got {managers!r}")


def _check_scheduler_options(quotas: Mapping[str, Quota], options: Mapping[str, Any]) -> None:
    """Build one scheduler here so a bad option fails deploy() with SpecError, not the actor."""
    from ..scheduler.core import Scheduler

    known = {a.name for a in attrs.fields(SchedulerOptions)}
    unknown = sorted(set(options) - known)
    if unknown:
        raise SpecError(f"unknown scheduler option(s) {unknown}; known: {sorted(known)}")
    try:
        Scheduler(Pool(quotas=dict(quotas)), **options)
    except Exception as exc:  # noqa: BLE001 - any rejection of the values
        raise SpecError(f"scheduler options {dict(options)!r} rejected: {type(exc).__name__}: {exc}") from None


def _retrieve(task: asyncio.Task[Any]) -> None:
    """Mark a shared attempt's failure as seen (its callers may all have been cancelled)."""
    if not task.cancelled():
        task.exception()


async def _awaitable(ref: Any) -> Any:
    """A coroutine over a Ray ObjectRef (``within`` runs it as a task)."""
    return await ref


# beyond a remote exec's own timeout: the agent kills the command and answers within this
_AGENT_GRACE = 10.0


async def _agent_call(rt: RemoteTangram, agent: str, method: str, args: tuple[Any, ...],
                      limit: Any) -> Any:
    """``lease.exec`` / ``lease.call`` on the node agent holding the lease's resources. The agent
    enforces ``timeout``; this side waits ``_AGENT_GRACE`` longer, so a frozen agent ends in a
    ManagerError naming it, and an agent that dies ends the call in NodeLostError (Ray's own actor
    errors are not project errors). Without a timeout only the agent's death ends the wait."""
    ray = require()
    what = f"node agent {rt.namespace}/{agent}"
    bound = limit + _AGENT_GRACE if isinstance(limit, (int, float)) and math.isfinite(limit) and limit >= 0 else None
    try:
        handle = rt._agents.get(agent)
        if handle is None:  # a control-store lookup: off the loop and bounded (see RemoteTangram._connect)
            handle = await within(asyncio.to_thread(rt._agent, agent), rt.connect_timeout,
                                  lambda: f"the lookup of {what} in Ray's control store took over "
                                          f"{rt.connect_timeout:g} s (a slow or restarting GCS)")
        ref = getattr(handle, method).remote(*args)
        return await within(_awaitable(ref), bound,
                            lambda: f"{what} did not answer lease.{method} within {bound:g} s "
                                    "(its timeout plus a grace): frozen or unreachable")
    except ray.exceptions.RayActorError as exc:
        raise NodeLostError(f"{what} died during lease.{method}: {type(exc).__name__}") from exc
    except ValueError as exc:
        if isinstance(exc, ray.exceptions.RayError):
            raise
        raise NodeLostError(f"{what} is gone (lease.{method}): {exc}") from exc
    except TimeoutError as exc:
        if isinstance(exc, ray.exceptions.RayError):  # the remote command's own error
            raise
        raise ManagerError(str(exc), resource=what) from None


class _Held:
    __slots__ = ("cancelled", "lease", "lost", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.lease: Lease | None = None  # set once built (resizes are applied to it)
        self.lost: BaseException | None = None
        self.cancelled = False


def _apply_resize(lease: Lease, cpus: Sequence[int], units: int) -> None:
    """A resize the actor reported, applied to the client's lease as the in-process runtime
    applies one: it says the new cores, its ``run`` commands are re-pinned, its callbacks run."""
    lease._resize(tuple(cpus), int(units))
    lease._resized()


_OPEN_LINKS: weakref.WeakSet[_Link] = weakref.WeakSet()


def _close_links_in_child() -> None:
    """A forked child (a ProcessPoolExecutor worker, multiprocessing's default on Linux) inherits
    the links' sockets: close its copies, or the actor sees no end of file when the parent dies
    and keeps the parent's leases until its TTL."""
    for link in list(_OPEN_LINKS):
        transport = link.proto.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                os.close(sock.fileno())


os.register_at_fork(after_in_child=_close_links_in_child)


class _Link:
    """One authenticated connection to the scheduler actor."""

    def __init__(self, rt: RemoteTangram) -> None:
        self.rt = rt
        self.proto = _wire.FrameProtocol(self._on_frame, self._on_lost)
        self.waiters: dict[int, asyncio.Future[Any]] = {}
        self.acks: dict[int, asyncio.Future[None]] = {}  # failed/cancelled actions waiting for their units to go back
        self.refused: set[int] = set()  # acquires the actor answered with an error
        self.held: dict[int, _Held] = {}
        # granted, lease not built yet: the resizes that arrived meanwhile (applied once it is)
        self.early: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        self.welcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.last_recv = time.monotonic()
        self.closed = False
        self.hb: asyncio.Task[None] | None = None
        self.config: dict[str, Any] = {}

    def send(self, msg: Any) -> None:
        self.proto.send(msg)

    def _on_frame(self, payload: bytes) -> None:
        self.last_recv = time.monotonic()
        try:
            msg = pickle.loads(payload)
            op = msg[0]
        except Exception as exc:  # noqa: BLE001 - cannot tell whose answer it was: drop the link
            log.error("undecodable frame from the Tangram scheduler actor (%r); dropping the link", exc)
            self.abort()
            return
        if op in ("grant", "reply"):
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
                if op == "grant":
                    self.early[msg[1]] = []
        elif op == "rsz":
            self._resized(msg[1], msg[2], msg[3])
        elif op == "err":
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_exception(msg[2])
                self.refused.add(msg[1])  # the actor failed it and kept nothing: no give-back needed
        elif op == "ack":
            ack = self.acks.pop(msg[1], None)
            if ack is not None and not ack.done():
                ack.set_result(None)
        elif op == "lost":
            self._lose(msg[1], msg[2])
        elif op == "welcome" and not self.welcome.done():
            self.welcome.set_result(msg[1])

    def _resized(self, key: int, cpus: Sequence[int], units: int) -> None:
        """``("rsz", key, cpus, units)``: the node's scheduler resized a held malleable lease. One
        released (or lost) already is left alone; one granted but not built yet gets it once built."""
        h = self.held.get(key)
        if h is not None:
            if h.lost is None and h.lease is not None:
                _apply_resize(h.lease, cpus, units)
            return
        early = self.early.get(key)
        if early is not None:
            early.append((tuple(cpus), int(units)))

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
        for ack in self.acks.values():  # the actor releases all of this connection's units itself
            if not ack.done():
                ack.set_result(None)
        self.acks.clear()
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

    async def give_back(self, msg: tuple[Any, ...], key: int) -> bool:
        """Send ``msg`` (a cancel or a failed release asking for an ack) and wait until the actor
        says the units are back, at most one heartbeat (a frozen actor: the link's silence limit
        then drops the connection, which releases them). Returns whether the caller was cancelled
        meanwhile; the wait itself is not cut short, so the cancel propagates after the units."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self.closed or not self.proto.send(msg):
            return False  # no link: the actor has released (or will release) everything it held
        self.acks[key] = fut
        def expire() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = loop.call_later(float(self.config.get("heartbeat", 2.0)), expire)
        cancelled = False
        try:
            while not fut.done():
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    cancelled = True
        finally:
            handle.cancel()
            self.acks.pop(key, None)
        return cancelled


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

    def __init__(self, name: str = "tangram", *, namespace: str = "tangram", connect_timeout: float = 10.0) -> None:
        self.name = name
        self.namespace = namespace
        self.connect_timeout = _seconds("connect_timeout", connect_timeout)
        self._actor: Any = None
        self._link: _Link | None = None
        self._connecting: asyncio.Task[_Link] | None = None
        self._keys = itertools.count(1)
        self._caller: str | None = None
        self._closing = False
        self._agents: dict[str, Any] = {}
        self._blobs: dict[int, tuple[ActionSpec, bytes]] = {}  # rollouts send the same few specs again
        self._open: dict[int, tuple[Lease, _RemoteAcquire]] = {}  # acquire_lease leases, by id()

    def _encode(self, spec: ActionSpec) -> bytes:
        hit = self._blobs.get(id(spec))
        if hit is not None and hit[0] is spec:
            return hit[1]
        blob = _wire.encode_spec(spec)
        if len(self._blobs) >= 1024:
            self._blobs.clear()
        self._blobs[id(spec)] = (spec, blob)  # holds the spec, so its id is not reused while cached
        return blob

    @classmethod
    async def connect(cls, name: str = "tangram", *, namespace: str = "tangram",
                      connect_timeout: float = 10.0) -> RemoteTangram:
        """``await RemoteTangram.connect(...)``: a connected instance (close it with ``aclose()``)."""
        self = cls(name, namespace=namespace, connect_timeout=connect_timeout)
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
                link.proto.flush()  # the releases queued in this iteration go out before the close
                link.proto.transport.close()

    async def _ready(self) -> _Link:
        """The live link, connecting first if needed. Concurrent callers share one attempt, bounded
        by ``connect_timeout``: against a frozen actor they all get SchedulerBrokenError after one
        bound, not one bound each behind a lock."""
        link = self._link
        if link is not None and not link.closed:
            return link
        if self._closing:
            raise RuntimeClosedError("this RemoteTangram has been closed")
        task = self._connecting
        if task is None or task.done():
            task = self._connecting = asyncio.get_running_loop().create_task(self._connect())
            task.add_done_callback(_retrieve)
        # shield: a cancelled caller leaves the shared attempt to the others; the plain await of
        # the shield's own future still delivers the cancel to this caller
        return await asyncio.shield(task)

    async def _connect(self) -> _Link:
        what = f"the Tangram scheduler actor {self.namespace}/{self.name}"
        bound = self.connect_timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + bound
        ray = require()
        if not ray.is_initialized():  # ray.init blocks (20 s against an unreachable address): off the loop
            try:
                await within(asyncio.to_thread(_ensure_ray, self.namespace), bound,
                             lambda: f"connecting to the Ray cluster took over {bound:g} s "
                                     f"(RAY_ADDRESS={os.environ.get('RAY_ADDRESS', 'auto')!r} unreachable?)")
            except TimeoutError as exc:
                raise SchedulerBrokenError(str(exc)) from None
        if self._caller is None:
            self._caller = ray.get_runtime_context().get_node_id()

        def late(step: str) -> str:
            return f"{what} did not answer {step} within {bound:g} s (frozen, overloaded, or its node is unreachable)"

        try:
            # the lookup asks Ray's control store: in a thread, under the same bound (on the loop,
            # a slow or frozen GCS stalled it, and every other link's heartbeats with it)
            actor = await within(asyncio.to_thread(ray.get_actor, self.name, namespace=self.namespace),
                                 bound, lambda: f"the lookup of {what} in Ray's control store took over "
                                                f"{bound:g} s (a slow or restarting GCS)")
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        except ValueError:
            raise TangramError(f"no Tangram named {self.name!r} in namespace {self.namespace!r}; "
                               f"call tangram_sdk.ray.deploy() first") from None
        try:
            ep = await within(_awaitable(actor.endpoint.remote()), max(0.0, deadline - loop.time()),
                          lambda: late("the endpoint request"))
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        except Exception as exc:  # noqa: BLE001 - ActorDiedError and the like
            raise SchedulerBrokenError(f"{what} is gone: {exc!r}") from exc
        self._actor = actor
        link = _Link(self)
        try:
            await within(loop.create_connection(lambda: link.proto, ep["host"], ep["port"]),
                         max(0.0, deadline - loop.time()), lambda: late("the TCP connection"))
            link.proto.transport.write(_wire.frame(ep["token"]))  # type: ignore[union-attr]
            link.send(("hello", {"pid": os.getpid(), "node": self._caller}))
            link.config = await wait_future(link.welcome, max(0.0, deadline - loop.time()),
                                            lambda: late("the welcome"))
        except BaseException as exc:
            link.abort()
            if isinstance(exc, TimeoutError):
                raise SchedulerBrokenError(str(exc)) from None
            if isinstance(exc, OSError):
                raise SchedulerBrokenError(f"cannot connect to {what} at {ep['host']}:{ep['port']}: {exc}") from exc
            raise
        if self._closing:  # aclose() ran while this connected: the link must not outlive it
            link.abort()
            raise RuntimeClosedError("this RemoteTangram was closed while it connected")
        link.hb = loop.create_task(link.heartbeat(float(ep["heartbeat"]), float(ep["ttl"])))
        self._link = link
        _OPEN_LINKS.add(link)
        return link

    def acquire(self, spec: ActionSpec, *, timeout: float | None = None, node: str | None = None,
                deadline: float | None = None, expected_s: float | None = None) -> _RemoteAcquire:
        """Wait for ``spec``'s resources anywhere in the job; an async context manager yielding a
        :class:`~tangram_sdk.lease.Lease` (same fields as the in-process runtime's). ``node``
        forces a node label; by default a ``container=`` spec goes to its container's node, others
        to the caller's node while it has room, else the emptiest feasible node.
        ``lease.attachment("node")`` says where it landed. ``deadline``: as
        :meth:`Tangram.acquire` (this loop's ``loop.time()``; it travels as seconds from now, so
        the actor's clock need not agree): DeadlineError when the grant cannot or did not come
        by then. ``expected_s``: a length hint, as :meth:`Tangram.acquire` (sized on the node)."""
        if not isinstance(spec, ActionSpec):
            raise SpecError(f"acquire() needs an ActionSpec, got {type(spec).__name__}")
        limit = check_timeout(timeout)
        if node is not None and (not isinstance(node, str) or not node):
            raise SpecError(f"node must be None or a node label (a non-empty str), got {node!r}")
        return _RemoteAcquire(self, spec, limit, node, check_deadline(deadline), check_expected(expected_s))

    async def acquire_lease(self, spec: ActionSpec, *, timeout: float | None = None,
                            node: str | None = None, deadline: float | None = None,
                            expected_s: float | None = None) -> Lease:
        """:meth:`acquire` without the ``async with`` (as :meth:`Tangram.acquire_lease`): the
        lease, held until :meth:`release`."""
        acm = self.acquire(spec, timeout=timeout, node=node, deadline=deadline, expected_s=expected_s)
        lease = await acm.enter()
        self._open[id(lease)] = (lease, acm)  # holds the lease, so its id is not reused meanwhile
        return lease

    async def release(self, lease: Lease, *, failed: bool = False) -> None:
        """Give back a lease from :meth:`acquire_lease`. ``failed``: wait until the actor has the
        units back (as a failing ``async with`` block does). LeaseLostError when the actor took
        it back already. Releasing twice does nothing."""
        item = self._open.pop(id(lease), None)
        if item is not None:
            await item[1].exit(failed=failed)

    def report_tokens(self, lease: Lease, quota: str, used: int) -> None:
        """As :meth:`Tangram.report_tokens`, for a lease of this handle: the call really drew
        ``used`` tokens of weighted quota ``quota``; the job-wide bucket is corrected (one frame,
        not awaited: later acquires anywhere in the job wait for the truth). LeaseLostError when
        the link to the actor is gone."""
        check_tokens_used(lease.spec.tokens, lease.spec.kind, quota, used)
        link = self._link
        if link is None or link.closed:
            raise LeaseLostError("connection to the Tangram scheduler actor lost: tokens not reported")
        link.send(("tok", lease.action_id, quota, used))

    async def statistics(self) -> ClusterStatistics:
        """The scheduler actor's snapshot (:class:`~tangram_sdk.snapshot.ClusterStatistics`): per
        node, per quota, clients, peaks, invariant errors.
        SchedulerBrokenError when the actor does not answer within ``connect_timeout``."""
        link = await self._ready()
        key = next(self._keys)
        fut: asyncio.Future[Any] = asyncio.get_running_loop().create_future()
        link.waiters[key] = fut
        link.send(("stats", key))
        try:
            out: ClusterStatistics = await wait_future(
                fut, self.connect_timeout,
                lambda: f"the Tangram scheduler actor {self.namespace}/{self.name} did not answer statistics "
                        f"within {self.connect_timeout:g} s")
        except TimeoutError as exc:
            raise SchedulerBrokenError(str(exc)) from None
        finally:
            link.waiters.pop(key, None)
        return out

    async def astatistics(self) -> ClusterStatistics:
        """:meth:`statistics` under the name every Tangram handle shares (``AnyTangram``)."""
        return await self.statistics()

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
    __slots__ = ("_deadline", "_expected", "_key", "_lease", "_link", "_node", "_rt", "_spec", "_timeout")

    def __init__(self, rt: RemoteTangram, spec: ActionSpec, timeout: float | None, node: str | None,
                 deadline: float | None = None, expected: float | None = None) -> None:
        self._rt = rt
        self._spec = spec
        self._timeout = timeout
        self._node = node
        self._deadline = deadline
        self._expected = expected
        self._key = 0
        self._link: _Link | None = None
        self._lease: Lease | None = None

    async def __aenter__(self) -> Lease:
        return await self.enter()

    async def __aexit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                        tb: TracebackType | None) -> None:
        await self.exit(failed=exc_type is not None, exc=exc)

    async def enter(self) -> Lease:
        rt = self._rt
        blob = rt._encode(self._spec)  # SpecError before anything is registered or sent
        link = await rt._ready()
        loop = asyncio.get_running_loop()
        key = self._key = next(rt._keys)
        self._link = link
        if link.closed:
            raise LeaseLostError("connection to the Tangram scheduler actor lost before the request")
        fut: asyncio.Future[dict[str, Any]] = loop.create_future()
        link.waiters[key] = fut
        t0 = loop.time()
        within_s = None if self._deadline is None else self._deadline - t0
        frame: tuple[Any, ...] = ("acq", key, self._spec.kind, blob, self._timeout, self._node, rt._caller, within_s)
        if self._expected is not None:  # older actors take the frame without it
            frame += (self._expected,)
        link.send(frame)
        # the actor enforces `timeout`; this side waits a heartbeat longer for its answer, so a
        # frozen actor still yields TimeoutError on time (without a timeout, the link's silence
        # limit, ttl - heartbeat, ends the wait with LeaseLostError)
        bound = min((x for x in (self._timeout, None if within_s is None else max(0.0, within_s))
                     if x is not None), default=None)
        grace = None if bound is None else bound + float(link.config.get("heartbeat", 2.0))
        try:
            # never asyncio.wait_for: a grant landing with a cancel must not swallow the cancel
            f = await wait_future(fut, grace, self._late)
        except BaseException as exc:
            link.waiters.pop(key, None)
            link.early.pop(key, None)
            if key in link.refused:  # refused by the actor (SpecError, its own timeout...): nothing is held
                link.refused.discard(key)
                raise
            # whatever the actor has for this key goes back (no-op if nothing); raise once it has
            if await link.give_back(("cancel", key, True), key) and not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc  # cancelled while giving back: the cancel wins
            raise
        held = link.held[key] = _Held(asyncio.current_task())
        now = loop.time()
        lease = Lease(f["id"], self._spec, cpus=tuple(f["cpus"]), gpus=tuple(f["gpus"]), units=f["units"],
                      memory=f["memory"], quotas=tuple(f["quotas"]), queued_s=now - t0, granted_at=now,
                      counted=tuple(f.get("counted", ())), ceiling=f.get("workers") or None)
        lease.attach("node", f["node"])
        lease.attach("ray_node_id", f["ray_node_id"])
        agent_name = f["agent"]
        if agent_name is not None:
            aid = f["node_aid"]
            keys = set(f["agent_keys"])
            if "exec" in keys:
                async def _exec(cmd: Sequence[str], **kw: Any) -> Any:
                    return await _agent_call(rt, agent_name, "exec", (aid, list(cmd), kw), kw.get("timeout"))

                lease.attach("exec", _exec)
            if "call" in keys:
                async def _call(*args: Any, **kwargs: Any) -> Any:
                    return await _agent_call(rt, agent_name, "call", (aid, args, kwargs), kwargs.get("timeout"))

                lease.attach("call", _call)
        self._lease = held.lease = lease
        for cpus, units in link.early.pop(key, ()):  # resized between the grant and now
            _apply_resize(lease, cpus, units)
        return lease

    def _late(self) -> str:
        rt = self._rt
        # the wait is bounded by the timeout, the deadline, or both (a deadline alone has no timeout)
        what = f"within {self._timeout:g} s" if self._timeout is not None else "by its deadline"
        return (f"{self._spec.kind}: not granted {what}: the scheduler actor "
                f"{rt.namespace}/{rt.name} did not answer in time")

    async def exit(self, *, failed: bool, exc: BaseException | None = None) -> None:
        """Release: pipelined when the action succeeded; a failed one waits until the actor has
        the units back. A lease the actor took back raises its LeaseLostError (from ``exc``)."""
        link = self._link
        assert link is not None
        h = link.held.pop(self._key, None)
        if h is None or h.lost is None:
            # what the lease's commands really got (lease.run / lease.exec), for the actor's learning
            par = None if self._lease is None else self._lease.parallelism
            if not failed:
                # pipelined: ordered before the next request
                link.send(("rel", self._key, False) if par is None else ("rel", self._key, False, False, par))
                return
            # a failed or cancelled action: its exception propagates once the units are back
            if await link.give_back(("rel", self._key, True, True, par), self._key) and \
                    not isinstance(exc, asyncio.CancelledError):
                raise asyncio.CancelledError from exc
            return
        lost = h.lost
        task = h.task
        if h.cancelled and task is not None and hasattr(task, "uncancel"):
            task.uncancel()
        if exc is None or isinstance(exc, asyncio.CancelledError):
            raise lost from None
        raise lost from exc
