"""What one round computes once and its many plans ask again (the price grid asks every size of
every candidate): one object with one ``reset(now)`` at the round's start, instead of memo
attributes spread over the modules that fill them."""

from __future__ import annotations

import math

from .learn import KindStats

__all__ = ["RoundMemo"]


class RoundMemo:
    """Per-round answers; each is valid until the next :meth:`reset`.

    ``cold``: restore plus displacement of a new (service, size) instance. ``warm``: the soonest
    warm copy's wait and how many there are, per (service, size). ``rel``: ``T(m)/T(min)`` per
    (action id, units). ``rates`` / ``krates``: calls per second per service / per kind, keyed by
    the time they were computed at (``rates_at`` / ``krates_at``) so a second round at another
    time recomputes them even without a reset.
    """

    __slots__ = ("now", "cold", "warm", "rel", "rates", "rates_at", "krates", "krates_at")

    def __init__(self) -> None:
        self.now = 0.0
        self.cold: dict[tuple[str, int], float] = {}
        self.warm: dict[tuple[str | None, int], tuple[float, int]] = {}
        self.rel: dict[tuple[int, int], float] = {}
        self.rates: dict[str, float] | None = None
        self.rates_at = -math.inf
        self.krates: list[tuple[KindStats, float]] | None = None
        self.krates_at = -math.inf

    def reset(self, now: float) -> None:
        """A new round at ``now``: forget every answer of the last one."""
        self.now = now
        if self.cold:
            self.cold.clear()
        if self.warm:
            self.warm.clear()
        if self.rel:
            self.rel.clear()
        self.rates = None
        self.krates = None
