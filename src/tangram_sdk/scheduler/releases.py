"""When running actions give their cores back: a book kept sorted as actions start and end.

The price of cores (moldable.CpuSizing) and start-or-wait ask every round how many cores the
running actions release by when. Rebuilding that from every running action each round was about
half of a simulated CPU step. The book keeps each running action's entry sorted by its end
estimate, so a round recomputes only the entries already past their estimate (their expected end
moves with the clock) and merges them with the rest, which stay in order.

An action past its estimate is assumed half done (heavy tails: the longer it has run, the longer
it will): expected back at ``now + (now - started) / 2``. Pure bookkeeping: no clock, no IO.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping
from itertools import accumulate

from .action import Action

# (end estimate, cores, action id, started): sorted by estimate, then cores; the id makes it unique
_Entry = tuple[float, int, int, float]
Release = tuple[float, int]  # (expected time, cores)


class ReleaseBook:
    """The running CPU actions' entries, in the whole pool and per NUMA node (a grant spanning
    nodes has a part on each). ``add`` after a grant, ``remove`` at its end, ``reset`` after
    grants changed in place (a malleable resize, a restart)."""

    __slots__ = ("_node_of", "_all", "_nodes", "_ents")

    def __init__(self, node_of: Mapping[int, int], nodes: int) -> None:
        self._node_of = node_of
        self._all: list[_Entry] = []
        self._nodes: list[list[_Entry]] = [[] for _ in range(nodes)]
        # id -> (estimate, cores, started, (node, cores) parts): what to find again at removal
        self._ents: dict[int, tuple[float, int, float, tuple[tuple[int, int], ...]]] = {}

    def add(self, a: Action) -> None:
        g = a.grant
        assert g is not None
        cpus = g.cpus
        if not cpus:
            return
        node_of = self._node_of
        k = len(cpus)
        n0 = node_of[cpus[0]]
        if node_of[cpus[-1]] == n0:
            parts: tuple[tuple[int, int], ...] = ((n0, k),)
        else:  # a grant spanning nodes releases on each
            cnt: dict[int, int] = {}
            for c in cpus:
                cnt[node_of[c]] = cnt.get(node_of[c], 0) + 1
            parts = tuple(cnt.items())
        e, s, aid = a.est_end, a.started, a.id
        self._ents[aid] = (e, k, s, parts)
        insort(self._all, (e, k, aid, s))
        for n, kn in parts:
            insort(self._nodes[n], (e, kn, aid, s))

    def remove(self, aid: int) -> None:
        hit = self._ents.pop(aid, None)
        if hit is None:
            return
        e, k, s, parts = hit
        _drop(self._all, (e, k, aid, s))
        for n, kn in parts:
            _drop(self._nodes[n], (e, kn, aid, s))

    def reset(self, running: Iterable[Action]) -> None:
        self._all.clear()
        for lst in self._nodes:
            lst.clear()
        self._ents.clear()
        for a in running:
            self.add(a)

    def line(self, now: float) -> tuple[list[float], list[int], NodeReleases]:
        """Expected release times in order, the cores released by each (cumulative), and each
        node's expected releases ``(time, cores)`` in order (computed when first asked, from the
        entries as they are now)."""
        rel = _at(self._all, now)
        if len(self._nodes) == 1:
            nodes = NodeReleases(now, None, rel)
        else:
            nodes = NodeReleases(now, [lst.copy() for lst in self._nodes])
        if not rel:
            return [], [], nodes
        times, cores = zip(*rel)
        return list(times), list(accumulate(cores)), nodes

    def entries(self) -> list[tuple[int, float, int]]:
        """``(id, estimate, cores)`` of every entry, for the invariant check."""
        return sorted((aid, e, k) for aid, (e, k, _, _) in self._ents.items())


class NodeReleases:
    """Per node, ``(expected time, cores)`` in order: ``lines[n]``. A pool of many nodes asks
    for one or two a round, so each is computed on first use, from the node's entries as they
    were when the line was taken (a copy: grants later in the round do not change it)."""

    __slots__ = ("_now", "_entries", "_out")

    def __init__(self, now: float, entries: list[list[_Entry]] | None, one: list[Release] | None = None) -> None:
        self._now = now
        self._entries = entries
        self._out: list[list[Release] | None] = [one] if one is not None else [None] * len(entries or ())

    def __getitem__(self, n: int) -> list[Release]:
        hit = self._out[n]
        if hit is None:
            assert self._entries is not None
            hit = self._out[n] = _at(self._entries[n], self._now)
        return hit


def _drop(lst: list[_Entry], ent: _Entry) -> None:
    i = bisect_left(lst, ent)
    if i == len(lst) or lst[i] != ent:
        raise AssertionError(f"release entry {ent!r} missing")  # the book lost track: loud
    del lst[i]


def _at(entries: list[_Entry], now: float) -> list[Release]:
    """``entries`` as ``(expected time, cores)`` at ``now``, sorted: the same list a sort of every
    entry's expected time would give, with only the overdue prefix recomputed."""
    i = bisect_right(entries, (now, math.inf))  # estimates <= now: overdue
    fut = [(e, k) for e, k, _, _ in entries[i:]] if i < len(entries) else []
    if not i:
        return fut
    over = [(now + 0.5 * (now - s), k) for _, k, _, s in entries[:i]]
    if not fut:
        over.sort()
        return over
    over += fut
    over.sort()  # two sorted-ish runs: the overdue ones (unordered) and the rest (in order)
    return over
