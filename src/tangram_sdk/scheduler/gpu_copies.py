"""What a copy of a GPU service is worth: how many copies each service should keep, what a call
pays per call at a given set of copies, and what evicting one costs its service.

A restore is an investment, not a cost of the one call that triggers it: each service has a target
number of copies, allocated greedily by the drop in expected per-call cost each next copy brings
(M/G/c wait over its copies, plus the chance other services occupy them all) times its calls over
``restore_horizon`` seconds, while a copy is worth a restore and memory lasts. What a restore
displaces (the copies an LRU cache would evict, ``gpu_slots`` models per GPU) costs each victim's
service the same kind of value; a copy a service needs for its target is only taken by a service
with no copy at all, and a copy of a width no longer in use costs nothing.

Kept apart from the width (:mod:`.gpu_regime`, :mod:`.gpu_model`) and the placement
(:mod:`.gpu_sizing`) because it is a pure value model: recomputed when the market is, memoised
until then.
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from .action import Action
from .gpu_model import Service
from .gpu_regime import GpuRegime
from .placement import Placement
from .queueing import mmc_wq
from .residency import Residency

__all__ = ["CopyValue"]

_OVERLOAD = 100.0  # wait, in service times per unit of excess load, of a service with too few copies


class CopyValue:
    """Copy targets per service and the value of copies, read by the placement. The targets live
    on the services of the market in force (``Service.target``); the memos until the next one."""

    __slots__ = ("_regime", "_resident", "_gpu_holder", "_svc_queued", "_place", "_cost_memo", "_loss_memo")

    def __init__(self, regime: GpuRegime, resident: Residency, gpu_holder: list[Action | None],
                 svc_queued: dict[str, int], place: Placement) -> None:
        self._regime = regime
        self._resident = resident
        self._gpu_holder = gpu_holder
        self._svc_queued = svc_queued
        self._place = place
        self._cost_memo: dict[Any, Any] = {}
        self._loss_memo: dict[Any, float] = {}

    def refresh(self, svcs: dict[str, Service], mu: float, mu_w: float, load: float) -> None:
        """A new market: forget the memos and set every service's target copies."""
        self._cost_memo.clear()
        self._loss_memo.clear()
        self._targets(svcs, mu, mu_w, load)

    def _targets(self, svcs: dict[str, Service], mu: float, mu_w: float, load: float) -> None:
        """How many copies at its preferred size each service should keep: one each, then the
        next copy to whichever service it helps most (greedy on convex M/M/c waits: the exact
        staffing optimum), while it is worth a restore and memory lasts. Stable while rates are,
        so a full pool does not trade copies back and forth on noise."""
        G = max(1, len(self._gpu_holder))
        slots = self._regime.model.gpu_slots if self._regime.model.gpu_slots is not None else 1.0
        budget = G * slots  # models' worth of memory (a TP-k copy is one model spread over k)
        H = self._regime.restore_horizon
        heap: list[tuple[float, str]] = []
        for name, info in svcs.items():
            info.target = 0
            if info.lam <= 0:
                continue
            mem = 1.0 if self._regime.model.gpu_instances == "tp" else float(info.pref)
            info.target = 1
            budget -= mem
            heap.append((-self._copy_gain(info, 1, mu, load, G, H), name))
        heapq.heapify(heap)
        while heap and budget > 1e-9:
            g, name = heapq.heappop(heap)
            info = svcs[name]
            r = self._place.restore_cost(name)
            m = info.pref
            mem = 1.0 if self._regime.model.gpu_instances == "tp" else float(m)
            if -g < self._regime.model.restore_lat(r, m) + mu_w * self._regime.model.restore_gpu_s(r, m):
                continue  # not worth a restore; others may still be
            if mem > budget + 1e-9 or info.target >= G // m:
                continue
            info.target += 1
            budget -= mem
            heapq.heappush(heap, (-self._copy_gain(info, info.target, mu, load, G, H), name))
        if self._regime.eager:
            # prepared for an opening ramp (:meth:`.GpuRegime._prepares`): a copy on every cell
            # the pool's memory holds, shared evenly, before the calls that will need them
            active = [info for info in svcs.values() if info.lam > 0]
            for info in active:
                m = info.pref
                fair = int(self._regime.model.copies_fit(m, G) / len(active) + 1e-9)
                info.target = max(info.target, min(G // m, fair))

    def _copy_gain(self, info: Service, n: int, mu: float, load: float, G: int, H: float) -> float:
        """Seconds of ACT a service's (n+1)-th copy at its preferred size saves over the horizon."""
        rho_o = min(0.99, max(0.0, (load - info.load) / G))
        m = info.pref
        return H * info.lam * (self.cost(info, [m] * n, mu, rho_o)
                               - self.cost(info, [m] * (n + 1), mu, rho_o))

    def cost(self, info: Service, sizes: list[int], mu: float, rho_o: float) -> float:
        """Expected seconds per call of a service with warm instances of ``sizes``: the best
        one's execution (priced), an M/M/c wait over them, and the chance all are occupied by
        other services' calls (each then waits about one service time)."""
        if not sizes:
            return math.inf
        key = (id(info), tuple(sorted(sizes)), mu, rho_o)
        memo = self._cost_memo
        hit = memo.get(key)
        if hit is not None and hit[0] is info:
            return hit[1]  # type: ignore[no-any-return]
        if len(memo) > 8192:
            memo.clear()
        best = math.inf
        tb = 0.0
        for k in set(sizes):
            t = info.t(k)
            c = t * (1.0 + mu * k)
            if c < best:
                best, tb = c, t
        n = len(sizes)
        a = info.lam * tb
        wq = mmc_wq(n, a, tb) * self._regime.cv_f
        if math.isinf(wq):
            wq = _OVERLOAD * tb * (a / n)
        out = best + wq + (rho_o ** n) * tb
        memo[key] = (info, out)
        return out

    def victim_loss(self, key: tuple[str, tuple[int, ...]], svcs: dict[str, Service], mu: float,
                     mu_w: float, rho: float, forced: bool) -> float:
        """ACT seconds that evicting instance ``key`` costs its service: the calls over the
        horizon and the queue it has now lose a copy. ``forced``: the evicter has no warm copy at
        all (it must restore somewhere)."""
        other = key[0]
        waiting = self._svc_queued.get(other, 0)
        mkey = (key, waiting, forced, self._resident.version)
        memo = self._loss_memo
        hit = memo.get(mkey)
        if hit is not None:
            return hit
        if len(memo) > 8192:
            memo.clear()
        out = memo[mkey] = self._victim_loss_of(key, svcs, mu, mu_w, rho, forced, waiting)
        return out

    def _victim_loss_of(self, key: tuple[str, tuple[int, ...]], svcs: dict[str, Service], mu: float,
                        mu_w: float, rho: float, forced: bool, waiting: int) -> float:
        other = key[0]
        info = svcs.get(other)
        if info is None or (info.lam <= 0 and not waiting):
            return 0.0
        k = len(key[1])
        res = self._resident
        if res.replica:  # a per-GPU copy: losing it loses every cell of the service's width on it
            k = info.pref
            cells = res.warm_cells(other, k)
            have = [k] * len(cells)
            lost = sum(1 for c in cells if key[1][0] in c)
        else:
            if info.spec.elastic_resource == "gpu" and k != info.pref:
                return 0.0  # a copy of a size its calls no longer take: only memory
            have = [len(p) for p in res.cells_of(other) if len(p) == k]
            lost = 1
        if k == info.pref and len(have) <= info.target and not forced:
            return math.inf  # a copy its service needs: only one without any copy may take it
        r_other = self._place.restore_cost(other)
        calls = info.lam * self._regime.restore_horizon
        if len(have) <= lost:
            # its last copy: its next call restores (its waiters wait for that too)
            return ((min(1.0, calls) + waiting) * self._regime.model.restore_lat(r_other, info.pref)
                    + mu_w * self._regime.model.restore_gpu_s(r_other, info.pref))
        rest = have[lost:]
        rho_o = min(0.99, max(0.0, rho - info.load / max(1, len(self._gpu_holder))))
        t = info.t(info.pref)
        return (calls * (self.cost(info, rest, mu, rho_o) - self.cost(info, have, mu, rho_o))
                + waiting * t * (1.0 / len(rest) - 1.0 / len(have)))
