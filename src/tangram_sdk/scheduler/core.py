"""The pure scheduling core: ``Scheduler.handle(event, now) -> list[Decision]``.

No I/O, no clocks, no event loop: time comes in as an argument, decisions go out as values. The live
runtime and the simulator drive this same class, so a trace replayed through either gives the same
decision log.

One round, run after every event:

1. **Admit** (FCFS, by priority then arrival): walk the wait queue; an action that fits at its
   minimum is tentatively reserved and becomes a candidate; one that does not fit blocks the
   resources it lacks for everyone behind it (no overtaking on a contended resource, so nobody
   starves), while actions needing other resources still pass.
2. **Split** the spare units of each elastic resource among that resource's elastic candidates.
   For a price ``mu`` on unit-seconds, the split minimising ``sum T_i(m_i) + mu * m_i * T_i(m_i)``
   is found exactly (greedy for convex costs, a DP over legal shapes otherwise); a small grid of
   prices yields plans from "all spare to whoever waits now" to "everyone at minimum".
3. **Estimate** each plan's total ACT: candidates' execution + queued actions' waits (a
   completion-time heap over running actions' releases) + the waits of actions expected to arrive
   during the plan (per-kind arrival rates learned online). Keep the cheapest plan.
4. **Evict greedily**: push the last candidate back to the queue and re-plan while the estimate
   improves (long, highly parallel actions run faster one after another than side by side).
5. **Place** concretely: cores from one NUMA node, GPUs as aligned cells (1/2/4/8), preferring a
   cell where the action's service is already resident.

``Scheduler`` (no base class) owns the state and the collaborators, each an object with one job and
the few shared objects it is given at construction (or the round's snapshot per call):

* state: the :class:`.Ledger` (free units), the :class:`.WaitQueue` (:mod:`.queue`), the running and
  live actions, the learned kinds (:mod:`.learn`), who holds each GPU, the :class:`.Residency` and
  the :class:`.RoundMemo` (:mod:`.memo`, one ``reset(now)`` per round);
* on arrival and completion: :class:`.SpecForms` (:mod:`.specs`: the spec as sized, its Shape),
  :class:`.KindLearning` (:mod:`.kinds`: what is learned per kind);
* in the round: :class:`.Admission` (step 1: ``scan`` returns an ``Admitted``; ``alone`` for the
  uncontended shortcut), sizing at admission by :class:`.CpuSizing` (:mod:`.moldable`,
  :mod:`.pricing`) and :class:`.GpuSizing`; :class:`.Planner` (steps 2-4: ``plan`` returns a
  ``Plan``); :class:`.Placement` (step 5's nodes, cells and holders, restore prices);
  :class:`.Deadlines`; :class:`.Resizing` over :class:`.Malleables` and :class:`.Restarts`
  (running actions shrunk, grown or restarted: Resize).

This module is the transition itself: events in (each applied to the state), one round (shrink,
deadlines, the uncontended shortcut, admission, plan, grants, grow and restart), decisions out;
statistics (:mod:`.stats`) and invariants (:mod:`.invariants`) are read off the state.
Collaborators never write the core's counters or ``next_wakeup``: they return what the core records.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import TYPE_CHECKING

from ..errors import SpecError
from ..options import SchedulerOptions, check_scheduler_options, merge_options
from ..pool import Pool
from ..spec import ActionSpec
from .action import Action, dur_min
from .admission import Admission
from .decisions import Decision, Grant, Reject
from . import invariants
from .events import Cancelled, Event, Released, ServiceResidency, Submitted, Tick, TokensUsed
from .kinds import KindLearning
from .learn import ACT_ALPHA, KindStats
from .ledger import Ledger
from .malleable import Malleables
from .memo import RoundMemo
from .queue import WaitQueue
from .placement import Placement
from .deadlines import Deadlines
from .gpu_sizing import GpuSizing
from .moldable import CpuSizing
from .planning import Planner
from .residency import Residency
from .resizing import Resizing
from .restart import Restarts
from .specs import SpecForms
from .stats import SchedulerStats, ledger_fields

if TYPE_CHECKING:
    from typing_extensions import Unpack

    from ..options import SchedulerKeywords

_new_grant = tuple.__new__  # see _grant

__all__ = ["Scheduler", "SchedulerStats"]

_DEFAULT_MU_GRID = (0.0, 0.05, 0.15, 0.5, 1.5, 5.0, math.inf)
# the soonest a round's wake-up may be after its own time (Scheduler._wake_not_before)
MIN_WAKE = 1e-6
# objective -> default max_price (seconds of ACT one core-second may cost at most)


class Scheduler:
    """Action-level elastic scheduler over one :class:`Pool`.

    ``window``: most elastic candidates optimised jointly per round (the rest get their minimum).
    ``depth``: queued actions the estimator looks at. ``lookahead``: count expected arrivals.
    ``elastic=False`` grants everyone their minimum (an action-level FIFO baseline).
    ``gpu_slots``: how many model copies one GPU's memory holds (a TP-k instance uses 1/k per GPU);
    when given, restoring a service prices only the copies an LRU cache would really evict there,
    instead of every copy on the cell.

    Options come as keywords or as ``options=SchedulerOptions(...)`` (the value a Tangram, a
    deploy and a simulated policy share); one option given both ways is a SpecError.
    """

    def __init__(self, pool: Pool, *, options: SchedulerOptions | None = None,
                 **keywords: Unpack[SchedulerKeywords]) -> None:
        self._configure(pool, **merge_options(options, keywords))

    def _configure(
        self,
        pool: Pool,
        *,
        window: int = 16,
        depth: int = 64,
        scan_limit: int = 4096,
        elastic: bool = True,
        lookahead: bool = True,
        default_duration: float = 1.0,
        default_restore_s: float = 0.5,
        alpha: float = 0.2,
        duration_alpha: float = 0.002,
        learn_efficiency: bool = True,
        mu_grid: Iterable[float] = _DEFAULT_MU_GRID,
        max_evictions: int = 4,
        lookahead_cap: int = 64,
        skip_rounds: bool = True,
        gpu_slots: float | None = None,
        planner: str = "priced",
        load_target: float | None = None,
        price_horizon: float = 1 / 16,
        price_smoothing: float = 0.5,
        max_price: float | None = None,
        objective: str = "balanced",
        start_or_wait: bool = True,
        restart_gain: float = 0.5,
        restore_horizon: float = 300.0,
        gpu_instances: str = "tp",
        gpu_regime_window: float = 60.0,
        supply: str = "estimate",
        fallback: bool = True,
    ) -> None:
        # every option by name (the parameters above, SchedulerOptions' fields), checked
        values = {k: v for k, v in locals().items() if k not in ("self", "pool")}
        mu_grid, max_price, load_target = check_scheduler_options(values)
        GpuSizing.check_options(restore_horizon, gpu_instances, gpu_regime_window)
        self.restore_horizon = restore_horizon
        self.gpu_instances = gpu_instances
        self.regime_window = gpu_regime_window
        self.pool = pool
        self.window = window
        self.depth = depth
        self.scan_limit = scan_limit
        self.elastic = elastic
        self.lookahead = lookahead
        self.default_duration = default_duration
        self.default_restore_s = default_restore_s
        self.alpha = alpha
        self.duration_alpha = duration_alpha
        self.learn_efficiency = learn_efficiency
        self.mu_grid = tuple(mu_grid)
        self.max_evictions = max_evictions
        self.lookahead_cap = lookahead_cap
        self.skip_rounds = skip_rounds
        self.gpu_slots = gpu_slots
        self.objective = objective
        self.planner = planner
        self.load_target = load_target
        self.price_horizon = price_horizon
        self.price_smoothing = price_smoothing
        self.max_price = max_price
        self.start_or_wait = start_or_wait
        self.supply = supply
        self.fallback = fallback
        self.ledger = Ledger(pool)
        self._queue = WaitQueue()
        self._mall = Malleables(self.ledger)  # running malleable actions and the cores they borrowed
        self._rst = Restarts(self.ledger, restart_gain)  # running restartable actions, which were restarted
        self._running: dict[int, Action] = {}
        self._live: dict[int, Action] = {}  # queued or running, by id
        self._kinds: dict[str, KindStats] = {}
        self._learn = KindLearning(self._kinds, default_duration=default_duration, duration_alpha=duration_alpha,
                                   learn_efficiency=learn_efficiency)
        # the price of cores and the sizes it gives elastic CPU actions at admission
        self._cpu = CpuSizing(self.ledger, self._running, self._kinds, self._queue.spec_queued,
                              default_duration=default_duration, lookahead=lookahead, load_target=load_target,
                              price_horizon=price_horizon, price_smoothing=price_smoothing, max_price=max_price,
                              objective=objective, start_or_wait=start_or_wait, supply=supply,
                              fallback=fallback and elastic and planner == "priced")
        self._fallback = self._cpu.fallback  # the fixed DoPs replayed on the stream (fallback.py)
        self._book = self._cpu.book  # running actions' expected releases: added and removed here
        self._seq = 0
        self._deadlines = Deadlines(self._live, self._queue, self._running, self.ledger, self._cpu)
        ng = len(pool.gpus)
        self._cells = tuple(c for c in pool.gpu_cells if c <= ng)
        self._gpu_holder: list[Action | None] = [None] * ng
        self._resident = Residency(ng, replica=self.gpu_instances == "replica")
        self.next_wakeup: float | None = None
        # a spec without its container, capped to the pool, its Shape: each once per distinct spec
        self._specs = SpecForms(pool, self.ledger, self._cells, gpu_slots, self.gpu_instances == "replica")
        self._shape = self._specs.shapes  # read inline on the hot path (and by the soak test's bound)
        self._memo = RoundMemo()  # what this round computes once (reset at each round's start)
        self._place = Placement(self.ledger, self._resident, self._gpu_holder, self._queue, self._kinds,
                                self._memo, self.default_restore_s, self.gpu_slots)
        # how many elastic units each candidate of a round gets (a Plan), judged by the estimate
        self._planner = Planner(self._running, self._queue, self._place, self._resident, self._memo, self._cells,
                                window=window, depth=depth, lookahead=lookahead, lookahead_cap=lookahead_cap,
                                mu_grid=self.mu_grid, max_evictions=max_evictions)
        self._resizing = Resizing(self.ledger, self._queue, self._mall, self._rst, self._cpu)
        # the GPU market: widths, copies per service, start / wait / restore at admission
        self._gpu = GpuSizing(self._kinds, self._resident, self._gpu_holder, self._cells, self._queue.svc_queued,
                              self._place, gpu_slots=gpu_slots, default_duration=default_duration,
                              restore_horizon=restore_horizon, gpu_instances=gpu_instances,
                              regime_window=gpu_regime_window)
        # the FCFS fit at the minimum, with the sizes the CPU and GPU markets decide at admission
        self._admission = Admission(self.ledger, self._queue, self._place, self._cpu, self._gpu, scan_limit=scan_limit,
                                    priced=elastic and planner == "priced",
                                    gpu_priced=planner == "priced" and bool(self._cells))
        # round skipping: a submission that the last round's blocked set already covers, with no
        # resources freed and no time-dependent state since, cannot be granted: skip the round
        self._need_round = True
        self._blocked_last: set[str] = set()
        self._round_now = -math.inf
        self._time_sensitive = True
        # counters
        self.submitted = self.granted = self.released = self.cancelled = self.rejected = 0
        self.failed = self.rounds = self.evictions = 0
        self.completed = 0
        self._sum_act = self._sum_queue = self._sum_exec = 0.0

    # ------------------------------------------------------------------------------ public API
    def initial_gpu_width(self, spec: ActionSpec, services: int = 1) -> int:
        """The width the core grants ``spec`` before it has measured any load: the widest legal
        one leaving two cells in the pool at which ``services`` copies stay resident (a warm
        start restores copies at it)."""
        return self._gpu.initial_gpu_width(spec, services)

    def feasibility(self, spec: ActionSpec) -> str | None:
        """Why ``spec`` can never be granted by this pool, or None when it can (memoised: rollouts
        submit the same few specs millions of times, differing at most in container or group)."""
        if spec.container is not None or spec.group is not None:
            spec = self._specs.without_container(spec)
        return self._specs.shape(spec).reason

    def without_container(self, spec: ActionSpec) -> ActionSpec:
        """``spec`` without its container and group, one object per distinct rest (see :mod:`.specs`)."""
        return self._specs.without_container(spec)

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Apply one event at time ``now`` and run a scheduling round."""
        if type(event) is Submitted:
            return self.submit(event.action_id, event.spec, now, deadline=event.deadline,
                               expected=event.expected)
        if type(event) is Released:
            return self.release(event.action_id, now, failed=event.failed, parallelism=event.parallelism)
        out: list[Decision] = []
        self._apply(event, now, out)
        out.extend(self._round(now))
        return out

    def submit(self, action_id: int, spec: ActionSpec, now: float, *,
               deadline: float | None = None, expected: float | None = None) -> list[Decision]:
        """``handle(Submitted(action_id, spec, deadline, expected), now)`` without building the
        event (the runtime's hot path when nobody records events). An action arriving at an empty
        queue is decided on the spot, by the same rules as a round, without entering the queue.

        ``expected``: the caller's estimate of this action's seconds at its minimum units (a
        length hint: the size of the test suite, the last run of the same task). An elastic CPU
        action hinted at its kind's one-in-a-thousand among the hints seen is a *step risk*, sized
        for its own completion (``moldable.CpuSizing.units``); any other hint changes nothing (it
        is not taken as a duration), and the kind learns from what runs, as without one."""
        out: list[Decision] = []
        if deadline is not None and deadline <= now:
            return [self._too_late(action_id, spec)]
        a = self._submit(action_id, spec, now, out, direct=True, expected=expected)
        if a is not None and a.grant is not None:
            return out
        if deadline is None and self._queue.n and not (self._need_round or self._mall.running or self._rst.running
                                                       or self._deadlines.heap):
            return out  # what the round would do: the arrival cannot change the last one's answer
        r = self._round(now)
        if out:
            out.extend(r)
            r = out
        if deadline is not None and a is not None and a.grant is None and a.id in self._live:
            self._admit_deadline(a, deadline, now, r)
        return r

    def _too_late(self, action_id: int, spec: ActionSpec) -> Reject:
        """An arrival whose deadline has already passed: refused, counted as submitted."""
        if action_id in self._live:  # a duplicate id is the caller's bug, whatever its deadline
            raise ValueError(f"action id {action_id} submitted twice")
        self.submitted += 1
        self.rejected += 1
        return Reject(action_id, f"{spec.kind}: its deadline has already passed", "deadline")

    def tokens_used(self, quota: str, delta: float, now: float) -> list[Decision]:
        """``handle(TokensUsed(quota, delta), now)``: correct a weighted bucket after a call."""
        return self.handle(TokensUsed(quota, delta), now)

    def release(self, action_id: int, now: float, *, failed: bool = False,
                parallelism: float | None = None) -> list[Decision]:
        """``handle(Released(action_id, failed, parallelism), now)`` without building the event."""
        self._need_round = True
        self._release(action_id, now, failed=failed, parallelism=parallelism)
        if not self._queue.n and not (self._mall.running or self._rst.running or self._deadlines.heap):
            self.next_wakeup = None  # what the round would do with nothing queued (the common case)
            return []
        return self._round(now)

    def handle_many(self, events: Iterable[Event], now: float) -> list[Decision]:
        """Apply several simultaneous events, then run one round (what a busy runtime does)."""
        out: list[Decision] = []
        timed: list[Submitted] = []
        for ev in events:
            if type(ev) is Submitted and ev.deadline is not None:
                if ev.deadline <= now:
                    out.append(self._too_late(ev.action_id, ev.spec))
                    continue
                timed.append(ev)
            self._apply(ev, now, out)
        out.extend(self._round(now))
        for ev in timed:
            a = self._live.get(ev.action_id)
            if a is not None and a.grant is None:
                assert ev.deadline is not None
                self._admit_deadline(a, ev.deadline, now, out)
        return out

    @property
    def queued(self) -> int:
        return self._queue.n

    @property
    def running(self) -> int:
        return len(self._running)

    def grant_of(self, action_id: int) -> Grant | None:
        a = self._running.get(action_id)
        return None if a is None else a.grant

    def estimated_duration(self, spec: ActionSpec, units: int | None = None) -> float:
        """Seconds ``spec`` is expected to run at ``units`` (its minimum when None)."""
        return self._learn.estimated_duration(spec, units)

    def statistics(self) -> SchedulerStats:
        return SchedulerStats(
            **ledger_fields(self.pool, self.ledger),
            running=len(self._running), queued=self._queue.n,
            submitted=self.submitted, granted=self.granted, released=self.released,
            cancelled=self.cancelled, rejected=self.rejected, failed=self.failed,
            completed=self.completed, rounds=self.rounds, evictions=self.evictions,
            resizes=self._mall.resizes + self._rst.count, grown=len(self._mall.grown),
            restarts=self._rst.count,
            mean_act_s=(self._sum_act / self.completed) if self.completed else None,
            mean_queue_s=(self._sum_queue / self.granted) if self.granted else None,
            mean_exec_s=(self._sum_exec / self.completed) if self.completed else None,
            resident_services=len(self._resident),
            fallback_dop=self._fallback.mode,
        )

    def check_invariants(self) -> None:
        """Raise AssertionError if the ledger disagrees with the running grants (for tests)."""
        invariants.check_invariants(self.pool, self.ledger, self._resident, self._running, self.granted,
                                    self.released)
        invariants.check_inflight(self._live.values(), self._kinds.values())
        self._cpu.check_book()

    def __repr__(self) -> str:
        return f"<Scheduler {self.ledger.usage()} | {len(self._running)} running, {self._queue.n} queued>"

    # ------------------------------------------------------------------------------ the round
    def _round(self, now: float) -> list[Decision]:
        """One round at ``now``: malleable actions shrunk first and grown after when any run,
        restartable ones restarted after it, queued deadlines expired and armed when any are
        kept, admission, plan and grants."""
        if self._mall.running or self._rst.running:  # shrink before admission; grow and restart after
            pre: list[Decision] = []
            if self._resizing.shrink(pre, now):
                self._need_round = True
            pre.extend(self._round_plain(now))
            self._arm(self._resizing.lend_idle(pre, now))  # look again when a young one outruns its estimate
            self._wake_not_before(now)
            return pre
        out = self._round_plain(now) if self._deadlines.heap else self._round_fcfs(now)
        if out and (self._mall.running or self._rst.running):  # it started the first malleable/restartable one
            # its first look: the round that granted it did not take the branch that arms it
            self._arm(self._resizing.due(now))
        self._wake_not_before(now)
        return out

    def _wake_not_before(self, now: float) -> None:
        """Keep ``next_wakeup`` at least :data:`MIN_WAKE` after ``now``. A wait for a release
        estimated one float step after ``now`` armed a timer there; a clock on a grid (looptime's
        microseconds, the simulator's ``time_resolution``) fires it at ``now`` itself, the round
        decides the same wait again, and virtual time never advances (a 16-trajectory trace on
        12 cores hung the simulator). A microsecond later the estimate is overdue and re-read."""
        nw = self.next_wakeup
        if nw is not None and nw < now + MIN_WAKE:
            self.next_wakeup = now + MIN_WAKE

    def _arm(self, t: float | None) -> None:
        """Keep ``next_wakeup`` no later than ``t`` (None: nothing asks)."""
        if t is not None and (self.next_wakeup is None or t < self.next_wakeup):
            self.next_wakeup = t

    def _arm_deadlines(self) -> None:
        """Keep ``next_wakeup`` no later than the earliest deadline of a queued action."""
        self._arm(self._deadlines.earliest())

    def _admit_deadline(self, a: Action, deadline: float, now: float, out: list[Decision]) -> None:
        """``a`` was queued with a deadline: refused now if it cannot start in time (see
        :mod:`.deadlines`), else its deadline is kept and armed."""
        r = self._deadlines.admit(a, deadline, now, self.rounds)
        if r is not None:
            self.rejected += 1
            out.append(r)
            # the round that just ran counted it as queued (blocking what it lacked for those
            # behind it, and what round skipping trusts): decide again without it
            self._need_round = True
            out.extend(self._round(now))
            return
        self._arm_deadlines()

    def _round_plain(self, now: float) -> list[Decision]:
        if self._deadlines.heap:  # rare: only actions submitted with a deadline put entries here
            out = self._deadlines.expire(now)
            if out:
                self.rejected += len(out)
                self._need_round = True
            out.extend(self._round_fcfs(now))
            self._arm_deadlines()
            return out
        return self._round_fcfs(now)

    def _round_fcfs(self, now: float) -> list[Decision]:
        """Admission (:class:`.Admission`), the plan for the elastic candidates (:class:`.Planner`),
        the grants; skipped when the last round's blocked set says nothing can be granted."""
        wq = self._queue
        if not wq.n:
            self.next_wakeup = None
            return []
        if not self._need_round:
            return []
        self.next_wakeup = None
        self.rounds += 1
        if wq.n == 1:
            only = wq.newest
            if only is None or wq.by_prio[only.spec.priority].get(only.id) is not only:
                (only,) = wq
            if only.eres is None:
                return self._round_single(only, now)
        self._memo.reset(now)
        L = self.ledger
        if L.tokens:
            L.refill(now)
        adm = self._admission.scan(now, self.rounds)
        self.next_wakeup = adm.wake
        if adm.svc_blocked and self._gpu_holder:
            self._arm(self._place.holders_due(now))  # a service call waits for a busy warm copy
        self._blocked_last = adm.blocked
        self._round_now = now
        self._time_sensitive = adm.wake is not None or adm.svc_blocked
        self._need_round = False
        cands = adm.cands
        if not cands:
            return []
        sized = adm.sized
        if not adm.elastic:  # the common FIFO case: everyone gets exactly the minimum
            fifo: list[Decision] = []
            for a in cands:  # a loop, not a comprehension: on 3.10/3.11 that is one more call a round
                fifo.append(self._grant(a, sized.get(a.id, 0), now))
            return fifo
        units = {a.id: a.emin for a in cands if a.eres is not None}
        units.update(sized)
        evicted: set[int] = set()
        if self.elastic:
            plan = self._planner.plan(cands, adm.node_free, adm.gfree, now, cpu=self.planner != "priced")
            units.update(plan.units)
            evicted.update(plan.evicted)
            self.evictions += plan.evictions
        # The blocked set was computed with every candidate's minimum reserved; elastic extras only
        # take more, so it stays valid. Evicted candidates are waiters the next round re-plans.
        if evicted:
            self._need_round = True
        out: list[Decision] = []
        for a in cands:
            if a.id in evicted:
                continue
            out.append(self._grant(a, units.get(a.id, 0), now))
        return out

    def _round_single(self, a: Action, now: float) -> list[Decision]:
        """The uncontended case — one queued action, not elastic — decided straight on the ledger
        with exactly the rules of the full round, minus its bookkeeping."""
        if self._decide_single(a, now):
            return [self._grant(a, 0, now)]
        return []

    def _decide_single(self, a: Action, now: float) -> bool:
        """Does the lone action ``a`` fit now? Sets its placement, or (when it does not) the
        blocked state that round skipping relies on."""
        warm = self._memo.warm  # not a round: only the warm-copy waits are asked again here
        if warm:
            warm.clear()
        L = self.ledger
        if L.tokens:
            L.refill(now)
        if a.plain and len(L.node_count) == 1:
            # Admission.alone for a plain CPU action on a one-node pool, inline (the uncontended
            # acquire's path): cores are all it can lack, node 0 the only place; the same answer
            if L.node_count[0] >= a.cpu_min:
                self._round_now = now
                a.node, a.cell, a.span = 0, -1, False
                return True
        lack, wake = self._admission.alone(a, now, self.planner == "priced")
        self._round_now = now
        self._arm(wake)
        if lack:
            if self._gpu_holder and lack[0].startswith("svc:"):
                self._arm(self._place.holders_due(now))  # a service call waits for a busy warm copy
            self._blocked_last = set(lack)
            self._time_sensitive = self.next_wakeup is not None or bool(a.spec.service)
            self._need_round = False
            return False
        return True

    # -- grants ---------------------------------------------------------------------------------
    def _grant(self, a: Action, units: int, now: float, *, queued: bool = True) -> Grant:
        spec = a.spec
        ncpu = units if a.eres == "cpu" else a.cpu_min
        if ncpu == 1 and not a.span:  # Placement.take_cpus, inline for the common one-core grant
            cpus: tuple[int, ...] = (min(self.ledger.node_free[a.node]),)
        else:
            cpus = self._place.take_cpus(a, ncpu) if ncpu else ()
        gpus: tuple[int, ...] = ()
        restore = False
        if a.gpu_min:
            gpus, restore = self._place.take_cell(a, units if a.eres == "gpu" else a.gpu_min, now)
        # Grant(...) without its generated __new__ (a Python call per grant): the same typed tuple
        g = _new_grant(Grant, (a.id, cpus, gpus, units if a.eres else 0, spec.memory, spec.quotas, restore,
                               spec.tokens, a.need))
        self.ledger.take(g)
        if queued:
            self._queue.remove(a)
        a.grant = g
        a.started = now
        if a.eres == "gpu":
            self._gpu.observe_wait(a.submitted, now)
        if a.eres is None:  # dur_min(a), inline for fixed-size actions
            est = spec.duration if spec.duration is not None else a.stats.t1
        else:
            est = dur_min(a) * a.stats.rel(spec, units)
        if restore:
            est += self._gpu.restore_lat(self._place.restore_cost(spec.service), len(gpus))
        a.est_end = now + est
        self._running[a.id] = a
        if g.cpus and self._book.live:
            self._book.add(a)
        if a.eres == "cpu":
            self._mall.admitted(a)
            self._rst.admitted(a)
        self.granted += 1
        self._sum_queue += now - a.submitted
        return g

    # ------------------------------------------------------------------------------ events
    def _apply(self, ev: Event, now: float, out: list[Decision]) -> None:
        if isinstance(ev, Submitted):
            self._submit(ev.action_id, ev.spec, now, out, direct=False, expected=ev.expected)
            return
        self._need_round = True
        if isinstance(ev, Released):
            self._release(ev.action_id, now, failed=ev.failed, parallelism=ev.parallelism)
        elif isinstance(ev, Cancelled):
            self._cancel(ev.action_id, now)
        elif isinstance(ev, ServiceResidency):
            self._place.observe_residency(ev, now, self.alpha, tp=self.gpu_instances == "tp")
        elif isinstance(ev, Tick):
            pass
        elif isinstance(ev, TokensUsed):
            self.ledger.tokens_used(ev.quota, ev.delta, now)
        else:
            raise TypeError(f"unknown event {ev!r}")

    def _submit(self, aid: int, spec: ActionSpec, now: float, out: list[Decision], *,
                direct: bool, expected: float | None = None) -> Action | None:
        """Register an arrival and queue it. ``direct``: a fixed-size action meeting an empty queue
        is decided right here (the round would scan only it); in a batch it must queue, so the
        batch's one round sees every event first."""
        if aid in self._live:
            raise ValueError(f"action id {aid} submitted twice")
        if expected is not None and not (isinstance(expected, (int, float)) and 0.0 < expected < math.inf):
            raise SpecError(f"expected must be a finite number of seconds > 0, got {expected!r}")
        self.submitted += 1
        box = spec.group or spec.container
        form = self._specs.form(spec, box)
        if isinstance(form, str):
            self.rejected += 1
            out.append(Reject(aid, form))
            return None
        spec, shape = form
        st = self._kinds.get(spec.kind) or self._learn.new_kind(spec.kind)  # a call fewer: the hot path
        st.observe_arrival(now, self.alpha)
        st.spec = spec
        self._seq += 1
        a = self._live[aid] = Action(aid, spec, self._seq, now, st, shape)
        if a.eres == "cpu":
            self._learn.hint(a, box, expected)
        fb = self._fallback
        # no call where it would record nothing: a fixed-size action before it records, or its one
        # elastic kind while that learns from durations alone (fallback.py; the hot path's budget)
        if fb.on and a.cpu_min and (fb.recording or (a.eres == "cpu" and (
                st is not fb.watch or st.measured or spec.duration is not None))):
            fb.arrived(aid, spec, st, a.eres, a.cpu_min, now)
        keys = a.keys
        wq = self._queue
        if direct and not wq.n and a.eres is None:
            self.rounds += 1
            if not (self._mall.running or self._rst.running):  # else their grow/restart look stays
                self.next_wakeup = None
            if self._decide_single(a, now):
                out.append(self._grant(a, 0, now, queued=False))
                return a
            wq.add(a, keys)
            return a
        if not (self.skip_rounds and not self._need_round and keys and keys <= self._blocked_last
                and (not self._time_sensitive or now == self._round_now)
                and (len(wq.prios) == 1 and spec.priority == wq.prios[0]
                     or wq.not_ahead(spec.priority))):
            self._need_round = True
        wq.add(a, keys)
        return a

    def _release(self, aid: int, now: float, *, failed: bool, parallelism: float | None = None) -> None:
        a = self._running.pop(aid, None)
        if self._book.live:
            self._book.remove(aid)
        if a is None:
            if self._drop_queued(aid):
                self.cancelled += 1
                return
            raise KeyError(f"release of unknown action id {aid}")
        g = a.grant
        assert g is not None
        msp = self._mall.released(a, now) if self._mall.running else None
        rerun = self._rst.released(a, now) if self._rst.running else None
        self.ledger.give(g)
        if g.gpus:
            self._place.give_cell(a, g.gpus, now)
        self.released += 1
        del self._live[aid]
        a.stats.inflight -= 1
        if failed:
            self.failed += 1
            if aid in self._fallback.ids:
                self._fallback.dropped(aid)
            return
        exec_s = now - a.started
        act_s = now - a.submitted
        self.completed += 1
        self._sum_exec += exec_s
        self._sum_act += act_s
        st = a.stats  # KindStats.act, inline (the hot path: a method call is over its call budget)
        st.act = act_s if st.act == 0.0 else st.act + ACT_ALPHA * (act_s - st.act)
        if g.restore and g.gpus and self.planner == "priced":
            # the hold included the restore the grant asked for: learn the call, not the copy
            exec_s = max(0.1 * exec_s, exec_s - self._gpu.restore_lat(self._place.restore_cost(a.spec.service),
                                                                      len(g.gpus)))
        self._learn.completion(a, g.units, exec_s, msp, rerun, parallelism)
        if aid in self._fallback.ids:  # recorded by the fallback (an inline check: the hot path)
            self._fallback.ended(aid, exec_s, g.units, act_s)

    def _drop_queued(self, aid: int) -> bool:
        a = self._live.get(aid)
        if a is None or a.grant is not None:
            return False
        self._queue.remove(a)
        del self._live[aid]
        a.stats.inflight -= 1
        if aid in self._fallback.ids:
            self._fallback.dropped(aid)
        return True

    def _cancel(self, aid: int, now: float) -> None:
        if self._drop_queued(aid):
            self.cancelled += 1
            return
        if aid in self._running:
            self.cancelled += 1
            self._release(aid, now, failed=True)
        # unknown ids (already released, or rejected) are ignored: cancellation races are normal
