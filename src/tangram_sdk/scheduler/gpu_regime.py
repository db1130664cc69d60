"""The GPU width market: which width (TP-1/2/4...) every elastic GPU kind runs at now, and when
that may change.

Every kind runs at one width at a time, the same for all its calls: the width a fixed TP-m FIFO
would use, chosen per pool by load. Each candidate width is scored by the queueing model
(:mod:`.gpu_model`) at the call rates learned per kind (:mod:`.gpu_rates`, smoothed over ~30 s);
the cheapest predicted mean ACT wins, among widths whose calls would wait less than half the time
(Erlang C <= 0.55: with few wide cells the pooled model misses residency and fragmentation, and a
wrong guess there queues without bound; a width *wider* than the one in force only at <= 0.35, see
below), and at which every service called now keeps a resident copy
(``G // m`` aligned cells of ``gpu_slots x m`` TP-m copies: the model sees no residency, and 9
teachers on 5 GPUs at TP-2 thrashed a restore per call of the ninth), or which spills the coldest
services onto the GPUs beside its cells at a narrower width (:mod:`.gpu_spill`). The first width,
before any load is measured, is the widest leaving two cells that holds the services already
resident.

A new width must predict 3 % better, also at the latest rates, the last switch be
``gpu_regime_window`` seconds old, and the saving over ``restore_horizon`` pay for restoring the
copies at the new width (their restore latency, plus the GPU-seconds they hold at twice the pool's
price of a GPU-second); a wider width must also win with each width's waits as *measured* in its
earlier stints (the calls' real queue waits against the model's, per width: the pooled model
misses the residency of few wide cells). Narrowing when the width in force waits too often at the
latest rates is urgent (an overload queues within seconds) and goes to the narrower width those
rates score best (while they ramp, those rates 1.5x over: a load still rising would need a second
narrowing, every copy restored twice: deepsearch's saturated judge 1.073 -> 1.044x isolated), and
each urgent narrowing that the smoothed rates undo (within two regime windows, or at any age
when the narrow width's calls waited more against the model than the wide one's: heavy-calls MOPD
seed 1, 1.050 -> 1.032x fifo2) raises the bar for the next one from that width; one that only
the latest rates call for, without a ramp, waits for a backlog as large as its own restores would
cause (a clump of arrivals is not an overload), and is not heeded within 10 s of the last staged
narrowing (below: its copies are still restoring). Any narrowing but a ramp's or an overrun's
must also win at the latest rates two standard errors lower (near a width's capacity the
modelled wait is so steep that a 30 s count's noise reads as an overload: heavy-calls MOPD seed 1
went TP-2 -> TP-1 and back twice, 1.032 -> 1.010x fifo2). For 60 s after a planned switch the old
width's copies still serve while the new ones restore. A *staged* narrowing, an urgent one or one
taken while calls wait per cell, hands the old width's cells over one at a time instead
(:func:`.gpu_handover.plan_stages`): the cells not yet handed over serve at the old width and
nowhere else, the new width restores on the others, so the pool never stops for a restore
(deepsearch's judge burst: 1.020-1.023x fifo2 with every cell handed over at once, 1.013-1.017x
so).

Two rules read the queue, which the rates miss in a closed loop (stop 37): a width never grows
while a call waits per cell (rates *fall* behind a backlog: the calls' trajectories are blocked),
and calls piling up at the first width, chosen before any load was measured, are an overload
whatever the rates say (they lag the opening ramp by ~30 s). The second only for the first width:
for every width it narrowed on clumps in the heavy 8/10-GPU MOPD cells (up to 1.28x fifo2). Such an
overrun hands every cell over at once (the pool is not yet saturated, and on the saturated
deepsearch judge, 3 GPU-s calls on 8 GPUs, a TP-4 cell kept serving at 69 % of TP-1's throughput
for 6 s while the queue grew: seed 0 1.049 -> 1.042x isolated's mean ACT; MOPD unchanged).

One rule reads the opening ramp of a load that has just appeared (the latest rates 2.5x the smoothed
ones, the first width still the guess): once those rates would keep the narrowest width 15 % busy,
the pool goes to it at once and restores a copy on every cell while it is still idle (each call
below that target restores on a free cold cell rather than take a free warm copy), not in the
overload the ramp is heading for (:meth:`GpuRegime._prepares`). The guessed first width is also
scored with its calls' measured waits (against the model's, as a width is before it is grown into)
for a planned narrowing: heavy 8-GPU MOPD's TP-4, two cells, waited 2-4x the model as the step's
load rose and narrowed only at the peak, urgently, every teacher restored in the overload. And a
planned widening whose width the latest rates would no longer grow into is called off before its
transition ends, while no copy at its width is restored yet (:meth:`GpuRegime._called_off`).

A load that returns after a lull (``_LULL`` seconds between GPU calls, the pool idle: the next RL
step, after the trainer's update) is met at the narrowest width the last busy period ran
saturated at (a call queued per cell in half its markets: a width it *needed*), once its latest
rates would keep the narrowest width ``_RECALL_LOAD`` busy, with the copies restored on the still
nearly idle pool before its calls need them (:meth:`GpuRegime._recalled`). A step's tail thins and
the pool widens (deepsearch's saturated judge ends a step at TP-8); the next step's burst then
narrowed urgently with every TP-1 copy restored in the overload: 1.04-1.36x isolated's step-2
mean ACT at batch 512 (whose servers stay loaded), 1.000-1.003x recalled. With no saturated width
to recall, the opening rules apply again, as at the first look (the default judge at batch 2048,
seed 0: step 2 1.021 -> 1.010x fifo2; recalling its unsaturated TP-1 instead cost 1-4 % in
lighter cells). Nor does the pool widen for ``RATE_WINDOW`` seconds after a lull: the rates
decayed over it read ~0, and a step that ended at TP-1 opened the next at TP-4, to narrow back 8 s
on.

Growing has its own, lower bar: a width wider than the one in force is a candidate only while its
calls would wait at most ``_P_GROW`` (0.35) of the time at the smoothed rates, staying in one needs
0.55. At the mean rate the wider width is often best by the model, but a rate peak ~1.5x the mean
(one every minute or so in a 30 s count) then puts it past capacity, and the urgent narrowing back
restores every copy in that overload. Deepsearch's 3 GPU-s judge at batch 256 (seed 1) went TP-1 ->
TP-4 at Erlang C 0.40 and back to TP-1 urgently 80 s later, its calls queueing 2.3-2.6 s across the
switch, where TP-2 (0.12) holds through the peaks: 1.064 -> 1.025x fifo2 with
:mod:`.gpu_sizing`'s sunk first copy for one service (stop 45). The band between the two bars is
hysteresis: a width grown into at 0.35 is not left until 0.55.

Mixed widths at the same time were tried and lost: a TP-2 call in a 4-GPU cell keeps a TP-4 call
out of it (buddy fragmentation), and copies of every width split memory.

Sans-IO and deterministic like the rest of the core: :class:`.GpuSizing` asks :meth:`GpuRegime.market`
at most once a ``_MARKET_DT``, and reads the width, the preferred size per spec, the transition and
the spill plan from it when it places a call.
"""

from __future__ import annotations

import math
from typing import Any

from ..errors import SpecError
from ..spec import ActionSpec
from .action import Action, copy_min
from .gpu_handover import NO_STAGES, Stages, legacy_at, plan_stages
from .gpu_model import Service, WidthModel, pool_load, size_at
from .gpu_rates import RATE_WINDOW, CallRates
from .gpu_spill import spill_plans
from .learn import KindStats
from .placement import Placement
from .pricing import PRICE_GRID
from .queueing import lq_slope
from .residency import Residency

__all__ = ["GpuRegime", "Service"]

_MARKET_DT = 1.0  # seconds between market updates (rates are smooth; pricing every event costs)
_SWITCH = 0.03  # a width must score this much lower mean ACT to replace the one in force
_P_WAIT = 0.55  # never pick a width whose calls would wait this often (Erlang C) ...
_P_GROW = 0.35  # ... and never grow into one whose calls would wait this often (rate peaks: see above)
_TRANSITION = 60.0  # seconds after a switch during which the old width's copies still serve
_TRANSITION_STAGED = 0.0  # ... after a staged narrowing (urgent, or under a backlog): none anywhere
                          # (saturated old cells never free a GPU for the new width's copies;
                          # deepsearch's judge queued 5.9 s so), only on the cells not yet handed
                          # over (``legacy``, :mod:`.gpu_handover`)
_P_URGENT = 0.15  # the width in force waits this much more often than that: narrow at once
_QUEUE_GATE = 1.0  # ... when only the latest rates say so, once this many times the calls the
                   # switch's restores would hold up are queued (:meth:`GpuRegime._backlog_confirms`)
_OVERRUN = 4  # calls queued per cell of the first (guessed) width that read as an overload
_RAMP = 1.5  # ... or at once, when the latest rates exceed the smoothed ones this many times
_CAL_NARROW = True  # the first width, a guess, narrows (planned) on the waits its calls measured,
                    # as a width is grown into: heavy 8-GPU MOPD s2 1.021 -> 0.982x fifo2
_ROBUST = 2.0  # a narrowing must also win at the latest rates this many standard errors lower
_AHEAD = 1.5  # ... and then narrows to a width chosen at the latest rates this many times over
_URGENT_HOLD = 10.0  # ... but not within this many seconds of the last staged narrowing
_RAMP_OVER = 1.3  # ... a ramp skips that gate only if the latest rates overload the width this much
_PREP = 0.15  # the opening ramp: while the first width is a guess and the latest rates ramp, once they would
              # keep the narrowest width this busy, narrow to it at once and restore its copies then,
              # before the overload (:meth:`GpuRegime._prepares`)
_PREP_RAMP = 2.5  # ... the latest rates this many times the smoothed ones: a load that has just appeared
_CALL_OFF = True  # a planned widening the latest rates no longer support is called off
                  # (:meth:`GpuRegime._called_off`)
_START_CELLS = 2  # the first width: the widest that still leaves this many cells in the pool
_LULL = 60.0  # seconds without a GPU call, the pool idle, after which the load's return is recalled
_RECALL_LOAD = 0.03  # ... once its latest rates keep the narrowest width this busy (not one straggler)
_REOPEN = True  # ... and with no width to recall, the opening rules apply again (a new opening)
_RECALL_BACKLOG = 0.5  # ... at the narrowest width that queued a call per cell in this share of its markets
_MU_MAX = PRICE_GRID[-2]  # the largest finite price (an overloaded pool still restores cold services)
_SWITCH_MU = 2.0  # a switch's restores cost their GPU-seconds at this many times the price mu_work
                  # (the cells they stop, the mixed widths meanwhile, and the likely way back;
                  # 2-5 decide alike in the heavy MOPD cells, 1 does not)
_FALSE_ALARM = 2.0  # each urgent narrowing the smoothed rates undid multiplies _P_URGENT by this
_P_URGENT_MAX = 0.95  # ... up to this chance to wait: an overload at the latest rates still narrows
_FALSE_ALARM_MEASURED = True  # an urgent narrowing undone at any age counts as a false alarm too
                              # if its width waited more, against the model, than the one it left


class GpuRegime:
    """The width in force and the rules that change it: the spill plan per width, false alarms
    and hand-over stages; the call rates are learned by :class:`.CallRates`, and what each width
    would cost is asked of :attr:`model` (:class:`.WidthModel`, which also keeps the measured
    waits per width).

    Read by the placement (:class:`.GpuSizing`): ``width``, ``pref`` (the size each spec takes now)
    and, during a switch's ``transition``, ``prev_pref``; after a ``staged`` narrowing, ``legacy``
    (the old width's GPUs still serving, :mod:`.gpu_handover`); ``spill`` and ``spill_mask`` (which
    services run beside the cells, and on which GPUs); ``cv_f`` (the Allen-Cunneen factor)."""

    __slots__ = ("_kinds", "_resident", "_gpu_holder", "_cells", "_place", "restore_horizon",
                 "regime_window", "_mkt", "_rates", "width",
                 "switched_at", "transition", "cv_f", "pref", "prev_pref", "_false_alarms",
                 "_left_urgently", "model", "spill",
                 "spill_mask", "_svc_queued", "staged", "legacy", "_stage", "guessed", "eager", "_from",
                 "_backlog_at", "_recall", "_last_call", "_hold")

    @staticmethod
    def check_options(restore_horizon: float, gpu_instances: str, regime_window: float) -> None:
        if gpu_instances not in ("tp", "replica"):
            raise SpecError(f"gpu_instances must be 'tp' or 'replica', got {gpu_instances!r}")
        if not (restore_horizon >= 0 and regime_window >= 0):
            raise SpecError("restore_horizon and gpu_regime_window must be >= 0")

    def __init__(self, kinds: dict[str, KindStats], resident: Residency, gpu_holder: list[Action | None],
                 cells: tuple[int, ...], svc_queued: dict[str, int], place: Placement, *,
                 gpu_slots: float | None, default_duration: float, restore_horizon: float, gpu_instances: str,
                 regime_window: float) -> None:
        self.check_options(restore_horizon, gpu_instances, regime_window)
        self._kinds = kinds
        self._svc_queued = svc_queued
        self._resident = resident
        self._gpu_holder = gpu_holder
        self._cells = cells
        self._place = place
        self.restore_horizon = restore_horizon
        self.regime_window = regime_window
        self._mkt: Any = None
        # what each width would cost; the one owner of gpu_slots and gpu_instances
        self.model = WidthModel(kinds, place, gpu_slots, gpu_instances)
        self._false_alarms: dict[int, int] = {}
        self._rates = CallRates(kinds, default_duration)  # the call rates each market is priced at
        self.width = 1 << 30  # chosen at the first look (initial_gpu_width)
        self.switched_at = -math.inf
        self.transition = _TRANSITION
        self.cv_f = 1.0
        self.pref: dict[ActionSpec, int] = {}
        self.prev_pref: dict[ActionSpec, int] = {}
        self.spill: tuple[int, frozenset[str]] | None = None  # the plan of the width in force
        self.spill_mask = 0  # ... its GPUs
        self.staged = False  # the last switch was a staged narrowing: an urgent one, or one under a backlog
        # the width in force is still the first one, chosen before any load was measured
        self.guessed = True
        # the width in force was taken to prepare for an opening ramp (:meth:`_prepares`): its
        # copies are restored on idle cells before the calls need them (:class:`.CopyValue`)
        self.eager = False
        self._from = 0  # the width any switch left, 0 once called off: a planned widening's way back
        self._left_urgently = 0  # ... only if that switch was an urgent narrowing: its false alarms
        # during a staged narrowing, the GPUs on which the old width's copies still serve (the
        # new width's may not), handed over cell by cell as ``_stage`` says (:class:`.Stages`)
        self.legacy = 0
        self._stage: Stages = NO_STAGES
        # per width in force since the last lull: markets, and those with a call queued per cell;
        # after a lull, the width to return to
        self._backlog_at: dict[int, tuple[int, int]] = {}
        self._recall = 0
        self._last_call: float | None = None  # the latest GPU call arrival the last market saw
        self._hold = -math.inf  # no widening before this (the rates relearn a load after a lull)

    @property
    def last(self) -> tuple[float, dict[str, Service], float, float]:
        """The market in force: what the last :meth:`market` that recomputed returned."""
        return self._mkt[2]  # type: ignore[no-any-return]

    # -- sizes ----------------------------------------------------------------------------------
    def sizes(self, spec: ActionSpec) -> tuple[int, ...]:
        lo = spec.gpus
        hi = spec.max_units if spec.elastic_resource == "gpu" else lo
        model = self.model
        if spec.service is not None and model.gpu_slots is not None:  # a copy must fit its GPUs
            lo = copy_min(lo, hi, self._cells, model.gpu_slots, model.gpu_instances == "replica") or lo
        return tuple(c for c in self._cells if lo <= c <= hi) or (lo,)

    def initial_width(self, spec: ActionSpec, services: int = 1) -> int:
        """The width the core grants ``spec`` before it has measured any load: the widest legal
        one leaving ``_START_CELLS`` cells in the pool at which ``services`` copies stay resident
        (a warm start restores copies at it)."""
        sizes = self.sizes(spec)
        if spec.elastic_resource != "gpu":
            return spec.gpus
        G = max(1, len(self._gpu_holder))
        unbounded = self.model.gpu_slots is None  # no memory model: every width holds every copy
        return max((m for m in sizes if G // m >= _START_CELLS and (
            unbounded or self.model.copies_fit(m, G) >= services)), default=sizes[0])

    # -- the market ---------------------------------------------------------------------------
    def market(self, now: float) -> tuple[float, dict[str, Service], float, float] | None:
        """``(mu, services, pool load, mu_work)`` when recomputed, which happens every
        ``_MARKET_DT`` seconds or when a new kind appears (rates are smooth; a market per event
        would dominate the round); None while the last one still holds (:attr:`last`)."""
        memo = self._mkt
        if memo is not None and now - memo[0] < _MARKET_DT and now >= memo[0] and memo[1] == len(self._kinds):
            return None
        if self.legacy:
            self.legacy = legacy_at(self._stage, now, self.switched_at)
        G = max(1, len(self._gpu_holder))
        kinds, fast, svcs = self._rates.demand(now, self.sizes)
        last = self._rates.latest_call
        if (self._last_call is not None and last - self._last_call >= _LULL
                and all(h is None for h in self._gpu_holder)):
            # the first GPU call after a lull (markets price every placement, so the previous
            # market saw the lull's last call), nothing running: the load returns
            sat = [m for m, (n, b) in self._backlog_at.items() if b >= _RECALL_BACKLOG * n]
            self._recall = min(sat, default=0)
            self._backlog_at = {}
            if not self._recall and _REOPEN:
                self.guessed = True  # a new opening: the opening rules again (ramp, overrun)
            # and no widening while the rates relearn the load: decayed over the lull they read
            # ~0, and the market widened TP-1 -> TP-4 at a step's first call, to narrow back 8 s on
            self._hold = now + RATE_WINDOW
        self._last_call = last
        widths = self._candidates(kinds, fast, svcs, G)
        cv_f = self.cv_f = self.model.cv_factor(kinds)
        pick = self._choose(now, kinds, fast, svcs, widths, G, cv_f, memo)
        n, b = self._backlog_at.get(pick, (0, 0))
        self._backlog_at[pick] = (n + 1, b + (sum(self._svc_queued.values()) >= G // pick))
        self.model.calibrate(kinds, pick, G, cv_f)
        return self._settle(now, kinds, svcs, pick, G)

    def _candidates(self, kinds: list[Any], fast: list[Any], svcs: dict[str, Service], G: int) -> list[int]:
        """The widths that may be in force: every one of the kinds' sizes at which each service
        called now keeps a resident copy, or that spills the rest beside its cells."""
        m_cur = self.width
        widths = sorted({m for _l, _s, ts, _i in kinds for m in ts}) or [1]
        # a width is a candidate only if every service called now keeps a resident copy at it
        # (the queueing model below sees no residency): without this 5 GPUs and 9 teachers went
        # TP-2, where 8 copies fit, and the ninth restored on every call (2.2 s mean ACT vs TP-1's
        # 0.63). A width may instead spill the coldest services onto the GPUs beside its cells
        # (:func:`.spill_plans`: 6 GPUs at batch 512, where fifo4's thrash beat TP-2 by 6 %)
        if self.model.gpu_slots is not None:
            active = sum(1 for info in svcs.values() if info.lam > 0)
            if m_cur == 1 << 30:  # the first look: the services already resident count too
                active = max(active, len(self._resident.by_service))
            fit = [m for m in widths if self.model.copies_fit(m, G) >= active]
            # ... or if the GPUs left beside its cells hold the rest at a narrower width
            self.model.spill_plan = plans = spill_plans(self.model, widths, fit, svcs, active, G, kinds, fast,
                                                        self.width if self.spill is not None else 0)
            fit = sorted(set(fit) | set(plans))
            if not fit:  # no width holds them all (thrash at any width): the widths keeping the
                # most copies, where the model's faster restores and calls decide (6 GPUs holding
                # one model each for 9 teachers: TP-2 keeps as many copies as TP-1, restores in R/2)
                most = max(self.model.copies_fit(m, G) for m in widths)
                fit = [m for m in widths if self.model.copies_fit(m, G) >= most]
            widths = fit
        return widths

    def _choose(self, now: float, kinds: list[Any], fast: list[Any], svcs: dict[str, Service],
                widths: list[int], G: int, cv_f: float, memo: Any) -> int:
        """The width in force after this market, switching to it if it changes (the rules of the
        module docstring: the first look, urgent narrowing, a planned switch and what it must
        win, false alarms)."""
        m_cur = self.width
        lam_sum = sum(k[0] for k in kinds)
        # candidates: one width for every kind (as a TP-m FIFO would run it), scored by the
        # model's mean ACT; a width whose calls would wait more often than _P_WAIT is not grown
        # into (the pooled model misses the residency and cell fragmentation of few wide cells,
        # and there a wrong guess queues without bound: 8 GPUs at TP-4 measured 13-30x its wait)
        scores = {}
        for m in widths:
            ex, wq, pw = self.model.predict(kinds, m, G, cv_f)
            scores[m] = (ex + wq, pw)
        if m_cur == 1 << 30:  # the first look: the widest width leaving _START_CELLS cells
            two = [m for m in widths if G // m >= _START_CELLS]
            m_cur = self.width = max(two) if two else widths[0]
            self.switched_at = now
        cur = scores.get(m_cur)
        ok = [m for m in widths if scores[m][1] <= (_P_WAIT if m <= m_cur else _P_GROW) or m == widths[0]]
        best_m = min(ok, key=lambda m: (scores[m][0], -m))
        pick = m_cur
        urgent = False
        overrun = False  # calls pile up at the first width (below)
        if cur is not None and m_cur > widths[0]:
            pw_fast = self.model.predict(fast, m_cur, G, cv_f)[2]
            if self.guessed and sum(self._svc_queued.values()) >= _OVERRUN * (G // m_cur):
                # the first width was a guess; calls piling up at it are an overload whatever the
                # rates say (smoothed over 30 s, they lag the opening ramp)
                pw_fast = 1.0
                overrun = True
        if cur is not None and self._called_off(now, fast, svcs, widths, m_cur, G, cv_f):
            return self.width
        thr = min(_P_URGENT_MAX, _P_WAIT + _P_URGENT * (_FALSE_ALARM ** self._false_alarms.get(m_cur, 0)))
        prep = cur is not None and not overrun and self._prepares(kinds, fast, widths, m_cur, G)
        back = self._recalled(widths, m_cur, fast, G) if cur is not None and not overrun and not prep else 0
        if prep or back:
            # the opening ramp of a load that will outgrow the first width (to the narrowest, the
            # most calls a GPU), or a load returning after a lull (to the width its last busy
            # period ran saturated at): every cell handed over at once, the pool still nearly idle
            pick, urgent, overrun, prep = back or widths[0], True, True, True
        elif cur is None or (m_cur > widths[0] and max(cur[1], pw_fast) > thr):
            # narrowing is urgent (an overload queues in seconds), judged at the latest rates
            nar = [m for m in widths if m < m_cur and (m == widths[0] or self.model.predict(
                fast, m, G, cv_f)[2] <= _P_WAIT)]
            # to the narrower width the latest rates score best (not merely the next one down:
            # a second urgent step would restore every copy twice)
            # ... and under a ramp, at the rates it is heading for: a narrowing sized for the
            # latest rates alone needs a second one (every copy restored twice, the second time
            # in an overload: deepsearch's 3 GPU-s judge went TP-4 -> TP-2 -> TP-1 10 s apart)
            ahead = self._ahead(fast, lam_sum) if cur is not None else fast
            if ahead is not fast:
                nar = [m for m in widths if m < m_cur and (m == widths[0] or self.model.predict(
                    ahead, m, G, cv_f)[2] <= _P_WAIT)]
            pick = best_m if cur is None else min(nar, default=widths[0], key=lambda m: (
                sum(self.model.predict(ahead, m, G, cv_f)[:2]), -m))
            urgent = cur is not None
            if cur is not None and cur[1] <= thr and (
                    self._just_narrowed(now) or not self._backlog_confirms(kinds, fast, svcs, pick, G)):
                pick, urgent = m_cur, False  # a clump, an echo or a restore transient, not (yet) an overload
        elif (best_m != m_cur and now - self.switched_at >= self.regime_window
              and scores[best_m][0] < cur[0] * (1.0 - _SWITCH)
              and (best_m < m_cur or (not self._backlogged(m_cur, G) and now >= self._hold))):
            # at the latest rates too (a rising load must not be met by growing wider)
            ex_f, wq_f, pw_f = self.model.predict(fast, best_m, G, cv_f)
            if best_m > m_cur and self.model.wq_f:
                # growing must also win with each width's waits as measured in its past stints
                # (the pooled model misses the residency of few wide cells: 2 TP-4 cells of 8
                # GPUs waited ~3x its prediction at batch 4096, TP-2 ~2x; growing on the model
                # alone traded TP-2 and TP-4 every minute there, 1.15x fifo2's mean ACT)
                if (self.model.measured(kinds, best_m, G, cv_f)
                        >= self.model.measured(kinds, m_cur, G, cv_f) * (1.0 - _SWITCH)):
                    pw_f = math.inf  # not grown into
            if best_m < m_cur or (pw_f <= _P_WAIT and ex_f + wq_f < sum(
                    self.model.predict(fast, m_cur, G, cv_f)[:2]) * (1.0 - _SWITCH)):
                pick = best_m
        cal_gain = None
        if (_CAL_NARROW and self.guessed and pick == m_cur and cur is not None and not urgent
                and m_cur in self.model.wq_f and now - self.switched_at >= self.regime_window):
            cal = {m: self.model.measured(kinds, m, G, cv_f) for m in set(ok) | {m_cur}}
            nb = min((m for m in ok if m < m_cur), key=lambda m: (cal[m], -m), default=None)
            if nb is not None and math.isfinite(cal[m_cur]) and cal[nb] < cal[m_cur] * (1.0 - _SWITCH):
                pick, cal_gain = nb, cal[m_cur] - cal[nb]
        if pick != m_cur and cur is not None and not urgent:
            # a switch restores copies at the new width (the calls that meet them cold wait for
            # them): worth it only if the predicted saving over restore_horizon pays for that
            fast_new = sum(self.model.predict(fast, pick, G, cv_f)[:2])
            fast_cur = sum(self.model.predict(fast, m_cur, G, cv_f)[:2])
            gain = ((min(cur[0], fast_cur) if math.isfinite(fast_cur) else fast_cur)
                    - min(scores[pick][0], fast_new))
            if cal_gain is not None:
                gain = cal_gain
            cost = 0.0
            mu_prev = memo[2][3] if memo is not None else 0.0  # the price at the width in force
            for name, info in svcs.items():
                if info.lam > 0:
                    # the copies at the width in force (this market's sizes are set after)
                    n = max(1, len(self._resident.warm_cells(name, self.pref.get(info.spec, info.pref))))
                    r_s = self._place.restore_cost(name)
                    cost += n * (self.model.restore_lat(r_s, pick)
                                 + _SWITCH_MU * mu_prev * self.model.restore_gpu_s(r_s, pick))
            horizon = max(self.restore_horizon, self.regime_window, 1.0)
            if math.isfinite(gain) and gain * lam_sum * horizon < cost:
                pick = m_cur
        # a narrowing while calls wait per cell hands the old width's cells over as an urgent one
        # does: for a planned switch's _TRANSITION the saturated old cells keep serving and never
        # free a GPU for the new width's copies (heavy-calls MOPD seed 1: a planned TP-4 -> TP-2
        # under a 6-call queue served at TP-4 for ~45 s more while the queue grew to 27, 1.14x fifo2)
        if (pick < m_cur and cur is not None and not overrun
                and not self._beyond_noise(fast, lam_sum, pick, m_cur, G, cv_f,
                                           measured=cal_gain is not None)):
            # near capacity, where the wait is steep, noise looks like an overload
            pick, urgent = m_cur, False
        staged = urgent or (pick < m_cur and cur is not None and self._backlogged(m_cur, G))
        if pick != m_cur:
            f = self.model.wq_f
            if (not urgent and pick > m_cur and self._left_urgently == pick
                    and (now - self.switched_at <= 2.0 * max(self.regime_window, 1.0)
                         or (_FALSE_ALARM_MEASURED and f.get(m_cur, 1.0) > f.get(pick, 1.0)))):
                # back to a width left urgently, at the smoothed rates: the alarm was false, and
                # the next one from this width needs a higher chance to wait (10 GPUs at batch
                # 3072 left TP-4 three times for 60-180 s, restoring every teacher each way).
                # Also later, if the narrow width's calls waited more against the model than the
                # wide one's: the narrowing did not buy the waits it was taken for. Heavy-calls
                # MOPD seed 1 (3 GPU-s calls, 10 GPUs) narrowed TP-2 -> TP-1 at the peak, came
                # back 162 s later (TP-1 waited 4.1x its prediction, TP-2 1.6x: a TP-1 copy
                # restores in R, as long as a call, so each teacher's calls queue on its own few
                # copies) and narrowed again at the next peak: 1.050x fifo2, 1.032 without the
                # second round trip
                self._false_alarms[pick] = self._false_alarms.get(pick, 0) + 1
            self._left_urgently = m_cur if urgent else 0
            self.eager = prep
            self._from = m_cur
            self.switched_at = now
            self.guessed = False
            self.transition = _TRANSITION_STAGED if staged else _TRANSITION
            self.staged = staged
            self.legacy = 0
            if staged and not (urgent and overrun):
                # (an overrun first width hands every cell over at once: see the module docstring)
                stages = plan_stages(svcs, m_cur, pick, G, pref=self.pref, resident=self._resident,
                                     holder=self._gpu_holder, model=self.model,
                                     spilled=self.spill is not None)
                if stages is not None:
                    self._stage = stages
                    self.transition = stages.seconds
                    self.legacy = legacy_at(stages, now, self.switched_at)
            self.width = pick
            self.prev_pref = dict(self.pref)
        if not math.isfinite(self.switched_at):
            self.switched_at = now
        return pick

    def _beyond_noise(self, fast: list[Any], lam_sum: float, new: int, old: int, G: int, cv_f: float,
                      measured: bool = False) -> bool:
        """A narrowing from ``old`` to ``new`` still wins at the latest rates ``_ROBUST`` standard
        errors lower (a count of N calls is off by ~sqrt(N)), or the rates ramp (a load still
        rising is believed at once). Near a width's capacity the M/G/c wait is so steep that noise
        alone reads as an overload: heavy-calls MOPD seed 1 (3 GPU-s calls on 10 GPUs) narrowed
        TP-2 -> TP-1 twice at 2.5 calls/s, where TP-2's Erlang C was 0.79 and its calls really
        waited less than the model said, and every teacher restored four times (1.032x fifo2's
        mean ACT; 1.010x with this test)."""
        lam = sum(k[0] for k in fast)
        if _ROBUST <= 0 or lam >= _RAMP * lam_sum:
            return True
        f = max(0.0, 1.0 - _ROBUST / math.sqrt(max(1.0, lam * RATE_WINDOW)))
        low = [(k[0] * f,) + tuple(k[1:]) for k in fast]
        if measured:  # a narrowing taken on measured waits is checked on them too
            return self.model.measured(low, new, G, cv_f) < self.model.measured(low, old, G, cv_f)
        return sum(self.model.predict(low, new, G, cv_f)[:2]) < sum(self.model.predict(low, old, G, cv_f)[:2])

    def _prepares(self, kinds: list[Any], fast: list[Any], widths: list[int], m_cur: int, G: int) -> bool:
        """Whether to leave the first width, a guess, for the narrowest before any overload: while
        the latest rates ramp (``_PREP_RAMP`` times the smoothed ones: a kind's first calls, a load that
        has just appeared) and would already keep the narrowest width ``_PREP`` busy.

        Deepsearch's judge at 3 GPU-s a call on 8 GPUs: its calls go from ~1/s to ~5/s ~10 s after
        the first, an overload that lasts minutes. Narrowed there (TP-4 -> TP-1, urgently), the 8
        TP-1 copies restored at its start, 4 s each with the queue growing behind them, and every
        later call waited for that: 1.037-1.050x isolated's mean ACT (eight copies resident from
        the start), as fifo1, which restores its copies as calls meet them, 1.046-1.069x. Narrowed
        at the ramp's first seconds (0.7-1.3 calls/s, the narrowest width 15-40 % busy) with the
        copies restored on idle cells: 1.001-1.033x over seeds 0-7 (1.017 / 1.013 / 1.001 on the
        matrix's; restored as calls meet them, 1.047-1.074x). The default judge (0.5 GPU-s)
        narrows at its burst as before, a few seconds sooner: 1.004-1.013x fifo2 over seeds 0-7,
        was 1.007-1.024x. Only at a ramp of 3x (2.5x since stop 42): at 1.5x the batch-512
        judge, whose load never needs TP-1, went there on a clump (1.026x fifo2, was 1.001); the
        heaviest MOPD openings reach 0.09 there (0.14 at 1.5x), the saturated judge 0.17-0.63.

        Stop 42 (at 3x until then): the same judge at batch 512, where the load ramps over ~20 s
        rather than ~10, read a ramp of 2.2-3x and was missed, then narrowed urgently with 8 TP-1
        restores in the overload: 1.135-1.177x isolated in 5 of 20 seeds. At 2.5x two of them are
        1.002-1.006x and one 1.026x (seeds 9 and 10 still 1.17x), no MOPD cell moves, and the
        default judge at batch 1024 (not a matrix cell) pays for clumps read as ramps: held-out
        seeds 3-5 1.000 / 1.023 / 1.012 -> 1.019 / 1.022 / 1.021x fifo2. 2.0x broke batch 512's
        default judge (1.020-1.026x); ``_PREP`` 0.10-0.12 fixed seed 9 too but sent a fast-decoding
        MOPD opening (batch 512, 16 GPUs, TP-4 best) to TP-1: 1.45-1.56x fifo4."""
        if not (_PREP > 0 and self.guessed and m_cur > widths[0]):
            return False
        if sum(k[0] for k in fast) < _PREP_RAMP * sum(k[0] for k in kinds):
            return False
        busy = pool_load(fast, widths[0])[0]  # GPU-seconds a second at the narrowest width
        return busy >= _PREP * G

    def _recalled(self, widths: list[int], m_cur: int, fast: list[Any], G: int) -> int:
        """After a lull, the width to meet the returning load at: the narrowest the last busy
        period ran saturated at (a call queued per cell in ``_RECALL_BACKLOG`` of its markets: a
        width it *needed*; the default judge narrows to TP-1 unsaturated, where a recall cost
        1-4 %), the widest candidate not wider, once the latest rates would keep the narrowest
        width ``_RECALL_LOAD`` busy (a straggler's call after a lull is not the load coming back:
        the matrix's heavy MOPD tails restored six copies for it); 0 until then, and for good once
        the width in force is as narrow."""
        back = self._recall
        if not back:
            return 0
        to = max((m for m in widths if m <= back), default=widths[0])
        if to >= m_cur:
            self._recall = 0
            return 0
        if pool_load(fast, widths[0])[0] < _RECALL_LOAD * G:
            return 0
        self._recall = 0
        return to

    def _called_off(self, now: float, fast: list[Any], svcs: dict[str, Service], widths: list[int],
                    m_cur: int, G: int, cv_f: float) -> bool:
        """A planned widening still in its transition, before any copy at its width is restored,
        is called off (back to the width it left, whose copies still serve every call) once the
        latest rates would not grow into it (its calls would wait more often than ``_P_WAIT``).
        The default deepsearch judge (seed 0) widened TP-1 -> TP-2 at its burst's peak, restored
        four TP-2 copies as the transition ended, and narrowed back urgently 5 s later, restoring
        eight TP-1 copies cell by cell in the burst (1.028x fifo2; called off, 1.010)."""
        old = self._from
        if (not _CALL_OFF or self.staged or not old or old >= m_cur or old not in widths
                or now - self.switched_at >= self.transition
                or self.model.predict(fast, m_cur, G, cv_f)[2] <= _P_WAIT):
            return False
        if any(self._resident.warm_cells(n, self.pref.get(info.spec, info.pref))
               for n, info in svcs.items() if info.lam > 0):
            return False  # copies at the new width are in use already (two models a GPU)
        self._from = 0
        self.width = old
        self.switched_at = now
        self.transition = 0.0
        self.pref, self.prev_pref = dict(self.prev_pref), {}
        self.legacy = 0
        self.eager = False
        return True

    @staticmethod
    def _ahead(fast: list[Any], lam_sum: float) -> list[Any]:
        """The latest rates ``_AHEAD`` times over when they exceed the smoothed ones ``_RAMP`` times
        (a load ramping up keeps rising for a while), else ``fast`` itself."""
        if sum(k[0] for k in fast) < _RAMP * lam_sum:
            return fast
        return [(k[0] * _AHEAD,) + tuple(k[1:]) for k in fast]

    def _backlogged(self, m: int, G: int) -> bool:
        """Calls wait for a cell: at least one queued per cell of width ``m``. A width never grows
        then: growing trades throughput for latency, and the model, fed arrival rates, does not
        see a backlog (in a closed loop the rates *fall* while calls wait: deepsearch's 3 GPU-s
        judge on 8 GPUs grew to TP-8 behind a 290 s queue, 1.19-1.23x isolated's mean ACT)."""
        return sum(self._svc_queued.values()) >= max(1, G // m)

    def _just_narrowed(self, now: float) -> bool:
        """Within ``_URGENT_HOLD`` s of a staged narrowing (an urgent one, or one under a backlog):
        the width in force is still restoring its copies, and its queue is the switch's, not its
        own. Deepsearch seed 7 narrowed TP-4 -> TP-2 -> TP-1 2.2 s apart, before any TP-2 copy
        served (1.051x fifo2; 1.025 with the hold)."""
        return self.staged and now - self.switched_at < _URGENT_HOLD

    def _backlog_confirms(self, kinds: list[Any], fast: list[Any], svcs: dict[str, Service], m: int,
                          G: int) -> bool:
        """Whether an urgent narrowing to width ``m`` that only the latest rates call for goes ahead:
        at once when they exceed the smoothed rates ``_RAMP`` times (a load really ramping: the
        judge burst of deepsearch), else once the calls queued now are ``_QUEUE_GATE`` times those
        the switch's own restores would hold up (the smoothed rate times the outage: every service
        called now restores a copy at ``m``, in parallel over the ``G // m`` cells).

        A clump of arrivals, or the calls an earlier outage held back coming back together a think
        time later, reads as an overload at the 32-arrival rate but queues a handful of calls. On
        heavy 8-GPU MOPD the narrowings they caused stopped the pool for 4-5 s at ~10 calls/s
        each, twice at the step's peak: 1.06-1.11x fifo2; with the gate 1.006 / 0.989 / 1.032.

        A ramp skips the gate only while the latest rates would load the width in force
        ``_RAMP_OVER`` (1.3) times past its GPUs (stop 45). Erlang C is 1 at any overload, so a
        clump mid-step, 1.6x the smoothed rate and 6 % past TP-2's capacity, read as the judge's
        opening burst: the 1.5 GPU-s judge at batch 512 (seed 0) narrowed TP-2 -> TP-1 at once,
        restored eight copies and stayed narrow for a regime window, where fifo2 queued through
        the clump (1.042 -> 1.026x fifo2; seed 1 1.028 -> 1.016). The bursts the shortcut is for
        load the width several times over; no MOPD cell moves."""
        lam = sum(k[0] for k in kinds)
        if sum(k[0] for k in fast) >= _RAMP * lam and (
                not _RAMP_OVER or pool_load(fast, self.width)[0] >= _RAMP_OVER * G):
            return True
        called = [n for n, info in svcs.items() if info.lam > 0]
        if not called:
            return True
        outage = self.model.restore_rounds(called, m, G // m)
        queued: int = sum(self._svc_queued.values())
        return bool(queued >= _QUEUE_GATE * lam * outage)

    def observe_wait(self, submitted: float, now: float) -> None:
        """A call of an elastic GPU kind submitted at ``submitted`` is granted ``now``: its wait
        calibrates the width in force (:meth:`.WidthModel.observe_wait`)."""
        self.model.observe_wait(submitted, now, self.width, self.switched_at, self.transition)

    def _settle(self, now: float, kinds: list[Any], svcs: dict[str, Service], pick: int,
                G: int) -> tuple[float, dict[str, Service], float, float]:
        """The size each spec takes at width ``pick`` (its spill width if spilled), the load per
        service, and the pool's price of a GPU-second; remembered as the market in force."""
        total = W = 0.0
        pref: dict[ActionSpec, int] = {}
        plan = self.spill = self.model.spill_plan.get(pick)
        # beside the width's aligned cells
        self.spill_mask = 0 if plan is None else ((1 << G) - 1) & ~((1 << (G // pick * pick)) - 1)
        for lam, spec, ts, info in kinds:
            top = plan[0] if plan is not None and spec.service in plan[1] else pick
            m = size_at(ts, top)
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
        self._mkt = (now, len(self._kinds), out)
        self.pref = pref
        return out

