"""Steady-state M/M/c formulas (Erlang C), the queueing model behind GPU pricing.

Pure functions over plain numbers. ``c`` identical servers, offered load ``a = lambda * T`` (in
servers' worth of work); at ``a >= c`` the queue grows without bound and every answer is ``inf``.
"""

from __future__ import annotations

import math

__all__ = ["erlang_c", "mmc_lq", "mmc_wq", "lq_slope"]


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
