"""Policies compared on the same workload and pool. Every one is a real scheduler run, not a formula.

* ``tangram``  -- action-level, elastic (``elastic=True, lookahead=True``): one Scheduler, whole pool.
* ``fifo<d>``  -- action-level FIFO with a fixed degree of parallelism: an elastic action asks for
  exactly ``min(d, its max)`` units of its key resource (``elastic=False`` grants the minimum); a
  non-elastic action keeps its own demand (a fixed-DoP system still knows ``ls`` is serial).
* ``static``   -- trajectory-level: each trajectory holds a sandbox of ``sandbox_cpus`` cores from its
  first CPU action until it ends, paying a container start-up once; trajectories queue (FCFS, via a
  ``Scheduler(elastic=False)``) for sandboxes when the pool is short. Its actions then run at once on
  the sandbox's cores (an elastic action uses ``min(sandbox, max)`` of them). Non-CPU actions (quota,
  GPU) go to a shared action-level FIFO, as they would in such a deployment.
* ``isolated`` -- task-level: every GPU service owns a fixed slice of GPUs with its own FIFO queue
  (one Scheduler per slice), its model always resident there; each call uses ``tp`` GPUs.
  Actions needing no GPU share one FIFO scheduler over the CPUs and quotas.

The baselines' real failure modes and fairness, as options (off by default unless a workload
turns them on; docs/simulator.md):

* ``static``: sandbox creation is rate limited (``sandbox_rate`` per second, like a Kubernetes
  API or image pull limit) and the start-up grows with the creations in flight
  (``sandbox_startup_per_inflight`` seconds each);
* ``quota_procs``: the fixed policies guard each quota with per-process semaphores, N rollout
  processes each holding ``1/N`` of the concurrency and rate, trajectories spread over them
  round-robin (a process cannot borrow the idle share of another), against Tangram's one quota;
* ``iso_batch``: an isolated model server batches up to that many concurrent calls per GPU, a
  batch of ``n`` taking ``1 + iso_batch_cost * (n - 1)`` times one call (SGLang-style continuous
  batching; prefill-bound scoring gains little, so the cost is close to 1).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..options import SchedulerOptions, merge_options
from ..pool import Pool, Quota
from ..scheduler.core import Scheduler
from ..spec import ActionSpec, Elasticity

__all__ = ["Policy", "make_policy", "POLICIES"]

POLICIES = ("tangram", "static", "fifo1", "fifo4", "fifo16", "isolated")

# Per-grant cost of making a CPU grant real: one cpuset/CFS-quota update of a parked container.
# design.md: Docker Engine API ~20 ms (p99 ~240 ms); cgroupfs write ~0.1 ms. We charge the Docker path.
CPU_UPDATE_S = 0.02
# Trajectory-static: container start-up per trajectory (image cached, Kubernetes-like pod start).
SANDBOX_STARTUP_S = 2.0
SANDBOX_CPUS = 3
_SLOT = 1024  # batch slot j of physical GPU g has id j * _SLOT + g (GPU ids stay below 65536)  # 15 x 256 cores / 1280 trajectories = 3 cores each: the paper's static sizing


class Policy:
    """A set of lanes (schedulers) plus routing. See the module docstring for the behaviours."""

    def __init__(self, name: str, lanes: list[Scheduler], *, hold: ActionSpec | None = None,
                 hold_startup_s: float = 0.0, cpu_overhead_s: float = CPU_UPDATE_S,
                 dop: int | None = None, service_lane: Mapping[str, int] | None = None,
                 tp: int = 1, report_residency: bool = True, sandbox_rate: float | None = None,
                 sandbox_startup_per_inflight: float = 0.0, quota_lanes: Sequence[int] = (),
                 batch: int = 1, batch_cost: float = 1.0) -> None:
        self.name = name
        self.lanes = lanes
        self.hold = hold
        self.hold_startup_s = hold_startup_s
        self.cpu_overhead_s = cpu_overhead_s
        self.dop = dop
        self.service_lane = dict(service_lane or {})
        self.tp = tp
        self.report_residency = report_residency
        self.sandbox_rate = sandbox_rate
        self.sandbox_startup_per_inflight = sandbox_startup_per_inflight
        self.quota_lanes = tuple(quota_lanes)  # per-process semaphore lanes, by trajectory
        self.batch = batch  # isolated servers: concurrent calls per physical GPU
        self.batch_cost = batch_cost
        self._cache: dict[ActionSpec, tuple[int, ActionSpec]] = {}

    def in_sandbox(self, spec: ActionSpec) -> bool:
        return spec.cpus > 0 and spec.gpus == 0 and not spec.quotas

    def route(self, spec: ActionSpec) -> tuple[int, ActionSpec]:
        hit = self._cache.get(spec)
        if hit is None:
            hit = self._cache[spec] = self._route(spec)
        return hit

    def route_traj(self, spec: ActionSpec, traj: int) -> tuple[int, ActionSpec]:
        """:meth:`route` for an action of trajectory ``traj`` (per-process quota lanes)."""
        if self.quota_lanes and spec.quotas and not spec.gpus and not spec.cpus:
            return self.quota_lanes[traj % len(self.quota_lanes)], spec
        return self.route(spec)

    def phys_gpu(self, gid: int) -> int:
        """The physical GPU behind a grant's GPU id (an isolated server's batch slots share one)."""
        return gid % _SLOT if self.batch > 1 else gid

    def _route(self, spec: ActionSpec) -> tuple[int, ActionSpec]:
        if self.service_lane:
            if spec.gpus:
                if spec.service not in self.service_lane:
                    raise ValueError(f"isolated policy: no GPU slice for service {spec.service!r}")
                return self.service_lane[spec.service], _fixed(spec, self.tp)
            return len(self.lanes) - 1, spec
        if self.dop is not None and spec.elastic is not None:
            return 0, _fixed(spec, self.dop)
        return 0, spec


def _fixed(spec: ActionSpec, d: int) -> ActionSpec:
    """``spec`` asking for exactly ``d`` units (clamped to its range) of its elastic resource."""
    el = spec.elastic
    if el is None:
        return spec
    k = max(spec.min_units, min(d, el.max_units))
    if el.resource == "gpu":  # GPU grants come in cells of 1/2/4/8
        k = 1 << (k.bit_length() - 1)
        k = max(k, spec.min_units)
    new_el = Elasticity(el.resource, max_units=k, efficiency=el.efficiency)
    if el.resource == "cpu":
        return attrs.evolve(spec, cpus=k, elastic=new_el, duration=_scaled(spec, k))
    return attrs.evolve(spec, gpus=k, elastic=new_el, duration=_scaled(spec, k))


def _scaled(spec: ActionSpec, k: int) -> float | None:
    return None if spec.duration is None else spec.duration * spec.relative_duration(k)


def _quota_lanes(lanes: list[Scheduler], pool: Pool, procs: int, opts: Mapping[str, Any]) -> list[int]:
    """Append ``procs`` lanes, each holding 1/procs of every quota (per-process semaphores)."""
    if procs <= 1 or not pool.quotas:
        return []
    out = []
    for _ in range(procs):
        qs = {}
        for qname, q in pool.quotas:
            qs[qname] = Quota(
                concurrency=None if q.concurrency is None else max(1, q.concurrency // procs),
                rate=None if q.rate is None else q.rate / procs,
                burst=None if q.rate is None or q.burst is None else max(1, q.burst // procs),
                tokens_per_s=None if q.tokens_per_s is None else q.tokens_per_s / procs,
                token_burst=None if q.tokens_per_s is None or q.token_burst is None
                else max(1, q.token_burst // procs))
        out.append(len(lanes))
        lanes.append(Scheduler(Pool(quotas=qs), elastic=False, **opts))
    return out


def make_policy(name: str, pool: Pool, *, services: Sequence[str] = (), service_share: Mapping[str, float]
                | None = None, gpus_per_service: int | None = None, iso_tp: int = 1,
                sandbox_cpus: int = SANDBOX_CPUS, sandbox_startup_s: float = SANDBOX_STARTUP_S,
                sandbox_rate: float | None = None, sandbox_startup_per_inflight: float = 0.0,
                quota_procs: int = 1, iso_batch: int = 1, iso_batch_cost: float = 1.0,
                options: SchedulerOptions | None = None, **sched_opts: Any) -> Policy:
    """Build policy ``name`` over ``pool``. ``services``/``service_share``/``gpus_per_service``
    size the isolated slices (fixed ``gpus_per_service`` each, else proportional to call share, at
    least ``iso_tp`` each). The failure-mode options (module docstring) apply to the fixed
    policies only: Tangram holds one quota for the pool and creates no sandboxes. Scheduler
    options (``options=SchedulerOptions(...)`` or keywords, as for a Tangram) go to every lane."""
    sched_opts = merge_options(options, sched_opts)
    if iso_batch < 1 or iso_batch > 64 or not 0 < iso_batch_cost <= 1 or quota_procs < 1:
        raise ValueError("iso_batch must be in 1..64, quota_procs >= 1, 0 < iso_batch_cost <= 1")
    if sandbox_rate is not None and not sandbox_rate > 0:
        raise ValueError(f"sandbox_rate must be None or > 0, got {sandbox_rate!r}")
    if isinstance(sandbox_cpus, bool) or not isinstance(sandbox_cpus, int) or sandbox_cpus < 1:
        raise ValueError(f"sandbox_cpus must be an int >= 1 (the static sandbox's cores), got {sandbox_cpus!r}")
    for what, v in (("iso_tp", iso_tp), ("gpus_per_service", gpus_per_service)):
        # a negative iso_tp never finished sizing the slices; 0 divided by zero
        if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
            raise ValueError(f"{what} must be an int >= 1, got {v!r}")
    if name == "tangram":
        return Policy(name, [Scheduler(pool, **{"elastic": True, "lookahead": True, **sched_opts})])
    if name.startswith("fifo") and name[4:].isdigit():
        d = int(name[4:])
        lanes: list[Scheduler] = [Scheduler(pool, **{**sched_opts, "elastic": False})]
        ql = _quota_lanes(lanes, pool, quota_procs, {k: v for k, v in sched_opts.items() if k != "elastic"})
        return Policy(name, lanes, dop=d, quota_lanes=ql)
    if name == "static":
        hold = ActionSpec(kind="sandbox", cpus=sandbox_cpus)
        lanes = [Scheduler(pool, elastic=False, **sched_opts)]
        ql = _quota_lanes(lanes, pool, quota_procs, sched_opts)
        return Policy(name, lanes, hold=hold, hold_startup_s=sandbox_startup_s, cpu_overhead_s=0.0,
                      sandbox_rate=sandbox_rate, sandbox_startup_per_inflight=sandbox_startup_per_inflight,
                      quota_lanes=ql)
    if name == "isolated":
        if iso_batch > 1 and (iso_tp > 1 or len(pool.gpus) and max(pool.gpus) >= _SLOT):
            raise ValueError(f"isolated batching models TP-1 servers on GPU ids < {_SLOT}")
        if not services:
            raise ValueError("the isolated policy needs GPU services (this workload has none)")
        sizes = _slices(list(services), len(pool.gpus), service_share, gpus_per_service, iso_tp)
        lanes = []
        lane_of: dict[str, int] = {}
        at = 0
        for svc, k in zip(services, sizes):
            ids = list(pool.gpus[at:at + k])
            at += k
            lane_of[svc] = len(lanes)
            if iso_batch > 1:  # batch slots: iso_batch schedulable ids per physical GPU, TP-1 calls;
                # every GPU's first slot before any second one (a call batches only when all are busy)
                ids = [j * _SLOT + g for j in range(iso_batch) for g in ids]
            lanes.append(Scheduler(Pool(gpus=list(ids), gpu_cells=pool.gpu_cells), elastic=False, **sched_opts))
        rest = Pool(cpus=list(pool.cpus), numa=pool.numa, memory=pool.memory, quotas=dict(pool.quotas),
                    resources=pool.resources)
        lanes.append(Scheduler(rest, elastic=False, **sched_opts))
        ql = _quota_lanes(lanes, pool, quota_procs, sched_opts)
        return Policy(name, lanes, service_lane=lane_of, tp=iso_tp, quota_lanes=ql, batch=iso_batch,
                      batch_cost=iso_batch_cost)
    raise ValueError(f"unknown policy {name!r}; choose from {', '.join(POLICIES)} or fifo<N>")


def _slices(services: list[str], ngpus: int, share: Mapping[str, float] | None, fixed: int | None,
            tp: int) -> list[int]:
    n = len(services)
    if fixed is not None:
        if fixed * n > ngpus:
            raise ValueError(f"isolated: {n} services x {fixed} GPUs exceed the pool's {ngpus}")
        return [fixed] * n
    if tp * n > ngpus:
        raise ValueError(f"isolated: {n} services need at least {tp * n} GPUs, pool has {ngpus}")
    w = [max(1e-9, (share or {}).get(s, 1.0)) for s in services]
    tot = sum(w)
    sizes = [tp] * n
    left = ngpus - tp * n
    while left >= tp:  # give each next slice of tp GPUs to the service with most load per GPU
        i = max(range(n), key=lambda j: (w[j] / tot) / sizes[j])
        sizes[i] += tp
        left -= tp
    return sizes
