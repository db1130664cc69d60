"""Priced moldable sizing of elastic CPU actions, decided at admission.

An admitted elastic CPU action gets the size that minimises ``T(m) * (1 + mu * m)`` at the current
*clearing price* ``mu`` (:mod:`.pricing`): the lowest price at which the cores that everyone
queued, plus everyone expected to arrive over a short window (counted at ``1 / load_target``),
would take at that price's sizes fit what is free now plus what running actions release within
the window.
Then **start or wait**: if its node has fewer free cores than that size, it starts on what is
free unless waiting for the expected releases finishes sooner (the reserved idle cores priced in);
a waiting action blocks the cores for everyone behind it, as FCFS admission does for any action
that does not fit.

Why this and not a split of all free units among the current candidates (the ``estimate``
planner): a split decided for who is here *now* drains the pool for whoever arrives a moment
later, and its remedy (simulating expected arrivals per plan) is costly and was still beaten by a
fixed DoP when the DoP cap is wide; the price needs no plan search, its sizes do not depend on an
action's (unknown) length, and it falls to zero exactly when nothing else wants the cores.
``max_price`` bounds the price: the most one core-second may cost in seconds of ACT. Without a
bound a momentary flood prices every action down to its minimum, which for well-parallel work is
wrong even for mean ACT (a perfectly parallel action costs the same core-seconds at any size) and
leaves the RL step at the mercy of one long action granted one core. Durations and efficiency
come from the kind's learned model (:mod:`.learn`).

An action's own kind, queued and expected, counts in its price only as far as shrinking that
kind saves capacity (``CpuSizing._demand_of``): a higher price makes room only where a
smaller size costs fewer core-seconds. Near-linear work (Amdahl 0.97 at cap 8) costs almost the
same core-seconds at any size, so pricing it down for its own queue or forecast serves no one
sooner; it turns the wait into a slower run that keeps its few cores after the queue has gone.
Counted in full, that lost 2.4-2.6 % of mean ACT to a fixed DoP of 8 at medium load, and 5-7 %
in an open loop at 75 % busy (docs/evaluation.md, "near-linear work").
"""

from __future__ import annotations

import math
from bisect import bisect_right
from collections.abc import Callable

from typing import Any

from ..spec import ActionSpec
from .action import Action, dur_min, spec_dur_min
from .learn import LONE, UP_MIN, KindStats
from .ledger import Ledger
from .pricing import PRICE_GRID, dop_at_price, dops_over_grid
from .queueing import FCFS_STATES, closed_fcfs_act, closed_wq, fcfs_states, mmc_wq
from .releases import ReleaseBook
from .fallback import Fallback

__all__ = ["CpuSizing", "RISK_MIN_RATIO", "RISK_Z"]

_EXPLORE_EVERY = 16  # every n-th arrival of a kind at price 0 re-checks its declared size
_EXPLORE_UNITS = 4  # ... or, declared flat, runs on this many times its minimum
# a re-check (_EXPLORE_EVERY) is at no more than this many times the kind's size now when its
# runs report their parallelism (0: the declared size): paired with its size, one probe at twice
# the size measures the slope, and on a node of a few cores the declared size took the whole node
# for one flat run while the other trajectories' arrivals waited (4 trajectories on 8 cores,
# tests truly flat: 1.035x -> 1.019x the best fixed DoP's mean ACT; a machine fast again is
# noticed at the same arrival, tests/test_learn.py)
_PROBE_X = 2
# a kind's own demand counts in full in its price when shrinking it from its declared price-0
# size to its minimum saves at least this share of its core-seconds, in proportion below (Amdahl
# 0.9 at cap 8 saves 41 %, the calibrated workload's narrowest cap: its decisions do not move;
# 0.97 at cap 8 saves 17 %, 0.99 at cap 16 13 %)
_FULL_SAVING = 0.4
# the pricing window is at least this many times the run of the action's widest grant (its size at
# price zero) times the share of its node that grant holds: on a node only a few grants wide, one
# grant holds much of the node for its whole run, so the arrivals that find it taken are those of
# that run, not of 1/16 of a single-core run (open loop, 16 cores, Amdahl 0.9 at cap 16, 30 % busy:
# 1.083x the best fixed DoP with the 1/16 window alone, 1.015x with this). Below a quarter of a node
# it is under the 1/16 window for the workloads the matrix calibrates (Amdahl 0.9 at cap 64 on
# 256 cores: 0.046), so pools many grants wide decide as before (docs/evaluation.md, "narrow pools")
_RUN_SHARE = 1.6
# ... and the whole of those 1.6 runs on a pool fewer than this many of those grants wide, in
# proportion below (0: off). The price is the pool's: on a pool a few grants wide, the cores one
# grant takes are a large share of its supply for the whole run, and the arrivals that find them
# taken are those of that run, however the pool is split into nodes. Open loop, Amdahl 0.9 at cap
# 16 on 64 cores, 45 % busy: 1.072x the best fixed DoP (8) with the node's share alone (0.4 of a
# run), 0.995x with this. The matrix's light and medium pools are many nodes of 256 cores (cap 64
# on 15 nodes: 0.07 of a run, under the 1/16 window) and decide as before; a window of the whole
# run there cost the light cap-64 step 7 % and contended mean ACT up to 4 points
# (docs/evaluation.md, "a pool a few grants wide")
_POOL_GRANTS = 4
# an idle node less than this many of an action's priced grants wide is sized past the fragment
# its grant would leave (CpuSizing._past_fragment; 0: never): open loop, 16 cores, Amdahl 0.97 at
# cap 16, 30 % busy, 1.130x the best fixed DoP without it, 1.006x with it. The matrix's 256-core
# nodes (caps up to 64) are never that narrow, so they decide as before; its tiny 16-core cells,
# seeds 0-2, too (3 of 160 seed and cap pairs move, docs/evaluation.md, "fragments")
_FRAGMENT_GRANTS = 2
# ... while the spread of its kind's lengths (KindStats.spread: the log-variance, learned or, for a
# declared duration, of its runs; the right tail's for logs skewed left) is at most this (log-normal
# sigma 1.38). Open loop, Amdahl 0.97 at
# cap 16 on 16 cores, 30 % busy, ratio to the best fixed DoP without the rule / with it unbounded /
# with this bound: log-normal sigma 1.5 learned 1.173 / 1.416 / 1.201, declared 1.185 / 1.363 /
# 1.188 (the best fixed DoP is 8: short tests pass long ones); sigma 1 (the matrix's tests) 1.055 /
# 0.998 / 0.998; exponential work (log-variance ~1.6) declared 1.130 / 0.994 / 1.006, learned
# 1.129 / 1.009 / 1.012 (docs/evaluation.md, "fragments")
_FRAGMENT_SPREAD = 1.9
# ... and past this log-variance (log-normal sigma 1.41), once _HEAVY_MIN runs have measured it,
# such a node is sized by the fixed DoP a G/G/c queue at the kind's rate says is best there
# (CpuSizing._heavy_dop: that DoP when idle, no more when busy): widely spread lengths make the
# wait behind a long run the cost, and a grant that leaves room lets short ones pass. Open loop,
# Amdahl 0.97 at cap 16 on 16 cores, log-normal sigma 1.5, 15 / 30 % busy, ratio to the best fixed
# DoP (8) without it / with it: learned 1.342 / 0.989, 1.201 / 1.009; declared 1.346 / 0.997,
# 1.188 / 0.920. Above the fragment rule's bound: exponential lengths (log-variance ~1.6) are not
# heavy, and their estimate, noisy early, crossed 1.9 often enough to cost 1-2 points
# (docs/evaluation.md, "heavy tails"). Since stop 66 their spread is their right tail's (~1.2,
# KindStats.spread): by their log-variance they crossed 2.0 too, in ~1 stream of 5 within its
# first few hundred runs, and one such stream on two 16-core nodes lost 1.295x to fifo16 ("the right tail")
_HEAVY_SPREAD = 2.0
_HEAVY_MIN = 64
# ... at the lower of the kind's windowed rate (32 arrivals) and its slow one (~512: learn.SLOW),
# as a fixed policy picks its DoP for the stream's load and keeps it through a burst. At the
# windowed rate alone the model chose 4 cores in each Poisson burst, and those slow runs were still
# in flight after it: Amdahl 0.97 at cap 16 on 16 cores, 30 % busy, log-normal sigma 1.5, ten
# streams of 5,000, 1.051 of fifo8 (8 of 10 losing); with the slow rate 1.007 (Amdahl 0.9 at 15 %:
# 1.030 -> 0.992; docs/evaluation.md, "the stream's rate")
_HEAVY_SLOW = True
# a busy node less than _FRAGMENT_GRANTS of an action's priced grants wide, its lengths not heavy,
# is granted no more than the fixed DoP a closed pool of the job's callers says is best there
# (CpuSizing._closed_dop) while the job has had at most this many actions in the system at once:
# a few coding trajectories on one node, where a wide grant made while others run leaves the next
# arrivals (the other trajectories' shells and tests) waiting for its whole run. Four trajectories
# on 8 cores, tests that gain 1.33x at 2 cores: 1.121x the mean ACT of two cores per test without
# it, 0.997x with it (benchmarks/tiny_busy.py --closed-off). More callers than this are an open stream, which
# the price serves (the model, O(n) a decision, converges to the open one), and the matrix's jobs
# pass it within their first arrivals, before any completion: they decide as before
_CLOSED_MAX = 64
# ... and only where that DoP's modelled mean ACT is at least this share below the priced size's:
# where the model is flat (an open stream on 16 cores, sizes 8-16 within 1 % of each other, its
# max-in-system a handful so the model applies) the price's size, which follows the pool's state,
# is kept. Open loop at 0: Amdahl 0.97 at 60 % busy 1.047x the best fixed DoP (1.040x without the
# cap), log-normal sigma 1.5 learned one cell losing (1.027); at 0.05 lengths learned, 75 % busy,
# 1.000 -> 1.034x; at 0.1 the open loops are as without the cap within noise, and the tiny busy
# cells keep their gains (benchmarks/tiny_busy.py --closed-off)
_CLOSED_GAIN = 0.1
# ... on a pool of one node of at most this many cores, with the exact chain of a fixed DoP
# (queueing.closed_fcfs_act) where it is small enough: there one request is a large share of the
# node, and a wide one at the head of the line blocks everything behind it, which servers of the
# mean request's (fractional) size do not see. Four trajectories on 4 cores, tests declared
# truly Amdahl 0.95: 1.023x the best fixed DoP's mean ACT with that model, 0.999x exact. Wider
# nodes keep it: on the open loop's 16-128 cores (one class, the chain small) the exact model
# moved cells both ways, lengths learned worst 1.096 -> 1.113, heavy tails 1 -> 2 losing
_EXACT_CORES = 8
# a hinted action is a step risk when its hint is its kind's one-in-a-thousand (z of 0.999) among
# the hints seen (KindStats.observe_hint)
RISK_Z = 3.09
# ... and at least this many times the mean hint: hints learned per sandbox are shrunk towards the
# kind's mean, so among sandboxes that barely differ the z-score alone would pick out noise
RISK_MIN_RATIO = 4.0


def _next_arrival(t: float, k: float, d: float) -> float:
    """An arrival's cost over its cost with the cores free, integrated over its arrival ``u ~
    U(0, t)`` into a run of ``t`` that holds them: waiting costs ``(t - u) * k`` (``k``: the
    wait itself and the cores left idle meanwhile, at their price), starting at once on the
    leftover costs ``d`` (``math.inf``: too few to start on), whichever is less."""
    x = d / k  # the wait beyond which starting on the leftover is cheaper
    return k * t * t / 2 if x >= t else k * x * x / 2 + (t - x) * d


class CpuSizing:
    """The price of cores, and the size it gives each elastic CPU action at admission.

    Given at construction: the ledger, the running actions, the learned kinds and the queue's
    per-spec counts (shared objects the core mutates; this reads them) and the pricing options.
    Its own state: the sizes per grid price per spec, the per-spec price smoothing, and memos
    keyed by the core's round number ``rnd`` (every method that uses them takes it)."""

    __slots__ = ("ledger", "_running", "_kinds", "_spec_queued", "default_duration", "lookahead",
                 "load_target", "price_horizon", "price_smoothing", "objective", "start_or_wait",
                 "_price_cap", "_cap_overload", "_price_ewma", "_dops", "book", "_price_memo", "_market_memo", "_probe", "_ncpus",
                 "_expected", "_node_max", "_pop", "fallback")

    def __init__(self, ledger: Ledger, running: dict[int, Action], kinds: dict[str, KindStats],
                 spec_queued: dict[ActionSpec, int], *, default_duration: float, lookahead: bool,
                 load_target: float, price_horizon: float, price_smoothing: float, max_price: float,
                 objective: str, start_or_wait: bool, supply: str = "estimate",
                 fallback: bool = False) -> None:
        self.ledger = ledger
        self._running = running
        self._kinds = kinds
        self._spec_queued = spec_queued
        self.default_duration = default_duration
        self.lookahead = lookahead
        self.load_target = load_target
        self.price_horizon = price_horizon
        self.price_smoothing = price_smoothing
        self.objective = objective
        self.start_or_wait = start_or_wait
        self._price_cap = max(i for i, mu in enumerate(PRICE_GRID) if mu <= max_price)
        # under a sustained overload, "act" runs everyone at the minimum (throughput-optimal for
        # mean ACT); the others keep the price bounded so no elastic action runs below the size
        # max_price implies (one long action on one core otherwise sets the RL step)
        self._cap_overload = objective != "act"
        self._price_ewma: dict[ActionSpec, float] = {}
        # size per grid price, demand weight and pricing window (a share of the run at the minimum),
        # per spec, learned exponent and upgrade (_demand_of)
        self._dops: dict[tuple[ActionSpec, float, float | None], tuple[tuple[int, ...], float, float]] = {}
        self.book = ReleaseBook(ledger.node_of, len(ledger.node_size),  # running actions' releases
                                expected=supply == "expected")
        self._price_memo: dict[tuple[int, ActionSpec], int] = {}
        self._market_memo: dict[tuple[int, ActionSpec], Any] = {}
        self._probe = 0  # round keys below zero: prices asked between rounds (price_now)
        self._ncpus = len(ledger.pool.cpus)  # free_cpus below it: some running action holds cores
        # how running actions' releases count in the supply: at their end estimates (the line), or
        # each by its probability of ending within the window (supply.py)
        self._expected = supply == "expected"
        self._node_max = max(ledger.node_size) if ledger.node_size else 1
        self._pop = 0  # the most actions in the system (running and queued) seen at a decision
        # the fixed DoPs a user could pick, replayed on the stream: the one to fall back to while
        # sizing is measurably behind it (fallback.py)
        self.fallback = Fallback(tuple(ledger.node_size), enabled=fallback)

    def forget_releases(self) -> None:
        """Running actions' cores changed within the round (a malleable resize): rebuild the
        release line at its next use."""
        self.book.reset(self._running.values())

    def price_now(self, a: Action, now: float) -> int:
        """Index in PRICE_GRID of the clearing price for ``a``'s cores at ``now``, unsmoothed and
        not memoised: asked outside admission (a restart check), so no round's memo may answer
        it and it must not move the per-spec smoothing that admission uses."""
        self._probe -= 1
        self.book.forget_line()
        return self._clearing(a, now, self._probe)

    def _window(self, a: Action) -> float:
        """Seconds of the pricing window for ``a``: ``price_horizon`` of its run at its minimum,
        or longer on a node or a pool only a few of its widest grants wide (:data:`_RUN_SHARE`,
        :data:`_POOL_GRANTS`)."""
        return self._demand_of(a.spec)[2] * dur_min(a)

    def _rel_fn(self, spec: ActionSpec) -> Callable[[int], float]:
        """``m -> T(m)/T(min)`` for ``spec`` as its kind has learned it."""
        st = self._kinds.get(spec.kind)
        if st is None:
            return spec.relative_duration
        return lambda m: st.rel(spec, m)

    def dops_of(self, spec: ActionSpec) -> tuple[int, ...]:
        """Units ``spec`` would take at each grid price, under its kind's learned efficiency
        (memoised per spec until that moves)."""
        return self._demand_of(spec)[0]

    def _demand_of(self, spec: ActionSpec) -> tuple[tuple[int, ...], float, float]:
        """``(sizes, weight, window)`` for ``spec``: its sizes per grid price (:meth:`dops_of`);
        the weight, how much of each of its queued or
        expected actions counts in its own kind's price: the share of its core-seconds that
        shrinking it from its price-0 size to its minimum saves, relative to :data:`_FULL_SAVING`
        (at most 1). A price that shrinks near-linear work frees almost no capacity, only reorders
        who runs. The saving is the *declared* efficiency's: the learned exponent drifts above 1
        in contended cells of Amdahl 0.9 tests (sizes granted in a backlog complete with other
        lengths than sizes granted in a lull), and a weight following it moved the straggler
        lottery of the matrix's contended steps (one two-step cell 166 -> 240 s); and the pricing
        window, as a share of its run at its minimum (:meth:`_window`). Memoised per spec, learned
        exponent and upgraded shape: the market asks for all three per spec and round."""
        st = self._kinds.get(spec.kind)
        up = st.up if st is not None else None
        key = (spec, st.beta if st is not None else 1.0, up)
        hit = self._dops.get(key)
        if hit is None:
            if len(self._dops) > 4096:
                self._dops.clear()
            units = range(spec.min_units, spec.max_units + 1)
            # declared (see the docstring), unless measured parallelism upgraded the kind's shape:
            # that is a fit to paired evidence, not a drift of lengths across sizes
            rel = spec.relative_duration if up is None else self._rel_fn(spec)
            lo = spec.min_units
            full = dop_at_price(rel, units, 0.0)
            saving = 1.0 - lo / (full * rel(full)) if full > lo else 0.0
            win = self.price_horizon
            if win > 0:  # a window of zero is the caller's choice: no forecast, no releases
                # the declared run, as for the weight (the learned exponent's drift would move it)
                run = _RUN_SHARE * rel(full)
                win = max(win, run * full / self._node_max,
                          run * min(1.0, _POOL_GRANTS * full / max(1, self._ncpus)))
            hit = self._dops[key] = (dops_over_grid(self._rel_fn(spec), units),
                                     min(1.0, max(0.0, saving) / _FULL_SAVING), win)
        return hit

    def spec_d0(self, spec: ActionSpec) -> float:
        """Seconds ``spec`` runs at its minimum units, from what its kind has learned."""
        return spec_dur_min(spec, self._kinds.get(spec.kind), self.default_duration)

    def check_book(self) -> None:
        """Raise AssertionError if the release book disagrees with the running grants."""
        if not self.book.live:
            return
        want = sorted((a.id, a.est_end, len(a.grant.cpus)) for a in self._running.values()
                      if a.grant is not None and a.grant.cpus)
        have = self.book.entries()
        if have != want:
            raise AssertionError(f"release book {have[:4]}... != running grants {want[:4]}...")

    def _market(self, a: Action, now: float, rnd: int) -> Callable[[float], int]:
        """``supply -> price index``: the clearing price for ``a``'s cores if ``supply`` cores
        were free (memoised per round and spec). The lowest price at which the cores wanted by
        everyone queued, plus everyone expected to arrive within the window (a fixed fraction of
        ``a``'s duration at its minimum, weighted ``1 / load_target``), fit the supply."""
        key = (rnd, a.spec)
        memo = self._market_memo
        hit: Callable[[float], int] | None = memo.get(key)
        if hit is not None:
            return hit
        if len(memo) > 64:
            memo.clear()
        tau = self._window(a)
        ahead = 1.0 / self.load_target
        # demand per distinct spec: a count (queued) or expected count in the window (arriving),
        # with its size per price (elastic CPU) or its fixed need. ``a``'s own kind counts at its
        # weight (_demand_of): pricing near-linear work down makes no room, for itself or its kind
        # (another kind's demand counts in full: what it takes at its sizes is gone for ``a``)
        own = a.spec.kind
        fixed = 0.0
        backlog = 0.0  # the queue at minimum sizes
        elastic: list[tuple[float, tuple[int, ...]]] = []
        for spec, n in self._spec_queued.items():
            if spec.cpus:
                if spec.elastic_resource == "cpu":
                    sizes, w, _ = self._demand_of(spec)
                    backlog += n * sizes[-1]
                    elastic.append((n * w if spec.kind == own else n, sizes))
                else:
                    fixed += n * spec.cpus
        backlog += fixed
        if self.lookahead:
            for st in self._kinds.values():
                spec = st.spec
                if spec is None or not spec.cpus or (st.lone >= LONE and st is a.stats):
                    continue  # one caller's loop does not arrive while its own action runs
                n_in = st.window_rate(now) * tau * ahead
                if n_in <= 0:
                    continue
                if spec.elastic_resource == "cpu":
                    sizes, w, _ = self._demand_of(spec)
                    elastic.append((n_in * w if spec.kind == own else n_in, sizes))
                else:
                    fixed += n_in * spec.cpus
        top = len(PRICE_GRID) - 1
        cap = self._price_cap
        cap_overload = self._cap_overload
        always = self.objective == "step"  # the floor holds even under a backlog

        seen: dict[float, int] = {}
        demands: dict[int, float] = {}  # grid index -> demand there (the same for every supply)

        def index(supply: float) -> int:
            if supply in seen:
                return seen[supply]

            def fits(gi: int) -> bool:
                demand = demands.get(gi)
                if demand is None:
                    demand = fixed
                    for n, sizes in elastic:
                        demand += n * sizes[gi]
                    demands[gi] = demand
                return demand < supply + 1.0  # expected arrivals: less than one core is no one's

            lo, hi = 0, top
            if not fits(lo):
                while lo < hi:  # first feasible index: demand only falls as the price rises
                    mid = (lo + hi) // 2
                    if fits(mid):
                        hi = mid
                    else:
                        lo = mid + 1
            if lo > cap and (always or lo < top or fits(top) or (cap_overload and backlog <= supply)):
                # a flood of expected arrivals is priced at most max_price; only a backlog the
                # pool cannot absorb even at minimum sizes (or any overload, with objective "act")
                lo = cap
            seen[supply] = lo
            return lo

        memo[key] = index
        return index

    def _clearing(self, a: Action, now: float, rnd: int) -> int:
        """The clearing price index for ``a``'s cores at ``now``: supply is what is free plus what
        running actions release within the pricing window. Inlined in :meth:`_cpu_price`, the
        hot path.

        ``supply="expected"``: a price that is zero on the free cores alone stays zero with more
        supply, and with nothing running there is nothing to release, so the window's sum
        (supply.py, a pass over the running actions) is skipped then."""
        market = self._market(a, now, rnd)
        free = self.ledger.free_cpus
        if not self._expected:
            return market(free + self._line_by(now, a, rnd))
        lo = market(free)
        if lo and free < self._ncpus:
            lo = market(free + self.book.supply(now, rnd, self._running).by(now + self._window(a)))
        return lo

    def _line_by(self, now: float, a: Action, rnd: int) -> int:
        """Cores the release line expects back by the end of the pricing window."""
        line = self.book.line(now, rnd, self._running)
        tw = now + self._window(a)
        if tw >= line.known_before:  # Line.cores_by, inline
            line.compute(tw)
        i = bisect_right(line.times, tw)
        return line.cum[i - 1] if i else 0

    def _cpu_price(self, a: Action, now: float, rnd: int) -> int:
        """Index in PRICE_GRID of the price ``a`` is sized at now: the clearing price for the
        supply now, smoothed per spec (memoised per round and spec). Smoothing keeps one pair
        of close arrivals from pricing the next action down to a sliver while the pool frees up."""
        key = (rnd, a.spec)
        memo = self._price_memo
        hit = memo.get(key)
        if hit is not None:
            return hit
        if len(memo) > 64:
            memo.clear()
        market = self._market(a, now, rnd)  # _clearing, inline
        free = self.ledger.free_cpus
        if not self._expected:
            line = self.book.line(now, rnd, self._running)  # _line_by, inline
            tw = now + self._window(a)
            if tw >= line.known_before:
                line.compute(tw)
            i = bisect_right(line.times, tw)
            lo = market(free + (line.cum[i - 1] if i else 0))
        else:
            lo = market(free)
            if lo and free < self._ncpus:
                lo = market(free + self.book.supply(now, rnd, self._running).by(now + self._window(a)))
        sm = self.price_smoothing
        if sm and lo < len(PRICE_GRID) - 1:
            prev = self._price_ewma.get(a.spec)
            x = float(lo) if prev is None else (1 - sm) * prev + sm * lo
            self._price_ewma[a.spec] = x
            lo = min(int(round(x)), self._price_cap)
        memo[key] = lo
        return lo

    def _past_fragment(self, a: Action, want: int, free: int, gi: int, now: float, explore: bool) -> int:
        """The size for ``a`` on an idle node less than two of its priced grants wide: from
        ``want`` (its price's) up to the whole node, the one that minimises its own priced cost
        plus what the leftover costs the next arrival of its kind. A grant of 12 of 16 idle cores
        leaves 4, and the next arrival, likely within the run, either starts on them (slowly) or
        waits for this one's release; the price, which counts that arrival as a fraction of one
        (a mean over many grants), cannot see either. The next arrival is expected at the kind's
        rate, uniformly over this one's run, and takes the better of the leftover at its price
        or waiting (the reserved idle cores priced in, as start-or-wait prices them); its cost
        with the cores free is its priced cost at ``want``. Nothing else runs on the node, so
        this one's release is the only one in sight: the model holds exactly there (with other
        actions running, their end estimates would stand in for their releases, and in the tiny
        closed-loop cells that moved steps both ways: docs/evaluation.md, "fragments"). Not for
        a kind whose lengths are spread wider than :data:`_FRAGMENT_SPREAD`: there the next
        arrival's wait behind a long one dominates, and smaller grants that let short ones pass
        beat the whole node. Wider still (:data:`_HEAVY_SPREAD`), the node is sized as the best
        fixed DoP there (:meth:`_heavy_dop`), up or down from ``want``, the whole node (``want ==
        free``) included. Otherwise a whole-node ``want`` is sized by :meth:`_whole_node`."""
        st = a.stats
        mu = PRICE_GRID[gi]
        if st.lone >= LONE or math.isinf(mu):
            return want
        spread = st.spread()
        heavy = self._heavy_dop(a, free, now, spread)
        if heavy is not None:
            return heavy
        if want >= free:  # an explored size is there to be measured; no lookahead, no forecast
            return self._whole_node(a, want, free, mu, now) if self.lookahead and not explore else want
        if spread > _FRAGMENT_SPREAD:
            return want
        lam = st.window_rate(now)
        if lam <= 0.0:
            return want
        rel = self._rel_fn(a.spec)
        d0 = dur_min(a)
        lo = a.spec.min_units
        base = d0 * rel(want) * (1.0 + mu * want)  # the next arrival's cost with the cores free
        best, best_m = math.inf, want
        for m in range(want, min(free, a.spec.max_units) + 1):
            t = d0 * rel(m)
            r = free - m
            k = 1.0 + mu * r  # per second of waiting: the wait itself and the r idle cores
            rm = min(r, want)
            extra = _next_arrival(t, k, d0 * rel(rm) * (1.0 + mu * rm) - base if r >= lo else math.inf)
            c = t * (1.0 + mu * m) + (1.0 - math.exp(-lam * t)) * extra / t
            if c < best * (1.0 - 1e-12):
                best, best_m = c, m
        return best_m

    def _whole_node(self, a: Action, want: int, free: int, mu: float, now: float) -> int:
        """The size for ``a`` when its price's size is the whole idle node: from its minimum up
        to ``want``, the one that minimises its own priced cost plus the waits of what arrives,
        of any kind, during its run. At the whole node every arrival waits out the run, and the
        price, which counts arrivals as core demand spread over many grants, does not see that
        wait: two trajectories on 2 cores (``tangram demo``), tests declared Amdahl 0.95 that gain
        1.33x at 2 cores on a busy machine, took both cores for every test while the other
        trajectory's 0.4-s shells waited 0.6 s each (1.16x the mean ACT of one core per action,
        simulated). Arrivals come at their kinds' windowed rates, ``lam * t`` of them during a
        run of ``t``, each ``t / 2`` into it on average; with cores left over, a fixed-size
        arrival (one core) starts at once and an elastic one, of ``a``'s kind or another's (priced
        as ``a``'s own: counted as blocked outright they cost the two-kind open loop 1-2 % at
        light load), starts on them or waits, whichever costs it less (as
        :meth:`_past_fragment` prices the leftover). Not for an explored size, nor without
        lookahead (the caller's choice: no forecast)."""
        st = a.stats
        lam_own = st.window_rate(now)
        lam_oth = 0.0
        for other in self._kinds.values():
            if other is not st and other.spec is not None and other.spec.cpus:
                if other.spec.elastic_resource == "cpu":
                    lam_own += other.window_rate(now)
                else:
                    lam_oth += other.window_rate(now)
        if lam_own + lam_oth <= 0.0:
            return want
        rel = self._rel_fn(a.spec)
        d0 = dur_min(a)
        lo = a.spec.min_units
        base = d0 * rel(want) * (1.0 + mu * want)  # the next own arrival's cost with the cores free
        best, best_m = math.inf, want
        for m in range(want, lo - 1, -1):
            t = d0 * rel(m)
            r = free - m
            k = 1.0 + mu * r  # per second of waiting: the wait itself and the r idle cores
            rm = min(r, want)
            own = _next_arrival(t, k, d0 * rel(rm) * (1.0 + mu * rm) - base if r >= lo else math.inf)
            oth = 0.0 if r >= 1 else own  # a fixed-size arrival (one core) starts on any leftover
            # lam * t arrivals, each costing the mean of its kind's cost over the run (own / t)
            c = t * (1.0 + mu * m) + lam_own * own + lam_oth * oth
            if c < best * (1.0 - 1e-12):
                best, best_m = c, m
        return best_m

    def _closed_dop(self, a: Action, cores: int, want: int, now: float) -> int | None:
        """The DoP (at most ``cores``, the node) a fixed policy would best use for ``a``'s kind
        when the job is a closed pool of a few callers (at most :data:`_CLOSED_MAX` actions ever
        in the system at once, ``n``): each caller alternates an action with thinking ``z``
        seconds (a trajectory's generation), so ``n / (R + z)`` is the arrival rate of every CPU
        kind together at their mean ACTs ``R`` (Little), which gives ``z``. On one node of at most
        :data:`_EXACT_CORES` the mean ACT at each size ``d`` is the exact chain's
        (queueing.closed_fcfs_act: ``a``'s kind at ``d``, the others as one class of their mean
        size and length) while small enough. Otherwise each size makes the pool's cores (the
        rates are the pool's) ``c`` servers of the load-weighted mean action (``a``'s kind at
        ``d``, the others at their minimum), and the mean ACT is that action's run plus the wait
        of the closed queue (queueing.closed_wq). None without rates or ACTs
        yet, when ``n`` does not cover what the rates and ACTs say is in the system (not a closed
        pool then), or when the best size is not :data:`_CLOSED_GAIN` better than ``want``."""
        st = a.stats
        n = self._pop
        lam = st.window_rate(now)
        if lam <= 0.0 or st.act == 0.0 or n > _CLOSED_MAX:
            return None
        lam_all = lam
        in_system = lam * st.act
        load_o = 0.0  # the other kinds' core-seconds per second
        work_o = 0.0  # ... and action-seconds per second
        for other in self._kinds.values():
            spec = other.spec
            if other is st or spec is None or not spec.cpus:
                continue
            r = other.window_rate(now)
            if r <= 0.0:
                continue
            t = spec_dur_min(spec, other, self.default_duration)
            lam_all += r
            load_o += r * t * (spec.min_units if spec.elastic_resource == "cpu" else spec.cpus)
            work_o += r * t
            in_system += r * (other.act or t)
        z = (n - in_system) / lam_all
        if z <= 0.0:
            return None
        rel = self._rel_fn(a.spec)
        d0 = dur_min(a)
        best, best_d = math.inf, None
        at_want = math.inf
        share = lam / lam_all
        others = (() if work_o <= 0.0 else
                  ((1.0 - share, max(1, min(cores, round(load_o / work_o))), work_o / (lam_all - lam)),))
        exact = self._ncpus == cores <= _EXACT_CORES and fcfs_states(n, 1 + len(others)) <= FCFS_STATES
        for d in range(min(cores, a.spec.max_units), a.spec.min_units - 1, -1):
            t = d0 * rel(d)
            if exact:
                act = closed_fcfs_act(n, cores, z, ((share, d, t), *others))
            else:
                work = lam * t + work_o
                c = self._ncpus * work / (lam * t * d + load_o)
                tbar = work / lam_all
                act = tbar + closed_wq(n, c, tbar, z)
            if d == want:
                at_want = act
            if act < best * (1.0 - 1e-12):
                best, best_d = act, d
        if best > at_want * (1.0 - _CLOSED_GAIN):
            return None
        return best_d

    def _heavy_dop(self, a: Action, cores: int, now: float, spread: float) -> int | None:
        """For a kind whose lengths are heavy tailed (``spread``, its :meth:`KindStats.spread`,
        above :data:`_HEAVY_SPREAD`, measured by :data:`_HEAVY_MIN` runs) and arriving at a rate:
        the DoP a fixed policy would best use on a node of ``cores`` at that rate. Each size ``d``
        makes ``cores // d`` servers of a G/G/c queue whose mean ACT is the run plus the
        Allen-Cunneen wait: the M/M/c wait times (1 + scv) / 2, scv the lengths' squared
        coefficient of variation (log-normal: e^spread - 1). With heavy tails that wait, behind a
        long run holding the node, is what a wide grant costs, and the price, which sizes for
        core-seconds, does not count it. The rate is the stream's, not a burst's (the lower of the
        windowed and the slow rate, :data:`_HEAVY_SLOW`). None otherwise, or when every size
        would overload."""
        st = a.stats
        if spread <= _HEAVY_SPREAD or (st.declared[0] if a.spec.duration is not None
                                       else st.t1_samples) < _HEAVY_MIN:
            return None
        lam = st.window_rate(now)
        if lam <= 0.0:
            return None
        if _HEAVY_SLOW:
            slow = st.slow_rate()
            if 0.0 < slow < lam:
                lam = slow
        rel = self._rel_fn(a.spec)
        d0 = dur_min(a)
        var = math.exp(spread) / 2.0  # (1 + scv) / 2
        best, best_d = math.inf, None
        for d in range(min(cores, a.spec.max_units), a.spec.min_units - 1, -1):
            c = cores // d
            s = d0 * rel(d)
            off = lam * s  # offered load in servers
            if off >= c:
                continue
            act = s + var * mmc_wq(c, off, s)
            if act < best * (1.0 - 1e-12):
                best, best_d = act, d
        return best_d

    def _stranding(self, a: Action, node: int, d: int, since: float) -> bool:
        """Whether a running action of ``a``'s kind on ``node``, granted before ``since`` (the
        fallback's switch to ``d``), holds a number of cores that ``d`` does not divide."""
        st = a.stats
        for r in self._running.values():
            g = r.grant
            if r.stats is st and r.node == node and r.started < since and g is not None and len(g.cpus) % d:
                return True
        return False

    def units(self, a: Action, node: int, node_free: list[int], span: bool, now: float,
              rnd: int) -> tuple[int, float | None]:
        """Cores for elastic CPU action ``a`` at its price, or 0 to wait for more, and when a
        waiting one should be re-decided (None: not waiting). Waiting until
        the next releases on its node is chosen when that finishes sooner, counting the wait of
        everyone queued behind it and the idle reserved cores at the price then, than starting
        now on what is free at the price now."""
        fb = self.fallback
        if fb.mode is not None and fb.kind == a.spec.kind and not span:  # fb.fixed(kind), inline
            # behind the best fixed DoP on this stream: run as it would, in FIFO order
            d = min(max(fb.mode, a.spec.min_units), a.spec.max_units)
            free = node_free[node]
            if free >= d:
                return d, None
            if free >= a.spec.min_units and self._stranding(a, node, d, fb.at):
                # cores the replay's FIFO of d never strands: a grant of the kind sized before
                # this DoP began, of a size d does not divide, still runs on the node. Left idle,
                # they cost for as long as that run lasts: a 1-core run of 74 s (heavy tails)
                # left 3 of 16 cores idle under a burst, the queue reached 91 and the stream went
                # 0.852 -> 1.163 of fifo4's mean ACT (docs/evaluation.md, "ten seeds"). Fixed-size
                # kinds strand the replay's cores too, and grants made here end: neither counts.
                # The head takes them only where that ends it sooner than waiting for d (start
                # or wait): taken at once, a near-linear stream's heads ran on 3-5 of 8 cores
                # while the d cores came back within a run (0.97:16:16 at 60 % busy, 1,500
                # arrivals, seed 2: 1.052 of fifo8 without the fallback, 1.124 with it)
                back = self.book.line(now, rnd, self._running).node(node).when(d - free)
                rel = self._rel_fn(a.spec)
                t1 = dur_min(a)
                if now + t1 * rel(free) < back + t1 * rel(d):
                    return free, None
            return 0, None
        gi = self._cpu_price(a, now, rnd)
        dops = self.dops_of(a.spec)
        want = dops[gi]
        st = a.stats
        explore = False
        if gi == 0 and st.beta < 1.0 and st.arrivals % _EXPLORE_EVERY == 0:
            # a kind learned to gain less than declared still gets, now and then while cores are
            # idle anyway, the size its declaration asks for (measured: at most _PROBE_X times its
            # size now): how a machine that has become fast again is noticed
            probe = dop_at_price(a.spec.relative_duration, range(a.spec.min_units, a.spec.max_units + 1), 0.0)
            if st.measured and _PROBE_X:  # its parallelism is paired with its size: no need to go wide
                probe = min(probe, _PROBE_X * want)
            want = max(want, probe)
            explore = True
        elif (gi == 0 and want == a.spec.min_units < a.spec.max_units and st.up is None
              and (st.measured or not st.t1_samples) and not st.slope_measured
              and (st.up_n < UP_MIN or st.arrivals % _EXPLORE_EVERY == 0)):
            # a kind whose declaration (or whose evidence so far) says more cores do not help,
            # but whose runs report their parallelism (or, before its first completion, may): on
            # cores idle anyway, a few more, so a declaration too modest (Amdahl(0.0) for tests
            # that scale) is measured wrong (learn.KindStats._upgrade). Every time until UP_MIN
            # such runs have reported (a job's opening burst arrives before any completion), then
            # every _EXPLORE_EVERY-th: a machine that got faster is noticed too. Not a kind whose
            # runs measured a slope (slope_measured): there "no speedup" is an answer, and exploring
            # it again put the loaded 2-core demo 6 % behind static sandboxes
            want = min(a.spec.max_units, _EXPLORE_UNITS * a.spec.min_units)
            explore = True
        risk = a.risk
        full = dops[0]
        if risk and a.hint is not None:
            # a step risk is worth as many of its kind's actions as its hint is long: its cores
            # cost the (bounded) price divided by that, and below that size it waits whenever
            # waiting ends it sooner, not counting the queue behind it (its end is the step's)
            mu = PRICE_GRID[min(gi, self._price_cap)] * st.hint_mean() / a.hint
            want = full = max(want, dop_at_price(self._rel_fn(a.spec),
                                                 range(a.spec.min_units, a.spec.max_units + 1), mu))
        free = sum(node_free) if span else node_free[node]
        if self._pop <= _CLOSED_MAX:  # past it the job is an open stream for good: no need to count
            pop = len(self._running) + sum(self._spec_queued.values())
            if pop > self._pop:
                self._pop = pop
        if (want <= free < _FRAGMENT_GRANTS * want and not span and not risk and self.start_or_wait
                and free == self.ledger.node_size[node] and (want < free or st.lone < LONE)):
            want = self._past_fragment(a, want, free, gi, now, explore)
        elif (not span and not risk and self.start_or_wait and st.lone < LONE
                and self.ledger.node_size[node] < _FRAGMENT_GRANTS * want):
            # the same node with others running: no larger than the best fixed DoP there either
            # (heavy tails; or, for a closed pool of a few callers, what _closed_dop says; the
            # idle node stays the price's and _past_fragment's: a fixed DoP there gave up the
            # whole-node grants that win an open stream at light load)
            size = self.ledger.node_size[node]
            heavy = self._heavy_dop(a, size, now, st.spread())
            if heavy is None and free < size and self.lookahead and not explore:
                heavy = self._closed_dop(a, size, min(want, size), now)
            if heavy is not None and heavy < want:
                want = full = min(full, heavy)  # and start-or-wait waits for no more
        start = min(want, free)
        if not self.start_or_wait or span or start >= full:
            return start, None
        # objective "step": at the bound, no action starts below the size max_price implies while
        # the cores for it are expected back within its own run at that size (one long action
        # started on a core or two during a flood sets the RL step). For "balanced" this cost more
        # than it saved: in the quick contended cells it held actions waiting for the floor and
        # the step got worse (1.06 -> 1.45), and it did not save the full seed-2 straggler.
        floor = dops[gi] if gi == self._price_cap and self.objective == "step" else a.emin
        line = self.book.line(now, rnd, self._running)
        market = self._market(a, now, rnd)
        # the clearing price when each awaited release is back: the supply then is what is free
        # now plus what is expected back by then and over the pricing window: read off the pool's
        # line, or (``supply="expected"``, supply.py) summed for a few releases at a time; zero on
        # the free cores alone, it stays zero
        horizon = self._window(a)
        free_all = self.ledger.free_cpus
        rel = self._rel_fn(a.spec)
        d0 = a.hint if risk and a.hint is not None else dur_min(a)
        behind = sum(n for spec, n in self._spec_queued.items() if spec.cpus) - 1
        best = d0 * rel(start) if start >= floor else math.inf
        patience = d0 * rel(floor)
        best_m, best_w = start, 0.0
        have = free
        expected = self._expected
        esup = None
        if expected and free_all < self._ncpus and market(free_all):
            esup = self.book.supply(now, rnd, self._running)
        sup: list[float] = []
        sup_at = 0
        ptimes, pcum = line.times, line.cum
        # the walk reads the node's line release by release: inline, the reads a round makes
        # most (Line iteration, without its calls)
        nline = line.node(node)
        ntimes, ncores = nline.times, nline.cores
        i = 0
        while True:
            if i == len(ntimes) and not nline.more():
                break
            t = ntimes[i]
            k = ncores[i]
            i += 1
            w = t - now
            if w >= best or w > patience:  # nothing that starts later can finish sooner
                break
            have += k
            if risk:
                m = min(have, want)
                if m <= start:
                    continue
                c = w + d0 * rel(m)
            else:
                if have <= start or have < floor:  # at any price: m = min(have, dops[gk]) <= have
                    continue
                if not expected:
                    tw = t + horizon
                    if tw >= line.known_before:
                        line.compute(tw)
                    j = bisect_right(ptimes, tw)
                    gk = market(free_all + (pcum[j - 1] if j else 0))
                elif esup is None:
                    gk = 0
                else:
                    b = i - 1 - sup_at
                    if b >= len(sup):  # the supply at this release and the next few, in one pass
                        while len(ntimes) < i - 1 + 2 * len(sup) + 8 and nline.more():
                            pass
                        sup_at, b = i - 1, 0
                        sup = esup.by_each([x + horizon for x in ntimes[i - 1:i + 2 * len(sup) + 7]])
                    gk = market(free_all + sup[b])
                m = min(have, dops[gk])
                if m <= start or m < floor:
                    continue
                mu = PRICE_GRID[gk]
                idle = 0.0 if math.isinf(mu) else mu * free * w
                c = w * (1 + behind) + d0 * rel(m) + idle
            if c < best:
                best, best_m, best_w = c, m, w
            if have >= full:
                break
        if best_m == start:  # includes: no release in sight that would reach the floor
            return start, None
        return 0, now + best_w  # re-decide when the awaited cores should be back, even if late
