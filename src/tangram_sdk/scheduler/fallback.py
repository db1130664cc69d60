"""The fallback: replay the stream under the fixed DoPs a user could have picked, and fall back
to the best of them while elastic sizing is measurably behind it.

Why: the bar Tangram is held to is "never worse than the fixed policy a user would otherwise
pick". Pricing and start-or-wait get close to it from a model of the pool; the fallback checks it
on the stream itself. Every CPU action's arrival and, once it ends, its run are replayed, in
arrival order, through one strict-FIFO copy of the pool per candidate DoP ``d``: the elastic
kind at ``d`` cores (a run of ``t`` on ``m`` cores takes ``t * S(m) / S(d)``), every fixed-size
action as it ran, exactly what ``Scheduler(elastic=False)`` with that DoP would do. On an open
stream (arrivals that do not depend on the scheduler) the replay is that policy's counterfactual
on the same arrivals and lengths: a paired comparison, with none of the noise of two separate
runs. In a closed loop
(trajectories whose next action waits on this one) it is an approximation: the replay sees the
arrivals the realised run produced, not those the fixed policy would have (a job running faster
submits sooner, which makes the replay of the slower policy busier than it would be).

The comparison is on blocks of ``_BLOCK`` samples (a queue's samples correlate; its block means
much less): a candidate is ahead when its mean ACT is ``_MARGIN`` below the other's and the
block differences put that ``_T`` standard errors from zero, over at least ``_MIN_BLOCKS``
blocks (the stream's first ``_WARMUP`` blocks left out: what the core learns is still settling).

- elastic sizing, and the best fixed DoP is ahead of it on the blocks elastic sizing ran: use
  that DoP (FIFO, exactly ``d`` cores, as the replay does);
- fixed at ``d``, and another candidate is ahead of ``d`` since the switch: use that one;
- fixed, and the load moved (the DoP's share of the pool by ``_SHIFT``): try elastic sizing
  again on a fresh record; or fixed for ``_EXPLORE`` blocks (doubling after each trial that
  loses): try it again, its old record kept, so a trial that changes nothing costs a block.

Only a candidate whose replay keeps the pool under ``_MAX_UTIL`` busy is picked (the narrowest
always), and only for a kind whose speedups are declared (a declared duration: the core trusts
the declaration everywhere) or measured (its runs report their parallelism): the replay divides
by them, and a slope learned from durations alone is too far off for hundreds of completions.

Measured (docs/evaluation.md, "The fallback to a fixed DoP"): it needs ~1,300 samples before it
can act, so it serves long streams; shorter jobs' decisions are exactly as without it.

Scope: a pool of one node or several (no grant spans nodes; the replay places as ``Placement``
does), with a single elastic CPU kind, not malleable or restartable (those resize or rerun, which
the replay does not model). Anything else leaves the fallback off and decisions exactly as
without it. A kind whose lengths are heavy tailed (spread past ``_HEAVY``, ``KindStats.spread``) is recorded but
never switched: there the block test picks whichever DoP the last burst favoured.

At a fixed DoP, admission grants exactly it, FIFO, with one exception the replay has no need of:
cores stranded by a grant of the kind sized before the switch (a size the DoP does not divide)
go to the head of the line rather than idle for as long as that run lasts, where that ends it
sooner than waiting for the DoP's cores (``CpuSizing._stranding``).
"""

from __future__ import annotations

import heapq
from collections import deque
from typing import Any

__all__ = ["Fallback"]

_BLOCK = 32  # samples per block: the comparison is on block means (a queue's samples correlate)
_MIN_BLOCKS = 32  # blocks of a record before a comparison on it counts (1,024 samples)
_MAX_BLOCKS = 64  # the comparison's window: the latest blocks since the last switch
_T = 2.0  # how many standard errors of the block differences an advantage must clear
_MARGIN = 0.01  # ... and how large it must be, as a share of the mean ACT it is compared with
_WARMUP = 8  # blocks at the stream's start left out of every comparison (what is learned settles)
_EXPLORE = 32  # blocks at a fixed DoP before elastic sizing is tried again (doubles on a loss)
_TRIAL = 16  # blocks a trial of elastic sizing lasts, unless it falls clearly behind sooner
_SHIFT = 0.1  # a change in the fixed DoP's share of the pool, since the fallback, that is a new load
_MAX_PENDING = 1 << 16  # records waiting on an earlier one's end: past it, the fallback gives up
# a candidate whose replay asks more of the pool than this share of its cores is never picked
# (the narrowest excepted): over a short window an overloaded DoP can look best (its queue has not
# built up yet) and then leaves a backlog that no later switch undoes, and one near saturation
# loses the bursts that elastic sizing wins (0.9 let 0.97:16:32 on two nodes at 75 % busy switch
# to fifo4 at 82 %: 0.971 -> 1.010 of it over 5,000 arrivals)
_MAX_UTIL = 0.8
_KEEP = 1.0 - 1.0 / 1024  # the fading of the long record (which fixed DoP is best, and its load)
# past this spread of the kind's lengths (KindStats.spread, a log-variance: log-normal sigma 1.41; moldable._HEAVY_SPREAD, where
# the core sizes narrow nodes for heavy tails) the comparison does not hold and the fallback stands
# aside: a block's mean is one burst behind a long run, so which policy is ahead over 64 blocks is
# which one the last burst favoured. Log-normal sigma 1.5, 5,000 arrivals, ten seeds, 0.97:16:16 at
# 45 % busy: 1.066 of fifo4 with the fallback acting (switching on a burst, then meeting the next one
# at the wrong DoP: one seed 0.960 -> 1.235), 0.998 without (docs/evaluation.md, "ten seeds")
_HEAVY = 2.0


class _Fifo:
    """Nodes of the given sizes under strict FIFO, placed as the core places: an action starts
    when every earlier one has and a node has its cores free, the elastic kind on the node with
    the most free (room to grow), a fixed-size one on the fullest that fits (``Placement``)."""

    __slots__ = ("free", "ends", "last")

    def __init__(self, sizes: tuple[int, ...]) -> None:
        self.free = list(sizes)
        self.ends: list[tuple[float, int, int]] = []  # (end, node, cores) of the replayed actions running
        self.last = 0.0  # the latest start: FIFO never starts one earlier

    def run(self, arrival: float, k: int, dur: float, worst: bool = True) -> float:
        """Start the next arrival (``k`` cores for ``dur`` s; ``worst``: worst fit, else best);
        returns its end."""
        t = arrival if arrival > self.last else self.last
        ends, free = self.ends, self.free
        while ends and ends[0][0] <= t:
            _e, n, c = heapq.heappop(ends)
            free[n] += c
        while True:
            node = -1
            for i, f in enumerate(free):
                if f >= k and (node < 0 or (f > free[node] if worst else f < free[node])):
                    node = i
            if node >= 0:
                break
            e, n, c = heapq.heappop(ends)
            free[n] += c
            if e > t:
                t = e
        free[node] -= k
        self.last = t
        end = t + dur
        heapq.heappush(ends, (end, node, k))
        return end


class Fallback:
    """Per pool: the replay and the switch (see the module docstring). The core tells it of
    arrivals, ends and drops; admission asks :meth:`fixed` for the DoP to use, or None."""

    __slots__ = ("on", "_sizes", "_cores", "_widest", "kind", "_spec", "watch", "_pending", "ids", "_fifos", "_dops",
                 "_blk", "_blocks", "_all", "_busy", "_span", "_last", "_n", "mode", "_explore",
                 "_since", "_trial", "switches", "_elastic", "_util_at", "_shape", "_sp", "recording", "now", "at")

    def __init__(self, node_sizes: tuple[int, ...], enabled: bool = True) -> None:
        self.on = enabled and bool(node_sizes)
        self._sizes = tuple(node_sizes)
        self._cores = sum(node_sizes)  # the pool's, for the replays' utilisation
        self._widest = max(node_sizes, default=0)  # no grant spans nodes
        self.kind: str | None = None  # the one elastic CPU kind
        self.recording = False  # its speedups are declared or measured: the replay runs
        self._spec: Any = None  # its latest spec: the candidate DoPs
        self.watch: Any = None  # its KindStats: the speedups it has learned (speedup_at)
        # [arrival, size (0: the elastic kind), its run or None (-1: dropped), ACT, units], by arrival
        self._pending: deque[list[Any]] = deque()
        self.ids: dict[int, list[Any]] = {}
        self._fifos: dict[int, _Fifo] = {}
        self._dops: tuple[int, ...] = ()
        # the block being filled: realised ACT summed, then each DoP's replayed ACT (candidate order)
        self._blk: list[float] = []
        self._blocks: deque[list[float]] = deque(maxlen=_MAX_BLOCKS)  # full blocks since the last switch
        # the blocks elastic sizing ran, across switches (a trial adds to what the fallback saw)
        self._elastic: deque[list[float]] = deque(maxlen=_MAX_BLOCKS)
        self._util_at = 0.0  # the fixed DoP's share of the pool when it was switched to
        # the kind's learned speedup per size, memoised while its shape (beta, upgrade) holds: the
        # replay asks for every candidate at every completion (the hot path's call budget)
        self._shape: tuple[Any, ...] = ()
        self._sp: dict[int, float] = {}
        # every sample's replayed ACT per DoP, fading: which fixed DoP is best does not depend on
        # what was running, so it is judged on the longest record
        self._all: list[float] = []
        self._busy: list[float] = []  # core-seconds each DoP's replay asked for (faded alike)
        self._span = 0.0  # seconds of arrivals they came in (faded alike)
        self._last: float | None = None  # the latest replayed arrival
        self._n = 0  # samples replayed
        self.mode: int | None = None  # the fixed DoP in use, None: elastic sizing
        self._explore = _EXPLORE
        self._since = 0  # blocks at the current fixed DoP
        self._trial = False  # elastic sizing on trial after a fallback
        self.switches = 0
        self.now = 0.0  # the latest arrival or end it was told of
        self.at = 0.0  # when the current mode began: grants started before it were sized otherwise

    # ------------------------------------------------------------------ what admission asks
    def fixed(self, kind: str) -> int | None:
        """The fixed DoP ``kind`` runs at now, or None (size it elastically). Admission reads
        ``mode`` and ``kind`` inline (the hot path's call budget)."""
        return self.mode if kind == self.kind else None

    # ------------------------------------------------------------------ what the core tells
    def arrived(self, aid: int, spec: Any, stats: Any, eres: str | None, cpus: int, now: float) -> None:
        """A CPU action arrived (``cpus``: its fixed size; ignored for the elastic kind). Fixed-size
        ones count from the elastic kind's first arrival on: a pool without one costs nothing."""
        self.now = now
        if eres == "cpu":
            if self.kind is None:
                el = spec.elastic
                if el.malleable or el.restartable or spec.min_units > self._widest:
                    self._off()
                    return
                self.kind = spec.kind
                self.watch = stats
            elif spec.kind != self.kind:
                self._off()  # a second elastic kind: the candidates would be pairs of DoPs
                return
            if spec.duration is None and not stats.measured:
                # the replay is only as right as the speedups it divides by, and a slope learned
                # from durations alone is off by 0.1-0.15 for hundreds of completions (32
                # exponential lengths a size: a posterior sd near 0.45). Replayed under it, the
                # open loop's fixed DoPs looked better than they ran and the fallback fired where
                # elastic sizing was ahead (5000 arrivals, lengths learned: a seed 0.968 -> 1.015
                # of fifo4); an allowance for the error large enough to stop that stopped it
                # firing at all. Nothing is recorded until the runs report their parallelism.
                return
            if spec is not self._spec:
                if spec.min_units > self._widest:  # a spec of the kind that spans nodes
                    self._off()
                    return
                self._adopt(spec)
            self.recording = True
            size = 0
        elif cpus and self.recording:
            if cpus > self._widest:  # it spans nodes, which the replay does not model
                self._off()
                return
            size = cpus
        else:
            return
        rec = [now, size, None, 0.0, 0]
        self._pending.append(rec)
        self.ids[aid] = rec
        if len(self._pending) > _MAX_PENDING:
            self._off()

    def ended(self, aid: int, exec_s: float, units: int, act: float) -> None:
        """``aid`` completed: it ran ``exec_s`` on ``units``, ``act`` after it arrived."""
        rec = self.ids.pop(aid, None)
        if rec is None:
            return
        rec[2] = exec_s
        rec[3] = act
        rec[4] = units
        self.now = rec[0] + act  # its end: now, for the core
        self._advance()

    def dropped(self, aid: int) -> None:
        """``aid`` was cancelled or failed: it leaves the replay."""
        rec = self.ids.pop(aid, None)
        if rec is None:
            return
        rec[2] = -1.0
        self._advance()

    # ------------------------------------------------------------------ internals
    def _off(self) -> None:
        self.on = False
        self.mode = None
        self._pending.clear()
        self.ids.clear()
        self._fifos.clear()

    def _adopt(self, spec: Any) -> None:
        """The candidates for ``spec``: powers of two from its minimum, and its cap (within the
        node), as the fixed policies a user would try. A new set mid-stream starts over."""
        self._spec = spec
        lo, hi = spec.min_units, min(spec.max_units, self._widest)
        dops = []
        d = lo
        while d < hi:
            dops.append(d)
            d *= 2
        dops.append(hi)
        new = tuple(dops)
        if new != self._dops:
            self._dops = new
            self._fifos = {d: _Fifo(self._sizes) for d in new}
            self._all = [0.0] * len(new)
            self._busy = [0.0] * len(new)
            self.mode = None
            self._trial, self._explore = False, _EXPLORE
            self._elastic.clear()  # its blocks have a column per old candidate
            self._new_window()

    def _new_window(self) -> None:
        self._blk = [0.0] * (1 + len(self._dops))
        self._blocks.clear()
        if self._n <= _WARMUP * _BLOCK:
            self._elastic.clear()

    def _advance(self) -> None:
        pend = self._pending
        spec, st = self._spec, self.watch
        while pend and pend[0][2] is not None:
            arrival, size, exec_s, act, m = pend.popleft()
            if exec_s < 0:
                continue
            if (st.beta, st.up, spec) != self._shape:
                self._shape = (st.beta, st.up, spec)
                self._sp = {d: st.speedup_at(spec, d) for d in self._dops}
            sp = self._sp
            sm = 1.0
            if not size:  # an elastic run of exec_s at m takes exec_s * S(m) / S(d) at d
                sm = sp.get(m) or sp.setdefault(m, st.speedup_at(spec, m))
            blk, whole, busy = self._blk, self._all, self._busy
            if self._last is not None:
                self._span = self._span * _KEEP + (arrival - self._last)
            self._last = arrival
            blk[0] += act
            for i, (d, fifo) in enumerate(self._fifos.items()):
                if size:
                    k, dur = size, exec_s
                else:
                    k, dur = d, exec_s * sm / sp[d]
                r = fifo.run(arrival, k, dur, not size) - arrival
                blk[i + 1] += r
                whole[i] = whole[i] * _KEEP + r
                busy[i] = busy[i] * _KEEP + k * dur
            self._n += 1
            if self._n % _BLOCK == 0:
                if self._n <= _WARMUP * _BLOCK:
                    self._new_window()
                    continue
                self._blocks.append(blk)
                if self.mode is None:
                    self._elastic.append(blk)
                else:
                    self._since += 1
                self._blk = [0.0] * len(blk)
                self._decide()

    @staticmethod
    def _ahead(blocks: deque[list[float]], a: int, b: int) -> bool:
        """Whether column ``a`` of ``blocks`` is ahead of column ``b`` (lower mean ACT) by
        ``_MARGIN`` of ``b``'s and ``_T`` standard errors of the block differences."""
        n = len(blocks)
        if n < _MIN_BLOCKS:
            return False
        diffs = [blk[b] - blk[a] for blk in blocks]
        mean = sum(diffs) / n
        if mean <= _MARGIN * sum(blk[b] for blk in blocks) / n:
            return False
        var = sum((x - mean) ** 2 for x in diffs) / (n - 1)
        return mean * mean * n > _T * _T * var

    def _util(self, i: int) -> float:
        """The share of the pool candidate ``i``'s replay asked for (faded record)."""
        return self._busy[i] / (self._cores * self._span) if self._span > 0 else 0.0

    def _decide(self) -> None:
        if self.watch.spread() > _HEAVY:  # heavy tails: the block test does not hold
            if self.mode is not None:
                self._trial, self._explore = False, _EXPLORE
                self._switch(None)
            return
        # the narrowest candidate is always one: it spends the fewest core-seconds of any
        # policy, so a backlog it leaves every other would leave too
        stable = [i for i in range(len(self._dops)) if i == 0 or self._util(i) < _MAX_UTIL]
        best = min(stable, key=self._all.__getitem__)
        if self.mode is None:
            if self._ahead(self._elastic, best + 1, 0):
                if self._trial:
                    self._explore *= 2
                self._trial = False
                self._switch(best)
            elif self._trial and len(self._blocks) >= _TRIAL:
                self._trial = False  # elastic sizing held its own: keep it, trials at the base rate
                self._explore = _EXPLORE
            return
        cur = self._dops.index(self.mode)
        if best != cur and self._ahead(self._blocks, best + 1, cur + 1):
            self._switch(best)
        elif abs(self._util(cur) - self._util_at) > _SHIFT:
            # the load moved since the fallback: elastic sizing's record is of another load
            self._elastic.clear()
            self._trial = True
            self._switch(None)
        elif self._since >= self._explore:
            self._trial = True
            self._switch(None)

    def _switch(self, i: int | None) -> None:
        self.mode = None if i is None else self._dops[i]
        self.at = self.now
        if i is not None:
            self._util_at = self._util(i)
        self._since = 0
        self.switches += 1
        self._new_window()
