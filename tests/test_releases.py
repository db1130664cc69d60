"""The release book (scheduler/releases.py) against its definition: every running action's
expected release, recomputed from scratch and sorted. The price of cores and start-or-wait read
it every round, so an entry lost or left behind would size every later action wrong."""

from __future__ import annotations

import random
from types import SimpleNamespace
from typing import Any

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


def test_the_book_gives_every_running_actions_release_in_order() -> None:
    rng = random.Random(7)
    for nodes in (1, 3):
        node_of = [c // 8 for c in range(8 * nodes)]
        book = ReleaseBook(node_of, nodes)
        running: dict[int, Any] = {}
        now, aid = 0.0, 0
        for rnd in range(400):
            now += rng.choice((0.0, rng.expovariate(2.0)))  # several asks at one time, too
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
            times, cum, per = book.line(now, rnd, running)
            assert book.line(now + 1.0, rnd, running)[0] is times  # one line a round
            if rng.random() < 0.5:  # a node's line is the book as it was when the line was taken
                x = SimpleNamespace(id=-1, grant=SimpleNamespace(cpus=(0,)), est_end=now, started=now)
                book.add(x)  # type: ignore[arg-type]
                book.remove(-1)
                book.add(x)  # type: ignore[arg-type]
                got = (times, cum, [per[n] for n in range(nodes)])
                book.remove(-1)
            else:
                got = (times, cum, [per[n] for n in range(nodes)])
            assert got == _brute(running, node_of, nodes, now)
        assert book.entries() == sorted((a.id, a.est_end, len(a.grant.cpus)) for a in running.values())


def test_a_removal_the_book_never_saw_added_is_ignored_and_a_lost_entry_is_loud() -> None:
    book = ReleaseBook([0, 0], 1)
    assert book.line(0.0, 0, {}) == ([], [], [[]]) and book.live  # the first ask makes it live
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
