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
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ..pool import Pool
from ..scheduler.core import Scheduler
from ..spec import ActionSpec, Elasticity

__all__ = ["Policy", "make_policy", "POLICIES"]

POLICIES = ("tangram", "static", "fifo1", "fifo4", "fifo16", "isolated")

# Per-grant cost of making a CPU grant real: one cpuset/CFS-quota update of a parked container.
# design.md: Docker Engine API ~20 ms (p99 ~240 ms); cgroupfs write ~0.1 ms. We charge the Docker path.
CPU_UPDATE_S = 0.02
# Trajectory-static: container start-up per trajectory (image cached, Kubernetes-like pod start).
SANDBOX_STARTUP_S = 2.0
SANDBOX_CPUS = 3  # 15 x 256 cores / 1280 trajectories = 3 cores each: the paper's static sizing


class Policy:
    """A set of lanes (schedulers) plus routing. See the module docstring for the behaviours."""

    def __init__(self, name: str, lanes: list[Scheduler], *, hold: ActionSpec | None = None,
                 hold_startup_s: float = 0.0, cpu_overhead_s: float = CPU_UPDATE_S,
                 dop: int | None = None, service_lane: Mapping[str, int] | None = None,
                 tp: int = 1, report_residency: bool = True) -> None:
        self.name = name
        self.lanes = lanes
        self.hold = hold
        self.hold_startup_s = hold_startup_s
        self.cpu_overhead_s = cpu_overhead_s
        self.dop = dop
        self.service_lane = dict(service_lane or {})
        self.tp = tp
        self.report_residency = report_residency
        self._cache: dict[ActionSpec, tuple[int, ActionSpec]] = {}

    def in_sandbox(self, spec: ActionSpec) -> bool:
        return spec.cpus > 0 and spec.gpus == 0 and not spec.quotas

    def route(self, spec: ActionSpec) -> tuple[int, ActionSpec]:
        hit = self._cache.get(spec)
        if hit is None:
            hit = self._cache[spec] = self._route(spec)
        return hit

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


def make_policy(name: str, pool: Pool, *, services: Sequence[str] = (), service_share: Mapping[str, float]
                | None = None, gpus_per_service: int | None = None, iso_tp: int = 1,
                sandbox_cpus: int = SANDBOX_CPUS, sandbox_startup_s: float = SANDBOX_STARTUP_S,
                **sched_opts: Any) -> Policy:
    """Build policy ``name`` over ``pool``. ``services``/``service_share``/``gpus_per_service``
    size the isolated slices (fixed ``gpus_per_service`` each, else proportional to call share, at
    least ``iso_tp`` each)."""
    if name == "tangram":
        return Policy(name, [Scheduler(pool, **{"elastic": True, "lookahead": True, **sched_opts})])
    if name.startswith("fifo") and name[4:].isdigit():
        d = int(name[4:])
        return Policy(name, [Scheduler(pool, **{**sched_opts, "elastic": False})], dop=d)
    if name == "static":
        hold = ActionSpec(kind="sandbox", cpus=sandbox_cpus)
        return Policy(name, [Scheduler(pool, elastic=False, **sched_opts)], hold=hold,
                      hold_startup_s=sandbox_startup_s, cpu_overhead_s=0.0)
    if name == "isolated":
        if not services:
            raise ValueError("the isolated policy needs GPU services (this workload has none)")
        sizes = _slices(list(services), len(pool.gpus), service_share, gpus_per_service, iso_tp)
        lanes: list[Scheduler] = []
        lane_of: dict[str, int] = {}
        at = 0
        for svc, k in zip(services, sizes):
            ids = pool.gpus[at:at + k]
            at += k
            lane_of[svc] = len(lanes)
            lanes.append(Scheduler(Pool(gpus=list(ids), gpu_cells=pool.gpu_cells), elastic=False, **sched_opts))
        rest = Pool(cpus=list(pool.cpus), numa=pool.numa, memory=pool.memory, quotas=dict(pool.quotas))
        lanes.append(Scheduler(rest, elastic=False, **sched_opts))
        return Policy(name, lanes, service_lane=lane_of, tp=iso_tp)
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
