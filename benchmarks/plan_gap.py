"""How far is the scheduler's greedy plan (mu-grid split + greedy eviction) from the best plan an
exhaustive search finds under the *same* cost estimate, on small random instances?

Exhaustive: every FCFS prefix of the candidates is admitted (the rest evicted; only when eviction
is allowed, i.e. nobody else waits for the resource) and every split of the spare units among the
admitted is tried. The gap is (greedy - best) / best of the estimated
total ACT. Run: python benchmarks/plan_gap.py [--instances 300] [--seed 0]
"""

from __future__ import annotations

import argparse
import itertools
import random
import statistics
import sys

from tangram_sdk import ActionSpec, Amdahl, Elasticity, Pool, Scheduler
from tangram_sdk.scheduler.events import Released, Submitted


def _recording(s: Scheduler) -> list[tuple[float, float]]:
    """Make ``s``'s planner, for every elastic CPU plan it makes, also find the exhaustive optimum;
    returns the list ``(chosen cost, best cost)`` pairs are appended to."""
    planner = s._planner  # noqa: SLF001 - the benchmark measures the core's own planner
    inner = planner.plan_group
    gaps: list[tuple[float, float]] = []

    def plan_group(group, bins, spare, free_total, fixed_rel, res, now,  # type: ignore[no-untyped-def]
                   step_units, evict):
        plan = inner(group, bins, spare, free_total, fixed_rel, res, now, step_units, evict)
        if res != "cpu" or len(group) > 4:
            return plan
        units, evicted = plan.units, set(plan.evicted)
        may_evict = planner.may_evict(group, res, evict)
        cost = planner.plan_context(group, fixed_rel, free_total, res, now)
        active = [a for a in group if a.id not in evicted]
        out = [a for a in group if a.id in evicted]
        chosen_cost = cost(active, out, {a.id: units[a.id] for a in active})
        best = chosen_cost
        for k in range(1 if may_evict else len(group), len(group) + 1):
            act, ev = group[:k], group[k:]
            sp = dict(spare)
            for a in ev:
                sp[a.node] += a.emin
            ranges = [range(a.emin, min(a.emax, a.emin + sp[a.node]) + 1) for a in act]
            for combo in itertools.product(*ranges):
                used: dict[int, int] = {}
                for a, m in zip(act, combo):
                    used[a.node] = used.get(a.node, 0) + m - a.emin
                if any(used[b] > sp[b] for b in used):
                    continue
                c = cost(act, ev, {a.id: m for a, m in zip(act, combo)})
                best = min(best, c)
        gaps.append((chosen_cost, best))
        return plan

    planner.plan_group = plan_group  # type: ignore[method-assign]
    return gaps


def run(instances: int, seed: int) -> list[float]:
    rng = random.Random(seed)
    gaps: list[float] = []
    for _ in range(instances):
        s = Scheduler(Pool(cpus=rng.choice([4, 6, 8])), lookahead=rng.random() < 0.5, planner="estimate")
        recorded = _recording(s)
        now = 0.0
        aid = 0
        running: list[tuple[float, int]] = []
        for _step in range(12):
            batch = []
            for _ in range(rng.randint(1, 3)):
                aid += 1
                spec = ActionSpec(kind=rng.choice(["a", "b"]), cpus=rng.choice([1, 1, 2]),
                                  elastic=Elasticity("cpu", max_units=rng.choice([2, 4, 6]),
                                                     efficiency=Amdahl(rng.choice([0.5, 0.8, 0.95, 1.0]))),
                                  duration=rng.uniform(0.2, 3.0))
                batch.append(Submitted(aid, spec))
            for d in s.handle_many(batch, now):
                running.append((now + rng.uniform(0.1, 2.0), d.action_id))
            now += rng.uniform(0.05, 0.5)
            running.sort()
            while running and running[0][0] <= now:
                t, rid = running.pop(0)
                for d in s.handle(Released(rid), t):
                    running.append((t + rng.uniform(0.1, 2.0), d.action_id))
                running.sort()
        for chosen, best in recorded:
            gaps.append((chosen - best) / best if best > 0 else 0.0)
    return gaps


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--instances", type=int, default=300)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    gaps = run(args.instances, args.seed)
    gaps.sort()
    n = len(gaps)
    print(f"plans compared with exhaustive search: {n}")
    print(f"{'optimal':<10}{'mean gap':>10}{'p50':>8}{'p90':>8}{'p99':>8}{'max':>8}")
    print(f"{sum(g <= 1e-9 for g in gaps) / n:<10.1%}{statistics.mean(gaps):>10.2%}{gaps[n // 2]:>8.2%}"
          f"{gaps[int(n * 0.9)]:>8.2%}{gaps[min(n - 1, int(n * 0.99))]:>8.2%}{gaps[-1]:>8.2%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
