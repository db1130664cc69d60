"""What a GPU width would cost: the queueing model that scores each candidate width.

Kept apart from the switch rules (:mod:`.gpu_regime`) because it only predicts: given the call
rates per kind, each width is scored by an M/G/c model of the pool in cells of that width
(Allen-Cunneen, with the learned spread of call durations), or, for a width that spills
(:mod:`.gpu_spill`), its aligned cells and the GPUs beside them as two pools. The pooled model
misses the residency and fragmentation of few wide cells, so each width's calls' measured waits,
set against the model's, calibrate it for growing into it again. Restore latencies and
GPU-seconds per width (``gpu_instances``) and the copies a width's cells hold live here too.
"""

from __future__ import annotations

import math
from typing import Any

from ..spec import ActionSpec
from .learn import KindStats
from .placement import Placement
from .queueing import erlang_c, mmc_wq

__all__ = ["Service", "WidthModel", "pool_load", "size_at"]

_CAL_SETTLE = 10.0  # calls submitted this soon after a switch (after its transition) wait for its restores
_CAL_DECAY = 0.998  # per observed call: measured waits are remembered over ~500 calls
_CAL_PRIOR = 20.0  # calls' worth of execution seconds on both sides: few samples keep the model


def size_at(ts: dict[int, float], m: int) -> int:
    """The size a kind with durations ``ts`` (per size) runs at under width ``m``: its widest legal
    size not above ``m``, or its smallest when every size is wider."""
    return max((x for x in ts if x <= m), default=min(ts))


def pool_load(kinds: list[Any], m: int) -> tuple[float, float, float]:
    """What ``kinds`` ``(rate, spec, {size: seconds}, service)`` ask of the pool if every kind ran
    at width ``m``: GPU-seconds, execution seconds and calls, per second."""
    A = W = L = 0.0
    for lam, _spec, ts, _i in kinds:
        k = size_at(ts, m)
        t = ts[k]
        A += lam * k * t
        W += lam * t
        L += lam
    return A, W, L


class Service:
    """One GPU service as the market sees it: learned call rate, duration model, the instance
    size the price prefers for it, and how many such copies it should keep (``target``)."""

    __slots__ = ("lam", "spec", "d0", "stats", "load", "pref", "target", "calls")

    def __init__(self, lam: float, spec: ActionSpec, d0: float, stats: Any) -> None:
        self.lam = lam
        self.spec = spec
        self.d0 = d0
        self.stats = stats
        self.load = 0.0  # GPU-seconds per second at the market's sizes
        self.pref = spec.gpus
        self.target = 0
        self.calls = 0  # arrivals ever, over its kinds: a popularity rank that noise does not flip

    def t(self, k: int) -> float:
        spec = self.spec
        if spec.elastic_resource != "gpu":
            return self.d0
        return self.d0 * float(self.stats.rel(spec, k))


class WidthModel:
    """Predicted mean execution, mean wait and chance to wait per width, the measured / modelled
    wait ratio per width (``wq_f``), and what copies and restores cost at a width. ``spill_plan``
    (width -> (narrower width, services spilled to it)) is set by the regime each market.

    The one owner of ``gpu_slots`` (models a GPU's memory holds; None: no memory model) and
    ``gpu_instances`` ('tp' or 'replica'): the regime, :class:`.CopyValue` and :class:`.GpuSizing`
    read them here."""

    __slots__ = ("_kinds", "_place", "gpu_slots", "gpu_instances", "spill_plan", "_wq_obs", "wq_f",
                 "_pred_wq", "_drained_at")

    def __init__(self, kinds: dict[str, KindStats], place: Placement, gpu_slots: float | None,
                 gpu_instances: str) -> None:
        self._kinds = kinds
        self._place = place
        self.gpu_slots = gpu_slots
        self.gpu_instances = gpu_instances
        # width -> (narrower width, services served at it on the GPUs no aligned cell of the width
        # covers): a width whose cells cannot hold every service called now spills the coldest
        self.spill_plan: dict[int, tuple[int, frozenset[str]]] = {}
        self._wq_obs: dict[int, tuple[float, float]] = {}  # width -> decayed (measured, predicted) waits
        self.wq_f: dict[int, float] = {}  # width -> measured / predicted wait, with the prior
        self._pred_wq = 0.0  # the model's wait at the width in force, at the last market
        self._drained_at = -math.inf  # when the last call queued before the last switch was granted

    # -- the prediction -------------------------------------------------------------------------
    def predict(self, kinds: list[Any], m: int, G: int, cv_f: float) -> tuple[float, float, float]:
        """:meth:`pooled_predict` at width ``m``, split as its spill plan says: the main cells
        and the leftover GPUs are two pools, each with its own services."""
        plan = self.spill_plan.get(m)
        if plan is None:
            return self.pooled_predict(kinds, m, G, cv_f)
        m2, cold = plan
        n = G // m  # the aligned cells
        k1 = [k for k in kinds if k[1].service not in cold]
        k2 = [k for k in kinds if k[1].service in cold]
        e1, w1, p1 = self.cells_predict(k1, m, n, cv_f)
        e2, w2, p2 = self.pooled_predict(k2, m2, G - n * m, cv_f)
        l1 = sum(k[0] for k in k1)
        l2 = sum(k[0] for k in k2)
        if l1 + l2 <= 0:
            return 0.0, 0.0, 0.0
        f1, f2 = l1 / (l1 + l2), l2 / (l1 + l2)
        return e1 * f1 + e2 * f2, w1 * f1 + w2 * f2, max(p1, p2)

    def cells_predict(self, kinds: list[Any], m: int, n: int, cv_f: float) -> tuple[float, float, float]:
        """The ``n`` aligned cells of width ``m`` beside a spill: one queue if ``n`` is 1, else a
        queue per cell. There every service kept has room for one copy, so each service's calls
        wait for its own cell only: its services split by load (longest first, to the least busy
        cell), each cell an M/G/1. Pooled as one M/G/n, two TP-2 cells of 5 GPUs looked far
        better than they ran (a spill there lost 4-8 % to TP-1)."""
        if n <= 1:
            return self.pooled_predict(kinds, m, m, cv_f)
        groups: dict[str, list[Any]] = {}
        for k in kinds:
            groups.setdefault(k[1].service if k[1].service is not None else k[1].kind, []).append(k)
        busy = [0.0] * n
        split: list[list[Any]] = [[] for _ in range(n)]

        def work(ks: list[Any]) -> float:
            return float(sum(lam * ts[size_at(ts, m)] for lam, _s, ts, _i in ks))

        for w, key in sorted(((work(ks), key) for key, ks in groups.items()), reverse=True):
            i = min(range(n), key=lambda j: (busy[j], j))
            busy[i] += w
            split[i].extend(groups[key])
        E = Wq = P = L = 0.0
        for ks in split:
            e, w, p = self.pooled_predict(ks, m, m, cv_f)
            lam = sum(k[0] for k in ks)
            E += e * lam
            Wq += w * lam
            L += lam
            P = max(P, p)
        if L <= 0:
            return 0.0, 0.0, 0.0
        return E / L, Wq / L, P

    @staticmethod
    def pooled_predict(kinds: list[Any], m: int, G: int, cv_f: float) -> tuple[float, float, float]:
        """Mean execution, mean wait and the chance to wait if every kind ran at width ``m`` (its widest
        legal size not above it): an M/G/c model of the pool in cells of the mean width."""
        A, W, L = pool_load(kinds, m)
        if A <= 0 or L <= 0:
            return 0.0, 0.0, 0.0
        mbar = A / W
        c = max(1, int(G / mbar))
        a = A / mbar
        return W / L, cv_f * mmc_wq(c, a, W / L), erlang_c(c, a)

    def cv_factor(self, kinds: list[Any]) -> float:
        """Allen-Cunneen: an M/G/c waits (1 + CV^2)/2 times an M/M/c; the spread of call durations
        is learned (log-normal residual variance per kind)."""
        lam_sum = sum(k[0] for k in kinds)
        cv_f = 1.0
        if lam_sum > 0:
            cv2 = sum(k[0] * (math.exp(min(k[1] is not None and self._kinds[k[1].kind].log_var or 0.0, 4.0))
                              - 1.0)
                      for k in kinds) / lam_sum
            cv_f = (1.0 + cv2) / 2.0
        return cv_f

    # -- measured waits -------------------------------------------------------------------------
    def measured(self, kinds: list[Any], m: int, G: int, cv_f: float) -> float:
        """The model's mean ACT at width ``m`` with its wait scaled by the width's measured /
        modelled ratio (:meth:`calibrate`; 1 for a width never measured)."""
        ex, wq, _p = self.predict(kinds, m, G, cv_f)
        return ex + wq * self.wq_f.get(m, 1.0)

    def calibrate(self, kinds: list[Any], pick: int, G: int, cv_f: float) -> None:
        """The model's wait at the width in force (what the next calls' measured waits are set
        against), and every measured width's measured / predicted ratio, with the prior."""
        self._pred_wq = self.predict(kinds, pick, G, cv_f)[1]
        for mm, (o, p) in self._wq_obs.items():
            prior = _CAL_PRIOR * (self.predict(kinds, mm, G, cv_f)[0] or 1.0)
            self.wq_f[mm] = (o + prior) / (p + prior)

    def observe_wait(self, submitted: float, now: float, width: int, switched_at: float,
                     transition: float) -> None:
        """A call at width ``width`` (in force since ``switched_at``) submitted at ``submitted`` is
        granted ``now``: its wait, beside the one the model predicted for that width, calibrates it
        for growing into it again. Calls submitted during a switch's ``transition`` (the old width's
        copies still serving beside the new ones) or _CAL_SETTLE s after it, or before the last call
        queued ahead of the switch was granted, wait for the switch's restores, the mixed widths and
        the old width's backlog, not for the model, and are not counted."""
        if submitted < switched_at:  # queued before the switch: its backlog drains still
            self._drained_at = now
            return
        if (submitted - switched_at < transition + _CAL_SETTLE
                or submitted < self._drained_at or not math.isfinite(self._pred_wq)):
            return  # (an infinite prediction, the width held past its capacity, calibrates nothing)
        o, p = self._wq_obs.get(width, (0.0, 0.0))
        self._wq_obs[width] = (o * _CAL_DECAY + (now - submitted), p * _CAL_DECAY + self._pred_wq)

    # -- copies and restores --------------------------------------------------------------------
    def copies_fit(self, m: int, G: int) -> float:
        """Copies at width ``m`` the pool's memory holds in aligned cells (``gpu_slots`` x m TP-m
        copies a cell, ``gpu_slots`` under 'replica')."""
        slots = float(self.gpu_slots or 1.0)
        return (G // m) * slots * (m if self.gpu_instances == "tp" else 1)

    def restore_lat(self, r: float, k: int) -> float:
        """Seconds a k-GPU restore takes: TP instances load 1/k per GPU in parallel; replicas a
        full copy per GPU, also in parallel."""
        return r / k if self.gpu_instances == "tp" else r

    def restore_gpu_s(self, r: float, k: int) -> float:
        return r if self.gpu_instances == "tp" else r * k

    def restore_rounds(self, called: list[str], m: int, cells: int) -> float:
        """Seconds to restore a TP-``m`` copy of every service in ``called`` over ``cells`` cells
        of width ``m``, in parallel across the cells (rounds of the slowest restore)."""
        return math.ceil(len(called) / max(1, cells)) * max(
            self.restore_lat(self._place.restore_cost(n), m) for n in called)
