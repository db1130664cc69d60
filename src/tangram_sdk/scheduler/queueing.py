"""Steady-state M/M/c formulas (Erlang C), the queueing model behind GPU pricing, and its
closed-population twin (the machine-repairman model) for a few callers in a loop.

Pure functions over plain numbers. ``c`` identical servers, offered load ``a = lambda * T`` (in
servers' worth of work); at ``a >= c`` the queue grows without bound and every answer is ``inf``.
"""

from __future__ import annotations

import functools
import itertools
import math

import numpy as np

__all__ = ["erlang_c", "mmc_lq", "mmc_wq", "lq_slope", "closed_wq", "closed_fcfs_act", "fcfs_states",
           "FCFS_STATES"]

# the most states closed_fcfs_act solves (sequences of up to n requests of k classes): 127 is
# six callers of two classes, 0.2 ms a solve here; eight callers are 511 states, 6 ms a solve, and
# a decision solves one per size of the node
FCFS_STATES = 130


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


def fcfs_states(n: int, k: int) -> int:
    """States of :func:`closed_fcfs_act`'s chain: sequences of up to ``n`` requests of ``k`` classes."""
    return n + 1 if k == 1 else (k ** (n + 1) - 1) // (k - 1)


@functools.lru_cache(maxsize=64)
def _fcfs_chain(n: int, cores: int, units: tuple[int, ...]) -> tuple[np.ndarray, ...]:
    """The transitions of :func:`closed_fcfs_act`'s chain, which depend on sizes only: every
    sequence of up to ``n`` requests (classes in arrival order), and per transition its source,
    target, class, and whether it is an arrival (else a completion)."""
    k = len(units)
    states: list[tuple[int, ...]] = [()]
    for length in range(1, n + 1):
        states.extend(itertools.product(range(k), repeat=length))
    index = {s: i for i, s in enumerate(states)}
    moves: list[tuple[int, int, int, bool]] = []  # (from, to, class, an arrival)
    for i, s in enumerate(states):
        if len(s) < n:
            moves.extend((i, index[s + (c,)], c, True) for c in range(k))
        used = 0
        for pos, c in enumerate(s):  # strict FCFS: the head of the line blocks the rest
            used += units[c]
            if used > cores:
                break
            moves.append((i, index[s[:pos] + s[pos + 1:]], c, False))
    src, dst, cls, arr = zip(*moves)
    lengths = np.array([len(s) for s in states], dtype=float)
    return (np.array(src), np.array(dst), np.array(cls), np.array(arr), lengths)


@functools.lru_cache(maxsize=4096)
def _fcfs_act(n: int, cores: int, z: float, classes: tuple[tuple[float, int, float], ...]) -> float:
    src, dst, cls, arr, lengths = _fcfs_chain(n, cores, tuple(u for _p, u, _t in classes))
    share = np.array([p for p, _u, _t in classes])
    mu = np.array([1.0 / t for _p, _u, t in classes])
    rate = np.where(arr, (n - lengths[src]) / z * share[cls], mu[cls])
    m = len(lengths)
    q = np.zeros((m, m))
    np.add.at(q, (src, dst), rate)
    q[np.arange(m), np.arange(m)] = -q.sum(axis=1)
    a = q.T.copy()
    a[-1, :] = 1.0  # one balance equation is redundant: replaced by "probabilities sum to 1"
    b = np.zeros(m)
    b[-1] = 1.0
    pi = np.linalg.solve(a, b)
    done = float(pi[src[~arr]] @ rate[~arr])  # throughput: the completions' flow
    return float(pi @ lengths) / done if done > 0.0 else math.inf  # Little: R = L / X


def closed_fcfs_act(n: int, cores: int, z: float, classes: tuple[tuple[float, int, float], ...]) -> float:
    """Mean seconds from request to completion in a closed pool of ``n`` callers on a node of
    ``cores``, each thinking ``z`` seconds (exponential) between requests: a request is of class
    ``(share, units, t)`` with probability ``share``, holds ``units`` cores for ``t`` seconds
    (exponential), and starts in arrival order (strict FCFS, what a fixed DoP does: a wide
    request at the head waits for the whole of its cores and everything behind it waits too).

    The exact Markov chain over the sequences of requests in the system, where
    :func:`closed_wq`'s identical servers (a mean request of fractional size) miss that blocking:
    four callers on four cores whose tests gain 3.5x on four cores, shells on one, are best served
    by a fixed DoP of 2 (1.50 s; 1.81 s at 4), which the identical-server model rates equal.
    Inputs are rounded to 1 % (in logs) so that a job's decisions share a few solves.
    ``inf`` past :data:`FCFS_STATES` states or for a class wider than the node."""
    if (n <= 0 or fcfs_states(n, len(classes)) > FCFS_STATES or z <= 0.0
            or any(u > cores or t <= 0.0 for _p, u, t in classes)):
        return math.inf

    def r(x: float) -> float:
        return math.exp(round(math.log(x) * 100.0) / 100.0)

    return _fcfs_act(n, cores, r(z), tuple((round(p, 2), u, r(t)) for p, u, t in classes))
