"""The actions waiting for a grant: FIFO per priority, highest priority first, with the counts
admission and pricing ask for on every round kept up to date as actions come and go (so nobody
rescans the queue to learn how many wait for a resource, a spec or a service)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from ..spec import ActionSpec
from .action import Action

__all__ = ["WaitQueue"]


class WaitQueue:
    """``by_prio``: one FIFO per priority. OrderedDict, not dict: a dict drained from the front
    keeps its dead slots until the next resize, and every round's scan would step over them first.
    ``prios``: the priorities present, highest first. ``n``: queued actions. ``sig_count`` /
    ``spec_queued`` / ``svc_queued``: queued actions per resource-key set / distinct spec / GPU
    service. ``newest``: the last one queued (the only one when the queue was empty, so the
    uncontended round needs no scan)."""

    __slots__ = ("by_prio", "prios", "n", "sig_count", "spec_queued", "svc_queued", "newest")

    def __init__(self) -> None:
        self.by_prio: dict[int, OrderedDict[int, Action]] = {}
        self.prios: list[int] = []
        self.n = 0
        self.sig_count: dict[frozenset[str], int] = {}
        self.spec_queued: dict[ActionSpec, int] = {}
        self.svc_queued: dict[str, int] = {}
        self.newest: Action | None = None

    def add(self, a: Action, keys: frozenset[str]) -> None:
        spec = a.spec
        q = self.by_prio.get(spec.priority)
        if q is None:
            q = self.by_prio[spec.priority] = OrderedDict()
            self.prios = sorted(self.by_prio, reverse=True)
        q[a.id] = a
        self.n += 1
        self.newest = a
        kc = self.sig_count
        kc[keys] = kc.get(keys, 0) + 1
        sq = self.spec_queued
        sq[spec] = sq.get(spec, 0) + 1
        if spec.service is not None:
            self.svc_queued[spec.service] = self.svc_queued.get(spec.service, 0) + 1

    def remove(self, a: Action) -> None:
        del self.by_prio[a.spec.priority][a.id]
        self.n -= 1
        kc = self.sig_count
        n = kc[a.keys] - 1
        if n:
            kc[a.keys] = n
        else:
            del kc[a.keys]
        sq = self.spec_queued
        n = sq[a.spec] - 1
        if n:
            sq[a.spec] = n
        else:
            del sq[a.spec]
        svc = a.spec.service
        if svc is not None:
            self.svc_queued[svc] -= 1

    def __iter__(self) -> Iterator[Action]:
        """Every queued action in scan order: by priority, then arrival."""
        for p in self.prios:
            yield from self.by_prio[p].values()

    def not_ahead(self, prio: int) -> bool:
        """A new action of priority ``prio`` would not be scanned before any queued one."""
        prios = self.prios
        if len(prios) == 1:
            return prio <= prios[0] or not self.by_prio[prios[0]]
        return all(prio <= p for p in prios if self.by_prio[p])
