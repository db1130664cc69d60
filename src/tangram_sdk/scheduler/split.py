"""Split spare units of one resource among candidates: an exact dynamic programme over legal shapes,
and a greedy marginal-gain allocator that equals it when costs are convex (and is much cheaper).

Each candidate ``i`` offers options ``(extra_units, cost)``; choose one option per candidate so the
extras sum to at most ``capacity`` and the total cost is minimal. Option 0 (no extra) always exists.
Pure functions over plain lists: no scheduler state, so they are tested against brute force.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections.abc import Sequence

__all__ = ["Options", "brute_force_split", "dp_split", "greedy_split", "is_convex", "single_split"]

# options[i] = [(extra_units, cost), ...] sorted by extra_units, starting with (0, cost0)
Options = Sequence[Sequence[tuple[int, float]]]


def dp_split(options: Options, capacity: int) -> tuple[list[int], float]:
    """Exact minimum-cost choice (knapsack over units). O(n * capacity * options)."""
    n = len(options)
    if n == 0:
        return [], 0.0
    cap = max(0, capacity)
    inf = math.inf
    # best[u] = min cost of candidates so far using exactly u extra units
    best = [inf] * (cap + 1)
    best[0] = 0.0
    choice: list[list[int]] = []
    for opts in options:
        nxt = [inf] * (cap + 1)
        pick = [-1] * (cap + 1)
        for u in range(cap + 1):
            bu = best[u]
            if bu == inf:
                continue
            for j, (k, c) in enumerate(opts):
                v = u + k
                if v > cap:
                    break
                total = bu + c
                if total < nxt[v] - 1e-12:
                    nxt[v] = total
                    pick[v] = j
        best = nxt
        choice.append(pick)
    u_best = min(range(cap + 1), key=lambda u: (best[u], u))
    total = best[u_best]
    if total == inf:  # no finite combination: everyone at option 0
        return [0] * n, sum(o[0][1] for o in options)
    picks = [0] * n
    u = u_best
    for i in range(n - 1, -1, -1):
        j = choice[i][u]
        picks[i] = options[i][j][0]
        u -= picks[i]
    return picks, total


def is_convex(opts: Sequence[tuple[int, float]]) -> bool:
    """True when options are consecutive unit steps with non-decreasing marginal cost, so taking the
    cheapest marginal step first is optimal."""
    prev_delta = -math.inf
    for (k0, c0), (k1, c1) in zip(opts, opts[1:]):
        if k1 - k0 != 1:
            return False
        d = c1 - c0
        if d < prev_delta - 1e-12:
            return False
        prev_delta = d
    return True


def greedy_split(options: Options, capacity: int) -> tuple[list[int], float]:
    """Marginal-gain allocation for convex unit-step options: O(capacity * log n)."""
    n = len(options)
    picks = [0] * n
    total = sum(opts[0][1] for opts in options)
    heap: list[tuple[float, int]] = []
    for i, opts in enumerate(options):
        if len(opts) > 1:
            heap.append((opts[1][1] - opts[0][1], i))
    heapq.heapify(heap)
    left = capacity
    while left > 0 and heap:
        delta, i = heapq.heappop(heap)
        if delta >= 0:
            break
        picks[i] += 1
        total += delta
        left -= 1
        opts = options[i]
        j = picks[i]
        if j + 1 < len(opts):
            heapq.heappush(heap, (opts[j + 1][1] - opts[j][1], i))
    return picks, total


def best_split(options: Options, capacity: int) -> tuple[list[int], float]:
    """Greedy when every candidate's options are convex, else the exact DP."""
    if len(options) == 1 and not is_convex(options[0]):
        return single_split(options[0], capacity)
    if all(is_convex(o) for o in options):
        return greedy_split(options, capacity)
    return dp_split(options, capacity)


def single_split(opts: Sequence[tuple[int, float]], capacity: int) -> tuple[list[int], float]:
    """``dp_split([opts], capacity)`` without the table: the cheapest option that fits (fewest
    extra units on a tie; option 0 when none is finite). Most rounds plan one candidate."""
    cap = max(0, capacity)
    best_k, best_c = 0, math.inf
    for k, c in opts:
        if k > cap:
            break
        if c < best_c:
            best_k, best_c = k, c
    if best_c == math.inf:
        return [0], opts[0][1]
    return [best_k], best_c


def brute_force_split(options: Options, capacity: int) -> tuple[list[int], float]:
    """Reference: try every combination (tests only; exponential)."""
    best: tuple[float, list[int]] = (math.inf, [])
    for combo in itertools.product(*options):
        if sum(k for k, _ in combo) <= capacity:
            cost = sum(c for _, c in combo)
            if cost < best[0] - 1e-12:
                best = (cost, [k for k, _ in combo])
    return best[1], best[0]
