"""When running actions give their cores back: a book kept sorted as actions start and end.

The price of cores (moldable.CpuSizing) and start-or-wait ask every round how many cores the
running actions release by when. Rebuilding that from every running action each round was about
half of a simulated CPU step. The book keeps each running action's entry sorted by its end
estimate, so a round recomputes only the entries already past their estimate (their expected end
moves with the clock) and merges them with the rest, which stay in order. A grant waits unsorted
until the next round that reads the line, so an uncontended acquire, granted and released between
two such rounds, costs one dict operation each way.

An action past its estimate is assumed half done (heavy tails: the longer it has run, the longer
it will): expected back at ``now + (now - started) / 2``. Pure bookkeeping: no clock, no IO.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Mapping, Sequence
from itertools import accumulate

from .action import Action

__all__ = ["NodeReleases", "Release", "ReleaseBook", "ReleaseLine"]

# (end estimate, cores, action id, started): sorted by estimate, then cores; the id makes it unique
_Entry = tuple[float, int, int, float]
Release = tuple[float, int]  # (expected time, cores)
# sorted expected release times, cumulative cores, per node (expected time, cores) in order
ReleaseLine = tuple[list[float], list[int], Sequence[list[Release]]]


class ReleaseBook:
    """The running CPU actions' entries, in the whole pool and per NUMA node (a grant spanning
    nodes has a part on each). ``add`` after a grant, ``remove`` at its end, ``reset`` after
    grants changed in place (a malleable resize, a restart). Kept only while ``live``: from the
    first :meth:`line` on (a fixed policy never asks), so the core checks ``live`` before it calls
    ``add`` or ``remove`` (no call at all on the uncontended hot path of a fixed policy)."""

    __slots__ = ("_node_of", "_all", "_nodes", "_multi", "_ents", "_pending", "live", "_line", "_round")

    def __init__(self, node_of: Mapping[int, int], nodes: int) -> None:
        self._node_of = node_of
        self._all: list[_Entry] = []
        self._multi = nodes > 1  # one node: its line is the pool's, no lists of its own
        self._nodes: list[list[_Entry]] = [[] for _ in range(nodes)] if self._multi else []
        # id -> its entry and, on a pool of several nodes, (node, entry) per node it holds cores on
        self._ents: dict[int, tuple[_Entry, tuple[tuple[int, _Entry], ...]]] = {}
        self._pending: dict[int, Action] = {}  # granted since the last line: not in the lists yet
        self.live = False
        self._line: ReleaseLine | None = None  # the line of round ``_round``
        self._round = -1

    def add(self, a: Action) -> None:
        """``a`` holds cores now. Its entry waits unsorted until the next line merges it: an
        uncontended acquire adds and removes it again without touching the sorted lists."""
        g = a.grant
        assert g is not None
        if g.cpus:
            self._pending[a.id] = a

    def remove(self, aid: int) -> None:
        if self._pending.pop(aid, None) is not None:
            return
        hit = self._ents.pop(aid, None)
        if hit is None:
            return
        ent, parts = hit
        _drop(self._all, ent)
        for n, part in parts:
            _drop(self._nodes[n], part)

    def _merge(self) -> None:
        """The entries added since the last line, into the sorted lists (per node too)."""
        node_of = self._node_of
        for aid, a in self._pending.items():
            g = a.grant
            assert g is not None
            cpus = g.cpus
            ent = (a.est_end, len(cpus), aid, a.started)
            insort(self._all, ent)
            if not self._multi:
                self._ents[aid] = (ent, ())
                continue
            n0 = node_of[cpus[0]]
            if node_of[cpus[-1]] == n0:
                parts: tuple[tuple[int, _Entry], ...] = ((n0, ent),)
            else:  # a grant spanning nodes releases on each
                cnt: dict[int, int] = {}
                for c in cpus:
                    cnt[node_of[c]] = cnt.get(node_of[c], 0) + 1
                parts = tuple((n, (ent[0], kn, aid, ent[3])) for n, kn in cnt.items())
            for n, part in parts:
                insort(self._nodes[n], part)
            self._ents[aid] = (ent, parts)
        self._pending.clear()

    def reset(self, running: Iterable[Action]) -> None:
        """Rebuild from ``running`` (grants changed in place) and forget this round's line."""
        self._line = None
        if not self.live:
            return
        self._all.clear()
        for lst in self._nodes:
            lst.clear()
        self._ents.clear()
        self._pending.clear()
        for a in running:
            self.add(a)

    def forget_line(self) -> None:
        """The next :meth:`line` is computed afresh, whatever its round."""
        self._line = None

    def line(self, now: float, rnd: int, running: Mapping[int, Action]) -> ReleaseLine:
        """As of the first ask in round ``rnd``: expected release times in order, the cores
        released by each (cumulative), and each node's expected releases ``(time, cores)`` in
        order (a node's computed when first asked, from its entries as they were then).
        ``running``: what a book not yet live is filled from."""
        line = self._line
        if line is not None and self._round == rnd:
            return line
        if not self.live:
            self.live = True
            self.reset(running.values())
        if self._pending:
            self._merge()
        rel = _at(self._all, now) if self._all else []
        nodes: Sequence[list[Release]]
        nodes = NodeReleases(now, [lst.copy() for lst in self._nodes]) if self._multi else [rel]
        if rel:
            times, cores = zip(*rel)
            line = (list(times), list(accumulate(cores)), nodes)
        else:
            line = ([], [], nodes)
        self._line = line
        self._round = rnd
        return line

    def entries(self) -> list[tuple[int, float, int]]:
        """``(id, estimate, cores)`` of every entry, for the invariant check."""
        out = [(aid, ent[0], ent[1]) for aid, (ent, _) in self._ents.items()]
        for aid, a in self._pending.items():
            assert a.grant is not None
            out.append((aid, a.est_end, len(a.grant.cpus)))
        return sorted(out)


class NodeReleases(Sequence[list[Release]]):
    """Per node, ``(expected time, cores)`` in order: ``lines[n]``. A pool of many nodes asks
    for one or two a round, so each is computed on first use, from the node's entries as they
    were when the line was taken (a copy: grants later in the round do not change it)."""

    __slots__ = ("_now", "_entries", "_out")

    def __init__(self, now: float, entries: list[list[_Entry]]) -> None:
        self._now = now
        self._entries = entries
        self._out: list[list[Release] | None] = [None] * len(entries)

    def __getitem__(self, n: int) -> list[Release]:  # type: ignore[override]
        hit = self._out[n]
        if hit is None:
            hit = self._out[n] = _at(self._entries[n], self._now)
        return hit

    def __len__(self) -> int:
        return len(self._out)


def _drop(lst: list[_Entry], ent: _Entry) -> None:
    i = bisect_left(lst, ent)
    try:
        if lst[i] is not ent:
            raise IndexError(i)
    except IndexError:
        raise AssertionError(f"release entry {ent!r} missing") from None  # the book lost track: loud
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
