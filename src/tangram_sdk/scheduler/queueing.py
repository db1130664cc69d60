"""Steady-state M/M/c formulas (Erlang C), the queueing model behind GPU pricing, and its
closed-population twin (the machine-repairman model) for a few callers in a loop.

Pure functions over plain numbers. ``c`` identical servers, offered load ``a = lambda * T`` (in
servers' worth of work); at ``a >= c`` the queue grows without bound and every answer is ``inf``.
"""

from __future__ import annotations

import math

__all__ = ["erlang_c", "mmc_lq", "mmc_wq", "lq_slope", "closed_wq"]


def erlang_c(c: int, a: float) -> float:
    """Probability that an arrival waits (Erlang C), via the stable Erlang B recursion."""
    if a <= 0:
        return 0.0
    if c < 1 or a >= c:
        return 1.0
    b = 1.0
    for k in range(1, c + 1):
        b = a * b / (k + a * b)
    return c * b / (c - a * (1.0 - b))


def mmc_lq(c: int, a: float) -> float:
    """Mean number waiting (= waiting seconds accrued per second)."""
    if a <= 0:
        return 0.0
    if c < 1 or a >= c:
        return math.inf
    return erlang_c(c, a) * a / (c - a)


def mmc_wq(c: int, a: float, t: float) -> float:
    """Mean wait of one arrival, service time ``t``."""
    if a <= 0:
        return 0.0
    if c < 1 or a >= c:
        return math.inf
    return erlang_c(c, a) * t / (c - a)


def lq_slope(c: int, a: float) -> float:
    """``d Lq / d a``: the waiting seconds one more server-second of work costs everyone else."""
    if c < 1 or a >= c:
        return math.inf
    h = max(1e-6, 1e-3 * (c - a))
    return (mmc_lq(c, a + h) - mmc_lq(c, max(0.0, a - h))) / (a + h - max(0.0, a - h))


def closed_wq(n: int, c: float, t: float, z: float) -> float:
    """Mean wait of one request in a closed pool: ``n`` callers, each thinking ``z`` seconds
    between requests of ``t`` seconds on ``c`` servers (M/M/c//n, the machine-repairman model).
    ``c`` may be fractional (servers of a mean request's size on a pool of mixed sizes): ``k``
    requests in service progress at ``min(k, c) / t``. A few callers in a loop wait far less than
    an open stream of the same rate would (no caller queues behind itself), and the open formula
    sized their tiny pools as if they did. O(n): states 0..n, in logs (n of hundreds overflows)."""
    if n <= 0 or t <= 0.0:
        return 0.0
    logs = [0.0]
    lp = 0.0
    for k in range(1, n + 1):
        lp += math.log((n - k + 1) * t / (z * min(k, c)))
        logs.append(lp)
    top = max(logs)
    p = [math.exp(x - top) for x in logs]
    in_system = sum(k * q for k, q in enumerate(p))
    served = sum(min(k, c) * q for k, q in enumerate(p)) / t  # throughput x sum(p)
    return max(in_system / served - t, 0.0)
