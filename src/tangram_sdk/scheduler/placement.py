"""Where an admitted action goes: a NUMA node for its cores, an aligned GPU cell, and what
restoring a service there costs (its own restore plus the warm copies of other services it would
displace, priced by their learned call rates).

A collaborator the core owns, not a base class: it reads the ledger, the residency, who holds each
GPU, the wait queue's counts, the learned kinds and the round memo it is given (all shared
objects). Choosing changes none of them but its own cell memo; the core's grants and releases
place concretely through it (:meth:`~Placement.take_cpus`, :meth:`~Placement.take_cell`,
:meth:`~Placement.give_cell`: who holds each GPU, which copy a grant makes resident), and the GPU
manager's restores and evictions reach it as :meth:`~Placement.observe_residency` (what is
resident where, and what a restore costs, are the prices it keeps). The ledger stays the core's.
"""

from __future__ import annotations

import math

from .action import Action, dur_min
from .events import ServiceResidency
from .learn import KindStats
from .ledger import Ledger
from .memo import RoundMemo
from .queue import WaitQueue
from .residency import Residency

__all__ = ["Placement"]


class Placement:
    __slots__ = ("ledger", "_resident", "_gpu_holder", "_queue", "_kinds", "_memo", "_cell_memo",
                 "_restore_s", "default_restore_s", "gpu_slots")

    def __init__(self, ledger: Ledger, resident: Residency, gpu_holder: list[Action | None], queue: WaitQueue,
                 kinds: dict[str, KindStats], memo: RoundMemo, default_restore_s: float,
                 gpu_slots: float | None) -> None:
        self.ledger = ledger
        self._resident = resident
        self._gpu_holder = gpu_holder
        self._queue = queue
        self._kinds = kinds
        self._memo = memo
        # pick_cold_cell per (size, free mask): valid until residency changes (take_cell,
        # observe_residency clear it)
        self._cell_memo: dict[tuple[int, int], int] = {}
        self._restore_s: dict[str, float] = {}  # learned restore seconds per service (observe_residency)
        self.default_restore_s = default_restore_s
        self.gpu_slots = gpu_slots

    def take_cpus(self, a: Action, ncpu: int) -> tuple[int, ...]:
        """The ``ncpu`` cores granted to ``a``: the lowest free ones of its node, or, when it spans
        nodes, the lowest of the fullest nodes first."""
        L = self.ledger
        if a.span:
            picked: list[int] = []
            for i in sorted(range(len(L.node_free)), key=lambda i: -len(L.node_free[i])):
                take = sorted(L.node_free[i])[: ncpu - len(picked)]
                picked.extend(take)
                if len(picked) >= ncpu:
                    break
            return tuple(sorted(picked))
        if ncpu == 1:
            return (min(L.node_free[a.node]),)
        return tuple(sorted(L.node_free[a.node])[:ncpu])

    def take_cell(self, a: Action, size: int, now: float) -> tuple[tuple[int, ...], bool]:
        """``a`` is granted the ``size`` GPUs of its cell: their ids, and whether its service must be
        restored there (the copy is resident from now on, and ``a`` holds the GPUs)."""
        pos = tuple(range(a.cell, a.cell + size))
        gpus = tuple(self.ledger.gpu_ids[p] for p in pos)
        restore = False
        service = a.spec.service
        if service is not None:
            key = (service, pos)
            restore = key not in self._resident
            if restore:
                self._cell_memo.clear()
            self._resident.add(key, now)
        for p in pos:
            self._gpu_holder[p] = a
        return gpus, restore

    def give_cell(self, a: Action, gpus: tuple[int, ...], now: float) -> None:
        """``a`` released ``gpus``: nobody holds them, and its service's copy there was used now."""
        gpu_pos = self.ledger.gpu_pos
        for gid in gpus:
            self._gpu_holder[gpu_pos[gid]] = None
        if a.spec.service:
            self._resident.touch((a.spec.service, tuple(gpu_pos[x] for x in gpus)), now)

    def holders_due(self, now: float) -> float | None:
        """When to look again at a service call that chose to wait for a busy warm copy: the choice
        changes with time (a holder that overran its estimate is assumed half done, so its expected
        remainder grows with its age until restoring elsewhere pays). The first holder's due end,
        or, once overdue, when it has aged another quarter: a handful of looks per overrun. None
        when no GPU is held."""
        wake: float | None = None
        for h in self._gpu_holder:
            if h is None:
                continue
            t = h.est_end if h.est_end > now else now + max(0.05, 0.25 * (now - h.started))
            if wake is None or t < wake:
                wake = t
        return wake

    def observe_residency(self, ev: ServiceResidency, now: float, alpha: float, *, tp: bool) -> None:
        """The ``ServiceResidency`` event: the copy added or removed (the cell memo cleared with it)
        and its restore seconds learned, as one full model's restore when ``tp`` (a TP-k instance
        loads 1/k per GPU in parallel). GPUs the pool does not hold: ignored."""
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
            r = ev.restore_s * (len(ev.gpus) if tp else 1)
            old = self._restore_s.get(ev.service)
            self._restore_s[ev.service] = r if old is None else (1 - alpha) * old + alpha * r

    def restore_cost(self, service: str | None) -> float:
        if service is None:
            return 0.0
        return self._restore_s.get(service, self.default_restore_s)

    def pick_node(self, a: Action, node_free: list[int]) -> int:
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

    def pick_cell(self, size: int, service: str | None, mask: int) -> int:
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
            hit = memo[key] = self.pick_cold_cell(size, mask)
        return hit

    def pick_cold_cell(self, size: int, mask: int) -> int:
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

    def should_wait_for_resident(self, a: Action, cell: int, now: float) -> bool:
        """Waiting for a busy GPU that already holds the service can beat restoring it elsewhere."""
        svc = a.spec.service
        size = a.gpu_min
        cells = self._resident.cells_of(svc)
        if not cells or tuple(range(cell, cell + size)) in cells:
            return False
        restore = self.restore_cost(svc)
        # the soonest warm copy and how many there are: the same for every action of the service
        # scanned in this round (holders change only when the round grants), so computed once
        memo_key = (svc, size)
        hit = self._memo.warm.get(memo_key)
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
            hit = self._memo.warm[memo_key] = (best_wait, n_warm or 1)
        best_wait, n_warm = hit
        # everyone queued behind ``a`` for this service waits on the same warm copies: compare the
        # backlog's drain time with one restore, or a hot service never scales out (issue 5 finding)
        backlog = (self._queue.sig_count.get(a.keys, 1) - 1) * dur_min(a) / n_warm
        wait = best_wait + backlog
        # Restoring here may displace other services' warm copies; each one that is called again
        # within the wait pays a restore of its own. Without this price a hot service scaling out
        # on a tight pool just moves the restore around (MOPD thrash when every GPU caches someone).
        return wait < restore + self.displacement(svc, tuple(range(cell, cell + size)), wait, now)

    def displacement(self, svc: str | None, cell: tuple[int, ...], horizon: float, now: float) -> float:
        """Expected restore seconds that putting ``svc`` on ``cell`` costs *other* services whose
        warm copies live there: each pays a restore if it is called within ``horizon``."""
        cost = 0.0
        slots = self.gpu_slots
        victims = (self._resident.services_on(cell) if slots is None  # capacity unknown: all go
                   else self._resident.evicted_by(cell, slots))
        for other in victims:
            if other == svc:
                continue
            if self._queue.svc_queued.get(other):
                return math.inf  # its own waiters would use that warm copy: never take it from them
            cost += self.restore_cost(other) * min(1.0, self.service_rate(other, now) * horizon)
        return cost

    def cold_cost(self, svc: str, size: int, dur: float, now: float) -> float:
        """Restore plus displacement for a new ``size``-GPU instance of ``svc``, on the free cell
        where that is cheapest (memoised per round: the price grid asks many times)."""
        key = (svc, size)
        hit = self._memo.cold.get(key)
        if hit is not None:
            return hit
        restore = self.restore_cost(svc)
        o = self.pick_cell(size, svc, self.ledger.gpu_free)  # where placement would put it
        best = self.displacement(svc, tuple(range(o, o + size)), dur, now) if o >= 0 else 0.0
        self._memo.cold[key] = restore + best
        return restore + best

    def service_rate(self, service: str, now: float) -> float:
        """Calls per second of ``service`` (all kinds using it), from the learned arrival rates;
        computed for every service at once, at most once per round."""
        m = self._memo
        rates = m.rates
        if rates is None or m.rates_at != now:
            rates = {}
            for st, lam in self.kind_rates(now):
                svc = st.spec.service if st.spec is not None else None
                if svc is not None:
                    rates[svc] = rates.get(svc, 0.0) + lam
            m.rates, m.rates_at = rates, now
        return rates.get(service, 0.0)

    def kind_rates(self, now: float) -> list[tuple[KindStats, float]]:
        """Every kind's learned arrival rate at ``now``, once per round (placement pricing and
        the arrival lookahead both ask)."""
        m = self._memo
        memo = m.krates
        if memo is None or m.krates_at != now:
            memo = m.krates = [(st, st.rate(now)) for st in self._kinds.values()]
            m.krates_at = now
        return memo
