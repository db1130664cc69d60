"""The call rates the GPU width market is priced at: per GPU kind, smoothed and the latest.

Kept apart from the switch rules (:mod:`.gpu_regime`) because it only learns what is asked, not
what to do about it: each market turns every GPU kind's arrivals into a rate smoothed over
``RATE_WINDOW`` seconds (a 32-arrival window swings by a factor of two, and copies and sizes must
not follow that) and the latest rate beside it (a load rising is believed at once), with the
kind's durations at each of its sizes, and gathers the kinds by the service they call
(:class:`.Service`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

from ..spec import ActionSpec
from .action import spec_dur_min
from .gpu_model import Service
from .learn import KindStats

__all__ = ["RATE_WINDOW", "CallRates"]

RATE_WINDOW = 30.0  # seconds over which call rates are smoothed


class CallRates:
    """The smoothed call rate of every GPU kind, carried from market to market: ``(when,
    arrivals then, rate, stats)`` per kind, started afresh when the kind's stats change."""

    __slots__ = ("_kinds", "_rates", "default_duration", "latest_call")

    def __init__(self, kinds: dict[str, KindStats], default_duration: float) -> None:
        self._kinds = kinds
        self.default_duration = default_duration
        self._rates: dict[str, Any] = {}
        self.latest_call = 0.0  # the latest arrival of any GPU kind, as of the last demand()

    def demand(self, now: float, sizes: Callable[[ActionSpec], tuple[int, ...]]
               ) -> tuple[list[Any], list[Any], dict[str, Service]]:
        """Per GPU kind ``(rate, spec, {size: seconds}, service)`` at the smoothed rates and at the
        latest ones (a load rising is believed at once), and the services they call; ``sizes``
        gives a spec's legal sizes (:meth:`.GpuRegime.sizes`)."""
        kinds = []  # (rate, spec, {size: seconds}, service info)
        fast = []
        svcs: dict[str, Service] = {}
        rates = self._rates
        latest = 0.0
        for name, st in self._kinds.items():
            spec = st.spec
            if spec is None or not spec.gpus:
                continue
            latest = max(latest, st.last_arrival or 0.0)
            # arrivals per second smoothed over ~RATE_WINDOW s: a 32-arrival window swings by
            # a factor of two, and copies and sizes must not follow that
            r = rates.get(name)
            if r is None or r[3] is not st:
                lam = st.window_rate(now)
            else:
                t0, n0, lam0, _st = r
                dt = now - t0
                lam = lam0 if dt <= 0 else lam0 + (1.0 - math.exp(-dt / RATE_WINDOW)) * (
                    (st.arrivals - n0) / dt - lam0)
            rates[name] = (now, st.arrivals, lam, st)
            d0 = spec_dur_min(spec, st, self.default_duration)
            svc = spec.service
            info = None
            if svc is not None:
                info = svcs.get(svc)
                if info is None:
                    info = svcs[svc] = Service(lam, spec, d0, st)
                else:
                    if lam > info.lam:  # the busiest kind speaks for the service's durations
                        info.spec, info.d0, info.stats = spec, d0, st
                    info.lam += lam
                info.calls += st.arrivals
            ts = {m: d0 * (st.rel(spec, m) if spec.elastic_resource == "gpu" else 1.0) for m in sizes(spec)}
            kinds.append((lam, spec, ts, info))
            fast.append((max(lam, st.window_rate(now)), spec, ts, info))
        self.latest_call = latest
        return kinds, fast, svcs
