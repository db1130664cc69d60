"""The release book (scheduler/releases.py) against its definition: every running action's
expected release, recomputed from scratch and sorted. The price of cores and start-or-wait read
it every round, so an entry lost or left behind would size every later action wrong."""

from __future__ import annotations

import itertools
import math
import random
from types import SimpleNamespace
from typing import Any

import pytest

from tangram_sdk.scheduler import releases
from tangram_sdk.scheduler.releases import ReleaseBook


def _brute(running: dict[int, Any], node_of: list[int], nodes: int, now: float) -> tuple[Any, ...]:
    allr: list[tuple[float, int]] = []
    per: list[list[tuple[float, int]]] = [[] for _ in range(nodes)]
    for a in running.values():
        t = a.est_end if a.est_end > now else now + 0.5 * (now - a.started)
        allr.append((t, len(a.grant.cpus)))
        cnt: dict[int, int] = {}
        for c in a.grant.cpus:
            cnt[node_of[c]] = cnt.get(node_of[c], 0) + 1
        for n, k in cnt.items():
            per[n].append((t, k))
    allr.sort()
    cum, acc = [], 0
    for _, k in allr:
        acc += k
        cum.append(acc)
    return [t for t, _ in allr], cum, [sorted(p) for p in per]


@pytest.mark.parametrize("chunk", [1, 3, 16])
def test_the_book_gives_every_running_actions_release_in_order(chunk: int, monkeypatch: Any) -> None:
    monkeypatch.setattr(releases, "_CHUNK", chunk)  # a line computed a few releases at a time
    rng = random.Random(7 + chunk)
    for nodes in (1, 3):
        node_of = [c // 8 for c in range(8 * nodes)]
        book = ReleaseBook(node_of, nodes)
        running: dict[int, Any] = {}
        now, aid = 0.0, 0
        for rnd in range(400):
            now += rng.choice((0.0, rng.expovariate(2.0)))  # several asks at one time, too
            if rng.random() < 0.03:
                now = max(0.0, now - rng.expovariate(1.0))  # a clock that went back: still right
            r = rng.random()
            if running and r < 0.4:
                gone = rng.choice(list(running))
                del running[gone]
                book.remove(gone)
            elif r < 0.9:
                k = rng.randint(1, min(10, len(node_of)))
                first = rng.randrange(0, len(node_of) - k + 1)  # some span two nodes
                est = now + rng.choice((0.0, rng.expovariate(1.0)))  # estimates ending now, too
                a = SimpleNamespace(id=aid, grant=SimpleNamespace(cpus=tuple(range(first, first + k))),
                                    est_end=est, started=now)
                aid += 1
                running[a.id] = a
                book.add(a)  # type: ignore[arg-type]
            else:  # a resize in place (malleable, restart): the book is rebuilt
                a = rng.choice(list(running.values())) if running else None
                if a is not None:
                    a.est_end = now + rng.expovariate(1.0)
                    a.grant = SimpleNamespace(cpus=a.grant.cpus[:1])
                    book.reset(running.values())  # type: ignore[arg-type]
            line = book.line(now, rnd, running)
            assert book.line(now + 1.0, rnd, running) is line  # one line a round
            want_t, want_cum, want_per = _brute(running, node_of, nodes, now)
            # read lazily first, as a round does: a few windows, the start of a node's line, when
            # so many cores are back; each must see what the whole line would give
            for _ in range(3):
                t = now + rng.choice((0.0, rng.expovariate(2.0), rng.expovariate(0.2)))
                j = sum(1 for x in want_t if x <= t)
                assert line.cores_by(t) == (want_cum[j - 1] if j else 0)
                short = rng.randint(1, 12)
                assert line.when(short) == next((x for x, c in zip(want_t, want_cum) if c >= short),
                                                math.inf)
                n = rng.randrange(nodes)
                head = list(itertools.islice(line.node(n), rng.randint(0, 4)))
                assert head == want_per[n][:len(head)]
            if rng.random() < 0.5:  # a node's line is the book as it was when the line was taken
                x = SimpleNamespace(id=-1, grant=SimpleNamespace(cpus=(0,)), est_end=now, started=now)
                book.add(x)  # type: ignore[arg-type]
                book.remove(-1)
                book.add(x)  # type: ignore[arg-type]
                times, _, cum = line.full()
                got = (times, cum, [list(line.node(n)) for n in range(nodes)])
                book.remove(-1)
            else:
                times, _, cum = line.full()
                got = (times, cum, [list(line.node(n)) for n in range(nodes)])
            assert got == (want_t, want_cum, want_per)
        assert book.entries() == sorted((a.id, a.est_end, len(a.grant.cpus)) for a in running.values())


def test_a_removal_the_book_never_saw_added_is_ignored_and_a_lost_entry_is_loud() -> None:
    book = ReleaseBook([0, 0], 1)
    line = book.line(0.0, 0, {})
    assert line.full() == ([], [], []) and list(line.node(0)) == [] and book.live  # the first ask: live
    assert line.cores_by(9.0) == 0 and line.when(1) == math.inf
    book.remove(42)  # an action holding no cores (GPU only) was never added
    a = SimpleNamespace(id=1, grant=SimpleNamespace(cpus=(0,)), est_end=2.0, started=0.0)
    book.add(a)  # type: ignore[arg-type]
    book.line(1.0, 1, {1: a})  # merged into the sorted list
    book._all.clear()  # what a bookkeeping bug would leave
    try:
        book.remove(1)
    except AssertionError as e:
        assert "missing" in str(e)
    else:
        raise AssertionError("a lost entry went unnoticed")


def test_an_overdue_release_tied_with_estimates_takes_its_place_by_cores() -> None:
    """Start-or-wait walks a node's releases one at a time, so ties must come out as a full sort
    of ``(time, cores)`` would give them, whichever side (overdue or not) they come from."""
    book = ReleaseBook([0] * 16, 1)
    running: dict[int, Any] = {}
    for aid, (est, k, started) in enumerate([(1.0, 5, 0.0), (3.0, 2, 1.5), (3.0, 7, 1.5),
                                             (4.0, 1, 1.5), (1.5, 1, 0.0)]):
        running[aid] = SimpleNamespace(id=aid, grant=SimpleNamespace(cpus=tuple(range(k))),
                                       est_end=est, started=started)
        book.add(running[aid])  # type: ignore[arg-type]
    # at 2.0 the first is overdue, expected at 2 + (2 - 0) / 2 = 3.0, between the two estimates
    # of 3.0 by its 5 cores; the last is expected at 3.0 too, first of all by its 1 core
    line = book.line(2.0, 0, running)
    assert line.cores_by(2.9) == 0 and line.cores_by(3.0) == 15
    assert list(line.node(0)) == [(3.0, 1), (3.0, 2), (3.0, 5), (3.0, 7), (4.0, 1)]
    assert line.when(8) == 3.0 and line.when(16) == 4.0 and line.when(17) == math.inf
