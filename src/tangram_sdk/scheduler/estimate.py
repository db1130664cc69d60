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
from collections.abc import Sequence
from typing import Any

__all__ = ["Waiter", "estimate_waits"]

# (arrival time, min units, duration at min units, max units, spec for T(m)/T(min) or None)
Waiter = tuple[float, int, float, int, Any]


def estimate_waits(
    now: float,
    free: int,
    releases: Sequence[tuple[float, int]],
    extra_releases: Sequence[tuple[float, int]],
    waiters: Sequence[Waiter],
    pow2: bool = False,
) -> float:
    """Sum of completion - arrival (wait + execution) over ``waiters`` served FCFS.

    ``releases`` is sorted by time (running actions, shared by every plan of a round);
    ``extra_releases`` are the plan's own (few) releases. Waiters needing more units than can ever
    be free are charged up to the last release (they would wait at least that long).
    An elastic waiter starts with what is free beyond the next waiter's minimum (up to its max;
    a power of two when ``pow2``, as GPU cells are), as the scheduler would give it.
    """
    heap = list(extra_releases)
    heapq.heapify(heap)
    ri = 0
    nrel = len(releases)
    t = now
    total = 0.0
    nw = len(waiters)
    for i, (arrival, need, dur, maxu, spec) in enumerate(waiters):
        if arrival > t:
            t = arrival
        while free < need:
            # pop the earliest release from the sorted list or the heap
            if ri < nrel and (not heap or releases[ri][0] <= heap[0][0]):
                rt, ru = releases[ri]
                ri += 1
            elif heap:
                rt, ru = heapq.heappop(heap)
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
            reserve = waiters[i + 1][1] if i + 1 < nw and waiters[i + 1][0] <= t else 0
            take = max(need, min(maxu, free - reserve))
            if pow2:
                take = max(need, 1 << (take.bit_length() - 1))
            if take > need:
                dur = dur * spec.relative_duration(take)
        total += t - arrival + dur
        free -= take
        heapq.heappush(heap, (t + dur, take))
    return total
