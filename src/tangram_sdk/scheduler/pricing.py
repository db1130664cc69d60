"""Shadow prices for elastic units: how many units an action gets is the size that minimises its
duration plus the unit-seconds it consumes at the current price, ``T(m) * (1 + mu * m)``.

Two facts make this the right lever. The best size at a price does not depend on the action's
length (both terms scale with ``T1``), only on how well it parallelises, so an unknown duration
cannot mislead it. And the price has a meaning the scheduler can measure: the ACT seconds that one
unit-second costs everyone else. The price is set so that what the waiting and soon-arriving
actions would take at that price fits what is free now plus what running actions release soon
(a clearing price); no load means price 0 (everyone gets what helps them), a flood means the
price rises until everyone gets their minimum.

Pure functions over plain numbers: tested directly and against brute force.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

__all__ = ["PRICE_GRID", "dop_at_price", "dops_over_grid"]

# Prices per unit-second, ascending. For Amdahl p the best size is sqrt(p / (mu (1 - p))), so a
# ratio of ~1.5 between steps moves the size by ~20 %: finer than any fixed-DoP choice a user makes.
PRICE_GRID: tuple[float, ...] = (0.0,) + tuple(0.0005 * 1.5 ** k for k in range(30)) + (math.inf,)


def dop_at_price(rel: Callable[[int], float], sizes: Sequence[int], mu: float) -> int:
    """The size in ``sizes`` (ascending, legal shapes) minimising ``rel(m) * (1 + mu * m)``;
    ``rel(m)`` is the duration at ``m`` relative to any fixed reference. Ties go to the smaller
    size; at price 0 so does anything within 0.5 % of the fastest: units that barely help are
    not taken even when nobody else wants them now (someone may, a moment later), and a kind
    learned to gain nothing from more units gets its minimum. ``mu = inf`` is the smallest."""
    if math.isinf(mu):
        return sizes[0]
    if mu == 0.0:
        durs = [rel(m) for m in sizes]
        limit = min(durs) * 1.005
        for m, d in zip(sizes, durs):
            if d <= limit:
                return m
    best_m = sizes[0]
    best = rel(best_m) * (1.0 + mu * best_m)
    for m in sizes[1:]:
        c = rel(m) * (1.0 + mu * m)
        if c < best * (1.0 - 1e-12):
            best, best_m = c, m
    return best_m


def dops_over_grid(rel: Callable[[int], float], sizes: Sequence[int],
                   grid: Sequence[float] = PRICE_GRID) -> tuple[int, ...]:
    """``dop_at_price`` for every price of ``grid``, made non-increasing in the price (the
    clearing search relies on demand falling as the price rises; only the price-0 tolerance can
    break that, by a size or two)."""
    out = []
    hi = len(sizes)
    for mu in grid:
        m = dop_at_price(rel, sizes[:hi], mu)
        out.append(m)
        hi = sizes.index(m) + 1  # a higher price never asks for more: search below
    return tuple(out)
