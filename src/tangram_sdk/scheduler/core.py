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
"""

from __future__ import annotations

import math
from collections import OrderedDict
from operator import itemgetter
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from ..pool import Pool
from ..spec import ActionSpec
from .decisions import Decision, Grant, Reject
from .estimate import Waiter, estimate_waits
from .events import Cancelled, Event, Released, ServiceResidency, Submitted, Tick
from .learn import KindStats
from .residency import Residency
from .ledger import Ledger
from .split import best_split

__all__ = ["Scheduler", "SchedulerStats"]

_by_time = itemgetter(0)
_DEFAULT_MU_GRID = (0.0, 0.05, 0.15, 0.5, 1.5, 5.0, math.inf)
_MAX_KINDS = 4096  # learned per-kind state kept (least recently seen forgotten beyond it)


class _Action:
    __slots__ = ("id", "spec", "seq", "submitted", "keys", "cpu_min", "gpu_min", "eres", "emin",
                 "emax", "sp_min", "node", "cell", "grant", "started", "est_end", "stats", "span")

    def __init__(self, aid: int, spec: ActionSpec, seq: int, now: float, stats: KindStats,
                 shape: _Shape) -> None:
        self.id = aid
        self.spec = spec
        self.seq = seq
        self.submitted = now
        (_reason, self.keys, self.cpu_min, self.gpu_min, self.eres, self.emin, self.emax,
         self.sp_min) = shape
        self.node = -1
        self.cell = -1
        self.span = False
        self.grant: Grant | None = None
        self.started = 0.0
        self.est_end = 0.0
        self.stats = stats


# What the core derives once per distinct spec: why it can never fit (None: it can), the resources
# it contends for, its minimum cores and GPUs, its elastic resource with the unit range, and the
# speedup at the minimum (durations are learned per unit and planned from the minimum).
_Shape = tuple[str | None, frozenset[str], int, int, str | None, int, int, float]


def _resource_keys(spec: ActionSpec) -> frozenset[str]:
    """The resources an action contends for: what a blocked action blocks for those behind it."""
    keys = set()
    if spec.cpus:
        keys.add("cpu")
    if spec.gpus:
        keys.add("gpu")
    if spec.memory:
        keys.add("mem")
    for name, _ in spec.quotas:
        keys.add("q:" + name)
    if spec.service is not None:
        keys.add(f"svc:{spec.service}:{spec.gpus}")
    return frozenset(keys)


def _priced(durations: list[tuple[int, float]], emin: int, mu: float) -> list[tuple[int, float]]:
    """Split options ``(extra units, cost)`` at price ``mu`` per unit-second: ``T(m) + mu*m*T(m)``;
    ``mu = inf`` means "minimum only". A size whose cost is infinite (it could only displace busy
    services' caches) is dropped, except the minimum, which admission has already granted."""
    opts = []
    inf_mu = math.isinf(mu)
    for m, t in durations:
        if inf_mu:
            if m > emin:
                break
            cost = t
        else:
            cost = t + mu * m * t
        if math.isinf(cost):
            if m > emin:
                continue
            cost = 1e12
        opts.append((m - emin, cost))
    return opts


class SchedulerStats(dict[str, Any]):
    """A plain-dict snapshot (easy to log or serialise)."""


class Scheduler:
    """Action-level elastic scheduler over one :class:`Pool`.

    ``window``: most elastic candidates optimised jointly per round (the rest get their minimum).
    ``depth``: queued actions the estimator looks at. ``lookahead``: count expected arrivals.
    ``elastic=False`` grants everyone their minimum (an action-level FIFO baseline).
    ``gpu_slots``: how many model copies one GPU's memory holds (a TP-k instance uses 1/k per GPU);
    when given, restoring a service prices only the copies an LRU cache would really evict there,
    instead of every copy on the cell.
    """

    def __init__(
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
        mu_grid: Iterable[float] = _DEFAULT_MU_GRID,
        max_evictions: int = 4,
        lookahead_cap: int = 64,
        skip_rounds: bool = True,
        gpu_slots: float | None = None,
    ) -> None:
        if window < 1 or depth < 0 or scan_limit < 1:
            raise ValueError("window and scan_limit must be >= 1, depth >= 0")
        if gpu_slots is not None and not gpu_slots > 0:
            raise ValueError(f"gpu_slots must be None or > 0, got {gpu_slots!r}")
        self.pool = pool
        self.window = window
        self.depth = depth
        self.scan_limit = scan_limit
        self.elastic = elastic
        self.lookahead = lookahead
        self.default_duration = default_duration
        self.default_restore_s = default_restore_s
        self.alpha = alpha
        self.mu_grid = tuple(mu_grid)
        self.max_evictions = max_evictions
        self.lookahead_cap = lookahead_cap
        self.skip_rounds = skip_rounds
        self.gpu_slots = gpu_slots
        self.ledger = Ledger(pool)
        # FIFO per priority. OrderedDict, not dict: a dict drained from the front keeps its dead
        # slots until the next resize, and every round's scan would step over them first.
        self._queues: dict[int, OrderedDict[int, _Action]] = {}
        self._prios: list[int] = []
        self._nqueued = 0
        self._running: dict[int, _Action] = {}
        self._live: dict[int, _Action] = {}  # queued or running, by id
        self._kinds: dict[str, KindStats] = {}
        self._seq = 0
        ng = len(pool.gpus)
        self._cells = tuple(c for c in pool.gpu_cells if c <= ng)
        self._gpu_holder: list[_Action | None] = [None] * ng
        self._resident = Residency(ng)
        self._restore_s: dict[str, float] = {}
        self.next_wakeup: float | None = None
        self._shape: dict[ActionSpec, _Shape] = {}  # per distinct spec, see _Shape
        self._max_node = max(self.ledger.node_size) if self.ledger.node_size else 0
        self._sig_count: dict[frozenset[str], int] = {}  # queued actions per resource-key set
        self._cold_memo: dict[tuple[str, int], float] = {}
        self._warm_memo: dict[tuple[str | None, int], tuple[float, int]] = {}  # per round, see below
        self._spec_rel: dict[tuple[int, int], tuple[Any, float]] = {}  # estimator's T(m)/T(min) cache
        # _pick_cold_cell answers per (size, free mask): valid until residency changes
        self._cell_memo: dict[tuple[int, int], int] = {}
        self._newest: _Action | None = None
        self._rel_memo: dict[tuple[int, int], float] = {}  # (action, units) -> T(m)/T(min), per round
        self._rates_memo: dict[str, float] | None = None
        self._krates: list[tuple[KindStats, float]] | None = None
        self._krates_at = -math.inf
        self._rates_at = -math.inf
        self._svc_queued: dict[str, int] = {}  # queued actions per GPU service
        self._now = 0.0
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
    def feasibility(self, spec: ActionSpec) -> str | None:
        """Why ``spec`` can never be granted by this pool, or None when it can (memoised: rollouts
        submit the same few specs millions of times)."""
        return self._shape_of(spec)[0]

    def _shape_of(self, spec: ActionSpec) -> _Shape:
        cache = self._shape
        try:
            return cache[spec]
        except KeyError:
            pass
        if len(cache) > 4096:
            cache.clear()
        el = spec.elastic
        if el is None:
            eres, emin, emax = None, 0, 0
        else:
            eres, emin, emax = el.resource, (spec.cpus if el.resource == "cpu" else spec.gpus), el.max_units
        shape = cache[spec] = (self._feasibility(spec), _resource_keys(spec), spec.cpus, spec.gpus,
                               eres, emin, emax, spec.speedup(emin) if eres else 1.0)
        return shape

    def _feasibility(self, spec: ActionSpec) -> str | None:
        pool = self.pool
        if spec.cpus > len(pool.cpus):
            return f"cpus={spec.cpus} exceeds the pool's {len(pool.cpus)} cores"
        if spec.gpus:
            if spec.gpus > len(pool.gpus):
                return f"gpus={spec.gpus} exceeds the pool's {len(pool.gpus)} GPUs"
            if spec.gpus not in self._cells:
                return f"gpus={spec.gpus} is not a GPU cell size of this pool {self._cells}"
        if spec.memory and pool.memory is not None and spec.memory > pool.memory:
            return f"memory={spec.memory} exceeds the pool's {pool.memory} bytes"
        conc = self.ledger.q_conc
        for name, q in spec.quotas:
            if name not in conc:
                return f"unknown quota {name!r} (pool has {sorted(conc)})"
            c = conc[name]
            if c is not None and q > c:
                return f"quota {name!r}: {q} units exceed its concurrency {c}"
            b = self.ledger.q_bucket[name]
            if b is not None and q > b:
                return f"quota {name!r}: {q} units exceed its burst {b}"
        return None

    def handle(self, event: Event, now: float) -> list[Decision]:
        """Apply one event at time ``now`` and run a scheduling round."""
        if type(event) is Submitted:
            return self.submit(event.action_id, event.spec, now)
        if type(event) is Released:
            return self.release(event.action_id, now, failed=event.failed)
        out: list[Decision] = []
        self._apply(event, now, out)
        out.extend(self._round(now))
        return out

    def submit(self, action_id: int, spec: ActionSpec, now: float) -> list[Decision]:
        """``handle(Submitted(action_id, spec), now)`` without building the event (the runtime's
        hot path when nobody records events). An action arriving at an empty queue is decided on
        the spot, by the same rules as a round, without entering the queue."""
        out: list[Decision] = []
        a = self._submit(action_id, spec, now, out, direct=True)
        if a is not None and a.grant is not None:
            return out
        r = self._round(now)
        if out:
            out.extend(r)
            return out
        return r

    def release(self, action_id: int, now: float, *, failed: bool = False) -> list[Decision]:
        """``handle(Released(action_id, failed), now)`` without building the event."""
        self._need_round = True
        self._release(action_id, now, failed=failed)
        return self._round(now)

    def handle_many(self, events: Iterable[Event], now: float) -> list[Decision]:
        """Apply several simultaneous events, then run one round (what a busy runtime does)."""
        out: list[Decision] = []
        for ev in events:
            self._apply(ev, now, out)
        out.extend(self._round(now))
        return out

    @property
    def queued(self) -> int:
        return self._nqueued

    @property
    def running(self) -> int:
        return len(self._running)

    def is_queued(self, action_id: int) -> bool:
        a = self._live.get(action_id)
        return a is not None and a.grant is None

    def grant_of(self, action_id: int) -> Grant | None:
        a = self._running.get(action_id)
        return None if a is None else a.grant

    def estimated_duration(self, spec: ActionSpec, units: int | None = None) -> float:
        """Seconds ``spec`` is expected to run at ``units`` (its minimum when None)."""
        st = self._kinds.get(spec.kind)
        t1 = spec.duration if spec.duration is not None else None
        if t1 is None:
            base = st.t1 if st is not None else self.default_duration
            d_min = base / spec.speedup(spec.min_units) if spec.elastic else base
        else:
            d_min = t1
        if units is None or spec.elastic is None:
            return d_min
        return d_min * spec.relative_duration(units)

    def statistics(self) -> SchedulerStats:
        L = self.ledger
        pool = self.pool
        s = SchedulerStats(
            cpus_total=len(pool.cpus), cpus_free=L.free_cpus,
            gpus_total=len(pool.gpus), gpus_free=L.free_gpus,
            memory_total=pool.memory, memory_free=L.mem_free,
            quotas={n: {"used": L.q_used[n], "concurrency": L.q_conc[n],
                        "tokens": (round(L.tokens[n], 3) if n in L.tokens else None)} for n in L.q_used},
            running=len(self._running), queued=self._nqueued,
            submitted=self.submitted, granted=self.granted, released=self.released,
            cancelled=self.cancelled, rejected=self.rejected, failed=self.failed,
            completed=self.completed, rounds=self.rounds, evictions=self.evictions,
            mean_act_s=(self._sum_act / self.completed) if self.completed else None,
            mean_queue_s=(self._sum_queue / self.granted) if self.granted else None,
            mean_exec_s=(self._sum_exec / self.completed) if self.completed else None,
            resident_services=len(self._resident),
        )
        return s

    def check_invariants(self) -> None:
        """Raise AssertionError if the ledger disagrees with the running grants (for tests)."""
        L = self.ledger
        used_c: set[int] = set()
        used_g: set[int] = set()
        q_used = {n: 0 for n in L.q_used}
        mem = 0
        for a in self._running.values():
            g = a.grant
            assert g is not None
            assert not (used_c & set(g.cpus)), f"core shared: {g.cpus}"
            assert not (used_g & set(g.gpus)), f"gpu shared: {g.gpus}"
            used_c |= set(g.cpus)
            used_g |= set(g.gpus)
            mem += g.memory
            for n, q in g.quotas:
                q_used[n] += q
            assert len(g.cpus) >= a.spec.cpus and len(g.gpus) >= a.spec.gpus, "minimum not honoured"
            if a.eres is not None:
                assert a.emin <= g.units <= a.emax, "elastic units out of range"
        free_c = set().union(*L.node_free) if L.node_free else set()
        assert not (free_c & used_c), "a granted core is also free"
        assert free_c | used_c == set(self.pool.cpus), "cores lost"
        assert L.node_count == [len(x) for x in L.node_free], "node counts out of step"
        res = self._resident
        for p in range(len(L.gpu_ids)):
            on_p = {key for key in res.last_used if p in key[1]}
            assert res.inst_at[p] == on_p, f"residency index out of step on GPU position {p}"
            assert abs(res.use_at[p] - sum(1.0 / len(key[1]) for key in on_p)) < 1e-9, "GPU use out of step"
        free_g = {L.gpu_ids[i] for i in range(len(L.gpu_ids)) if L.gpu_free >> i & 1}
        assert not (free_g & used_g) and free_g | used_g == set(self.pool.gpus), "GPUs lost"
        assert q_used == L.q_used, f"quota accounting {q_used} != {L.q_used}"
        for n, c in L.q_conc.items():
            assert c is None or q_used[n] <= c, f"quota {n} over concurrency"
        if L.mem_free is not None:
            assert L.mem_free + mem == self.pool.memory, "memory lost"
        assert self.granted == self.released + len(self._running), "granted != released + running"

    def __repr__(self) -> str:
        L = self.ledger
        parts = []
        if self.pool.cpus:
            parts.append(f"cpu {len(self.pool.cpus) - L.free_cpus}/{len(self.pool.cpus)}")
        if self.pool.gpus:
            parts.append(f"gpu {len(self.pool.gpus) - L.free_gpus}/{len(self.pool.gpus)}")
        for n in L.q_used:
            parts.append(f"{n} {L.q_used[n]}")
        return f"<Scheduler {' '.join(parts)} | {len(self._running)} running, {self._nqueued} queued>"

    # ------------------------------------------------------------------------------ events
    def _apply(self, ev: Event, now: float, out: list[Decision]) -> None:
        if isinstance(ev, Submitted):
            self._submit(ev.action_id, ev.spec, now, out, direct=False)
            return
        self._need_round = True
        if isinstance(ev, Released):
            self._release(ev.action_id, now, failed=ev.failed)
        elif isinstance(ev, Cancelled):
            self._cancel(ev.action_id, now)
        elif isinstance(ev, ServiceResidency):
            self._residency(ev, now)
        elif isinstance(ev, Tick):
            pass
        else:
            raise TypeError(f"unknown event {ev!r}")

    def _submit(self, aid: int, spec: ActionSpec, now: float, out: list[Decision], *,
                direct: bool) -> _Action | None:
        """Register an arrival and queue it. ``direct``: a fixed-size action meeting an empty queue
        is decided right here (the round would scan only it); in a batch it must queue, so the
        batch's one round sees every event first."""
        if aid in self._live:
            raise ValueError(f"action id {aid} submitted twice")
        self.submitted += 1
        shape = self._shape_of(spec)
        reason = shape[0]
        if reason is not None:
            self.rejected += 1
            out.append(Reject(aid, reason))
            return None
        st = self._kinds.get(spec.kind)
        if st is None:
            if len(self._kinds) >= _MAX_KINDS:
                self._forget_kinds()
            st = self._kinds[spec.kind] = KindStats(self.default_duration)
        st.observe_arrival(now, self.alpha)
        st.spec = spec
        self._seq += 1
        a = self._live[aid] = _Action(aid, spec, self._seq, now, st, shape)
        keys = a.keys
        if direct and not self._nqueued and a.eres is None:
            self.rounds += 1
            self.next_wakeup = None
            if self._decide_single(a, now):
                out.append(self._grant(a, 0, now, queued=False))
                return a
            self._enqueue(a, keys)
            return a
        if not (self.skip_rounds and not self._need_round and keys and keys <= self._blocked_last
                and (not self._time_sensitive or now == self._round_now)
                and (len(self._prios) == 1 and spec.priority == self._prios[0]
                     or self._not_ahead(spec.priority))):
            self._need_round = True
        self._enqueue(a, keys)
        return a

    def _enqueue(self, a: _Action, keys: frozenset[str]) -> None:
        spec = a.spec
        q = self._queues.get(spec.priority)
        if q is None:
            q = self._queues[spec.priority] = OrderedDict()
            self._prios = sorted(self._queues, reverse=True)
        q[a.id] = a
        self._nqueued += 1
        self._newest = a  # the only one when the queue was empty: the uncontended round needs no scan
        kc = self._sig_count
        kc[keys] = kc.get(keys, 0) + 1
        if spec.service is not None:
            self._svc_queued[spec.service] = self._svc_queued.get(spec.service, 0) + 1

    def _not_ahead(self, prio: int) -> bool:
        """A new action of priority ``prio`` would not be scanned before any queued one."""
        prios = self._prios
        if len(prios) == 1:
            return prio <= prios[0] or not self._queues[prios[0]]
        return all(prio <= p for p in prios if self._queues[p])

    def _forget_kinds(self) -> None:
        """Bound what is learned per kind: a job naming kinds per task (``f"pytest-{repo}"``) must
        not grow memory and planning cost forever. The least recently seen quarter is forgotten
        (actions in flight keep their own reference to their kind's stats)."""
        by_age = sorted(self._kinds, key=lambda k: self._kinds[k].last_arrival or 0.0)
        for k in by_age[: len(by_age) // 4]:
            del self._kinds[k]

    def _dequeue(self, a: _Action) -> None:
        del self._queues[a.spec.priority][a.id]
        self._nqueued -= 1
        kc = self._sig_count
        n = kc[a.keys] - 1
        if n:
            kc[a.keys] = n
        else:
            del kc[a.keys]
        svc = a.spec.service
        if svc is not None:
            self._svc_queued[svc] -= 1

    def _release(self, aid: int, now: float, *, failed: bool) -> None:
        a = self._running.pop(aid, None)
        if a is None:
            if self._drop_queued(aid):
                self.cancelled += 1
                return
            raise KeyError(f"release of unknown action id {aid}")
        g = a.grant
        assert g is not None
        self.ledger.give(g)
        for gid in g.gpus:
            self._gpu_holder[self.ledger.gpu_pos[gid]] = None
        if a.spec.service and g.gpus:
            self._resident.touch((a.spec.service, tuple(self.ledger.gpu_pos[x] for x in g.gpus)), now)
        self.released += 1
        del self._live[aid]
        if failed:
            self.failed += 1
            return
        exec_s = now - a.started
        self.completed += 1
        self._sum_exec += exec_s
        self._sum_act += now - a.submitted
        if a.spec.duration is None:
            t1 = exec_s * a.spec.speedup(g.units) if a.eres else exec_s
            a.stats.observe_duration(t1, self.alpha)

    def _drop_queued(self, aid: int) -> bool:
        a = self._live.get(aid)
        if a is None or a.grant is not None:
            return False
        self._dequeue(a)
        del self._live[aid]
        return True

    def _cancel(self, aid: int, now: float) -> None:
        if self._drop_queued(aid):
            self.cancelled += 1
            return
        if aid in self._running:
            self.cancelled += 1
            self._release(aid, now, failed=True)
        # unknown ids (already released, or rejected) are ignored: cancellation races are normal

    def _residency(self, ev: ServiceResidency, now: float) -> None:
        pos = self.ledger.gpu_pos
        try:
            key = (ev.service, tuple(pos[g] for g in ev.gpus))
        except KeyError:
            return
        if ev.resident:
            self._resident.add(key, now)
        else:
            self._resident.remove(key)
        self._cell_memo.clear()
        if ev.restore_s is not None and ev.restore_s >= 0:
            old = self._restore_s.get(ev.service)
            self._restore_s[ev.service] = (
                ev.restore_s if old is None else (1 - self.alpha) * old + self.alpha * ev.restore_s
            )

    # ------------------------------------------------------------------------------ the round
    def _iter_queue(self) -> Iterator[_Action]:
        for p in self._prios:
            yield from self._queues[p].values()

    def _dur_min(self, a: _Action) -> float:
        spec = a.spec
        if spec.duration is not None:
            return spec.duration
        t1 = a.stats.t1
        return t1 / a.sp_min if a.eres else t1

    def _restore_cost(self, service: str | None) -> float:
        if service is None:
            return 0.0
        return self._restore_s.get(service, self.default_restore_s)

    def _round(self, now: float) -> list[Decision]:
        if not self._nqueued:
            self.next_wakeup = None
            return []
        if not self._need_round:
            return []
        self.next_wakeup = None
        self.rounds += 1
        if self._nqueued == 1:
            only = self._newest
            if only is None or self._queues[only.spec.priority].get(only.id) is not only:
                (only,) = (a for q in self._queues.values() for a in q.values())
            if only.eres is None:
                return self._round_single(only, now)
        self._now = now
        if self._cold_memo:
            self._cold_memo.clear()
        if self._warm_memo:
            self._warm_memo.clear()
        if self._rel_memo:
            self._rel_memo.clear()
        self._rates_memo = None
        self._krates = None
        L = self.ledger
        if L.tokens:
            L.refill(now)
        node_free = L.node_count.copy()
        gfree = L.gpu_free
        mem = L.mem_free
        q_used = dict(L.q_used) if L.q_used else L.q_used
        tokens = dict(L.tokens) if L.tokens else L.tokens
        blocked: set[str] = set()
        sigs = self._sig_count
        exhausted = False  # every queued action needs something already blocked: stop scanning
        svc_blocked = False  # a service waits for its warm copy: the next round may differ in time
        elastic_cands = False
        cands: list[_Action] = []
        scanned = 0
        scan_limit = self.scan_limit
        queue = self._queues[self._prios[0]].values() if len(self._prios) == 1 else self._iter_queue()
        for a in queue:
            if scanned >= scan_limit or exhausted:
                break
            scanned += 1
            if blocked and not a.keys.isdisjoint(blocked):
                continue
            lack, node, cell, span = self._fits(a, node_free, gfree, mem, q_used, tokens, now)
            if lack:
                blocked.update(lack)
                exhausted = True
                for sig in sigs:
                    if sig.isdisjoint(blocked):
                        exhausted = False
                        break
                continue
            if cell >= 0 and a.spec.service and self._should_wait_for_resident(a, cell, now):
                # later actions of the same service would make the same choice: skip them cheaply
                blocked.add(f"svc:{a.spec.service}:{a.gpu_min}")
                svc_blocked = True
                exhausted = all(not sig.isdisjoint(blocked) for sig in sigs)
                continue
            # tentatively reserve the minimum
            for name, q in a.spec.quotas:
                q_used[name] += q
                if name in tokens:
                    tokens[name] -= q
            if a.spec.memory and mem is not None:
                mem -= a.spec.memory
            if span:
                need = a.cpu_min
                for i in sorted(range(len(node_free)), key=lambda i: -node_free[i]):
                    k = min(need, node_free[i])
                    node_free[i] -= k
                    need -= k
            elif node >= 0:
                node_free[node] -= a.cpu_min
            if cell >= 0:
                gfree &= ~(((1 << a.gpu_min) - 1) << cell)
            a.node, a.cell, a.span = node, cell, span
            if a.eres is not None:
                elastic_cands = True
            cands.append(a)
        self._blocked_last = blocked
        self._round_now = now
        self._time_sensitive = self.next_wakeup is not None or svc_blocked
        self._need_round = False
        if not cands:
            return []
        if not elastic_cands:  # the common FIFO case: everyone gets exactly the minimum
            return [self._grant(a, 0, now) for a in cands]
        units = {a.id: a.emin for a in cands if a.eres is not None}
        evicted: set[int] = set()
        if self.elastic:
            self._split_cpu(cands, node_free, now, units, evicted)
            self._split_gpu(cands, gfree, now, units, evicted)
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

    # -- admission helpers ----------------------------------------------------------------------
    def _fits(self, a: _Action, node_free: list[int], gfree: int, mem: int | None, q_used: dict[str, int],
              tokens: dict[str, float], now: float) -> tuple[list[str], int, int, bool]:
        """Does ``a`` fit at its minimum in this (tentative) state? Returns the resources it lacks
        (empty when it fits), its NUMA node, GPU cell offset, and whether it must span nodes. A
        missing rate-limit token also moves ``next_wakeup`` to when it will be there."""
        lack: list[str] = []
        spec = a.spec
        if spec.quotas:
            L = self.ledger
            for name, q in spec.quotas:
                c = L.q_conc[name]
                if c is not None and q_used[name] + q > c:
                    lack.append("q:" + name)
                elif name in tokens and tokens[name] + 1e-9 < q:
                    lack.append("q:" + name)
                    rate = L.q_rate[name]
                    assert rate is not None
                    t = now + (q - tokens[name]) / rate
                    if self.next_wakeup is None or t < self.next_wakeup:
                        self.next_wakeup = t
        if spec.memory and mem is not None and spec.memory > mem:
            lack.append("mem")
        node = -1
        span = False
        if a.cpu_min:
            node = self._pick_node(a, node_free)
            if node < 0:
                if a.cpu_min > self._max_node and sum(node_free) >= a.cpu_min:
                    span = True
                else:
                    lack.append("cpu")
        cell = -1
        if a.gpu_min:
            cell = self._pick_cell(a.gpu_min, spec.service, gfree)
            if cell < 0:
                lack.append("gpu")
        return lack, node, cell, span

    def _round_single(self, a: _Action, now: float) -> list[Decision]:
        """The uncontended case — one queued action, not elastic — decided straight on the ledger
        with exactly the rules of the full round, minus its bookkeeping."""
        if self._decide_single(a, now):
            return [self._grant(a, 0, now)]
        return []

    def _decide_single(self, a: _Action, now: float) -> bool:
        """Does the lone action ``a`` fit now? Sets its placement, or (when it does not) the
        blocked state that round skipping relies on."""
        if self._warm_memo:
            self._warm_memo.clear()
        L = self.ledger
        if L.tokens:
            L.refill(now)
        lack, node, cell, span = self._fits(a, L.node_count, L.gpu_free, L.mem_free,
                                           L.q_used, L.tokens, now)
        self._round_now = now
        if not lack and cell >= 0 and a.spec.service and self._should_wait_for_resident(a, cell, now):
            lack = [f"svc:{a.spec.service}:{a.gpu_min}"]
        if lack:
            self._blocked_last = set(lack)
            self._time_sensitive = self.next_wakeup is not None or bool(a.spec.service)
            self._need_round = False
            return False
        a.node, a.cell, a.span = node, cell, span
        return True

    def _pick_node(self, a: _Action, node_free: list[int]) -> int:
        """Elastic CPU actions go where there is most room to grow (worst fit); fixed-size ones pack
        into the fullest node that fits (best fit), keeping whole nodes free for big grants."""
        need = a.cpu_min
        if len(node_free) == 1:
            return 0 if node_free[0] >= need else -1
        best = -1
        best_free = -1 if a.eres == "cpu" else 1 << 30
        for i, f in enumerate(node_free):
            if f < need:
                continue
            if (a.eres == "cpu" and f > best_free) or (a.eres != "cpu" and f < best_free):
                best, best_free = i, f
        return best

    def _pick_cell(self, size: int, service: str | None, mask: int) -> int:
        """Aligned free cell of ``size`` GPUs: one where the service is resident first (tightest
        buddy block, then lowest offset), else one disturbing the fewest resident copies, then the
        tightest, then the lowest (hot path: called for every GPU action scanned and every price
        of a plan; the service-independent part is memoised until residency changes)."""
        if service is not None:
            warm_cells = self._resident.by_service.get(service)
            if warm_cells:
                full = (1 << size) - 1
                parent = size * 2
                pfull = (1 << parent) - 1
                full_all = (1 << len(self._gpu_holder)) - 1
                best, best_t = -1, 0
                for pos in warm_cells:
                    if len(pos) != size:
                        continue
                    o = pos[0]
                    if (mask >> o) & full != full:
                        continue
                    # tightness: free GPUs in its buddy (parent) block; lower keeps big blocks whole
                    t = (mask & ((pfull << (o // parent * parent)) & full_all)).bit_count()
                    if best < 0 or t < best_t or (t == best_t and o < best):
                        best, best_t = o, t
                if best >= 0:
                    return best
        memo = self._cell_memo
        key = (size, mask)
        hit = memo.get(key)
        if hit is None:
            if len(memo) > 4096:
                memo.clear()
            hit = memo[key] = self._pick_cold_cell(size, mask)
        return hit

    def _pick_cold_cell(self, size: int, mask: int) -> int:
        full = (1 << size) - 1
        ng = len(self._gpu_holder)
        opts = [o for o in range(0, ng - size + 1, size) if (mask >> o) & full == full]
        if not opts:
            return -1
        if len(opts) == 1 or size >= ng:
            return opts[0]
        full_all = (1 << ng) - 1
        parent = size * 2
        pfull = (1 << parent) - 1
        per_pos = self._resident.per_pos
        best, best_p, best_t = -1, 0, 0
        for o in opts:
            p = per_pos[o] if size == 1 else sum(per_pos[o:o + size])
            if best >= 0 and p > best_p:
                continue
            t = (mask & ((pfull << (o // parent * parent)) & full_all)).bit_count()
            if best < 0 or p < best_p or t < best_t:
                best, best_p, best_t = o, p, t
        return best

    def _should_wait_for_resident(self, a: _Action, cell: int, now: float) -> bool:
        """Waiting for a busy GPU that already holds the service can beat restoring it elsewhere."""
        svc = a.spec.service
        size = a.gpu_min
        cells = self._resident.cells_of(svc)
        if not cells or tuple(range(cell, cell + size)) in cells:
            return False
        restore = self._restore_cost(svc)
        # the soonest warm copy and how many there are: the same for every action of the service
        # scanned in this round (holders change only when the round grants), so computed once
        memo_key = (svc, size)
        hit = self._warm_memo.get(memo_key)
        if hit is None:
            best_wait = math.inf
            n_warm = 0
            for pos in cells:
                if len(pos) != size:
                    continue
                n_warm += 1
                wait = 0.0
                for p in pos:
                    h = self._gpu_holder[p]
                    if h is not None:
                        rem = h.est_end - now
                        if rem <= 0:  # overran its estimate: assume it is half done
                            rem = 0.5 * (now - h.started)
                        if rem > wait:
                            wait = rem
                if wait < best_wait:
                    best_wait = wait
            hit = self._warm_memo[memo_key] = (best_wait, n_warm or 1)
        best_wait, n_warm = hit
        # everyone queued behind ``a`` for this service waits on the same warm copies: compare the
        # backlog's drain time with one restore, or a hot service never scales out (issue 5 finding)
        backlog = (self._sig_count.get(a.keys, 1) - 1) * self._dur_min(a) / n_warm
        wait = best_wait + backlog
        # Restoring here may displace other services' warm copies; each one that is called again
        # within the wait pays a restore of its own. Without this price a hot service scaling out
        # on a tight pool just moves the restore around (MOPD thrash when every GPU caches someone).
        return wait < restore + self._displacement(svc, tuple(range(cell, cell + size)), wait, now)

    def _displacement(self, svc: str | None, cell: tuple[int, ...], horizon: float, now: float) -> float:
        """Expected restore seconds that putting ``svc`` on ``cell`` costs *other* services whose
        warm copies live there: each pays a restore if it is called within ``horizon``."""
        cost = 0.0
        slots = self.gpu_slots
        victims = (self._resident.services_on(cell) if slots is None  # capacity unknown: all go
                   else self._resident.evicted_by(cell, slots))
        for other in victims:
            if other == svc:
                continue
            if self._svc_queued.get(other):
                return math.inf  # its own waiters would use that warm copy: never take it from them
            cost += self._restore_cost(other) * min(1.0, self._service_rate(other, now) * horizon)
        return cost

    def _cold_cost(self, svc: str, size: int, dur: float, now: float) -> float:
        """Restore plus displacement for a new ``size``-GPU instance of ``svc``, on the free cell
        where that is cheapest (memoised per round: the price grid asks many times)."""
        key = (svc, size)
        hit = self._cold_memo.get(key)
        if hit is not None:
            return hit
        restore = self._restore_cost(svc)
        o = self._pick_cell(size, svc, self.ledger.gpu_free)  # where placement would put it
        best = self._displacement(svc, tuple(range(o, o + size)), dur, now) if o >= 0 else 0.0
        self._cold_memo[key] = restore + best
        return restore + best

    def _service_rate(self, service: str, now: float) -> float:
        """Calls per second of ``service`` (all kinds using it), from the learned arrival rates;
        computed for every service at once, at most once per round."""
        rates = self._rates_memo
        if rates is None or self._rates_at != now:
            rates = {}
            for st, lam in self._kind_rates(now):
                svc = st.spec.service if st.spec is not None else None
                if svc is not None:
                    rates[svc] = rates.get(svc, 0.0) + lam
            self._rates_memo, self._rates_at = rates, now
        return rates.get(service, 0.0)

    def _kind_rates(self, now: float) -> list[tuple[KindStats, float]]:
        """Every kind's learned arrival rate at ``now``, once per round (placement pricing and
        the arrival lookahead both ask)."""
        memo = self._krates
        if memo is None or self._krates_at != now:
            memo = self._krates = [(st, st.rate(now)) for st in self._kinds.values()]
            self._krates_at = now
        return memo

    # -- elastic split --------------------------------------------------------------------------
    def _releases(self, res: str, now: float) -> list[tuple[float, int]]:
        rel = []
        for r in self._running.values():
            g = r.grant
            assert g is not None
            k = len(g.cpus) if res == "cpu" else len(g.gpus)
            if k:
                rel.append((max(r.est_end, now), k))
        rel.sort()
        return rel

    def _may_evict(self, group: list[_Action], res: str, evict: bool) -> bool:
        """Evicting a candidate that fits only pays when nobody else waits for this resource: with
        a queue, its units would go to the queue's head, not to the other candidates."""
        if not evict:
            return False
        skip = {a.id for a in group}
        for a in self._iter_queue():
            if a.id not in skip and (a.cpu_min if res == "cpu" else a.gpu_min):
                return False
        return True

    def _queued_waiters(self, res: str, now: float, skip: set[int]) -> list[Waiter]:
        out: list[Waiter] = []
        for a in self._iter_queue():
            if len(out) >= self.depth:
                break
            if a.id in skip:
                continue
            need = a.cpu_min if res == "cpu" else a.gpu_min
            if need:
                out.append((now, need, self._dur_min(a), a.emax if a.eres == res else need, a.spec))
        return out

    def _arrivals(self, res: str, now: float, horizon: float) -> list[Waiter]:
        if not self.lookahead or horizon <= 0:
            return []
        per_kind = []
        total = 0.0
        for st, lam in self._kind_rates(now):
            spec = st.spec
            if spec is None or not (spec.cpus if res == "cpu" else spec.gpus):
                continue
            n = lam * horizon
            if n >= 0.5:
                per_kind.append((lam, st, n))
                total += n
        if not per_kind:
            return []
        # Past the cap, look less far ahead rather than thin the stream: the first arrivals at
        # their true rate are the ones a plan's spare units would have served.
        scale = min(1.0, self.lookahead_cap / total)
        span = horizon * scale
        out: list[Waiter] = []
        for _lam, st, n in per_kind:
            k = max(1, int(round(n * scale)))
            step = span / k
            spec = st.spec
            # estimated_duration(spec) at its minimum, from this kind's stats directly
            if spec.duration is not None:
                d = spec.duration
            else:
                d = st.t1 / spec.speedup(spec.min_units) if spec.elastic else st.t1
            need = spec.cpus if res == "cpu" else spec.gpus
            maxu = spec.max_units if spec.elastic_resource == res else need
            out.extend([(now + (j + 0.5) * step, need, d, maxu, spec) for j in range(k)])
        out.sort(key=_by_time)
        return out

    def _split_cpu(self, cands: list[_Action], node_free: list[int], now: float,
                   units: dict[int, int], evicted: set[int]) -> None:
        group = [a for a in cands if a.eres == "cpu" and not a.span]
        if not group:
            return
        evict = len(group) <= self.window
        if not evict:  # only the oldest `window` candidates are optimised; the rest keep minimum
            group = group[: self.window]
        if sum(node_free[a.node] for a in group) == 0 and len(group) < 2:
            return
        bins = sorted({a.node for a in group})
        spare = {b: node_free[b] for b in bins}
        free_total = sum(node_free)
        fixed_rel = [(now + self._dur_min(a), a.cpu_min) for a in cands
                     if a.cpu_min and (a.eres != "cpu" or a.span)]
        self._plan_group(group, bins, spare, free_total, fixed_rel, "cpu", now, units, evicted,
                         step_units=None, evict=evict)
        for a in group:
            if a.id not in evicted:
                node_free[a.node] -= units[a.id] - a.emin

    def _split_gpu(self, cands: list[_Action], gfree: int, now: float,
                   units: dict[int, int], evicted: set[int]) -> None:
        group = [a for a in cands if a.eres == "gpu"]
        if not group:
            return
        evict = len(group) <= self.window
        if not evict:
            group = group[: self.window]
        mask = gfree
        for a in group:  # give the tentative minimum cells back: the plan re-places them
            mask |= ((1 << a.gpu_min) - 1) << a.cell
        spare_total = mask.bit_count() - sum(a.emin for a in group)
        if spare_total <= 0 and len(group) < 2:  # nothing to split or evict: keep admission's cell
            return
        fixed_rel = [(now + self._dur_min(a), a.gpu_min) for a in cands if a.gpu_min and a.eres != "gpu"]
        self._plan_group(group, [0], {0: spare_total}, gfree.bit_count(), fixed_rel, "gpu", now, units,
                         evicted, step_units=self._cells, evict=evict)
        # place largest first into aligned cells; shrink what does not fit
        live = sorted((a for a in group if a.id not in evicted), key=lambda a: (-units[a.id], a.seq))
        for _attempt in range(len(live) * 4 + 1):
            m = mask
            placed: dict[int, int] = {}
            failed: _Action | None = None
            for a in live:
                o = self._pick_cell(units[a.id], a.spec.service, m)
                if o < 0:
                    failed = a
                    break
                placed[a.id] = o
                m &= ~(((1 << units[a.id]) - 1) << o)
            if failed is None:
                for a in live:
                    a.cell = placed[a.id]
                return
            smaller = [c for c in self._cells if failed.emin <= c < units[failed.id]]
            if not smaller:
                break
            units[failed.id] = smaller[-1]
            live.sort(key=lambda a: (-units[a.id], a.seq))
        for a in group:  # fall back: everyone at minimum in the cells admission chose
            units[a.id] = a.emin
            evicted.discard(a.id)

    def _durations(self, a: _Action, spare: int, steps: tuple[int, ...] | None) -> list[tuple[int, float]]:
        """``(units, expected seconds)`` for every size ``a`` may get out of ``spare``, a cold
        start's restore and displacement included. Independent of the price, so each plan builds
        it once per candidate and prices it for every ``mu`` (:func:`_priced`)."""
        d0 = self._dur_min(a)
        spec = a.spec
        hi = min(a.emax, a.emin + spare)
        sizes = range(a.emin, hi + 1) if steps is None else [s for s in steps if a.emin <= s <= hi]
        out = []
        warm_sizes = ({len(pos) for pos in self._resident.cells_of(spec.service)}
                      if steps is not None and spec.service is not None else None)
        rel = self._rel_memo
        for m in sizes:
            key = (a.id, m)
            r = rel.get(key)
            if r is None:
                r = rel[key] = spec.relative_duration(m)
            t = d0 * r
            if warm_sizes is not None and m not in warm_sizes:
                assert spec.service is not None
                t += self._cold_cost(spec.service, m, d0, self._now)
            out.append((m, t))
        return out

    def _plan_group(self, group: list[_Action], bins: list[int], spare: dict[int, int], free_total: int,
                    fixed_rel: list[tuple[float, int]], res: str, now: float, units: dict[int, int],
                    evicted: set[int], step_units: tuple[int, ...] | None, evict: bool) -> None:
        plan_cost = self._plan_context(group, fixed_rel, free_total, res, now)
        evict = self._may_evict(group, res, evict)
        binkey = (lambda a: a.node) if res == "cpu" else (lambda a: 0)

        def plan(active: list[_Action], out_: list[_Action]) -> tuple[float, dict[int, int]]:
            best_cost = math.inf
            best_units: dict[int, int] = {}
            seen: set[tuple[int, ...]] = set()
            sp = dict(spare)
            for a in out_:
                sp[binkey(a)] += a.emin
            per_bin = []
            for b in bins:
                members = [a for a in active if binkey(a) == b]
                if members:
                    per_bin.append((sp[b], members, [self._durations(a, sp[b], step_units) for a in members]))
            if len(per_bin) == 1 and len(active) == 1:  # most rounds: one candidate, one bin
                cap, (one,), (dur,) = per_bin[0]
                for mu in self.mu_grid:
                    m = one.emin + best_split([_priced(dur, one.emin, mu)], cap)[0][0]
                    if (m,) in seen:
                        continue
                    seen.add((m,))
                    chosen1 = {one.id: m}
                    cost = plan_cost(active, out_, chosen1)
                    if cost < best_cost - 1e-12:
                        best_cost, best_units = cost, chosen1
                return best_cost, best_units
            for mu in self.mu_grid:
                chosen: dict[int, int] = {}
                for cap, members, durs in per_bin:
                    opts = [_priced(d, a.emin, mu) for a, d in zip(members, durs)]
                    picks, _ = best_split(opts, cap)
                    for a, k in zip(members, picks):
                        chosen[a.id] = a.emin + k
                sig = tuple(chosen[a.id] for a in active)
                if sig in seen:
                    continue
                seen.add(sig)
                cost = plan_cost(active, out_, chosen)
                if cost < best_cost - 1e-12:
                    best_cost, best_units = cost, chosen
            return best_cost, best_units

        active = list(group)
        out_: list[_Action] = []
        best_cost, best_units = plan(active, out_)
        n_ev = 0
        while evict and len(active) > 1 and n_ev < self.max_evictions:
            trial_out = [active[-1]] + out_
            trial_active = active[:-1]
            cost, u = plan(trial_active, trial_out)
            if cost < best_cost - 1e-9:
                active, out_, best_cost, best_units = trial_active, trial_out, cost, u
                n_ev += 1
            else:
                break
        for a in active:
            units[a.id] = best_units.get(a.id, a.emin)
        for a in out_:
            evicted.add(a.id)
            self.evictions += 1

    def _plan_context(self, group: list[_Action], fixed_rel: list[tuple[float, int]], free_total: int,
                      res: str, now: float) -> Callable[[list[_Action], list[_Action], dict[int, int]], float]:
        """Everything a plan's cost depends on besides the plan itself, gathered once per round;
        returns ``cost(admitted, evicted, units)`` (also used by the exhaustive reference search)."""
        releases = self._releases(res, now)
        queued = self._queued_waiters(res, now, {a.id for a in group})
        horizon = max(self._dur_min(a) for a in group)
        arrivals = self._arrivals(res, now, horizon)

        def cost(active: list[_Action], out_: list[_Action], chosen: dict[int, int]) -> float:
            return self._plan_cost(active, out_, chosen, releases, fixed_rel, queued, arrivals, free_total,
                                   now, res)

        return cost

    def _plan_cost(self, active: list[_Action], out_: list[_Action], chosen: dict[int, int],
                   releases: list[tuple[float, int]], fixed_rel: list[tuple[float, int]],
                   queued: list[Waiter], arrivals: list[Waiter], free_total: int, now: float,
                   res: str) -> float:
        cost = 0.0
        extra_rel = list(fixed_rel)
        free = free_total
        policy: dict[str, int] = {}
        for a in active:
            m = chosen.get(a.id, a.emin)
            t = self._dur_min(a) * a.spec.relative_duration(m)
            cost += t
            extra_rel.append((now + t, m))
            free -= m - a.emin
            policy[a.spec.kind] = m
        waiters: list[Waiter] = []
        for a in out_:
            d = self._dur_min(a)
            free += a.emin
            waiters.append((now, a.emin, d, a.emax, a.spec))
        waiters.extend(queued)
        waiters.extend(arrivals)
        memo = self._spec_rel
        if len(memo) > 4096:
            memo.clear()
        return cost + estimate_waits(now, free, releases, extra_rel, waiters, pow2=res == "gpu", policy=policy,
                                     rel_memo=memo)

    # -- placement ------------------------------------------------------------------------------
    def _grant(self, a: _Action, units: int, now: float, *, queued: bool = True) -> Grant:
        L = self.ledger
        spec = a.spec
        ncpu = units if a.eres == "cpu" else a.cpu_min
        cpus: tuple[int, ...] = ()
        if ncpu:
            if a.span:
                picked: list[int] = []
                for i in sorted(range(len(L.node_free)), key=lambda i: -len(L.node_free[i])):
                    take = sorted(L.node_free[i])[: ncpu - len(picked)]
                    picked.extend(take)
                    if len(picked) >= ncpu:
                        break
                cpus = tuple(sorted(picked))
            elif ncpu == 1:
                cpus = (min(L.node_free[a.node]),)
            else:
                cpus = tuple(sorted(L.node_free[a.node])[:ncpu])
        gpus: tuple[int, ...] = ()
        restore = False
        if a.gpu_min:
            size = units if a.eres == "gpu" else a.gpu_min
            pos = tuple(range(a.cell, a.cell + size))
            gpus = tuple(L.gpu_ids[p] for p in pos)
            if spec.service is not None:
                key = (spec.service, pos)
                restore = key not in self._resident
                if restore:
                    self._cell_memo.clear()
                self._resident.add(key, now)
            for p in pos:
                self._gpu_holder[p] = a
        g = Grant(a.id, cpus, gpus, units if a.eres else 0, spec.memory, spec.quotas, restore)
        L.take(g)
        if queued:
            self._dequeue(a)
        a.grant = g
        a.started = now
        if spec.duration is not None:
            est = spec.duration
        elif a.eres is None:
            est = a.stats.t1
        else:
            est = a.stats.t1 / a.sp_min
        if a.eres is not None:
            est *= spec.relative_duration(units)
        if restore:
            est += self._restore_cost(spec.service)
        a.est_end = now + est
        self._running[a.id] = a
        self.granted += 1
        self._sum_queue += now - a.submitted
        return g
