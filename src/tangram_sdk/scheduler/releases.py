"""When running actions give their cores back: a book kept sorted as actions start and end.

The price of cores (moldable.CpuSizing) and start-or-wait ask every round how many cores the
running actions release by when. Rebuilding that from every running action each round was about
half of a simulated CPU step. The book keeps each running action's entry sorted by its end
estimate, and those already past their estimate apart, in order of start (their expected ends move
with the clock, but keep that order). A round's :class:`Line` merges the two only as far as the
round reads it: a few seconds ahead, about a fifth of the running actions on a contended pool. A
grant waits unsorted until the next round that reads the line, so an uncontended acquire, granted
and released between two such rounds, costs one dict operation each way.

An action past its estimate is assumed half done (heavy tails: the longer it has run, the longer
it will): expected back at ``now + (now - started) / 2``. Pure bookkeeping: no clock, no IO.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterable, Iterator, Mapping
from itertools import accumulate
from operator import itemgetter
from typing import Any

from .action import Action
from .supply import ExpectedSupply

__all__ = ["Line", "Release", "ReleaseBook"]

# (end estimate, cores, action id, started): sorted by estimate, then cores; the id makes it unique
_Entry = tuple[float, int, int, float]
# an entry past its estimate: (-started, cores, action id, estimate), latest start first
_Over = tuple[float, int, int, float]
Release = tuple[float, int]  # (expected time, cores)
_CHUNK = 32  # releases computed at a time when a reader walks the line


class _Lane:
    """One sorted set of entries (the pool's, or one node's) and, apart, those already past their
    estimates at ``at``, ordered by start, latest first: the order of their expected ends at any
    later time (``now + (now - started) / 2`` falls as ``started`` rises), so an entry joins that
    list once, when its estimate passes, instead of being recomputed and sorted every round."""

    __slots__ = ("ents", "over", "at")

    def __init__(self) -> None:
        self.ents: list[_Entry] = []
        self.over: list[_Over] = []
        self.at = -math.inf

    def add(self, ent: _Entry) -> None:
        insort(self.ents, ent)
        if ent[0] <= self.at:
            insort(self.over, _over(ent))

    def drop(self, ent: _Entry) -> None:
        _drop(self.ents, ent)
        if ent[0] <= self.at:
            _drop(self.over, _over(ent))

    def clear(self) -> None:
        self.ents.clear()
        self.over.clear()
        self.at = -math.inf

    def view(self, now: float) -> tuple[list[_Entry], list[_Over]]:
        """The entries not past their estimates at ``now``, and those past them, as of now (copies:
        what a line reads later in the round does not change)."""
        ents, over = self.ents, self.over
        j = bisect_right(ents, (now, math.inf))  # estimates <= now: overdue
        if now >= self.at:
            for e in ents[bisect_right(ents, (self.at, math.inf)):j]:  # overdue since last time
                insort(over, _over(e))
        else:  # the clock went back (never in the runtime or the simulator): from scratch
            over[:] = sorted(map(_over, ents[:j]))
        self.at = now
        return ents[j:], over.copy()


class ReleaseBook:
    """The running CPU actions' entries, in the whole pool and per NUMA node (a grant spanning
    nodes has a part on each). ``add`` after a grant, ``remove`` at its end, ``reset`` after
    grants changed in place (a malleable resize, a restart). Kept only while ``live``: from the
    first :meth:`line` on (a fixed policy never asks), so the core checks ``live`` before it calls
    ``add`` or ``remove`` (no call at all on the uncontended hot path of a fixed policy)."""

    __slots__ = ("_node_of", "_all", "_nodes", "_multi", "_ents", "_pending", "live", "_line", "_round",
                 "expected")

    def __init__(self, node_of: Mapping[int, int], nodes: int, *, expected: bool = False) -> None:
        self._node_of = node_of
        self._all = _Lane()
        self._multi = nodes > 1  # one node: its line is the pool's, no lanes of its own
        self._nodes: list[_Lane] = [_Lane() for _ in range(nodes)] if self._multi else []
        # id -> its entry and, on a pool of several nodes, (node, entry) per node it holds cores on
        self._ents: dict[int, tuple[_Entry, tuple[tuple[int, _Entry], ...]]] = {}
        self._pending: dict[int, Action] = {}  # granted since the last line: not in the lanes yet
        self.live = False
        self._line: Line | None = None  # the line of round ``_round``
        self._round = -1
        # the same entries counted by probability (supply.py): kept only for supply="expected"
        self.expected: ExpectedSupply | None = ExpectedSupply() if expected else None

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
        self._all.drop(ent)
        if self.expected is not None:
            self.expected.drop(aid)
        for n, part in parts:
            self._nodes[n].drop(part)

    def _merge(self) -> None:
        """The entries added since the last line, into the sorted lanes (per node too)."""
        node_of = self._node_of
        for aid, a in self._pending.items():
            g = a.grant
            assert g is not None
            cpus = g.cpus
            ent = (a.est_end, len(cpus), aid, a.started)
            self._all.add(ent)
            if self.expected is not None:
                self.expected.add(a, len(cpus))
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
                self._nodes[n].add(part)
            self._ents[aid] = (ent, parts)
        self._pending.clear()

    def reset(self, running: Iterable[Action]) -> None:
        """Rebuild from ``running`` (grants changed in place) and forget this round's line."""
        self._line = None
        if not self.live:
            return
        self._all.clear()
        for lane in self._nodes:
            lane.clear()
        self._ents.clear()
        self._pending.clear()
        if self.expected is not None:
            self.expected.clear()
        for a in running:
            self.add(a)

    def forget_line(self) -> None:
        """The next :meth:`line` is computed afresh, whatever its round."""
        self._line = None

    def supply(self, now: float, rnd: int, running: Mapping[int, Action]) -> ExpectedSupply:
        """The running actions' releases counted by probability, readied for round ``rnd`` (a book
        built with ``expected=True``)."""
        exp = self.expected
        assert exp is not None, "supply() needs ReleaseBook(..., expected=True)"
        if exp.ready(rnd):
            return exp
        self._catch_up(running)
        exp.at(now, rnd)
        return exp

    def _catch_up(self, running: Mapping[int, Action]) -> None:
        """Live from now on (filled from ``running`` the first time), every grant merged."""
        if not self.live:
            self.live = True
            self.reset(running.values())
        if self._pending:
            self._merge()

    def line(self, now: float, rnd: int, running: Mapping[int, Action]) -> Line:
        """The expected releases as of the first ask in round ``rnd`` (one :class:`Line` a round;
        a node's is taken from its entries as they were then). ``running``: what a book not yet
        live is filled from."""
        line = self._line
        if line is not None and self._round == rnd:
            return line
        self._catch_up(running)
        if self._all.ents:
            nodes = [lane.view(now) for lane in self._nodes] if self._multi else None
            line = self._line = Line(*self._all.view(now), now, nodes)
        else:  # nothing running holds cores: the one line with nothing to compute, ever
            line = self._line = _NONE
        self._round = rnd
        return line

    def entries(self) -> list[tuple[int, float, int]]:
        """``(id, estimate, cores)`` of every entry, for the invariant check (which the expected
        supply's slots must agree with)."""
        if self.expected is not None:
            merged = sorted((aid, ent[1]) for aid, (ent, _) in self._ents.items())
            if self.expected.entries() != merged:
                raise AssertionError(f"expected supply {self.expected.entries()[:4]}... != book {merged[:4]}...")
        out = [(aid, ent[0], ent[1]) for aid, (ent, _) in self._ents.items()]
        for aid, a in self._pending.items():
            assert a.grant is not None
            out.append((aid, a.est_end, len(a.grant.cpus)))
        return sorted(out)


class Line:
    """Expected releases ``(time, cores)`` in time order, computed only as far as they are read.

    A round reads a few seconds ahead (the pricing window, start-or-wait's patience): about a fifth
    of the running actions on a contended pool. The entries come in two runs, each in the order of
    its expected ends: those not past their estimates (ordered by estimate) and those past them
    (ordered by start, latest first); a read merges the next chunk of both and sorts it. The order
    is that of a sort of every ``(time, cores)`` pair, so every reader sees what a line built in
    full would give."""

    __slots__ = ("times", "cores", "cum", "known_before", "_over", "_oi", "_fut", "_fi", "_now", "_nodes",
                 "_node_lines")

    def __init__(self, fut: list[_Entry], over: list[_Over], now: float,
                 nodes: list[tuple[list[_Entry], list[_Over]]] | None) -> None:
        self._fut = fut  # not past their estimates, by estimate
        self._over = over  # past their estimates, latest start first
        self._now = now
        if len(fut) + len(over) <= _CHUNK:  # a small book: all of it now, as cheaply as it gets
            self._fi, self._oi = len(fut), len(over)
            pairs = [(now + 0.5 * (now + ns), k) for ns, k, _, _ in over] if over else []
            pairs.extend(map(_pair, fut))
            if over:
                pairs.sort()
            self.times: list[float] = list(map(_first, pairs))  # computed so far, in order
            self.cores: list[int] = list(map(_second, pairs))
            self.cum: list[int] = list(accumulate(self.cores))  # cores released by each, cumulative
            self.known_before = math.inf
        else:
            self._fi = self._oi = 0
            self.times, self.cores, self.cum = [], [], []
            # every release expected before this time is computed (and in ``times``): a reader
            # walking the line checks it inline, and calls compute() past it
            self.known_before = min(now + 0.5 * (now + over[0][0]) if over else math.inf,
                                    fut[0][0] if fut else math.inf)
        self._nodes = nodes  # per node (fut, over), or None: one node, this line is its line
        self._node_lines: dict[int, Line] = {}

    def node(self, n: int) -> Line:
        """Node ``n``'s expected releases (its part of grants spanning nodes)."""
        if self._nodes is None:
            return self
        hit = self._node_lines.get(n)
        if hit is None:
            hit = self._node_lines[n] = Line(*self._nodes[n], self._now, None)
        return hit

    def cores_by(self, t: float) -> int:
        """Cores expected back by ``t`` (inclusive)."""
        if t >= self.known_before:
            self.compute(t)
        j = bisect_right(self.times, t)
        return self.cum[j - 1] if j else 0

    def when(self, short: float) -> float:
        """When ``short`` more cores are back (``inf``: not in sight)."""
        i = 0
        while True:
            if i == len(self.cum) and not self.more():
                return math.inf
            if self.cum[i] >= short:
                return self.times[i]
            i += 1

    def __iter__(self) -> Iterator[Release]:
        i = 0
        times, cores = self.times, self.cores
        while True:
            if i == len(times) and not self.more():
                return
            yield times[i], cores[i]
            i += 1

    def full(self) -> tuple[list[float], list[int], list[int]]:
        """Every release: times, cores and cumulative cores (tests)."""
        self.compute(math.inf)
        return self.times, self.cores, self.cum

    def more(self) -> bool:
        """Compute the next releases; False when there is none."""
        if self.known_before == math.inf:
            return False
        self.compute(self.known_before)
        return True

    def compute(self, t: float) -> None:
        """Compute every release expected by ``t``, and a chunk more: a reader walking the line
        extends it a chunk at a time. The releases expected by a time, less those already
        computed, are the next ones in order, so a sort of that chunk alone continues the line."""
        over, fut = self._over, self._fut
        oi, fi = self._oi, self._fi
        no, nf = len(over), len(fut)
        now = self._now
        inf = math.inf
        if fi + _CHUNK >= nf and oi + _CHUNK >= no:  # less than a chunk left: all of it
            io, jf = no, nf
        else:
            # an overdue entry is expected back at now + (now - started) / 2 (over holds -started)
            t = max(t, min(fut[fi + _CHUNK][0] if fi + _CHUNK < nf else inf,
                           now + 0.5 * (now + over[oi + _CHUNK][0]) if oi + _CHUNK < no else inf))
            io = bisect_right(over, t, oi, key=lambda e: now + 0.5 * (now + e[0])) if oi < no else oi
            jf = bisect_right(fut, (t, inf), fi) if fi < nf else fi
        chunk: list[Any]  # (time, cores, ...) in order
        if io > oi:
            chunk = [(now + 0.5 * (now + ns), k) for ns, k, _, _ in over[oi:io]]
            if jf > fi:
                chunk.extend(map(_pair, fut[fi:jf]))
            chunk.sort()  # runs in order: a merge, and ties by cores
        elif jf > fi:
            chunk = fut[fi:jf]  # in order already: its first two fields are (time, cores)
        else:
            return
        self.times.extend(map(_first, chunk))
        ks = list(map(_second, chunk))
        self.cores.extend(ks)
        cum = self.cum
        acc = accumulate(ks, initial=cum[-1] if cum else 0)
        next(acc)  # the initial value: the last one already there (or none)
        cum.extend(acc)
        self._oi, self._fi = io, jf
        self.known_before = min(now + 0.5 * (now + over[io][0]) if io < no else inf,
                                fut[jf][0] if jf < nf else inf)


def _over(ent: _Entry) -> _Over:
    """An overdue entry's key: latest start first, then as the entry."""
    return (-ent[3], ent[1], ent[2], ent[0])


_pair = itemgetter(0, 1)
_first = itemgetter(0)
_second = itemgetter(1)
_NONE = Line([], [], 0.0, None)  # the line of an empty book


def _drop(lst: list[Any], ent: tuple[Any, ...]) -> None:
    """Remove ``ent`` (an entry, or an overdue key equal to one in ``lst``): loud if it is not
    there, since the book would have lost track of a running action."""
    i = bisect_left(lst, ent)
    if i == len(lst) or lst[i] != ent:
        raise AssertionError(f"release entry {ent!r} missing")
    del lst[i]
