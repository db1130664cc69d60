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
from .state import SchedulerState

__all__ = ["Deadlines"]


class Deadlines(SchedulerState):
    _deadlines: list[tuple[float, int, int]]  # (deadline, seq, action id) of queued actions

    def _expire(self, now: float) -> list[Decision]:
        """Drop queued actions whose deadline has passed; Reject each."""
        out: list[Decision] = []
        heap = self._deadlines
        while heap and heap[0][0] <= now:
            _d, _seq, aid = heapq.heappop(heap)
            a = self._live.get(aid)
            if a is None or a.grant is not None:
                continue
            self._queue.remove(a)
            del self._live[aid]
            self.rejected += 1
            self._need_round = True
            out.append(Reject(aid, f"{a.spec.kind}: not granted before its deadline "
                                   f"(queued {now - a.submitted:.3f} s)", "deadline"))
        return out

    def _arm_deadlines(self) -> None:
        """Keep ``next_wakeup`` no later than the earliest deadline of a queued action."""
        heap = self._deadlines
        while heap:
            a = self._live.get(heap[0][2])
            if a is not None and a.grant is None:
                break
            heapq.heappop(heap)
        if heap and (self.next_wakeup is None or heap[0][0] < self.next_wakeup):
            self.next_wakeup = heap[0][0]

    def _admit_deadline(self, a: Action, deadline: float, now: float, out: list[Decision]) -> None:
        """``a`` was queued with a deadline: refuse it now if it cannot start in time, else
        remember the deadline so the queue drops it then."""
        est = self._estimate_start(a, now)
        if est > deadline:
            self._queue.remove(a)
            del self._live[a.id]
            self.rejected += 1
            when = "never, as the pool stands" if math.isinf(est) else f"in about {est - now:.3f} s"
            out.append(Reject(a.id, f"{a.spec.kind}: cannot start before its deadline in "
                                    f"{deadline - now:.3f} s (estimated start {when})", "deadline"))
            return
        heapq.heappush(self._deadlines, (deadline, a.seq, a.id))
        self._arm_deadlines()

    def _estimate_start(self, a: Action, now: float) -> float:
        """The earliest time ``a`` could start (see the module docstring)."""
        spec = a.spec
        L = self.ledger
        ahead_cpu = ahead_gpu = 0
        ahead_q: dict[str, int] = {}
        ahead_t: dict[str, int] = {}
        for x in self._queue:
            if x is a:
                break
            ahead_cpu += x.cpu_min
            ahead_gpu += x.gpu_min
            for name, q in x.spec.quotas:
                ahead_q[name] = ahead_q.get(name, 0) + q
            for name, n in x.spec.tokens:
                ahead_t[name] = ahead_t.get(name, 0) + n
        start = now
        if a.cpu_min:
            times, cum, _ = self._cpu.release_line(now, self.rounds)
            start = max(start, _when(ahead_cpu + a.cpu_min - L.free_cpus, times, cum, now))
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
                    start = max(start, _refill(L, name, ahead_q.get(name, 0) + q, now))
        for name, n in spec.tokens:
            start = max(start, _refill(L, "#" + name, ahead_t.get(name, 0) + n, now))
        return start


def _when(short: float, times: list[float], cum: list[int], now: float) -> float:
    """When ``short`` more units are back, from sorted release times and cumulative units."""
    if short <= 0:
        return now
    for t, c in zip(times, cum):
        if c >= short:
            return t
    return math.inf


def _when_list(short: float, rel: list[tuple[float, int]], now: float) -> float:
    if short <= 0:
        return now
    acc = 0
    for t, k in sorted(rel):
        acc += k
        if acc >= short:
            return t
    return math.inf


def _refill(L: Ledger, key: str, need: float, now: float) -> float:
    """When bucket ``key`` will hold ``need`` (it refills at its rate up to its cap)."""
    rate = L.q_rate[key]
    cap = L.q_bucket[key]
    assert rate is not None and cap is not None
    if need > cap:
        return math.inf
    level = min(float(cap), L.tokens[key] + rate * max(0.0, now - L.refilled_at))
    short = need - level
    if short <= 0:
        return now
    return now + short / rate
