"""What a spec asks of a Tangram's pool: whether it can ever be served, and what was short.

Its own module because these are questions about one spec against the pool and the ledger, not
about the event loop: :func:`check_spec` runs at acquire, before the spec queues (an unknown quota
or an infeasible demand is an error at once, not after a wait that could never end), and
:func:`shortage` says what a waiter waited for when its time ran out. The runtime keeps the cache
of specs already checked and decides, inline on its hot path, when to call in here.
"""

from __future__ import annotations

from collections.abc import Sequence

from .errors import InfeasibleSpecError, SpecError
from .managers.base import Manager
from .pool import Pool
from .resources import MEMORY
from .scheduler import Scheduler
from .spec import ActionSpec

__all__ = ["MISSING", "check_spec", "shortage"]

MISSING = object()  # not a spec: the checked-specs cache's miss (a None spec is not checked)


def check_spec(core: Scheduler, managers: Sequence[Manager], checked: dict[int, ActionSpec],
               spec: ActionSpec) -> None:
    """``spec`` against the pool (once per spec object: ``checked`` holds those that passed), then
    against each manager (every time)."""
    if checked.get(id(spec), MISSING) is not spec:  # rollouts acquire the same few spec objects again
        key = spec
        if isinstance(spec, ActionSpec) and (spec.group is not None or spec.container is not None):
            # a copy per trajectory (the adapters' group, a sandbox): what the pool decides does
            # not depend on either, so the core's one stripped object stands for all of them
            key = core.without_container(spec)
        if checked.get(id(key), MISSING) is not key:
            _check_against_pool(core, key)
            if len(checked) > 1024:
                checked.clear()
            checked[id(key)] = key  # holds the spec, so its id cannot be reused while cached
    for m in managers:  # not cached: a container or service can go away between acquires
        m.check(spec)


def _check_against_pool(core: Scheduler, spec: ActionSpec) -> None:
    """What the pool alone decides (fixed for a Tangram's life, so checked once per spec)."""
    if not isinstance(spec, ActionSpec):
        raise SpecError(f"acquire() needs an ActionSpec, got {type(spec).__name__}")
    if spec.quotas:
        conc = core.ledger.q_conc
        for name, _ in spec.quotas:
            if name not in conc:
                raise SpecError(f"unknown quota {name!r}; this pool has {sorted(conc) or 'no quotas'}")
    for name, _ in spec.needs:
        if name not in core.ledger.counted_free:
            raise SpecError(f"unknown resource {name!r}; this pool counts "
                            f"{sorted(core.ledger.counted_free) or 'no resources'}")
    reason = core.feasibility(spec)
    if reason is not None:
        raise InfeasibleSpecError(f"{spec.kind}: {reason}")


def shortage(core: Scheduler, pool: Pool, spec: ActionSpec) -> str:
    """``waited for 2 cpus + api x1 (cpus 0/4 free, api 1/1 used, 3 queued)``."""
    if not isinstance(spec, ActionSpec):
        raise SpecError(f"shortage() needs an ActionSpec, got {type(spec).__name__}")
    need: list[str] = []
    have: list[str] = []
    L = core.ledger
    if spec.cpus:
        need.append(f"{spec.cpus} cpu{'s' if spec.cpus != 1 else ''}")
        have.append(f"cpus {L.free_cpus}/{len(pool.cpus)} free")
    if spec.gpus:
        need.append(f"{spec.gpus} gpu{'s' if spec.gpus != 1 else ''}")
        have.append(f"gpus {L.free_gpus}/{len(pool.gpus)} free")
    unit_of = {k.name: k.unit for k, _ in pool.counted_kinds}
    for name, n in (*((("memory", spec.memory),) if spec.memory else ()), *spec.needs):
        unit = unit_of.get(name, MEMORY.unit if name == MEMORY.name else "units")  # memory= may be uncounted
        need.append(f"{n} {unit} {name}")
        free = L.counted_free.get(name)
        if free is not None:
            have.append(f"{name} {free} {unit} free")
    for name, units in spec.quotas:
        need.append(f"quota {name} x{units}")
        conc = L.q_conc.get(name)
        used = L.q_used.get(name, 0)
        have.append(f"{name} {used}/{conc} used" if conc is not None else f"{name} rate-limited")
    if spec.service is not None:
        need.append(f"service {spec.service!r}")
    what = " + ".join(need) or "nothing (an empty spec)"
    return f"waited for {what} ({', '.join([*have, f'{core.queued} queued'])})"
