"""An open-loop arrival stream through the scheduler core: the textbook case for a fixed DoP.

Poisson arrivals of one elastic CPU kind (or a few sharing the pool), each with exponential
work, on a pool of a few nodes: no trajectories, no think times, nothing that adapts to the
scheduler. A fixed degree of parallelism picked for the load is hard to beat here (M/G/c with
sizes), so it is the yardstick for the price's forecast of arrivals (``benchmarks/open_loop.py``,
``tests/test_scheduler.py``).
Synchronous and pure: events are fed to :meth:`Scheduler.handle` at virtual times.
"""

from __future__ import annotations

import heapq
import random
from collections.abc import Iterable, Sequence

from ..pool import Pool
from ..scheduler import Scheduler
from ..scheduler.decisions import Grant
from ..scheduler.events import Released, Submitted
from ..spec import ActionSpec, Amdahl, Elasticity

__all__ = ["elastic_spec", "fixed_dop_acts", "fixed_pair_acts", "fixed_spec", "node_pool", "open_loop"]


def node_pool(cores: int, nodes: int = 1) -> Pool:
    """``cores`` in ``nodes`` equal NUMA nodes (one: a plain pool); no grant spans nodes."""
    if nodes == 1:
        return Pool(cpus=cores)
    per = cores // nodes
    return Pool(cpus=per * nodes, numa=[list(range(i * per, (i + 1) * per)) for i in range(nodes)])


def elastic_spec(max_units: int, p: float, duration: float | None = 1.0, kind: str = "t") -> ActionSpec:
    """An Amdahl-``p`` CPU action of ``duration`` seconds on one core (None: not declared, learned),
    elastic up to ``max_units``."""
    return ActionSpec(kind=kind, cpus=1, duration=duration,
                      elastic=Elasticity("cpu", max_units=max_units, efficiency=Amdahl(p)))


def open_loop(sched: Scheduler, spec: ActionSpec | Sequence[ActionSpec], gap: float, n: int,
              seed: int = 0, sigma: float | None = None, measured: bool = False) -> float:
    """Mean ACT of ``n`` Poisson arrivals every ``gap`` s on average, each with exponential work
    (``sigma``: log-normal of that log-sigma instead) of mean the spec's duration at its minimum
    (1 s when the spec declares none: the scheduler learns it) scaled by T(units). Several specs:
    each arrival is one of them, picked uniformly (kinds sharing the pool; one spec draws the
    same stream as before). ``measured``: each release reports the parallelism its work got (its
    speedup at its units, as ``lease.run`` measures work that conserves its CPU time)."""
    specs = (spec,) if isinstance(spec, ActionSpec) else tuple(spec)
    rng = random.Random(seed)
    ev: list[tuple[float, int, int, float]] = []
    which: list[int] = []
    t = 0.0
    for i in range(n):
        t += rng.expovariate(1 / gap)
        w = rng.expovariate(1.0) if sigma is None else rng.lognormvariate(-sigma * sigma / 2, sigma)
        which.append(rng.randrange(len(specs)) if len(specs) > 1 else 0)
        ev.append((t, 1, i, w))  # (time, 0=release 1=arrival, id, work)
    heapq.heapify(ev)
    sub: dict[int, float] = {}
    work: dict[int, float] = {}
    par: dict[int, float] = {}
    total = 0.0
    scale = [s.duration if s.duration is not None else 1.0 for s in specs]
    while ev:
        t, kind, aid, w = heapq.heappop(ev)
        if kind == 1:
            sub[aid], work[aid] = t, w
            d = sched.handle(Submitted(aid, specs[which[aid]]), t)
        else:
            total += t - sub[aid]
            d = sched.handle(Released(aid, parallelism=par.pop(aid)) if measured else Released(aid), t)
        for g in d:
            if isinstance(g, Grant):
                k = which[g.action_id]
                dur = work[g.action_id] * scale[k] * specs[k].relative_duration(g.units)
                if measured:
                    par[g.action_id] = specs[k].speedup(g.units)
                heapq.heappush(ev, (t + dur, 0, g.action_id, 0.0))
    sched.check_invariants()
    return total / n


def fixed_spec(p: float, dop: int, kind: str = "t") -> ActionSpec:
    """Exactly ``dop`` cores for Amdahl-``p`` work of 1 s on one core: a fixed DoP's action."""
    a = Amdahl(p)
    return ActionSpec(kind=kind, cpus=dop, elastic=Elasticity("cpu", max_units=dop, efficiency=a),
                      duration=1.0 / a.speedup(dop))


def fixed_dop_acts(p: float, cap: int, cores: int, gap: float, n: int, seed: int = 0,
                   dops: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                   sigma: float | None = None, nodes: int = 1) -> dict[int, float]:
    """Mean ACT of each fixed DoP up to ``cap`` (Amdahl ``p``) on the same open loop: an action of
    exactly that many cores, FCFS (``elastic=False``), on ``cores`` in ``nodes`` NUMA nodes."""
    out = {}
    for dop in (d for d in dops if d <= min(cap, cores // nodes)):
        out[dop] = open_loop(Scheduler(node_pool(cores, nodes), elastic=False), fixed_spec(p, dop), gap, n, seed,
                             sigma)
    return out


def fixed_pair_acts(p: float, p2: float, cap: int, cores: int, gap: float, n: int, seed: int = 0,
                    dops: Iterable[int] = (1, 2, 4, 8, 16, 32, 64),
                    sigma: float | None = None) -> dict[tuple[int, int], float]:
    """The same for two kinds sharing the pool (Amdahl ``p`` as kind "t", ``p2`` as "u", half the
    arrivals each): the mean ACT of every pair of fixed DoPs up to ``cap``, one per kind, as a user
    who sets one per tool would."""
    ds = [d for d in dops if d <= cap]
    return {(d1, d2): open_loop(Scheduler(Pool(cpus=cores), elastic=False),
                                (fixed_spec(p, d1, "t"), fixed_spec(p2, d2, "u")), gap, n, seed, sigma)
            for d1 in ds for d2 in ds}
