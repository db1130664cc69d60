"""The round's steps around admission for running actions that can change size: grown malleable
ones shrunk back before it when cores are wanted, idle cores lent after it (malleable ones grown,
restartable stragglers restarted).

Why one object over :class:`.Malleables` and :class:`.Restarts`: the rule that joins them (shrink
only when a CPU action waits, grow or restart only when none does and cores sit idle, the CPU
sizing's release line forgotten whenever cores moved) is one policy, and the core's round should
read as its two calls. Like every collaborator it writes no core state: it appends ``Resize``
decisions and returns what the core records (whether to run the round again, when to look next).
"""

from __future__ import annotations

from .action import Action
from .decisions import Decision
from .ledger import Ledger
from .malleable import Malleables
from .moldable import CpuSizing
from .pricing import PRICE_GRID
from .queue import WaitQueue
from .restart import Restarts

__all__ = ["Resizing"]


class Resizing:
    __slots__ = ("ledger", "_queue", "_mall", "_rst", "_cpu")

    def __init__(self, ledger: Ledger, queue: WaitQueue, mall: Malleables, rst: Restarts, cpu: CpuSizing) -> None:
        self.ledger = ledger
        self._queue = queue
        self._mall = mall
        self._rst = rst
        self._cpu = cpu

    def cpu_waiting(self) -> bool:
        return any(n and spec.cpus for spec, n in self._queue.spec_queued.items())

    def shrink(self, out: list[Decision], now: float) -> bool:
        """Before admission: grown malleable actions give back what they borrowed when an action
        that needs cores waits. True if anything was given back (the round must run)."""
        if self._mall.grown and self.cpu_waiting() and self._mall.shrink_all(out, now):
            self._cpu.forget_releases()  # the release line holds their cores
            return True
        return False

    def lend_idle(self, out: list[Decision], now: float) -> float | None:
        """After admission, when no action that needs cores waits and cores are free: grow the
        malleable actions, then restart the restartable stragglers. Returns when to look again
        (a young one may outrun its estimate), None when nothing asks."""
        if self.cpu_waiting() or not self.ledger.free_cpus:
            return None
        mall = self._mall
        rst = self._rst
        n = len(out)
        wake = mall.grow_idle(out, now, self._cpu.dops_of) if mall.running else None
        if rst.running and self.ledger.free_cpus:
            w = rst.restart_idle(out, now, lambda a: self._restart_size(a, now),
                                 lambda spec: self._cpu.dops_of(spec)[0])
            if w is not None and (wake is None or w < wake):
                wake = w
        if len(out) > n:
            self._cpu.forget_releases()
        return wake

    def due(self, now: float) -> float | None:
        """The first look a running malleable action (its estimate: it may grow after) or
        restartable one (its restart check) is due, None when none is."""
        wake = self._rst.next_due()
        for a in self._mall.running.values():
            if now < a.est_end and (wake is None or a.est_end < wake):
                wake = a.est_end
        return wake

    def _restart_size(self, a: Action, now: float) -> tuple[int, float]:
        """The size ``a``'s kind would be granted now, and the price per core-second then."""
        gi = self._cpu.price_now(a, now)
        return self._cpu.dops_of(a.spec)[gi], PRICE_GRID[gi]
