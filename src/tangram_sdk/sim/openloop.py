"""An open-loop arrival stream through the scheduler core: the textbook case for a fixed DoP.

Poisson arrivals of one elastic CPU kind, each with exponential work, on a pool of a few nodes:
no trajectories, no think times, nothing that adapts to the scheduler. A fixed degree of
parallelism picked for the load is hard to beat here (M/G/c with sizes), so it is the yardstick
for the price's forecast of arrivals (``benchmarks/open_loop.py``, ``tests/test_scheduler.py``).
Synchronous and pure: events are fed to :meth:`Scheduler.handle` at virtual times.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable

from ..pool import Pool
from ..scheduler import Scheduler
from ..scheduler.decisions import Grant
from ..scheduler.events import Released, Submitted
from ..spec import ActionSpec, Amdahl, Elasticity

__all__ = ["elastic_spec", "fixed_dop_acts", "open_loop"]


def elastic_spec(max_units: int, p: float, duration: float | None = 1.0, kind: str = "t") -> ActionSpec:
    """An Amdahl-``p`` CPU action of ``duration`` seconds on one core (None: not declared, learned),
    elastic up to ``max_units``."""
    return ActionSpec(kind=kind, cpus=1, duration=duration,
                      elastic=Elasticity("cpu", max_units=max_units, efficiency=Amdahl(p)))


def open_loop(sched: Scheduler, spec: ActionSpec, gap: float, n: int, seed: int = 0,
              sigma: float | None = None) -> float:
    """Mean ACT of ``n`` Poisson arrivals every ``gap`` s on average, each with exponential work
    (``sigma``: log-normal of that log-sigma instead) of mean the spec's duration at its minimum
    (1 s when the spec declares none: the scheduler learns it) scaled by T(units)."""
    rng = random.Random(seed)
    ev: list[tuple[float, int, int, float]] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / gap)
        w = rng.expovariate(1.0) if sigma is None else rng.lognormvariate(-sigma * sigma / 2, sigma)
        ev.append((t, 1, i, w))  # (time, 0=release 1=arrival, id, work)
    heapq.heapify(ev)
    sub: dict[int, float] = {}
    work: dict[int, float] = {}
    total = 0.0
    scale = spec.duration if spec.duration is not None else 1.0
    while ev:
        t, kind, aid, w = heapq.heappop(ev)
        if kind == 1:
            sub[aid], work[aid] = t, w
            d = sched.handle(Submitted(aid, spec), t)
        else:
            total += t - sub[aid]
            d = sched.handle(Released(aid), t)
        for g in d:
            if isinstance(g, Grant):
                dur = work[g.action_id] * scale * spec.relative_duration(g.units)
                heapq.heappush(ev, (t + dur, 0, g.action_id, 0.0))
    sched.check_invariants()
    return total / n


def fixed_dop_acts(p: float, cap: int, cores: int, gap: float, n: int, seed: int = 0,
                   dops: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                   sigma: float | None = None) -> dict[int, float]:
    """Mean ACT of each fixed DoP up to ``cap`` (Amdahl ``p``) on the same open loop: an action of
    exactly that many cores, FCFS (``elastic=False``)."""
    a = Amdahl(p)
    out = {}
    for dop in (d for d in dops if d <= cap):
        spec = ActionSpec(kind="t", cpus=dop, elastic=Elasticity("cpu", max_units=dop, efficiency=a),
                          duration=1.0 / a.speedup(dop))
        out[dop] = open_loop(Scheduler(Pool(cpus=cores), elastic=False), spec, gap, n, seed, sigma)
    return out
