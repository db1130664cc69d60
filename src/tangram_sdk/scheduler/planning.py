"""How many elastic units each candidate gets: for each price on unit-seconds the split is exact
(:mod:`.split`), and the completion-time estimate (:mod:`.estimate`) over running, queued and
expected actions picks among the prices' plans, with greedy eviction on top.

:class:`Planner` is a collaborator the core owns: given at construction the running actions, the
wait queue, the placement, the residency, the round memo, the pool's legal GPU cells and the
planning options, it takes a round's snapshot (the candidates admission reserved at their minimum,
the free cores per node and GPU mask left after them, the time) and returns a :class:`Plan`:
units per candidate plus the candidates pushed back. It changes nothing the core owns (its own
``T(m)/T(min)`` cache and the round memo's entries aside); the core grants the plan."""

from __future__ import annotations

import math
from collections.abc import Callable
from operator import itemgetter
from typing import Any, NamedTuple

from .action import Action, dur_min
from .estimate import Waiter, estimate_waits
from .memo import RoundMemo
from .placement import Placement
from .queue import WaitQueue
from .residency import Residency
from .split import best_split

__all__ = ["Plan", "Planner"]

_by_time = itemgetter(0)


def _priced(durations: list[tuple[int, float]], emin: int, mu: float) -> list[tuple[int, float]]:
    """Split options ``(extra units, cost)`` at price ``mu`` per unit-second: ``T(m) + mu*m*T(m)``;
    ``mu = inf`` means "minimum only". A size whose cost is infinite (it could only displace busy
    services' caches) is dropped, except the minimum, which admission has already granted."""
    opts = []
    inf_mu = math.isinf(mu)
    for m, t in durations:
        if inf_mu:
            if m > emin:
                break
            cost = t
        else:
            cost = t + mu * m * t
        if math.isinf(cost):
            if m > emin:
                continue
            cost = 1e12
        opts.append((m - emin, cost))
    return opts


class Plan(NamedTuple):
    """A planning step's answer: ``units`` per candidate it sized (action id -> units) and the
    ids it ``evicted`` (pushed back to the queue; the next round re-plans them). ``evictions``:
    how many the eviction search pushed back, what ``statistics().evictions`` counts; the same as
    ``len(evicted)`` except where the GPU split could not place its plan and fell back to every
    candidate's minimum."""

    units: dict[int, int]
    evicted: list[int]
    evictions: int = 0


class Planner:
    """Elastic units for a round's candidates (see the module docstring). Not slotted: one per
    scheduler, and ``benchmarks/plan_gap.py`` wraps :meth:`plan_group` on an instance."""

    def __init__(self, running: dict[int, Action], queue: WaitQueue, place: Placement, resident: Residency,
                 memo: RoundMemo, cells: tuple[int, ...], *, window: int, depth: int, lookahead: bool,
                 lookahead_cap: int, mu_grid: tuple[float, ...], max_evictions: int) -> None:
        self._running = running
        self._queue = queue
        self._place = place
        self._resident = resident
        self._memo = memo
        self._cells = cells
        self.window = window
        self.depth = depth
        self.lookahead = lookahead
        self.lookahead_cap = lookahead_cap
        self.mu_grid = mu_grid
        self.max_evictions = max_evictions
        self._spec_rel: dict[tuple[int, int], tuple[Any, float]] = {}  # estimator's T(m)/T(min) cache

    def plan(self, cands: list[Action], node_free: list[int], gfree: int, now: float, *, cpu: bool) -> Plan:
        """Units for the elastic candidates of one round (``cpu``: split the CPU-elastic ones too;
        the priced planner sized them at admission) and the candidates pushed back. ``node_free``
        and ``gfree``: what is free with every candidate's minimum reserved."""
        plans = [self._split_cpu(cands, node_free, now)] if cpu else []
        plans.append(self._split_gpu(cands, gfree, now))
        if len(plans) == 1:
            return plans[0]
        units: dict[int, int] = {}
        evicted: list[int] = []
        n = 0
        for p in plans:  # disjoint groups: CPU-elastic and GPU-elastic candidates
            units.update(p.units)
            evicted.extend(p.evicted)
            n += p.evictions
        return Plan(units, evicted, n)

    # -- elastic split --------------------------------------------------------------------------
    def _releases(self, res: str, now: float) -> list[tuple[float, int]]:
        rel = []
        for r in self._running.values():
            g = r.grant
            assert g is not None
            k = len(g.cpus) if res == "cpu" else len(g.gpus)
            if k:
                rel.append((max(r.est_end, now), k))
        rel.sort()
        return rel

    def may_evict(self, group: list[Action], res: str, evict: bool) -> bool:
        """Evicting a candidate that fits only pays when nobody else waits for this resource: with
        a queue, its units would go to the queue's head, not to the other candidates."""
        if not evict:
            return False
        skip = {a.id for a in group}
        for a in self._queue:
            if a.id not in skip and (a.cpu_min if res == "cpu" else a.gpu_min):
                return False
        return True

    def _queued_waiters(self, res: str, now: float, skip: set[int]) -> list[Waiter]:
        out: list[Waiter] = []
        for a in self._queue:
            if len(out) >= self.depth:
                break
            if a.id in skip:
                continue
            need = a.cpu_min if res == "cpu" else a.gpu_min
            if need:
                out.append(Waiter(now, need, dur_min(a), a.emax if a.eres == res else need, a.spec))
        return out

    def _arrivals(self, res: str, now: float, horizon: float) -> list[Waiter]:
        if not self.lookahead or horizon <= 0:
            return []
        per_kind = []
        total = 0.0
        for st, lam in self._place.kind_rates(now):
            spec = st.spec
            if spec is None or not (spec.cpus if res == "cpu" else spec.gpus):
                continue
            n = lam * horizon
            if n >= 0.5:
                per_kind.append((lam, st, n))
                total += n
        if not per_kind:
            return []
        # Past the cap, look less far ahead rather than thin the stream: the first arrivals at
        # their true rate are the ones a plan's spare units would have served.
        scale = min(1.0, self.lookahead_cap / total)
        span = horizon * scale
        out: list[Waiter] = []
        for _lam, st, n in per_kind:
            k = max(1, int(round(n * scale)))
            step = span / k
            spec = st.spec
            # estimated_duration(spec) at its minimum, from this kind's stats directly
            if spec.duration is not None:
                d = spec.duration
            else:
                d = st.t1 / st.speedup_at(spec, spec.min_units) if spec.elastic else st.t1
            need = spec.cpus if res == "cpu" else spec.gpus
            maxu = spec.max_units if spec.elastic_resource == res else need
            out.extend([Waiter(now + (j + 0.5) * step, need, d, maxu, spec) for j in range(k)])
        out.sort(key=_by_time)
        return out

    def _split_cpu(self, cands: list[Action], node_free: list[int], now: float) -> Plan:
        group = [a for a in cands if a.eres == "cpu" and not a.span]
        if not group:
            return Plan({}, [])
        evict = len(group) <= self.window
        if not evict:  # only the oldest `window` candidates are optimised; the rest keep minimum
            group = group[: self.window]
        if sum(node_free[a.node] for a in group) == 0 and len(group) < 2:
            return Plan({}, [])
        bins = sorted({a.node for a in group})
        spare = {b: node_free[b] for b in bins}
        free_total = sum(node_free)
        fixed_rel = [(now + dur_min(a), a.cpu_min) for a in cands
                     if a.cpu_min and (a.eres != "cpu" or a.span)]
        return self.plan_group(group, bins, spare, free_total, fixed_rel, "cpu", now, step_units=None,
                                evict=evict)

    def _split_gpu(self, cands: list[Action], gfree: int, now: float) -> Plan:
        group = [a for a in cands if a.eres == "gpu"]
        if not group:
            return Plan({}, [])
        evict = len(group) <= self.window
        if not evict:
            group = group[: self.window]
        mask = gfree
        for a in group:  # give the tentative minimum cells back: the plan re-places them
            mask |= ((1 << a.gpu_min) - 1) << a.cell
        spare_total = mask.bit_count() - sum(a.emin for a in group)
        if spare_total <= 0 and len(group) < 2:  # nothing to split or evict: keep admission's cell
            return Plan({}, [])
        fixed_rel = [(now + dur_min(a), a.gpu_min) for a in cands if a.gpu_min and a.eres != "gpu"]
        plan = self.plan_group(group, [0], {0: spare_total}, gfree.bit_count(), fixed_rel, "gpu", now,
                                step_units=self._cells, evict=evict)
        units = plan.units
        evicted = set(plan.evicted)
        # place largest first into aligned cells; shrink what does not fit
        live = sorted((a for a in group if a.id not in evicted), key=lambda a: (-units[a.id], a.seq))
        for _attempt in range(len(live) * 4 + 1):
            m = mask
            placed: dict[int, int] = {}
            failed: Action | None = None
            for a in live:
                o = self._place.pick_cell(units[a.id], a.spec.service, m)
                if o < 0:
                    failed = a
                    break
                placed[a.id] = o
                m &= ~(((1 << units[a.id]) - 1) << o)
            if failed is None:
                for a in live:
                    a.cell = placed[a.id]
                return plan
            smaller = [c for c in self._cells if failed.emin <= c < units[failed.id]]
            if not smaller:
                break
            units[failed.id] = smaller[-1]
            live.sort(key=lambda a: (-units[a.id], a.seq))
        # fall back: everyone at minimum in the cells admission chose, nobody pushed back
        return Plan({a.id: a.emin for a in group}, [], plan.evictions)

    def _durations(self, a: Action, spare: int, steps: tuple[int, ...] | None) -> list[tuple[int, float]]:
        """``(units, expected seconds)`` for every size ``a`` may get out of ``spare``, a cold
        start's restore and displacement included. Independent of the price, so each plan builds
        it once per candidate and prices it for every ``mu`` (:func:`_priced`)."""
        d0 = dur_min(a)
        spec = a.spec
        hi = min(a.emax, a.emin + spare)
        sizes = range(a.emin, hi + 1) if steps is None else [s for s in steps if a.emin <= s <= hi]
        out = []
        warm_sizes = ({len(pos) for pos in self._resident.cells_of(spec.service)}
                      if steps is not None and spec.service is not None else None)
        rel = self._memo.rel
        for m in sizes:
            key = (a.id, m)
            r = rel.get(key)
            if r is None:
                r = rel[key] = a.stats.rel(spec, m)
            t = d0 * r
            if warm_sizes is not None and m not in warm_sizes:
                assert spec.service is not None
                t += self._place.cold_cost(spec.service, m, d0, self._memo.now)
            out.append((m, t))
        return out

    def plan_group(self, group: list[Action], bins: list[int], spare: dict[int, int], free_total: int,
                    fixed_rel: list[tuple[float, int]], res: str, now: float,
                    step_units: tuple[int, ...] | None, evict: bool) -> Plan:
        plan_cost = self.plan_context(group, fixed_rel, free_total, res, now)
        evict = self.may_evict(group, res, evict)
        binkey = (lambda a: a.node) if res == "cpu" else (lambda a: 0)

        def plan(active: list[Action], out_: list[Action]) -> tuple[float, dict[int, int]]:
            best_cost = math.inf
            best_units: dict[int, int] = {}
            seen: set[tuple[int, ...]] = set()
            sp = dict(spare)
            for a in out_:
                sp[binkey(a)] += a.emin
            per_bin = []
            for b in bins:
                members = [a for a in active if binkey(a) == b]
                if members:
                    per_bin.append((sp[b], members, [self._durations(a, sp[b], step_units) for a in members]))
            if len(per_bin) == 1 and len(active) == 1:  # most rounds: one candidate, one bin
                cap, (one,), (dur,) = per_bin[0]
                for mu in self.mu_grid:
                    m = one.emin + best_split([_priced(dur, one.emin, mu)], cap)[0][0]
                    if (m,) in seen:
                        continue
                    seen.add((m,))
                    chosen1 = {one.id: m}
                    cost = plan_cost(active, out_, chosen1)
                    if cost < best_cost - 1e-12:
                        best_cost, best_units = cost, chosen1
                return best_cost, best_units
            for mu in self.mu_grid:
                chosen: dict[int, int] = {}
                for cap, members, durs in per_bin:
                    opts = [_priced(d, a.emin, mu) for a, d in zip(members, durs)]
                    picks, _ = best_split(opts, cap)
                    for a, k in zip(members, picks):
                        chosen[a.id] = a.emin + k
                sig = tuple(chosen[a.id] for a in active)
                if sig in seen:
                    continue
                seen.add(sig)
                cost = plan_cost(active, out_, chosen)
                if cost < best_cost - 1e-12:
                    best_cost, best_units = cost, chosen
            return best_cost, best_units

        active = list(group)
        out_: list[Action] = []
        best_cost, best_units = plan(active, out_)
        n_ev = 0
        while evict and len(active) > 1 and n_ev < self.max_evictions:
            trial_out = [active[-1]] + out_
            trial_active = active[:-1]
            cost, u = plan(trial_active, trial_out)
            if cost < best_cost - 1e-9:
                active, out_, best_cost, best_units = trial_active, trial_out, cost, u
                n_ev += 1
            else:
                break
        return Plan({a.id: best_units.get(a.id, a.emin) for a in active}, [a.id for a in out_], len(out_))

    def plan_context(self, group: list[Action], fixed_rel: list[tuple[float, int]], free_total: int,
                      res: str, now: float) -> Callable[[list[Action], list[Action], dict[int, int]], float]:
        """Everything a plan's cost depends on besides the plan itself, gathered once per round;
        returns ``cost(admitted, evicted, units)`` (also used by the exhaustive reference search)."""
        releases = self._releases(res, now)
        queued = self._queued_waiters(res, now, {a.id for a in group})
        horizon = max(dur_min(a) for a in group)
        arrivals = self._arrivals(res, now, horizon)

        def cost(active: list[Action], out_: list[Action], chosen: dict[int, int]) -> float:
            return self._plan_cost(active, out_, chosen, releases, fixed_rel, queued, arrivals, free_total,
                                   now, res)

        return cost

    def _plan_cost(self, active: list[Action], out_: list[Action], chosen: dict[int, int],
                   releases: list[tuple[float, int]], fixed_rel: list[tuple[float, int]],
                   queued: list[Waiter], arrivals: list[Waiter], free_total: int, now: float,
                   res: str) -> float:
        cost = 0.0
        extra_rel = list(fixed_rel)
        free = free_total
        policy: dict[str, int] = {}
        for a in active:
            m = chosen.get(a.id, a.emin)
            t = dur_min(a) * a.stats.rel(a.spec, m)
            cost += t
            extra_rel.append((now + t, m))
            free -= m - a.emin
            policy[a.spec.kind] = m
        waiters: list[Waiter] = []
        for a in out_:
            d = dur_min(a)
            free += a.emin
            waiters.append(Waiter(now, a.emin, d, a.emax, a.spec))
        waiters.extend(queued)
        waiters.extend(arrivals)
        memo = self._spec_rel
        if len(memo) > 4096:
            memo.clear()
        return cost + estimate_waits(now, free, releases, extra_rel, waiters, pow2=res == "gpu", policy=policy,
                                     rel_memo=memo)
