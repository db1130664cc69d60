"""Malleable CPU actions: grow a long-running action into idle cores, shrink it back on demand.

Why: moldable sizing decides an action's cores once, at admission, without knowing its length.
During an opening backlog every test starts at its minimum (throughput-optimal for mean ACT), and
the rare very long one keeps its one core after the backlog has cleared: it ends the RL step long
after every other trajectory (seed 2 of the contended matrix cells: one test of 331 core-seconds,
step 1.13-1.90x fifo4's). An action that can use cores added mid-run (``Elasticity(malleable=
True)``: ``make -j`` over a cpuset, a thread pool that follows its affinity) is grown, and only
then:

* **grow** when nothing that needs cores waits, and the action has outrun its estimate (a
  straggler by the only evidence there is: heavy-tailed lengths mean one that has run long will
  run long). It grows on its own NUMA node up to the size its kind would get at price zero;
* **shrink** back to the size it was admitted at, before admission, whenever an action that needs
  cores waits: growth only ever borrows cores nobody asked for, so it can never delay anyone by
  more than one resize.

A resize is a :class:`~.decisions.Resize` decision; the runtime applies it to the running work
(managers' ``resize``), the simulator re-times the remaining work. The learned duration of a
resized action is observed at its time-weighted speedup.

:class:`Malleables` is a collaborator the core owns (not a base class): it holds the running
malleable actions and what they borrowed, and touches only the ledger it is given.
"""

from __future__ import annotations

from collections.abc import Callable

from ..spec import ActionSpec
from .action import Action
from .decisions import Decision, Grant, Resize
from .ledger import Ledger

__all__ = ["Malleables"]


class Malleables:
    __slots__ = ("ledger", "running", "grown", "acc", "resizes")

    def __init__(self, ledger: Ledger) -> None:
        self.ledger = ledger
        self.running: dict[int, Action] = {}  # id -> running malleable action
        self.grown: dict[int, tuple[int, ...]] = {}  # id -> the cores it was admitted with
        self.acc: dict[int, tuple[float, float]] = {}  # id -> (segment start, speedup-seconds so far)
        self.resizes = 0

    def admitted(self, a: Action) -> None:
        """``a`` was just granted: track it if its spec is malleable."""
        el = a.spec.elastic
        if a.eres == "cpu" and el is not None and el.malleable:
            self.running[a.id] = a

    def shrink_all(self, out: list[Decision], now: float) -> bool:
        """Give back every borrowed core (someone needs cores). True if anything was given back."""
        if not self.grown:
            return False
        for aid, base in list(self.grown.items()):
            a = self.running[aid]
            g = a.grant
            assert g is not None
            keep = set(base)
            self.ledger.give(Grant(aid, tuple(c for c in g.cpus if c not in keep)))
            self._resize(a, base, len(base), out, now)
        self.grown.clear()
        return True

    def grow_idle(self, out: list[Decision], now: float,
                  dops_of: Callable[[ActionSpec], tuple[int, ...]]) -> float | None:
        """Lend idle cores to malleable actions past their estimate, oldest first, each up to
        ``dops_of(spec)[0]`` (its size at price zero). Returns the earliest estimate of one still
        young (when to look again), or None."""
        L = self.ledger
        wake: float | None = None
        for a in sorted(self.running.values(), key=lambda x: x.started):
            g = a.grant
            assert g is not None
            if not g.cpus:
                continue
            if now < a.est_end:
                if wake is None or a.est_end < wake:
                    wake = a.est_end
                continue
            extra = dops_of(a.spec)[0] - g.units
            if extra <= 0:
                continue
            free = L.node_free[L.node_of[g.cpus[0]]]
            if not free:
                continue
            more = tuple(sorted(free)[:extra])
            L.take(Grant(a.id, more))
            self.grown.setdefault(a.id, g.cpus)
            self._resize(a, tuple(sorted(g.cpus + more)), g.units + len(more), out, now)
        return wake

    def released(self, a: Action, now: float) -> float | None:
        """Forget ``a``; the time-weighted declared speedup it ran at if it was ever resized."""
        self.running.pop(a.id, None)
        self.grown.pop(a.id, None)
        hit = self.acc.pop(a.id, None)
        if hit is None:
            return None
        seg, acc = hit
        g = a.grant
        assert g is not None
        total = now - a.started
        acc += (now - seg) * a.spec.speedup(g.units)
        return acc / total if total > 0 else a.spec.speedup(g.units)

    def _resize(self, a: Action, cpus: tuple[int, ...], units: int, out: list[Decision], now: float) -> None:
        g = a.grant
        assert g is not None
        seg, acc = self.acc.get(a.id, (a.started, 0.0))
        self.acc[a.id] = (now, acc + (now - seg) * a.spec.speedup(g.units))
        a.grant = g._replace(cpus=cpus, units=units)
        self.resizes += 1
        out.append(Resize(a.id, cpus, units))
