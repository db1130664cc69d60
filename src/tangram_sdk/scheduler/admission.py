"""One scheduling round: admit waiting actions FCFS at their minimum (an action that does not fit
blocks only the resources it lacks), let :class:`.Planning` split the spare elastic units, then
place and grant. Also the uncontended shortcut that decides a lone action without the round's
bookkeeping, by the same fit rules."""

from __future__ import annotations

from .action import Action
from .state import SchedulerState
from .decisions import Decision, Grant

__all__ = ["Admission"]


class Admission(SchedulerState):
    _need_round: bool
    _blocked_last: set[str]
    _round_now: float
    _time_sensitive: bool
    rounds: int
    granted: int
    _sum_queue: float

    # ------------------------------------------------------------------------------ the round
    def _round(self, now: float) -> list[Decision]:
        mall = self._mall
        if mall:  # malleable actions running: shrink before admission, grow after
            pre: list[Decision] = []
            if mall.grown and self._cpu_waiting() and mall.shrink_all(pre, now):
                self._need_round = True
                self._cpu.forget_releases()  # the release line holds their cores
            pre.extend(self._round_plain(now))
            if not self._cpu_waiting() and self.ledger.free_cpus:
                n = len(pre)
                wake = mall.grow_idle(pre, now, self._cpu.dops_of)
                if len(pre) > n:
                    self._cpu.forget_releases()
                if wake is not None and (self.next_wakeup is None or wake < self.next_wakeup):
                    self.next_wakeup = wake  # look again when a young one outruns its estimate
            return pre
        return self._round_plain(now)

    def _arm_deadlines(self) -> None:
        """Keep ``next_wakeup`` no later than the earliest deadline of a queued action."""
        t = self._deadlines.earliest()
        if t is not None and (self.next_wakeup is None or t < self.next_wakeup):
            self.next_wakeup = t

    def _admit_deadline(self, a: Action, deadline: float, now: float, out: list[Decision]) -> None:
        """``a`` was queued with a deadline: refused now if it cannot start in time (see
        :mod:`.deadlines`), else its deadline is kept and armed."""
        r = self._deadlines.admit(a, deadline, now, self.rounds)
        if r is not None:
            self.rejected += 1
            out.append(r)
            return
        self._arm_deadlines()

    def _cpu_waiting(self) -> bool:
        return any(n and spec.cpus for spec, n in self._spec_queued.items())

    def _round_plain(self, now: float) -> list[Decision]:
        dl = self._deadlines
        if dl:  # rare: only actions submitted with a deadline put entries here
            out = dl.expire(now)
            if out:
                self.rejected += len(out)
                self._need_round = True
            out.extend(self._round_fcfs(now))
            self._arm_deadlines()
            return out
        return self._round_fcfs(now)

    def _round_fcfs(self, now: float) -> list[Decision]:
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
        node_free = L.node_count.copy()
        gfree = L.gpu_free
        counted = dict(L.counted_free) if L.counted_free else L.counted_free
        q_used = dict(L.q_used) if L.q_used else L.q_used
        tokens = dict(L.tokens) if L.tokens else L.tokens
        blocked: set[str] = set()
        sigs = wq.sig_count
        exhausted = False  # every queued action needs something already blocked: stop scanning
        svc_blocked = False  # a service waits for its warm copy: the next round may differ in time
        elastic_cands = False
        cands: list[Action] = []
        sized: dict[int, int] = {}  # priced CPU sizes chosen at admission
        priced = self.elastic and self.planner == "priced"
        gpu_priced = self.planner == "priced" and bool(self._cells)
        gpu = self._gpu
        gpu.begin_round()
        scanned = 0
        scan_limit = self.scan_limit
        queue = wq.by_prio[wq.prios[0]].values() if len(wq.prios) == 1 else iter(wq)
        for a in queue:
            if scanned >= scan_limit or exhausted:
                break
            scanned += 1
            if blocked and not a.keys.isdisjoint(blocked):
                continue
            lack, node, cell, span = self._fits(a, node_free, gfree, counted, q_used, tokens, now)
            if lack:
                blocked.update(lack)
                exhausted = True
                for sig in sigs:
                    if sig.isdisjoint(blocked):
                        exhausted = False
                        break
                continue
            gtake = a.gpu_min
            if cell >= 0 and (gpu_priced and (a.spec.service or a.eres == "gpu")):
                choice = gpu.choice(a, gfree, now)  # size, cell, or wait (gpu_sizing)
                if not choice.units:
                    gfree &= ~choice.awaited
                    if not choice.wait_all:  # a free warm copy is left: the next one may take it
                        continue
                    blocked.add(f"svc:{a.spec.service}:{a.gpu_min}")
                    svc_blocked = True
                    exhausted = all(not sig.isdisjoint(blocked) for sig in sigs)
                    continue
                gtake, cell = choice.units, choice.cell
                gpu.reserve(a, gtake, cell, now)
                if a.eres == "gpu":
                    sized[a.id] = gtake
            elif cell >= 0 and a.spec.service and self._place.should_wait_for_resident(a, cell, now):
                # later actions of the same service would make the same choice: skip them cheaply
                blocked.add(f"svc:{a.spec.service}:{a.gpu_min}")
                svc_blocked = True
                exhausted = all(not sig.isdisjoint(blocked) for sig in sigs)
                continue
            take = a.cpu_min
            if priced and a.eres == "cpu":
                take, wake = self._cpu.units(a, node, node_free, span, now, self.rounds)
                if wake is not None and (self.next_wakeup is None or wake < self.next_wakeup):
                    self.next_wakeup = wake
                if not take:  # waiting for more cores beats starting now on fewer
                    blocked.add("cpu")
                    svc_blocked = True
                    exhausted = all(not sig.isdisjoint(blocked) for sig in sigs)
                    continue
                sized[a.id] = take
            # tentatively reserve the minimum
            for name, q in a.spec.quotas:
                q_used[name] += q
                if name in tokens:
                    tokens[name] -= q
            for name, n in a.spec.tokens:
                tokens["#" + name] -= n
            for name, n in a.need:
                counted[name] -= n
            if span:
                need = take
                for i in sorted(range(len(node_free)), key=lambda i: -node_free[i]):
                    k = min(need, node_free[i])
                    node_free[i] -= k
                    need -= k
            elif node >= 0:
                node_free[node] -= take
            if cell >= 0:
                gfree &= ~(((1 << gtake) - 1) << cell)
            a.node, a.cell, a.span = node, cell, span
            if a.eres is not None and a.id not in sized:
                elastic_cands = True
            cands.append(a)
        self._blocked_last = blocked
        self._round_now = now
        self._time_sensitive = self.next_wakeup is not None or svc_blocked
        self._need_round = False
        if not cands:
            return []
        if not elastic_cands:  # the common FIFO case: everyone gets exactly the minimum
            return [self._grant(a, sized.get(a.id, 0), now) for a in cands]
        units = {a.id: a.emin for a in cands if a.eres is not None}
        units.update(sized)
        evicted: set[int] = set()
        if self.elastic:
            plan = self._planner.plan(cands, node_free, gfree, now, cpu=not priced)
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

    # -- admission helpers ----------------------------------------------------------------------
    def _fits(self, a: Action, node_free: list[int], gfree: int, counted: dict[str, int],
              q_used: dict[str, int], tokens: dict[str, float], now: float) -> tuple[list[str], int, int, bool]:
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
        if spec.tokens:
            L = self.ledger
            for name, n in spec.tokens:
                key = "#" + name
                if tokens[key] + 1e-9 < n:
                    if "q:" + name not in lack:
                        lack.append("q:" + name)
                    rate = L.q_rate[key]
                    assert rate is not None
                    t = now + (n - tokens[key]) / rate
                    if self.next_wakeup is None or t < self.next_wakeup:
                        self.next_wakeup = t
        for name, n in a.need:  # counted kinds (memory, declared resources): a count each
            if n > counted[name]:
                lack.append("n:" + name)
        node = -1
        span = False
        if a.cpu_min:
            node = self._place.pick_node(a, node_free)
            if node < 0:
                if a.cpu_min > self._max_node and sum(node_free) >= a.cpu_min:
                    span = True
                else:
                    lack.append("cpu")
        cell = -1
        if a.gpu_min:
            cell = self._place.pick_cell(a.gpu_min, spec.service, gfree)
            if cell < 0:
                lack.append("gpu")
        return lack, node, cell, span

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
        lack, node, cell, span = self._fits(a, L.node_count, L.gpu_free, L.counted_free,
                                           L.q_used, L.tokens, now)
        self._round_now = now
        if not lack and cell >= 0 and a.spec.service:
            if self.planner == "priced":
                gpu = self._gpu
                gpu.begin_round()
                choice = gpu.choice(a, L.gpu_free, now)
                if not choice.units:
                    lack = [f"svc:{a.spec.service}:{a.gpu_min}"]
                else:
                    cell = choice.cell
            elif self._place.should_wait_for_resident(a, cell, now):
                lack = [f"svc:{a.spec.service}:{a.gpu_min}"]
        if lack:
            self._blocked_last = set(lack)
            self._time_sensitive = self.next_wakeup is not None or bool(a.spec.service)
            self._need_round = False
            return False
        a.node, a.cell, a.span = node, cell, span
        return True

    # -- placement ------------------------------------------------------------------------------
    def _grant(self, a: Action, units: int, now: float, *, queued: bool = True) -> Grant:
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
        g = Grant(a.id, cpus, gpus, units if a.eres else 0, spec.memory, spec.quotas, restore, spec.tokens,
                  a.need)
        L.take(g)
        if queued:
            self._queue.remove(a)
        a.grant = g
        a.started = now
        est = self._dur_min(a)
        if a.eres is not None:
            est *= a.stats.rel(spec, units)
        if restore:
            est += self._gpu.restore_lat(self._place.restore_cost(spec.service), len(gpus))
        a.est_end = now + est
        self._running[a.id] = a
        if a.eres == "cpu":
            self._mall.admitted(a)
        self.granted += 1
        self._sum_queue += now - a.submitted
        return g
