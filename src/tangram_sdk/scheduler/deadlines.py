"""Deadlines: an action that cannot start before its deadline is refused when it asks, and one
still queued when its deadline passes is dropped from the queue. Both end in
``Reject(code="deadline")``, so the caller hears at once instead of after a useless wait (a rollout
step that ends, an RL timeout).

"Cannot start" is judged by an optimistic estimate: queued actions ahead of it take only their
minimum, running actions release at their expected ends (an overdue one is assumed half done),
and token buckets refill at their rates. Optimistic on purpose: refusing an action that would
have made it is worse than admitting one that waits until its deadline and is dropped then.
"""

from __future__ import annotations

import heapq
import math

from .action import Action
from .decisions import Decision, Reject
from .ledger import Ledger
from .moldable import CpuSizing
from .queue import WaitQueue

__all__ = ["Deadlines"]


class Deadlines:
    """The deadlines of queued actions, earliest first. Given at construction the live actions by
    id, the wait queue, the running actions, the ledger and the CPU sizing (its release line); an
    action refused or expired here leaves the queue and the live set here, and the Reject is
    returned for the core to count and emit."""

    __slots__ = ("heap", "_live", "_queue", "_running", "ledger", "_cpu")

    def __init__(self, live: dict[int, Action], queue: WaitQueue, running: dict[int, Action], ledger: Ledger,
                 cpu: CpuSizing) -> None:
        # (deadline, seq, action id) of queued actions; the core tests the list itself for
        # emptiness on every round (a list's truth is free, a __bool__ is a call)
        self.heap: list[tuple[float, int, int]] = []
        self._live = live
        self._queue = queue
        self._running = running
        self.ledger = ledger
        self._cpu = cpu

    def expire(self, now: float) -> list[Decision]:
        """Drop queued actions whose deadline has passed; Reject each."""
        out: list[Decision] = []
        heap = self.heap
        while heap and heap[0][0] <= now:
            _d, _seq, aid = heapq.heappop(heap)
            a = self._live.get(aid)
            if a is None or a.grant is not None:
                continue
            self._queue.remove(a)
            del self._live[aid]
            a.stats.inflight -= 1
            if aid in self._cpu.fallback.ids:
                self._cpu.fallback.dropped(aid)
            out.append(Reject(aid, f"{a.spec.kind}: not granted before its deadline "
                                   f"(queued {now - a.submitted:.3f} s)", "deadline"))
        return out

    def earliest(self) -> float | None:
        """The earliest deadline of a still queued action (None: none), for ``next_wakeup``."""
        heap = self.heap
        while heap:
            a = self._live.get(heap[0][2])
            if a is not None and a.grant is None:
                break
            heapq.heappop(heap)
        return heap[0][0] if heap else None

    def admit(self, a: Action, deadline: float, now: float, rnd: int) -> Reject | None:
        """``a`` was queued with a deadline: refuse it now (dropped from the queue) if it cannot
        start in time, else remember the deadline so :meth:`expire` drops it then. ``rnd``: the
        core's round number (the release line is memoised per round)."""
        est = self._estimate_start(a, now, rnd)
        if est > deadline:
            self._queue.remove(a)
            del self._live[a.id]
            a.stats.inflight -= 1
            if a.id in self._cpu.fallback.ids:
                self._cpu.fallback.dropped(a.id)
            when = "never, as the pool stands" if math.isinf(est) else f"in about {est - now:.3f} s"
            return Reject(a.id, f"{a.spec.kind}: cannot start before its deadline in "
                                f"{deadline - now:.3f} s (estimated start {when})", "deadline")
        heapq.heappush(self.heap, (deadline, a.seq, a.id))
        return None

    def _estimate_start(self, a: Action, now: float, rnd: int) -> float:
        """The earliest time ``a`` could start (see the module docstring)."""
        spec = a.spec
        L = self.ledger
        ahead_cpu = ahead_gpu = 0
        ahead_q: dict[str, int] = {}
        ahead_t: dict[str, int] = {}
        needs_gpu = bool(a.gpu_min)
        own_q = {name for name, _ in spec.quotas}
        own_t = {name for name, _ in spec.tokens}
        for x in self._queue:
            if x is a:
                break
            # optimistic: one ahead that also waits for something ``a`` does not need (a GPU, a
            # quota, a bucket) may be stuck on it and passed, so it is not counted against ``a``
            xs = x.spec
            if (x.gpu_min and not needs_gpu) or any(n not in own_q for n, _ in xs.quotas) \
                    or any(n not in own_t for n, _ in xs.tokens):
                continue
            ahead_cpu += x.cpu_min
            ahead_gpu += x.gpu_min
            for name, q in x.spec.quotas:
                ahead_q[name] = ahead_q.get(name, 0) + q
            for name, n in x.spec.tokens:
                ahead_t[name] = ahead_t.get(name, 0) + n
        start = now
        if a.cpu_min:
            line = self._cpu.book.line(now, rnd, self._running)  # taken now: the round's line
            short = ahead_cpu + a.cpu_min - L.free_cpus
            if short > 0:
                start = max(start, line.when(short))
        if a.gpu_min or spec.quotas:
            gpu_rel: list[tuple[float, int]] = []
            q_rel: dict[str, list[tuple[float, int]]] = {}
            for r in self._running.values():
                g = r.grant
                assert g is not None
                t = r.est_end if r.est_end > now else now + 0.5 * (now - r.started)
                if g.gpus:
                    gpu_rel.append((t, len(g.gpus)))
                for name, q in g.quotas:
                    q_rel.setdefault(name, []).append((t, q))
            if a.gpu_min:
                start = max(start, _when_list(ahead_gpu + a.gpu_min - L.free_gpus, gpu_rel, now))
            for name, q in spec.quotas:
                c = L.q_conc[name]
                if c is not None:
                    start = max(start, _when_list(ahead_q.get(name, 0) + q - (c - L.q_used[name]),
                                                  q_rel.get(name, []), now))
                if name in L.tokens:
                    start = max(start, _refill(L, name, ahead_q.get(name, 0) + q, q, now))
        for name, n in spec.tokens:
            start = max(start, _refill(L, "#" + name, ahead_t.get(name, 0) + n, n, now))
        return start


def _when_list(short: float, rel: list[tuple[float, int]], now: float) -> float:
    if short <= 0:
        return now
    acc = 0
    for t, k in sorted(rel):
        acc += k
        if acc >= short:
            return t
    return math.inf


def _refill(L: Ledger, key: str, need: float, own: float, now: float) -> float:
    """When bucket ``key`` will have handed out ``need`` (the queue ahead's and this action's
    ``own``): never only if ``own`` alone exceeds its cap; those ahead take theirs as it refills."""
    rate = L.q_rate[key]
    cap = L.q_bucket[key]
    assert rate is not None and cap is not None
    if own > cap:
        return math.inf
    level = min(float(cap), L.tokens[key] + rate * max(0.0, now - L.refilled_at))
    short = need - level
    if short <= 0:
        return now
    return now + short / rate
