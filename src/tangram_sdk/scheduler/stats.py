"""What :meth:`.Scheduler.statistics` reports: the typed snapshot and the ledger's half of it.

Kept out of the core because it only reads: assembling a snapshot is no part of a round, and the
field list (what the runtime and the metrics exporters rely on) is written down here once.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import attrs

from ..pool import Pool
from ..snapshot import Snapshot
from .ledger import Ledger

__all__ = ["SchedulerStats", "ledger_fields"]


@attrs.frozen(eq=False)
class SchedulerStats(Snapshot):
    """:meth:`Scheduler.statistics`: the pool's ledger and the core's counters right now (frozen;
    ``asdict()`` for JSON; ``s["granted"]``, ``.get``, ``dict(s)`` keep working for one release).

    ``quotas``: per quota ``used``, ``concurrency``, ``tokens`` and ``token_level`` (the request
    and token buckets, None without one). ``counted``: per counted kind the pool accounts (memory
    when counted, and its declared ``resources``) ``total``, ``free``, ``used`` and ``unit``.
    ``resizes``: Resize decisions so far (malleable actions grown or shrunk, restartable ones
    restarted); ``grown``: running malleable ones holding more than they were admitted with now;
    ``restarts``: restartable actions restarted on more cores. Means are None until there is
    something to average. ``fallback_dop``: the fixed DoP the pool's elastic CPU kind runs at
    while the fallback holds it there (``scheduler/fallback.py``), None while it is sized
    elastically."""

    cpus_total: int
    cpus_free: int
    gpus_total: int
    gpus_free: int
    memory_total: int | None
    memory_free: int | None
    quotas: Mapping[str, Mapping[str, Any]]
    counted: Mapping[str, Mapping[str, Any]]
    running: int
    queued: int
    submitted: int
    granted: int
    released: int
    cancelled: int
    rejected: int
    failed: int
    completed: int
    rounds: int
    evictions: int
    resizes: int
    grown: int
    restarts: int
    mean_act_s: float | None
    mean_queue_s: float | None
    mean_exec_s: float | None
    resident_services: int
    fallback_dop: int | None = None


def ledger_fields(pool: Pool, L: Ledger) -> dict[str, Any]:
    """The pool's half of a :class:`SchedulerStats`: totals, what is free, counted kinds, quotas."""
    return dict(
        cpus_total=len(pool.cpus), cpus_free=L.free_cpus,
        gpus_total=len(pool.gpus), gpus_free=L.free_gpus,
        memory_total=pool.memory, memory_free=L.mem_free,
        counted={k.name: {"total": cap, "free": L.counted_free[k.name],
                          "used": cap - L.counted_free[k.name], "unit": k.unit}
                 for k, cap in pool.counted_kinds},
        quotas={n: {"used": L.q_used[n], "concurrency": L.q_conc[n],
                    "tokens": (round(L.tokens[n], 3) if n in L.tokens else None),
                    "token_level": (round(L.tokens["#" + n], 3) if "#" + n in L.tokens else None)}
                for n in L.q_used},
    )
