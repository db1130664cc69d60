"""Frozen statistics snapshots: typed fields, ``asdict()`` for JSON and Prometheus, and the old
read-only dict access (``stats["cpus_free"]``, ``.get``, ``in``) kept for one release.

Why a base class and not plain dicts: a typo in a field name is an AttributeError (or a mypy error)
instead of a silent ``None`` from ``.get``, and the shape of each snapshot is written down once.
A snapshot may carry another layer's snapshot whose keys read flat (``_flatten``: the scheduling
core's counters in the runtime's, a node's runtime in the Ray actor's), through the dict access and
``asdict()``.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import TYPE_CHECKING, Any

import attrs

if TYPE_CHECKING:
    from .scheduler.core import SchedulerStats

__all__ = ["ClusterStatistics", "NodeStatistics", "RuntimeStatistics", "Snapshot"]


def _plain(value: Any) -> Any:
    if isinstance(value, Snapshot):
        return value.asdict()
    if attrs.has(type(value)):  # a Pool, a Quota: their fields
        return _plain(attrs.asdict(value, recurse=False))
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


class Snapshot(Mapping[str, Any]):
    """Base of the frozen attrs snapshots (subclasses are ``@attrs.frozen``)."""

    __slots__ = ()
    _flatten: tuple[str, ...] = ()  # fields whose own keys appear at this level in dict access

    def _keys(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for a in attrs.fields(type(self)):  # type: ignore[arg-type]
            v = getattr(self, a.name)
            if a.name in self._flatten:
                if v is not None:
                    out.update(v)
            else:
                out[a.name] = v
        return out

    def asdict(self) -> dict[str, Any]:
        """A plain, JSON-ready dict (nested snapshots and mappings too), the same keys as the dict
        access."""
        return {k: _plain(v) for k, v in self._keys().items()}

    def __getitem__(self, key: str) -> Any:
        return self._keys()[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._keys())

    def __len__(self) -> int:
        return len(self._keys())

    def __or__(self, other: Mapping[str, Any]) -> dict[str, Any]:  # ``stats | {...}``, as with the old dicts
        return {**self._keys(), **other}

    def __ror__(self, other: Mapping[str, Any]) -> dict[str, Any]:
        return {**other, **self._keys()}


@attrs.frozen(eq=False)
class RuntimeStatistics(Snapshot):
    """:meth:`Tangram.statistics`: the pool's state right now.

    ``state``: new / open / closed / broken. ``waiters``: acquires submitted and not yet left
    (queued or holding). ``quarantined``: finished actions whose units a manager still holds back
    (a container it could not park yet; they count as running). ``resizes``: resizes of running
    malleable leases applied, ``resize_failures``: manager ``resize`` calls that raised (the action
    ran on what it had). ``quotas``: per quota ``used``,
    ``concurrency``, ``tokens``, ``token_level``. ``counted``: per counted kind (memory when the
    pool counts it, and the pool's declared ``resources``) ``total``, ``free``, ``used``, ``unit``. ``core``: the scheduling core's own snapshot
    (:class:`~tangram_sdk.scheduler.SchedulerStats`: submitted, granted, released, cancelled,
    rejected, failed, completed, rounds, evictions, mean_act_s, mean_queue_s, mean_exec_s,
    resident_services), flattened into the dict access."""

    _flatten = ("core",)

    state: str
    waiters: int
    quarantined: int
    cpus_total: int
    cpus_free: int
    gpus_total: int
    gpus_free: int
    memory_total: int | None
    memory_free: int | None
    running: int
    queued: int
    quotas: Mapping[str, Mapping[str, Any]]
    counted: Mapping[str, Mapping[str, Any]]
    core: SchedulerStats
    resizes: int = 0
    resize_failures: int = 0

    # the core's counters and means as attributes too (docs/api.md lists them as fields; they were
    # reachable only as s.core.X or through the dict access that goes away)
    submitted = property(lambda self: self.core.submitted, doc="actions submitted (the core's count)")
    granted = property(lambda self: self.core.granted, doc="actions granted")
    released = property(lambda self: self.core.released, doc="actions released")
    cancelled = property(lambda self: self.core.cancelled, doc="waiters that left before a grant")
    rejected = property(lambda self: self.core.rejected, doc="actions refused (infeasible, deadline)")
    failed = property(lambda self: self.core.failed, doc="released with failed=True")
    completed = property(lambda self: self.core.completed, doc="released normally")
    rounds = property(lambda self: self.core.rounds, doc="scheduling rounds run")
    evictions = property(lambda self: self.core.evictions, doc="planner evictions")
    mean_act_s = property(lambda self: self.core.mean_act_s, doc="mean action completion time, s")
    mean_queue_s = property(lambda self: self.core.mean_queue_s, doc="mean queueing time, s")
    mean_exec_s = property(lambda self: self.core.mean_exec_s, doc="mean execution time, s")
    resident_services = property(lambda self: self.core.resident_services, doc="warm service copies")

    @classmethod
    def from_core(cls, core: SchedulerStats, *, state: str, waiters: int, quarantined: int,
                  resizes: int = 0, resize_failures: int = 0) -> RuntimeStatistics:
        return cls(state=state, waiters=waiters, quarantined=quarantined, cpus_total=core.cpus_total,
                   cpus_free=core.cpus_free, gpus_total=core.gpus_total, gpus_free=core.gpus_free,
                   memory_total=core.memory_total, memory_free=core.memory_free, running=core.running,
                   queued=core.queued, quotas=core.quotas, counted=core.counted, core=core,
                   resizes=resizes, resize_failures=resize_failures)


@attrs.frozen(eq=False)
class NodeStatistics(Snapshot):
    """One node of the Ray job-wide pool: its runtime's statistics (None once the node is lost)
    plus what the scheduler actor tracks about it; dict access shows the runtime's keys flat."""

    _flatten = ("runtime",)

    alive: bool
    reason: str | None
    ray_node_id: str
    agent: str
    pool: Any  # the node's Pool
    containers: list[str]
    peak_cpus_used: int
    peak_gpus_used: int
    peak_memory_used: int
    runtime: RuntimeStatistics | None = None


@attrs.frozen(eq=False)
class ClusterStatistics(Snapshot):
    """The Ray scheduler actor's snapshot (``TangramCluster.statistics()``, ``RemoteTangram.statistics()``).

    ``quotas``: the job-wide quotas (as in RuntimeStatistics, plus ``peak_used``). ``held`` /
    ``pending``: leases clients hold / acquires in flight. ``granted == released + lost + held``
    when nothing is in flight. ``lost_nodes``: ``{"node", "reason", "at"}`` per node that left."""

    name: str
    pid: int
    scheduler_node: str
    nodes: Mapping[str, NodeStatistics]
    quotas: Mapping[str, Mapping[str, Any]]
    clients: int
    held: int
    pending: int
    granted: int
    released: int
    lost: int
    expired_clients: int
    failed_acquires: int
    lost_nodes: list[Mapping[str, Any]]
    invariant_errors: list[str]
