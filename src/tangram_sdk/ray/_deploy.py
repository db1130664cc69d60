"""Setting up the job's pool from driver code: :func:`deploy` (get-or-create the scheduler actor and
its node agents) and :class:`TangramCluster` (a sync handle on it: statistics, nodes, shutdown).

Kept apart from :mod:`.client` because this is the driver's side, made of blocking Ray calls and
checks of deploy()'s arguments; the processes that use the pool only need
:class:`~tangram_sdk.ray.client.RemoteTangram`. Both are importable from :mod:`.client` and
:mod:`tangram_sdk.ray`.
"""

from __future__ import annotations

import secrets
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs

from ..errors import SchedulerBrokenError, SpecError, TangramError
from ..managers.base import Manager
from ..options import SchedulerOptions, merge_options
from ..pool import Pool, Quota
from ..snapshot import ClusterStatistics, NodeStatistics
from ._ray_calls import _ensure_ray, _kill, _ray_get, _seconds

__all__ = ["PoolSource", "TangramCluster", "deploy"]

PoolSource = Pool | Callable[[], Pool] | None


def _fingerprint(quotas: Mapping[str, Quota], options: Mapping[str, Any], ttl: float, hb: float,
                 agent_timeout: float | None = 120.0, check_invariants: bool = False) -> str:
    return repr((sorted((k, repr(v)) for k, v in quotas.items()), sorted((k, repr(v)) for k, v in options.items()),
                 float(ttl), float(hb), agent_timeout, bool(check_invariants)))


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
