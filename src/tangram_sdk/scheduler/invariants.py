"""The core's bookkeeping checked against itself (for tests): free plus granted is the pool, for
every kind of unit, and the residency's indexes agree with its copies."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from ..pool import Pool
from .action import Action
from .learn import KindStats
from .ledger import Ledger
from .residency import Residency

__all__ = ["check_inflight", "check_invariants"]


def check_invariants(pool: Pool, ledger: Ledger, resident: Residency, running: dict[int, Action], granted: int,
                     released: int) -> None:
    """Raise AssertionError if ``ledger`` disagrees with the ``running`` actions' grants."""
    L = ledger
    used_c: set[int] = set()
    used_g: set[int] = set()
    q_used = {n: 0 for n in L.q_used}
    counted = dict.fromkeys(L.counted_free, 0)
    for a in running.values():
        g = a.grant
        assert g is not None
        assert not (used_c & set(g.cpus)), f"core shared: {g.cpus}"
        assert not (used_g & set(g.gpus)), f"gpu shared: {g.gpus}"
        used_c |= set(g.cpus)
        used_g |= set(g.gpus)
        for n, k in g.counted:
            counted[n] += k
        assert g.counted == a.need, f"counted units {g.counted} != demand {a.need}"
        for n, q in g.quotas:
            q_used[n] += q
        assert len(g.cpus) >= a.spec.cpus and len(g.gpus) >= a.spec.gpus, "minimum not honoured"
        if a.eres is not None:
            assert a.emin <= g.units <= a.emax, "elastic units out of range"
    free_c = set().union(*L.node_free) if L.node_free else set()
    assert not (free_c & used_c), "a granted core is also free"
    assert free_c | used_c == set(pool.cpus), "cores lost"
    assert L.node_count == [len(x) for x in L.node_free], "node counts out of step"
    res = resident
    for p in range(len(L.gpu_ids)):
        on_p = {key for key in res.last_used if p in key[1]}
        assert res.inst_at[p] == on_p, f"residency index out of step on GPU position {p}"
        assert abs(res.use_at[p] - sum(1.0 / len(key[1]) for key in on_p)) < 1e-9, "GPU use out of step"
    free_g = {L.gpu_ids[i] for i in range(len(L.gpu_ids)) if L.gpu_free >> i & 1}
    assert not (free_g & used_g) and free_g | used_g == set(pool.gpus), "GPUs lost"
    assert q_used == L.q_used, f"quota accounting {q_used} != {L.q_used}"
    for n, c in L.q_conc.items():
        assert c is None or q_used[n] <= c, f"quota {n} over concurrency"
    for n, cap in pool.counted.items():
        assert 0 <= L.counted_free[n] and L.counted_free[n] + counted[n] == cap, f"{n} units lost"
    assert granted == released + len(running), "granted != released + running"


def check_inflight(live: Iterable[Action], kinds: Iterable[KindStats]) -> None:
    """Raise AssertionError if a kind's count of actions in flight is not its live actions'."""
    held: dict[int, list[Any]] = {}
    for a in live:
        held.setdefault(id(a.stats), [a.stats, 0])[1] += 1
    for st, n in held.values():
        assert st.inflight == n, f"kind in flight {st.inflight} != live {n}"
    for st in kinds:
        assert id(st) in held or st.inflight == 0, f"kind in flight {st.inflight} with none live"
