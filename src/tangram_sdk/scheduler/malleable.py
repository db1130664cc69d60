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
"""

from __future__ import annotations

from .action import Action
from .decisions import Decision, Grant, Resize
from .gpu_sizing import GpuSizing

__all__ = ["Malleable"]


class Malleable(GpuSizing):
    def _init_malleable(self) -> None:
        # running malleable actions (id -> action), and the ones holding more than admitted
        self._mall: dict[int, Action] = {}
        self._grown: dict[int, tuple[int, ...]] = {}  # id -> cores it was admitted with
        self._mall_acc: dict[int, tuple[float, float]] = {}  # id -> (segment start, speedup-seconds)
        self.resizes = 0

    def _cpu_waiting(self) -> bool:
        return any(n and spec.cpus for spec, n in self._spec_queued.items())

    def _shrink_all(self, out: list[Decision], now: float) -> None:
        """Give back every borrowed core: someone needs cores."""
        for aid, base in list(self._grown.items()):
            a = self._mall[aid]
            g = a.grant
            assert g is not None
            keep = set(base)
            back = tuple(c for c in g.cpus if c not in keep)
            self.ledger.give(Grant(aid, back))
            self._resize(a, base, len(base), out, now)
            del self._grown[aid]
        self._need_round = True

    def _grow_idle(self, out: list[Decision], now: float) -> None:
        """Lend idle cores to malleable actions past their estimate, oldest first."""
        L = self.ledger
        for a in sorted(self._mall.values(), key=lambda x: x.started):
            g = a.grant
            assert g is not None
            if now < a.est_end or not g.cpus:
                wake = a.est_end
                if g.cpus and (self.next_wakeup is None or wake < self.next_wakeup):
                    self.next_wakeup = wake  # look again when it outruns its estimate
                continue
            want = self._dops_of(a.spec)[0]  # what its kind would get on an idle pool
            extra = want - g.units
            if extra <= 0:
                continue
            node = L.node_of[g.cpus[0]]
            free = L.node_free[node]
            if not free:
                continue
            more = tuple(sorted(free)[:extra])
            L.take(Grant(a.id, more))
            if a.id not in self._grown:
                self._grown[a.id] = g.cpus
            self._resize(a, tuple(sorted(g.cpus + more)), g.units + len(more), out, now)

    def _resize(self, a: Action, cpus: tuple[int, ...], units: int, out: list[Decision], now: float) -> None:
        g = a.grant
        assert g is not None
        seg, acc = self._mall_acc.get(a.id, (a.started, 0.0))
        self._mall_acc[a.id] = (now, acc + (now - seg) * a.spec.speedup(g.units))
        a.grant = g._replace(cpus=cpus, units=units)
        self.resizes += 1
        self._node_rel_all = None  # the release line holds this action's cores
        out.append(Resize(a.id, cpus, units))

    def _malleable_speedup(self, a: Action, now: float) -> float | None:
        """The time-weighted declared speedup a resized action ran at (None: never resized)."""
        hit = self._mall_acc.pop(a.id, None)
        self._mall.pop(a.id, None)
        self._grown.pop(a.id, None)
        if hit is None:
            return None
        seg, acc = hit
        g = a.grant
        assert g is not None
        total = now - a.started
        acc += (now - seg) * a.spec.speedup(g.units)
        return acc / total if total > 0 else a.spec.speedup(g.units)

    def _malleable_round(self, out: list[Decision], now: float) -> None:
        """After admission: grow into what is still idle when nobody that needs cores waits."""
        if self._mall and not self._cpu_waiting() and self.ledger.free_cpus:
            self._grow_idle(out, now)
