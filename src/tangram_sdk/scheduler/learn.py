"""Online estimates per action kind: single-unit duration and arrival rate.

Both are exponentially weighted moving averages, so a workload that drifts (longer tests late in
training) is followed within a few dozen actions, and both are pure arithmetic on given times.
"""

from __future__ import annotations

import math
from typing import Any

__all__ = ["KindStats"]


class KindStats:
    """What the scheduler has learned about one ``kind`` of action."""

    __slots__ = ("t1", "t1_samples", "gap", "last_arrival", "arrivals", "spec")

    def __init__(self, prior_t1: float) -> None:
        self.t1 = prior_t1  # seconds at one unit of the elastic resource (or plain duration)
        self.t1_samples = 0
        self.gap = math.inf  # EWMA of inter-arrival gaps, seconds
        self.last_arrival: float | None = None
        self.arrivals = 0
        self.spec: Any = None  # the kind's latest ActionSpec: demand shape for arrival lookahead

    def observe_arrival(self, now: float, alpha: float) -> None:
        if self.last_arrival is not None:
            g = max(0.0, now - self.last_arrival)
            self.gap = g if math.isinf(self.gap) else (1 - alpha) * self.gap + alpha * g
        self.last_arrival = now
        self.arrivals += 1

    def observe_duration(self, t1: float, alpha: float) -> None:
        if not (t1 > 0 and math.isfinite(t1)):
            return
        # the first sample replaces the prior outright; later ones are averaged
        self.t1 = t1 if self.t1_samples == 0 else (1 - alpha) * self.t1 + alpha * t1
        self.t1_samples += 1

    def rate(self, now: float) -> float:
        """Arrivals per second; decays when the kind has gone quiet for longer than its usual gap."""
        if self.last_arrival is None or math.isinf(self.gap):
            return 0.0
        gap = max(self.gap, now - self.last_arrival, 1e-6)
        return 1.0 / gap
