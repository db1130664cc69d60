"""Sizing and placement of GPU service actions, decided at admission (the ``priced`` planner).

**Width.** Every kind runs at one width (TP-1/2/4...) at a time, the same for all its calls: the
width a fixed TP-m FIFO would use, chosen per pool by load. Each candidate width is scored by an
M/G/c model of the pool in cells of that width (Allen-Cunneen, with the learned spread of call
durations) at the call rates learned per kind (smoothed over ~30 s); the cheapest predicted mean
ACT wins, among widths whose calls would wait less than half the time (Erlang C <= 0.55: with few
wide cells the pooled model misses residency and fragmentation, and a wrong guess there queues
without bound), and at which every service called now keeps a resident copy (``G // m`` aligned
cells of ``gpu_slots x m`` TP-m copies: the model sees no residency, and 9 teachers on 5 GPUs at
TP-2 thrashed a restore per call of the ninth), or, for a width of one aligned cell, at which the
GPUs beside that cell hold the coldest services at a narrower width (a *spill*: 9 teachers on 6
GPUs run 8 at TP-4 in the one cell and the ninth at TP-2 on GPUs 4-5; each service then keeps
its one width and region). The first width, before any load is measured, is
the widest leaving two cells that holds the services already resident. A new width must predict
3 % better, also at the latest rates, the last switch be ``gpu_regime_window`` seconds old, and the
saving over ``restore_horizon`` pay for restoring the copies at the new width (their restore
latency, plus the GPU-seconds they hold at twice the pool's price of a GPU-second); a wider width
must also win with each width's waits as *measured* in its earlier stints (the calls' real queue
waits against the model's, per width: the pooled model misses the residency of few wide cells);
narrowing when the width in force waits too often at the latest rates is urgent (an overload
queues within seconds) and goes to the narrower width those rates score best, and each urgent
narrowing that the smoothed rates undo raises the bar for the next one from that width.
Mixed widths at the same time were tried and lost: a TP-2 call in
a 4-GPU cell keeps a TP-4 call out of it (buddy fragmentation), and copies of every width split
memory. For 60 s after a switch the old width's copies still serve while the new ones restore.

**Placement: start, wait, or restore.** A call of service ``S`` starts on a free cell where ``S`` is
warm, waits for a busy warm copy, or restores ``S`` on a free cold cell, whichever is cheapest in
seconds of ACT, counting:

* for this call: its wait, its restore (``R/m`` for a TP-m instance) and its execution, plus the
  GPU-seconds a restore holds at the price ``mu_work = d Lq / d A`` of the pool's model (the
  waiting one more GPU-second of work costs everyone else);
* a restore as an investment, not a cost of the one call that triggers it: each service has a
  target number of copies, allocated greedily by the drop in expected per-call cost each next copy
  brings (M/G/c wait over its copies, plus the chance other services occupy them all) times its
  calls over ``restore_horizon`` seconds, while a copy is worth a restore and memory lasts; a
  service below its target is credited that value for a new copy, and its queue drains sooner
  over one more copy;
* what a restore displaces: the copies an LRU cache would evict (``gpu_slots`` models per GPU)
  each cost their service the same kind of value; a copy a service needs for its target is only
  taken by a service with no copy at all, a copy of a width no longer in use costs nothing, and a
  restore that evicts must beat the alternative by its own cost again (two services trading one
  slot back and forth pay a restore each time).

A waiting call keeps its awaited cell from everyone behind it (FCFS across widths); the next call
of its service sees that copy busy for its turn too, so the queue spreads over the free copies.

Memory follows ``gpu_instances`` (:mod:`.residency`): ``"tp"`` (a TP-k instance holds 1/k of the
weights on each of its GPUs and restores in ``R/k``: a tensor-parallel server such as
vLLM/SGLang, what the simulator models) or ``"replica"`` (the torch GPU manager: a k-GPU grant
runs data-parallel on one full copy per GPU, shared by every width; restoring takes ``R``).
"""

from __future__ import annotations

import heapq
import math
from typing import Any

from typing import NamedTuple

from ..spec import ActionSpec
from .action import Action, copy_min, dur_min, spec_dur_min
from .learn import KindStats
from .placement import Placement
from .pricing import PRICE_GRID
from .queueing import erlang_c, lq_slope, mmc_wq
from .residency import Residency

__all__ = ["GpuChoice", "GpuSizing"]

_MARKET_DT = 1.0  # seconds between market updates (rates are smooth; pricing every event costs)
_RATE_WINDOW = 30.0  # seconds over which call rates and the GPU queue are smoothed
_SWITCH = 0.03  # a width must score this much lower mean ACT to replace the one in force
_P_WAIT = 0.55  # never grow into a width whose calls would wait this often (Erlang C)
_TRANSITION = 60.0  # seconds after a switch during which the old width's copies still serve
_TRANSITION_URGENT = 0.0  # ... after an urgent narrowing: none (saturated old cells never free a
                          # GPU for the new width's copies; deepsearch's judge queued 5.9 s so)
_P_URGENT = 0.15  # the width in force waits this much more often than that: narrow at once
_START_CELLS = 2  # the first width: the widest that still leaves this many cells in the pool
_SWAP_MARGIN = 1.0  # a restore that evicts must save this many times its own cost more
_MU_MAX = PRICE_GRID[-2]  # the largest finite price (an overloaded pool still restores cold services)
_SWITCH_MU = 2.0  # a switch's restores cost their GPU-seconds at this many times the price mu_work
                  # (the cells they stop, the mixed widths meanwhile, and the likely way back;
                  # 2-5 decide alike in the heavy MOPD cells, 1 does not)
_FALSE_ALARM = 2.0  # each urgent narrowing the smoothed rates undid multiplies _P_URGENT by this
_P_URGENT_MAX = 0.95  # ... up to this chance to wait: an overload at the latest rates still narrows
_CAL_SETTLE = 10.0  # calls submitted this soon after a switch (after its transition) wait for its restores
_CAL_DECAY = 0.998  # per observed call: measured waits are remembered over ~500 calls
_CAL_PRIOR = 20.0  # calls' worth of execution seconds on both sides: few samples keep the model
_SPILL_P_WAIT = 0.3  # a spilling width's one cell must wait less often than this (latest rates)
_SPILL_P_KEEP = 0.45  # ... once in force, until it waits this often
_SPILL_SWAP = 1.5  # a service spilled swaps with one kept only when this many times busier
_OVERLOAD = 100.0  # wait, in service times per unit of excess load, of a service with too few copies


class _Svc:
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


class GpuChoice(NamedTuple):
    """:meth:`GpuSizing.choice`'s answer: ``units`` on the cell at offset ``cell``, or (``units``
    0) wait for a busy warm copy; then ``awaited`` is the mask of its GPUs, kept from everyone
    behind it, and ``wait_all`` says no free warm copy is left for the next call of the service."""

    units: int
    cell: int
    awaited: int
    wait_all: bool


class GpuSizing:
    """The GPU market: one width per kind, the copies each service should keep, and the choice of
    cell (start warm, wait for a warm copy, or restore cold) for a GPU service action at admission.

    Given at construction: the learned kinds, the residency, who holds each GPU position, the
    pool's legal cell sizes, the queue's per-service counts and the placement (restore prices);
    shared objects the core mutates, read here. Its own state: the market (rates, regime, preferred
    widths, targets), its memos, and the cells tentatively taken in the current round (cleared by
    :meth:`begin_round`)."""

    __slots__ = ("_kinds", "_resident", "_gpu_holder", "_cells", "_svc_queued", "_place", "gpu_slots",
                 "default_duration", "restore_horizon", "gpu_instances", "regime_window", "_gpu_mkt",
                 "_gpu_tent", "_gpu_tent_end", "_gpu_cells", "_gpu_rates", "_gpu_regime", "_gpu_switched_at",
                 "_gpu_transition", "_gpu_cv_f", "_gpu_cost_memo", "_gpu_loss_memo", "_gpu_pref",
                 "_gpu_prev_pref", "_gpu_false_alarms", "_gpu_left_urgently",
                 "_gpu_wq_obs", "_gpu_wq_f", "_gpu_pred_wq", "_gpu_drained_at", "_gpu_spill_plan",
                 "_gpu_spill", "_gpu_spill_mask")

    @staticmethod
    def check_options(restore_horizon: float, gpu_instances: str, regime_window: float) -> None:
        if gpu_instances not in ("tp", "replica"):
            raise ValueError(f"gpu_instances must be 'tp' or 'replica', got {gpu_instances!r}")
        if not (restore_horizon >= 0 and regime_window >= 0):
            raise ValueError("restore_horizon and gpu_regime_window must be >= 0")

    def __init__(self, kinds: dict[str, KindStats], resident: Residency, gpu_holder: list[Action | None],
                 cells: tuple[int, ...], svc_queued: dict[str, int], place: Placement, *,
                 gpu_slots: float | None, default_duration: float, restore_horizon: float, gpu_instances: str,
                 regime_window: float) -> None:
        self.check_options(restore_horizon, gpu_instances, regime_window)
        self._kinds = kinds
        self._resident = resident
        self._gpu_holder = gpu_holder
        self._cells = cells
        self._svc_queued = svc_queued
        self._place = place
        self.gpu_slots = gpu_slots
        self.default_duration = default_duration
        self.restore_horizon = restore_horizon
        self.gpu_instances = gpu_instances
        self.regime_window = regime_window
        self._gpu_mkt: Any = None
        self._gpu_wq_obs: dict[int, tuple[float, float]] = {}  # width -> decayed (measured, predicted) waits
        self._gpu_wq_f: dict[int, float] = {}  # width -> measured / predicted wait, with the prior
        self._gpu_pred_wq = 0.0  # the model's wait at the width in force, at the last market
        self._gpu_drained_at = -math.inf  # when the last call queued before the last switch was granted
        self._gpu_false_alarms: dict[int, int] = {}
        self._gpu_left_urgently = 0
        self._gpu_tent: dict[str, list[tuple[int, ...]]] = {}
        self._gpu_tent_end: dict[int, float] = {}
        self._gpu_cells: dict[Any, Any] = {}
        self._gpu_rates: dict[str, Any] = {}
        self._gpu_regime = 1 << 30  # chosen at the first look (initial_gpu_width)
        self._gpu_switched_at = -math.inf
        self._gpu_transition = _TRANSITION
        self._gpu_cv_f = 1.0
        self._gpu_cost_memo: dict[Any, Any] = {}
        self._gpu_loss_memo: dict[Any, float] = {}
        self._gpu_pref: dict[ActionSpec, int] = {}
        self._gpu_prev_pref: dict[ActionSpec, int] = {}
        # width -> (narrower width, services served at it on the GPUs no aligned cell of the width
        # covers): a width whose cells cannot hold every service called now spills the coldest
        self._gpu_spill_plan: dict[int, tuple[int, frozenset[str]]] = {}
        self._gpu_spill: tuple[int, frozenset[str]] | None = None  # the plan of the width in force
        self._gpu_spill_mask = 0  # ... its GPUs

    def begin_round(self) -> None:
        """A round's admission starts: forget the cells earlier rounds took tentatively."""
        if self._gpu_tent_end:
            self._gpu_tent_end.clear()
            self._gpu_tent.clear()

    # -- sizes ----------------------------------------------------------------------------------
    def _gpu_sizes(self, spec: ActionSpec) -> tuple[int, ...]:
        lo = spec.gpus
        hi = spec.max_units if spec.elastic_resource == "gpu" else lo
        if spec.service is not None and self.gpu_slots is not None:  # a copy must fit its GPUs
            lo = copy_min(lo, hi, self._cells, self.gpu_slots, self.gpu_instances == "replica") or lo
        return tuple(c for c in self._cells if lo <= c <= hi) or (lo,)

    def initial_gpu_width(self, spec: ActionSpec, services: int = 1) -> int:
        """The width the core grants ``spec`` before it has measured any load: the widest legal
        one leaving ``_START_CELLS`` cells in the pool at which ``services`` copies stay resident
        (a warm start restores copies at it)."""
        sizes = self._gpu_sizes(spec)
        if spec.elastic_resource != "gpu":
            return spec.gpus
        G = max(1, len(self._gpu_holder))
        unbounded = self.gpu_slots is None  # no memory model: every width holds every copy
        return max((m for m in sizes if G // m >= _START_CELLS and (
            unbounded or self._copies_fit(m, G) >= services)), default=sizes[0])

    # -- the market ---------------------------------------------------------------------------
    def _gpu_market(self, now: float) -> tuple[float, dict[str, _Svc], float, float]:
        """``(mu, services, pool load, mu_work)``, recomputed every ``_MARKET_DT`` seconds or when
        a new kind appears (rates are smooth; a market per event would dominate the round)."""
        memo = self._gpu_mkt
        if memo is not None and now - memo[0] < _MARKET_DT and now >= memo[0] and memo[1] == len(self._kinds):
            return memo[2]  # type: ignore[no-any-return]
        G = max(1, len(self._gpu_holder))
        kinds = []  # (rate, spec, {size: seconds}, service info)
        fast = []  # the same at the latest rates: a load rising is believed at once
        svcs: dict[str, _Svc] = {}
        rates = self._gpu_rates
        for name, st in self._kinds.items():
            spec = st.spec
            if spec is None or not spec.gpus:
                continue
            # arrivals per second smoothed over ~_RATE_WINDOW s: a 32-arrival window swings by
            # a factor of two, and copies and sizes must not follow that
            r = rates.get(name)
            if r is None or r[3] is not st:
                lam = st.window_rate(now)
            else:
                t0, n0, lam0, _st = r
                dt = now - t0
                lam = lam0 if dt <= 0 else lam0 + (1.0 - math.exp(-dt / _RATE_WINDOW)) * (
                    (st.arrivals - n0) / dt - lam0)
            rates[name] = (now, st.arrivals, lam, st)
            d0 = spec_dur_min(spec, st, self.default_duration)
            svc = spec.service
            info = None
            if svc is not None:
                info = svcs.get(svc)
                if info is None:
                    info = svcs[svc] = _Svc(lam, spec, d0, st)
                else:
                    if lam > info.lam:  # the busiest kind speaks for the service's durations
                        info.spec, info.d0, info.stats = spec, d0, st
                    info.lam += lam
                info.calls += st.arrivals
            sizes = self._gpu_sizes(spec)
            ts = {m: d0 * (st.rel(spec, m) if spec.elastic_resource == "gpu" else 1.0) for m in sizes}
            kinds.append((lam, spec, ts, info))
            fast.append((max(lam, st.window_rate(now)), spec, ts, info))
        m_cur = self._gpu_regime
        widths = sorted({m for _l, _s, ts, _i in kinds for m in ts}) or [1]
        # a width is a candidate only if every service called now keeps a resident copy at it
        # (the queueing model below sees no residency): without this 5 GPUs and 9 teachers went
        # TP-2, where 8 copies fit, and the ninth restored on every call (2.2 s mean ACT vs TP-1's
        # 0.63). A width of one cell may instead spill the coldest services onto the GPUs beside
        # it (:meth:`_spill_plans`: 6 GPUs at batch 512, where fifo4's thrash beat TP-2 by 6 %)
        if self.gpu_slots is not None:
            active = sum(1 for info in svcs.values() if info.lam > 0)
            if m_cur == 1 << 30:  # the first look: the services already resident count too
                active = max(active, len(self._resident.by_service))
            fit = [m for m in widths if self._copies_fit(m, G) >= active]
            # ... or, with one cell, if the GPUs left beside it hold the rest at a narrower width
            self._gpu_spill_plan = plans = self._spill_plans(widths, fit, svcs, active, G, kinds, fast)
            fit = sorted(set(fit) | set(plans))
            if not fit:  # no width holds them all (thrash at any width): the widths keeping the
                # most copies, where the model's faster restores and calls decide (6 GPUs holding
                # one model each for 9 teachers: TP-2 keeps as many copies as TP-1, restores in R/2)
                most = max(self._copies_fit(m, G) for m in widths)
                fit = [m for m in widths if self._copies_fit(m, G) >= most]
            widths = fit
        # Allen-Cunneen: an M/G/c waits (1 + CV^2)/2 times an M/M/c; the spread of call durations
        # is learned (log-normal residual variance per kind)
        lam_sum = sum(k[0] for k in kinds)
        cv_f = 1.0
        if lam_sum > 0:
            cv2 = sum(k[0] * (math.exp(min(k[1] is not None and self._kinds[k[1].kind].log_var or 0.0, 4.0)) - 1.0)
                      for k in kinds) / lam_sum
            cv_f = (1.0 + cv2) / 2.0
        self._gpu_cv_f = cv_f
        # candidates: one width for every kind (as a TP-m FIFO would run it), scored by the
        # model's mean ACT; a width whose calls would wait more often than _P_WAIT is not grown
        # into (the pooled model misses the residency and cell fragmentation of few wide cells,
        # and there a wrong guess queues without bound: 8 GPUs at TP-4 measured 13-30x its wait)
        scores = {}
        for m in widths:
            ex, wq, pw = self._predict(kinds, m, G, cv_f)
            scores[m] = (ex + wq, pw)
        if m_cur == 1 << 30:  # the first look: the widest width leaving _START_CELLS cells
            two = [m for m in widths if G // m >= _START_CELLS]
            m_cur = self._gpu_regime = max(two) if two else widths[0]
            self._gpu_switched_at = now
        cur = scores.get(m_cur)
        ok = [m for m in widths if scores[m][1] <= _P_WAIT or m == widths[0]]
        best_m = min(ok, key=lambda m: (scores[m][0], -m))
        pick = m_cur
        urgent = False
        if cur is not None and m_cur > widths[0]:
            pw_fast = self._predict(fast, m_cur, G, cv_f)[2]
        if cur is None or (m_cur > widths[0] and max(cur[1], pw_fast) > min(_P_URGENT_MAX, _P_WAIT + _P_URGENT * (
                _FALSE_ALARM ** self._gpu_false_alarms.get(m_cur, 0)))):
            # narrowing is urgent (an overload queues in seconds), judged at the latest rates
            nar = [m for m in widths if m < m_cur and (m == widths[0] or self._predict(
                fast, m, G, cv_f)[2] <= _P_WAIT)]
            # to the narrower width the latest rates score best (not merely the next one down:
            # a second urgent step would restore every copy twice)
            pick = best_m if cur is None else min(nar, default=widths[0], key=lambda m: (
                sum(self._predict(fast, m, G, cv_f)[:2]), -m))
            urgent = cur is not None
        elif (best_m != m_cur and now - self._gpu_switched_at >= self.regime_window
              and scores[best_m][0] < cur[0] * (1.0 - _SWITCH)):
            # at the latest rates too (a rising load must not be met by growing wider)
            ex_f, wq_f, pw_f = self._predict(fast, best_m, G, cv_f)
            if best_m > m_cur and self._gpu_wq_f:
                # growing must also win with each width's waits as measured in its past stints
                # (the pooled model misses the residency of few wide cells: 2 TP-4 cells of 8
                # GPUs waited ~3x its prediction at batch 4096, TP-2 ~2x; growing on the model
                # alone traded TP-2 and TP-4 every minute there, 1.15x fifo2's mean ACT)
                f = self._gpu_wq_f
                eb, wb, _p = self._predict(kinds, best_m, G, cv_f)
                ec, wc, _p = self._predict(kinds, m_cur, G, cv_f)
                if eb + wb * f.get(best_m, 1.0) >= (ec + wc * f.get(m_cur, 1.0)) * (1.0 - _SWITCH):
                    pw_f = math.inf  # not grown into
            if best_m < m_cur or (pw_f <= _P_WAIT and ex_f + wq_f < sum(
                    self._predict(fast, m_cur, G, cv_f)[:2]) * (1.0 - _SWITCH)):
                pick = best_m
        if pick != m_cur and cur is not None and not urgent:
            # a switch restores copies at the new width (the calls that meet them cold wait for
            # them): worth it only if the predicted saving over restore_horizon pays for that
            fast_new = sum(self._predict(fast, pick, G, cv_f)[:2])
            fast_cur = sum(self._predict(fast, m_cur, G, cv_f)[:2])
            gain = (min(cur[0], fast_cur) if math.isfinite(fast_cur) else fast_cur) - min(scores[pick][0], fast_new)
            cost = 0.0
            mu_prev = memo[2][3] if memo is not None else 0.0  # the price at the width in force
            for name, info in svcs.items():
                if info.lam > 0:
                    n = max(1, len(self._resident.warm_cells(name, info.pref)))
                    r_s = self._place.restore_cost(name)
                    cost += n * (self.restore_lat(r_s, pick) + _SWITCH_MU * mu_prev * self._restore_gpu_s(r_s, pick))
            if math.isfinite(gain) and gain * lam_sum * max(self.restore_horizon, self.regime_window, 1.0) < cost:
                pick = m_cur
        if pick != m_cur:
            if (not urgent and pick > m_cur and self._gpu_left_urgently == pick
                    and now - self._gpu_switched_at <= 2.0 * max(self.regime_window, 1.0)):
                # back to a width left urgently, at the smoothed rates: the alarm was false, and
                # the next one from this width needs a higher chance to wait (10 GPUs at batch
                # 3072 left TP-4 three times for 60-180 s, restoring every teacher each way)
                self._gpu_false_alarms[pick] = self._gpu_false_alarms.get(pick, 0) + 1
            self._gpu_left_urgently = m_cur if urgent else 0
            self._gpu_switched_at = now
            self._gpu_transition = _TRANSITION_URGENT if urgent else _TRANSITION
            self._gpu_regime = pick
            self._gpu_prev_pref = dict(self._gpu_pref)
        if not math.isfinite(self._gpu_switched_at):
            self._gpu_switched_at = now
        self._gpu_pred_wq = self._predict(kinds, pick, G, cv_f)[1]
        for mm, (o, p) in self._gpu_wq_obs.items():
            prior = _CAL_PRIOR * (self._predict(kinds, mm, G, cv_f)[0] or 1.0)
            self._gpu_wq_f[mm] = (o + prior) / (p + prior)
        total = W = 0.0
        pref: dict[ActionSpec, int] = {}
        plan = self._gpu_spill = self._gpu_spill_plan.get(pick)
        self._gpu_spill_mask = 0 if plan is None else ((1 << G) - 1) & ~((1 << pick) - 1)  # beside the cell
        for lam, spec, ts, info in kinds:
            top = plan[0] if plan is not None and spec.service in plan[1] else pick
            m = max((x for x in ts if x <= top), default=min(ts))
            pref[spec] = m
            x = lam * m * ts[m]
            total += x
            W += lam * ts[m]
            if info is not None:
                info.load += x
                if info.spec is spec:
                    info.pref = m
        # what a GPU-second of restoring costs the others: the slope of the model's queue
        if total > 0:
            mbar = total / W
            mu_work = min(_MU_MAX, lq_slope(max(1, int(G / mbar)), total / mbar) / mbar)
        else:
            mu_work = 0.0
        mu = 0.0  # one width per kind: execution is not traded against GPU-seconds here
        out = (mu, svcs, total, mu_work)
        self._gpu_mkt = (now, len(self._kinds), out)
        self._gpu_cost_memo.clear()
        self._gpu_loss_memo.clear()
        self._gpu_pref = pref
        self._gpu_targets(svcs, mu, mu_work, total)
        return out

    def _spill_plans(self, widths: list[int], fit: list[int], svcs: dict[str, _Svc], active: int,
                     G: int, kinds: list[Any], fast: list[Any]) -> dict[int, tuple[int, frozenset[str]]]:
        """Width -> (narrower width, the services spilled to it) for each width of one aligned cell
        that cannot hold a copy of every service called now, where the GPUs beside that cell can
        hold the rest at the narrower width. 9 teachers on 6 GPUs: the one TP-4 cell holds 8
        copies; fifo4 thrashes the ninth through it (a restore every ~18 calls) and TP-2, where all
        9 fit, runs every call slower. Spilling the coldest to TP-2 on GPUs 4-5 keeps TP-4's speed
        for the rest with no thrash.

        * One cell only: there every service kept has its copy in the one cell, the single queue
          the model scores. Two TP-2 cells of 5 GPUs, one copy a teacher, are two queues: scored
          as one, the spill lost 4-8 % to TP-1.
        * Only while that cell waits less than ``_SPILL_P_WAIT`` of the time at the latest rates
          (``_SPILL_P_KEEP`` once in force). A single cell under a rising load is the first to
          queue, and without the plan the width is not a candidate any more, which narrows it
          with the old copies serving. Seed 2 of 6 GPUs at batch 2048 otherwise rode TP-4 into
          the peak and narrowed urgently: 1.034x fifo2.
        * The coldest by calls ever (a rank that noise does not flip) are spilled, and the set is
          sticky. A 30 s rate reshuffled the four coldest teachers and restored them ~30 times
          each.
        * Only services whose every kind is elastic down to the narrower width: a kind whose
          smallest size exceeds the GPUs beside the cell would wait there for ever (the
          property test ``tests/test_scheduler_props.py::GpuMachine`` found one)."""
        out: dict[int, tuple[int, frozenset[str]]] = {}
        low: dict[str, int] = {}  # service -> the smallest size all its kinds can run at
        for _lam, spec, ts, _info in kinds:
            if spec.service is not None:
                lo = min(ts) if spec.elastic_resource == "gpu" else 1 << 30
                low[spec.service] = max(low.get(spec.service, 0), lo)
        ranked = sorted((info.calls, name) for name, info in svcs.items() if info.lam > 0)
        for m in widths:
            left = G - m
            if m in fit or G // m != 1 or left <= 0:
                continue
            n_spill = active - int(self._copies_fit(m, G) + 1e-9)
            if n_spill <= 0:
                continue
            m2 = max((x for x in widths if x < m and x <= left and self._copies_fit(x, left) >= n_spill),
                     default=0)
            if not m2:
                continue
            able = [(c, name) for c, name in ranked if low.get(name, 1 << 30) <= m2]
            if n_spill > len(able):
                continue
            cold = [name for _c, name in able[:n_spill]]
            prev = self._gpu_spill_plan.get(m)
            if prev is not None and len(prev[1]) == n_spill and all(
                    n in svcs and svcs[n].lam > 0 for n in prev[1]):
                kept = [svcs[name].calls for _c, name in able if name not in prev[1]]
                if all(n in low and low[n] <= m2 for n in prev[1]) and (
                        not kept or max(svcs[n].calls for n in prev[1]) <= _SPILL_SWAP * min(kept)):
                    cold = sorted(prev[1])
            gate = _SPILL_P_KEEP if m == self._gpu_regime and self._gpu_spill is not None else _SPILL_P_WAIT
            if self._regime_predict([k for k in fast if k[1].service not in cold], m, m, 1.0)[2] > gate:
                continue
            out[m] = (m2, frozenset(cold))
        return out

    def _predict(self, kinds: list[Any], m: int, G: int, cv_f: float) -> tuple[float, float, float]:
        """:meth:`_regime_predict` at width ``m``, split as its spill plan says: the main cells
        and the leftover GPUs are two pools, each with its own services."""
        plan = self._gpu_spill_plan.get(m)
        if plan is None:
            return self._regime_predict(kinds, m, G, cv_f)
        m2, cold = plan
        main = m  # one cell
        k1 = [k for k in kinds if k[1].service not in cold]
        k2 = [k for k in kinds if k[1].service in cold]
        e1, w1, p1 = self._regime_predict(k1, m, main, cv_f)
        e2, w2, p2 = self._regime_predict(k2, m2, G - main, cv_f)
        l1 = sum(k[0] for k in k1)
        l2 = sum(k[0] for k in k2)
        if l1 + l2 <= 0:
            return 0.0, 0.0, 0.0
        f1, f2 = l1 / (l1 + l2), l2 / (l1 + l2)
        return e1 * f1 + e2 * f2, w1 * f1 + w2 * f2, max(p1, p2)

    def _regime_predict(self, kinds: list[Any], m: int, G: int, cv_f: float) -> tuple[float, float, float]:
        """Mean execution, mean wait and the chance to wait if every kind ran at width ``m`` (its widest
        legal size not above it): an M/G/c model of the pool in cells of the mean width."""
        A = W = L = 0.0
        for lam, _spec, ts, _i in kinds:
            k = max((x for x in ts if x <= m), default=min(ts))
            t = ts[k]
            A += lam * k * t
            W += lam * t
            L += lam
        if A <= 0 or L <= 0:
            return 0.0, 0.0, 0.0
        mbar = A / W
        c = max(1, int(G / mbar))
        a = A / mbar
        return W / L, cv_f * mmc_wq(c, a, W / L), erlang_c(c, a)

    def observe_wait(self, submitted: float, now: float) -> None:
        """A call of an elastic GPU kind submitted at ``submitted`` is granted ``now``: its wait,
        beside the one the model predicted for the width in force, calibrates that width for
        growing into it again. Calls submitted during a switch's transition (the old width's
        copies still serving beside the new ones) or _CAL_SETTLE s after it, or before the last call
        queued ahead of the switch was granted, wait for the switch's restores, the mixed widths and
        the old width's backlog, not for the model, and are not counted."""
        if submitted < self._gpu_switched_at:  # queued before the switch: its backlog drains still
            self._gpu_drained_at = now
            return
        if (submitted - self._gpu_switched_at < self._gpu_transition + _CAL_SETTLE
                or submitted < self._gpu_drained_at):
            return
        m = self._gpu_regime
        o, p = self._gpu_wq_obs.get(m, (0.0, 0.0))
        self._gpu_wq_obs[m] = (o * _CAL_DECAY + (now - submitted), p * _CAL_DECAY + self._gpu_pred_wq)

    def _copies_fit(self, m: int, G: int) -> float:
        """Copies at width ``m`` the pool's memory holds in aligned cells (``gpu_slots`` x m TP-m
        copies a cell, ``gpu_slots`` under 'replica')."""
        slots = float(self.gpu_slots or 1.0)
        return (G // m) * slots * (m if self.gpu_instances == "tp" else 1)

    def _gpu_targets(self, svcs: dict[str, _Svc], mu: float, mu_w: float, load: float) -> None:
        """How many copies at its preferred size each service should keep: one each, then the
        next copy to whichever service it helps most (greedy on convex M/M/c waits: the exact
        staffing optimum), while it is worth a restore and memory lasts. Stable while rates are,
        so a full pool does not trade copies back and forth on noise."""
        G = max(1, len(self._gpu_holder))
        slots = self.gpu_slots if self.gpu_slots is not None else 1.0
        budget = G * slots  # models' worth of memory (a TP-k copy is one model spread over k)
        H = self.restore_horizon
        heap: list[tuple[float, str]] = []
        for name, info in svcs.items():
            info.target = 0
            if info.lam <= 0:
                continue
            mem = 1.0 if self.gpu_instances == "tp" else float(info.pref)
            info.target = 1
            budget -= mem
            heap.append((-self._copy_gain(info, 1, mu, load, G, H), name))
        heapq.heapify(heap)
        while heap and budget > 1e-9:
            g, name = heapq.heappop(heap)
            info = svcs[name]
            r = self._place.restore_cost(name)
            m = info.pref
            mem = 1.0 if self.gpu_instances == "tp" else float(m)
            if -g < self.restore_lat(r, m) + mu_w * self._restore_gpu_s(r, m):
                continue  # not worth a restore; others may still be
            if mem > budget + 1e-9 or info.target >= G // m:
                continue
            info.target += 1
            budget -= mem
            heapq.heappush(heap, (-self._copy_gain(info, info.target, mu, load, G, H), name))

    def _copy_gain(self, info: _Svc, n: int, mu: float, load: float, G: int, H: float) -> float:
        """Seconds of ACT a service's (n+1)-th copy at its preferred size saves over the horizon."""
        rho_o = min(0.99, max(0.0, (load - info.load) / G))
        m = info.pref
        return H * info.lam * (self._svc_cost(info, [m] * n, mu, rho_o) - self._svc_cost(info, [m] * (n + 1), mu, rho_o))

    def _svc_cost(self, info: _Svc, sizes: list[int], mu: float, rho_o: float) -> float:
        """Expected seconds per call of a service with warm instances of ``sizes``: the best
        one's execution (priced), an M/M/c wait over them, and the chance all are occupied by
        other services' calls (each then waits about one service time)."""
        if not sizes:
            return math.inf
        key = (id(info), tuple(sorted(sizes)), mu, rho_o)
        memo = self._gpu_cost_memo
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
        wq = mmc_wq(n, a, tb) * self._gpu_cv_f
        if math.isinf(wq):
            wq = _OVERLOAD * tb * (a / n)
        out = best + wq + (rho_o ** n) * tb
        memo[key] = (info, out)
        return out

    def _victim_loss(self, key: tuple[str, tuple[int, ...]], svcs: dict[str, _Svc], mu: float,
                     mu_w: float, rho: float, forced: bool) -> float:
        """ACT seconds that evicting instance ``key`` costs its service: the calls over the
        horizon and the queue it has now lose a copy. ``forced``: the evicter has no warm copy at
        all (it must restore somewhere)."""
        other = key[0]
        waiting = self._svc_queued.get(other, 0)
        mkey = (key, waiting, forced, self._resident.version)
        memo = self._gpu_loss_memo
        hit = memo.get(mkey)
        if hit is not None:
            return hit
        if len(memo) > 8192:
            memo.clear()
        out = memo[mkey] = self._victim_loss_of(key, svcs, mu, mu_w, rho, forced, waiting)
        return out

    def _victim_loss_of(self, key: tuple[str, tuple[int, ...]], svcs: dict[str, _Svc], mu: float,
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
        calls = info.lam * self.restore_horizon
        if len(have) <= lost:
            # its last copy: its next call restores (its waiters wait for that too)
            return ((min(1.0, calls) + waiting) * self.restore_lat(r_other, info.pref)
                    + mu_w * self._restore_gpu_s(r_other, info.pref))
        rest = have[lost:]
        rho_o = min(0.99, max(0.0, rho - info.load / max(1, len(self._gpu_holder))))
        t = info.t(info.pref)
        return (calls * (self._svc_cost(info, rest, mu, rho_o) - self._svc_cost(info, have, mu, rho_o))
                + waiting * t * (1.0 / len(rest) - 1.0 / len(have)))

    def restore_lat(self, r: float, k: int) -> float:
        """Seconds a k-GPU restore takes: TP instances load 1/k per GPU in parallel; replicas a
        full copy per GPU, also in parallel."""
        return r / k if self.gpu_instances == "tp" else r

    def _restore_gpu_s(self, r: float, k: int) -> float:
        return r if self.gpu_instances == "tp" else r * k

    def _cells_by_use(self, m: int, need: float) -> list[tuple[int, bool]]:
        """Aligned ``m``-GPU cells, fullest first, each with whether an instance needing ``need``
        models' worth per GPU fits without evicting (memoised until the instances change)."""
        res = self._resident
        key = (m, need)
        memo = self._gpu_cells
        if memo.get("v") != res.version:
            memo.clear()
            memo["v"] = res.version
        hit = memo.get(key)
        if hit is None:
            use = res.use_at
            slots = self.gpu_slots
            G = len(self._gpu_holder)
            rows = []
            for o in range(0, G - m + 1, m):
                u = use[o:o + m]
                room = (all(x + need <= slots + 1e-9 for x in u) if slots is not None
                        else not any(x > 1e-9 for x in u))
                rows.append((-sum(u), o, room))
            rows.sort()
            hit = memo[key] = [(o, room) for _u, o, room in rows]
        return hit

    # -- the decision ---------------------------------------------------------------------------
    def _avail(self, pos: tuple[int, ...], now: float) -> float:
        """Seconds until every GPU of ``pos`` is free (running holders by their estimate; one
        that overran is assumed half done; cells taken earlier in this round by their plan)."""
        wait = 0.0
        tent = self._gpu_tent_end
        for p in pos:
            h = self._gpu_holder[p]
            if h is not None:
                rem = h.est_end - now
                if rem <= 0:
                    rem = 0.5 * (now - h.started)
            else:
                rem = tent.get(p, now) - now
            if rem > wait:
                wait = rem
        return wait

    def choice(self, a: Action, gfree: int, now: float) -> GpuChoice:
        """Units and cell offset for GPU service action ``a`` on the free mask ``gfree``, or (units
        0) wait, when waiting for a busy warm instance is cheapest (see :class:`GpuChoice`)."""
        spec = a.spec
        svc = spec.service
        mu, svcs, load, mu_w = self._gpu_market(now)
        sizes = self._gpu_sizes(spec)
        pk = self._gpu_pref.get(spec) if a.eres == "gpu" else None
        if pk is not None and pk in sizes:
            # exactly the size the regime says: a TP-2 call inside a 4-GPU cell keeps the cell
            # from a TP-4 call (the buddy-fragmentation of mixed sizes cost more than any
            # opportunistic use of a free copy of another size gained)
            sizes = (pk,)
        use_sizes = sizes
        prev = self._gpu_prev_pref.get(spec) if a.eres == "gpu" else None
        if prev is not None and prev != pk and now - self._gpu_switched_at < self._gpu_transition:
            # just after a switch the old width's copies still serve, while the new ones restore
            use_sizes = sizes + (prev,)
        info = svcs.get(svc) if svc is not None else None
        if info is None:
            info = _Svc(0.0, spec, dur_min(a), a.stats)
        d0 = dur_min(a)
        elastic = a.eres == "gpu"
        G = max(1, len(self._gpu_holder))
        rho = min(0.99, load / G)
        rho_o = min(0.99, max(0.0, (load - info.load) / G))
        behind = max(0, self._svc_queued.get(svc, 0) - 1) if svc is not None else 0
        weight = self.restore_horizon * info.lam if svc is not None else 0.0
        res = self._resident
        warm: set[tuple[int, ...]] = set()
        for k in use_sizes:
            warm |= res.warm_cells(svc, k)
        plan = self._gpu_spill
        if plan is not None and elastic:
            # a spilled service runs on the leftover GPUs only, the others only off them
            lm = self._gpu_spill_mask
            region = lm if svc in plan[1] else ~lm
            gfree &= region
            warm = {pos for pos in warm if all((region >> q) & 1 for q in pos)}
        tent = self._gpu_tent.get(svc, ()) if svc is not None else ()
        have = [len(p) for p in warm] + [len(p) for p in tent]
        have = [x for x in have if x in sizes]  # copies of other sizes are of no use to it

        def t_of(k: int) -> float:
            return d0 * a.stats.rel(spec, k) if elastic else d0

        # What a new copy is worth (a restore is an investment, not a cost of the one action
        # that triggers it): the calls over the horizon, if the service is below its target
        # copies (else others need the memory more), plus the queue behind ``a``, which drains
        # over one more copy (about t/n - t/(n+1) sooner each)
        pref = info.pref if svc is not None else sizes[0]
        below = svc is not None and have.count(pref) < info.target
        t_q = t_of(pref if pref in sizes else sizes[0])

        def credit(m: int) -> float:
            if not have:
                return 0.0
            c = behind * t_q * (1.0 / len(have) - 1.0 / (len(have) + 1))
            if below:
                c += weight * (self._svc_cost(info, have, mu, rho_o) - self._svc_cost(info, have + [m], mu, rho_o))
            return c

        best = math.inf
        choice: tuple[int, int] | None = None
        awaited = 0
        free_warm = False
        for pos in warm:
            k = len(pos)
            if k not in use_sizes:
                continue
            o = pos[0]
            full = ((1 << k) - 1) << o
            t = t_of(k)
            c = t * (1.0 + mu * k)
            if gfree & full == full:
                free_warm = True
                if c < best - 1e-12 or (c <= best + 1e-12 and (choice is None or o < choice[1])):
                    best, choice = c, (k, o)  # a tie goes to the lowest cell: deterministic
            else:
                c += self._avail(pos, now)
                if c < best - 1e-12:
                    best, choice, awaited = c, None, full
        r = self._place.restore_cost(svc)
        slots = self.gpu_slots
        warm_off: dict[int, set[int]] = {}
        for pos in warm:
            warm_off.setdefault(len(pos), set()).add(pos[0])
        # new instances only at the size the price prefers for this kind (what the fixed TP-m*
        # policy would hold): mixed sizes fragment memory into copies nobody uses
        for m in sizes:
            full = (1 << m) - 1
            t = t_of(m)
            fixed = self.restore_lat(r, m) + t * (1.0 + mu * m) + mu_w * self._restore_gpu_s(r, m)
            cr = credit(m)
            if fixed - cr >= best:
                continue
            need = 1.0 / m if self.gpu_instances == "tp" else 1.0
            # a free cell with room evicts nothing: take the best fit of those (keeps empty GPUs
            # for wide instances); else price the evictions of every free cold cell
            cells = []
            roomy = -1
            for o, room in self._cells_by_use(m, need):
                if (gfree >> o) & full != full or (m in warm_off and o in warm_off[m]):
                    continue
                if room or svc is None:
                    roomy = o
                    break
                cells.append(o)
            if roomy >= 0:
                c = fixed - cr
                if c < best - 1e-12:
                    best, choice = c, (m, roomy)
                continue
            if not cells:
                continue
            cell_best = math.inf
            cell_o = -1
            for o in cells:
                pos = tuple(range(o, o + m))
                if slots is None:
                    victims = sorted(res.inst_at_cell(pos), key=lambda k: (res.last_used[k], k))
                else:
                    victims = res.victims(pos, slots, need, svc)
                loss = 0.0
                for v in victims:
                    if v[0] == svc:
                        continue
                    loss += self._victim_loss(v, svcs, mu, mu_w, rho, not have)
                    if loss >= cell_best:
                        break
                if loss >= cell_best:
                    continue
                c = loss - cr
                if c < cell_best - 1e-12:
                    cell_best, cell_o = c, o
            if cell_o >= 0 and have:
                # a swap (evict a copy to scale out) must win clearly: learned rates are noisy, and
                # two services trading one slot back and forth pay a restore each time
                cell_best += _SWAP_MARGIN * fixed
            if cell_o >= 0 and fixed + cell_best < best - 1e-12:
                best, choice = fixed + cell_best, (m, cell_o)
        # waiting: the awaited instance's GPUs are kept from everyone behind (FCFS: a TP-4 waiter
        # is not starved by TP-1 grants taking its cell one GPU at a time)
        if choice is None and awaited:
            # the next waiter of this service sees the awaited copy busy for this one's turn too
            end = now + self._avail(tuple(i for i in range(G) if awaited >> i & 1), now) + t_of(
                awaited.bit_count())
            for i in range(G):
                if awaited >> i & 1:
                    self._gpu_tent_end[i] = end
        if choice is None:  # wait_all False: a free warm copy is left for the ones behind
            return GpuChoice(0, -1, awaited, not free_warm)
        return GpuChoice(choice[0], choice[1], 0, not free_warm)

    def reserve(self, a: Action, units: int, cell: int, now: float) -> None:
        """Note a GPU grant decided earlier in this round, for the later candidates' choices: when
        its cells free up, and a new instance if it restores."""
        pos = tuple(range(cell, cell + units))
        t = dur_min(a) * (a.stats.rel(a.spec, units) if a.eres == "gpu" else 1.0)
        svc = a.spec.service
        if svc is not None and (svc, pos) not in self._resident:
            t += self.restore_lat(self._place.restore_cost(svc), units)
            self._gpu_tent.setdefault(svc, []).append(pos)
        end = now + t
        for p in pos:
            self._gpu_tent_end[p] = end
