"""Admission: walk the wait queue FCFS (by priority, then arrival) and reserve each action that fits
at its minimum; an action that does not fit blocks only the resources it lacks for everyone behind
it (no overtaking on a contended resource, so nobody starves), while actions needing other
resources still pass. Sizes decided at admission come from the collaborators that price them: the
CPU sizing (:mod:`.moldable`) for elastic CPU actions, the GPU market (:mod:`.gpu_sizing`) for GPU
service actions.

:class:`Admission` is a collaborator the core owns: given the ledger, the wait queue, the placement,
the CPU and GPU sizing and its options, :meth:`~Admission.scan` reads the queue and the ledger and
returns what one round admits (:class:`Admitted`); :meth:`~Admission.fits` is the one fit rule, also
used by the core's uncontended shortcut through :meth:`~Admission.alone`. None changes the ledger or
the queue: the core grants (or, for the planner's evictions, leaves queued) what they return.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from .action import Action
from .gpu_sizing import GpuSizing
from .ledger import Ledger
from .moldable import CpuSizing
from .placement import Placement
from .queue import WaitQueue

__all__ = ["Admission", "Admitted", "Fit"]

# fits(): (resources it lacks, NUMA node, GPU cell offset, spans nodes, when a missing token is back)
Fit = tuple[Sequence[str], int, int, bool, float | None]
_new_admitted = tuple.__new__
_FITS_NODE0: Fit = ((), 0, -1, False, None)  # fits on node 0, nothing lacking


class Admitted(NamedTuple):
    """What one round's scan admitted: the round snapshot the planner and the grants start from."""

    cands: list[Action]  # reserved at their minimum, FCFS order (node, cell, span set on each)
    sized: dict[int, int]  # action id -> units decided at admission (priced CPU, the GPU market)
    node_free: list[int]  # free cores per NUMA node with every candidate's minimum reserved
    gfree: int  # free GPU positions (mask), likewise
    blocked: set[str]  # resource keys some waiter lacked (round skipping relies on them)
    svc_blocked: bool  # a waiter chose to wait (warm copy, more cores): time may change the answer
    elastic: bool  # a candidate's elastic units are left to the planner
    wake: float | None  # when to look again (a rate-limit token back, awaited cores back)


class Admission:
    """The FCFS fit at the minimum (see the module docstring)."""

    __slots__ = ("ledger", "_queue", "_place", "_cpu", "_gpu", "scan_limit", "priced", "gpu_priced",
                 "_max_node")

    def __init__(self, ledger: Ledger, queue: WaitQueue, place: Placement, cpu: CpuSizing, gpu: GpuSizing, *,
                 scan_limit: int, priced: bool, gpu_priced: bool) -> None:
        self.ledger = ledger
        self._queue = queue
        self._place = place
        self._cpu = cpu
        self._gpu = gpu
        self.scan_limit = scan_limit
        self.priced = priced  # elastic CPU actions sized at admission by the price of cores
        self.gpu_priced = gpu_priced  # GPU service actions placed by the GPU market
        self._max_node = max(ledger.node_size) if ledger.node_size else 0

    def scan(self, now: float, rnd: int) -> Admitted:
        """One round's admission at ``now`` over the ledger as it stands (token buckets refilled
        to ``now`` by the core); ``rnd``: the core's round number (the CPU sizing memoises by it)."""
        wq = self._queue
        L = self.ledger
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
        wake: float | None = None
        cands: list[Action] = []
        sized: dict[int, int] = {}  # priced CPU sizes chosen at admission
        priced = self.priced
        gpu_priced = self.gpu_priced
        gpu = self._gpu
        if gpu_priced:  # only the GPU market's choices take cells tentatively
            gpu.begin_round()
        scanned = 0
        scan_limit = self.scan_limit
        one_node = len(node_free) == 1
        queue = wq.by_prio[wq.prios[0]].values() if len(wq.prios) == 1 else iter(wq)
        for a in queue:
            if scanned >= scan_limit or exhausted:
                break
            scanned += 1
            if blocked and not a.keys.isdisjoint(blocked):
                continue
            if one_node and a.plain:
                # fits() for a plain CPU action (Shape.plain) on a one-node pool, inline (what a
                # contended pool of fixed-size actions scans): node 0's free cores decide
                if node_free[0] >= a.cpu_min:
                    lack, node, cell, span, t = _FITS_NODE0
                else:
                    lack, node, cell, span, t = ("cpu",), -1, -1, False, None
            else:
                lack, node, cell, span, t = self.fits(a, node_free, gfree, counted, q_used, tokens, now)
            if t is not None and (wake is None or t < wake):
                wake = t
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
                take, t = self._cpu.units(a, node, node_free, span, now, rnd)
                if t is not None and (wake is None or t < wake):
                    wake = t
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
        # Admitted(...) without the namedtuple's Python __new__ (a call a round): the same typed tuple
        return _new_admitted(Admitted, (cands, sized, node_free, gfree, blocked, svc_blocked, elastic_cands, wake))

    def fits(self, a: Action, node_free: list[int], gfree: int, counted: dict[str, int],
             q_used: dict[str, int], tokens: dict[str, float], now: float) -> Fit:
        """Does ``a`` fit at its minimum in this (tentative) state? Returns the resources it lacks
        (empty when it fits), its NUMA node, GPU cell offset, whether it must span nodes, and,
        when a rate-limit token is missing, when it will be there (else None)."""
        lack: list[str] = []
        wake: float | None = None
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
                    if wake is None or t < wake:
                        wake = t
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
                    if wake is None or t < wake:
                        wake = t
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
        return lack, node, cell, span, wake

    def alone(self, a: Action, now: float, market: bool) -> tuple[Sequence[str], float | None]:
        """The uncontended shortcut's fit: the lone queued fixed-size action ``a`` checked on the
        ledger (token buckets refilled to ``now`` by the core) by exactly the round's rules, the
        GPU market's choice when ``market`` (else the wait for a busy warm copy) included. Returns
        what it lacks (empty: it fits, and its node, cell and span are set on it) and when a
        missing rate-limit token is back (else None)."""
        L = self.ledger
        lack, node, cell, span, wake = self.fits(a, L.node_count, L.gpu_free, L.counted_free, L.q_used, L.tokens, now)
        if not lack and cell >= 0 and a.spec.service:
            if market:
                gpu = self._gpu
                gpu.begin_round()
                choice = gpu.choice(a, L.gpu_free, now)
                if not choice.units:
                    lack = [f"svc:{a.spec.service}:{a.gpu_min}"]
                else:
                    cell = choice.cell
            elif self._place.should_wait_for_resident(a, cell, now):
                lack = [f"svc:{a.spec.service}:{a.gpu_min}"]
        if not lack:
            a.node, a.cell, a.span = node, cell, span
        return lack, wake
