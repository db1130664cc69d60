"""Completion-time estimator: when would each waiting (and soon-arriving) action start if we commit
to a plan now?

The resource is treated as fungible units. Running actions release their units at their estimated
end; waiters start FCFS, each at its minimum units, as soon as enough units are free. The plan's
cost is the sum over admitted actions of their execution time, plus for every waiter its wait and
execution time, plus the waits of the actions expected to arrive during the horizon. That last term
is what stops a greedy split from draining the pool just before the next arrival.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple

__all__ = ["Waiter", "estimate_waits"]

class Waiter(NamedTuple):
    """One action the estimate serves FCFS: queued now, or expected to arrive."""

    arrival: float
    need: int  # its minimum units
    dur: float  # seconds at the minimum
    maxu: int  # the most units it can use (``need`` when not elastic in this resource)
    spec: Any  # for T(m)/T(min) when it gets more than its minimum (an ActionSpec)


def estimate_waits(
    now: float,
    free: int,
    releases: Sequence[tuple[float, int]],
    extra_releases: Sequence[tuple[float, int]],
    waiters: Sequence[Waiter],
    pow2: bool = False,
    policy: Mapping[str, int] | None = None,
    rel_memo: dict[tuple[int, int], tuple[Any, float]] | None = None,
) -> float:
    """Sum of completion - arrival (wait + execution) over ``waiters`` served FCFS.

    ``releases`` is sorted by time (running actions, shared by every plan of a round);
    ``extra_releases`` are the plan's own (few) releases. Waiters needing more units than can ever
    be free are charged up to the last release (they would wait at least that long).

    How many units an elastic waiter takes when it starts: if the plan gives a candidate of the
    same kind ``policy[kind]`` units, the same (a plan is judged as the stationary policy it
    implies: "actions like this one get m units"); otherwise its share of what is free among
    everyone waiting by then. Always at least its minimum, at most its max and what is free (a
    power of two when ``pow2``, as GPU cells are).

    ``rel_memo`` caches ``T(m)/T(min)`` by ``(id(spec), m)`` across calls (a round prices many
    plans over the same few specs); each entry keeps its spec, so an id is never misread.
    """
    heap = list(extra_releases)
    heapq.heapify(heap)
    heappop, heappush = heapq.heappop, heapq.heappush  # hot loop: no module attribute lookups
    ri = 0
    nrel = len(releases)
    t = now
    total = 0.0
    arrivals = [w[0] for w in waiters]  # sorted: queued actions (now) first, then expected arrivals
    rel = {} if rel_memo is None else rel_memo
    for i, (arrival, need, dur, maxu, spec) in enumerate(waiters):
        if arrival > t:
            t = arrival
        while True:
            # take every release due by t, then wait for more only if still short
            if ri < nrel and (not heap or releases[ri][0] <= heap[0][0]):
                if releases[ri][0] > t and free >= need:
                    break
                rt, ru = releases[ri]
                ri += 1
            elif heap:
                if heap[0][0] > t and free >= need:
                    break
                rt, ru = heappop(heap)
            else:
                break
            if rt > t:
                t = rt
            free += ru
        if free < need:  # can never be satisfied in this horizon: charge what we know
            total += t - arrival + dur
            continue
        take = need
        if maxu > need:
            target = policy.get(spec.kind) if policy and arrival > now else None
            if target is None:
                # share what is free with everyone already waiting at t
                waiting = bisect_right(arrivals, t, lo=i + 1) - i
                target = free // waiting
            take = maxu if maxu < target else target  # min(maxu, target, free), at least need
            if free < take:
                take = free
            if take < need:
                take = need
            if pow2 and take > need:
                take = 1 << (take.bit_length() - 1)
                if take < need:
                    take = need
            if take > need:
                key = (id(spec), take)
                hit = rel.get(key)
                if hit is None or hit[0] is not spec:
                    hit = rel[key] = (spec, spec.relative_duration(take))
                dur = dur * hit[1]
        total += t - arrival + dur
        free -= take
        heappush(heap, (t + dur, take))
    return total
