"""The core's per-action record and what it derives once per distinct spec."""

from __future__ import annotations

from typing import NamedTuple

from ..pool import Pool
from ..spec import ActionSpec
from .decisions import Grant
from .learn import KindStats
from .ledger import Ledger

__all__ = ["Action", "Shape", "dur_min", "feasibility", "resource_keys", "shape_of", "spec_dur_min"]


class Action:
    """One submitted action as the core tracks it: static demands copied from its spec's
    :data:`Shape`, then placement and timing as it is admitted and granted."""

    __slots__ = ("id", "spec", "seq", "submitted", "keys", "cpu_min", "gpu_min", "eres", "emin",
                 "emax", "sp_min", "need", "plain", "node", "cell", "grant", "started", "est_end", "stats",
                 "span", "hint", "risk", "box")

    def __init__(self, aid: int, spec: ActionSpec, seq: int, now: float, stats: KindStats,
                 shape: Shape) -> None:
        self.id = aid
        self.spec = spec
        self.seq = seq
        self.submitted = now
        (_reason, self.keys, self.cpu_min, self.gpu_min, self.eres, self.emin, self.emax,
         self.sp_min, self.need, self.plain) = shape
        self.node = -1
        self.cell = -1
        self.span = False
        self.grant: Grant | None = None
        self.started = 0.0
        self.est_end = 0.0
        self.stats = stats
        self.hint: float | None = None  # the caller's seconds at the minimum units (Submitted.expected)
        self.risk = False  # a step risk: its hint is in its kind's far tail (moldable.CpuSizing.units)
        self.box: str | None = None  # an elastic CPU action's container (lengths.SandboxLengths)


def dur_min(a: Action) -> float:
    """Seconds ``a`` runs at its minimum units, from its spec or what its kind has learned (a
    caller's length hint only marks a step risk, see ``moldable.CpuSizing.units``)."""
    spec = a.spec
    if spec.duration is not None:
        return spec.duration
    st = a.stats
    if not a.eres:
        return st.t1
    if st.up is not None:  # upgraded to a fitted Amdahl shape (learn.KindStats._upgrade)
        return st.t1 / st.speedup_at(spec, spec.min_units)
    return st.t1 / (a.sp_min if st.beta == 1.0 else a.sp_min ** st.beta)


def spec_dur_min(spec: ActionSpec, st: KindStats | None, default_duration: float) -> float:
    """Seconds ``spec`` runs at its minimum units: its declared duration, else what its kind
    ``st`` has learned, else ``default_duration`` (before anything is learned)."""
    if spec.duration is not None:
        return spec.duration
    if st is None:
        return default_duration / spec.speedup(spec.min_units) if spec.elastic else default_duration
    return st.t1 / st.speedup_at(spec, spec.min_units) if spec.elastic else st.t1


class Shape(NamedTuple):
    """What the core derives once per distinct spec (memoised by spec, so a tuple: cheap to
    unpack into each :class:`Action`)."""

    reason: str | None  # why it can never fit this pool (None: it can)
    keys: frozenset[str]  # the resources it contends for (see resource_keys)
    cpu_min: int
    gpu_min: int
    eres: str | None  # its elastic resource, "cpu" / "gpu" / None
    emin: int  # the elastic unit range
    emax: int
    sp_min: float  # speedup at the minimum (durations are learned per unit, planned from the minimum)
    need: tuple[tuple[str, int], ...]  # units of the pool's counted kinds it takes (Grant.counted)
    plain: bool  # cores and nothing else (no quota, tokens, counted kind, GPU): on a one-node pool
                 # it fits exactly when node 0 has cpu_min free (the fast paths of admission)


def resource_keys(spec: ActionSpec) -> frozenset[str]:
    """The resources an action contends for: what a blocked action blocks for those behind it."""
    keys = set()
    if spec.cpus:
        keys.add("cpu")
    if spec.gpus:
        keys.add("gpu")
    if spec.memory:  # the counted kinds it names ("n:memory" also where the pool counts no memory)
        keys.add("n:memory")
    for name, _ in spec.needs:
        keys.add("n:" + name)
    for name, _ in spec.quotas:
        keys.add("q:" + name)
    for name, _ in spec.tokens:
        keys.add("q:" + name)
    if spec.service is not None:
        keys.add(f"svc:{spec.service}:{spec.gpus}")
    return frozenset(keys)


def shape_of(spec: ActionSpec, pool: Pool, ledger: Ledger, cells: tuple[int, ...],
             gpu_slots: float | None = None, replica: bool = False) -> Shape:
    """What the core derives from ``spec`` once (it memoises the answer per spec). ``gpu_slots``
    (models per GPU; None: not modelled) and ``replica`` (a copy per GPU, not 1/k of one): a
    service's copy must fit its GPUs, so the smallest grant is the first cell size it fits."""
    el = spec.elastic
    if el is None:
        eres, emin, emax = None, 0, 0
    else:
        eres, emin, emax = el.resource, (spec.cpus if el.resource == "cpu" else spec.gpus), el.max_units
    need = spec.needs
    if spec.memory and "memory" in ledger.counted_free:  # memory= is the built-in counted kind
        need = tuple(sorted((*need, ("memory", spec.memory))))
    reason = feasibility(spec, pool, ledger, cells)
    gpu_min = spec.gpus
    if reason is None and spec.service is not None and spec.gpus and gpu_slots is not None:
        hi = emax if eres == "gpu" else spec.gpus
        k = copy_min(spec.gpus, hi, cells, gpu_slots, replica)
        if k is None:
            per = 1.0 if replica else 1.0 / hi
            reason = (f"a copy of service {spec.service!r} needs {per:g} of a model's memory on each GPU "
                      f"at {hi} GPU(s), and a GPU holds {gpu_slots:g} (gpu_slots): "
                      + ("ask for more GPUs or an elastic GPU width" if not replica else "no width fits"))
        else:
            gpu_min = k
            if eres == "gpu":
                emin = k
    plain = bool(spec.cpus) and not (spec.quotas or spec.tokens or need or gpu_min)
    return Shape(reason, resource_keys(spec), spec.cpus, gpu_min, eres, emin, emax,
                 spec.speedup(emin) if eres else 1.0, need, plain)


def copy_min(lo: int, hi: int, cells: tuple[int, ...], gpu_slots: float, replica: bool) -> int | None:
    """The fewest GPUs in ``lo..hi`` (a legal cell size) on which one copy of a service fits, at
    ``gpu_slots`` models per GPU: a TP-k copy takes 1/k of a model on each GPU, a replica a whole
    one. A model larger than a GPU (``gpu_slots`` < 1) runs at TP-2 or wider, never on one GPU."""
    for c in cells:
        if lo <= c <= hi and (1.0 if replica else 1.0 / c) <= gpu_slots + 1e-9:
            return c
    return None


def feasibility(spec: ActionSpec, pool: Pool, ledger: Ledger, cells: tuple[int, ...]) -> str | None:
    """Why ``spec`` can never be granted by ``pool`` (``ledger``: its quotas; ``cells``: its legal
    GPU cell sizes), or None when it can."""
    if spec.cpus > len(pool.cpus):
        return f"cpus={spec.cpus} exceeds the pool's {len(pool.cpus)} cores"
    if spec.gpus:
        if spec.gpus > len(pool.gpus):
            return f"gpus={spec.gpus} exceeds the pool's {len(pool.gpus)} GPUs"
        if spec.gpus not in cells:
            return f"gpus={spec.gpus} is not a GPU cell size of this pool {cells}"
    if spec.memory or spec.needs:
        kinds = {k.name: (k, cap) for k, cap in pool.counted_kinds}
        # memory= on a pool that does not count memory is a limit for managers only
        demands = (*((("memory", spec.memory),) if spec.memory and "memory" in kinds else ()), *spec.needs)
        for name, n in sorted(demands):
            if name not in kinds:
                return f"unknown resource {name!r} (pool counts {sorted(kinds) or 'none'})"
            kind, cap = kinds[name]
            if n > cap:
                return f"{name}={n} exceeds the pool's {cap} {kind.unit}"
    conc = ledger.q_conc
    for name, q in spec.quotas:
        if name not in conc:
            return f"unknown quota {name!r} (pool has {sorted(conc)})"
        c = conc[name]
        if c is not None and q > c:
            return f"quota {name!r}: {q} units exceed its concurrency {c}"
        b = ledger.q_bucket[name]
        if b is not None and q > b:
            return f"quota {name!r}: {q} units exceed its burst {b}"
    for name, n in spec.tokens:
        key = "#" + name
        if key not in ledger.tokens:
            weighted = sorted(k[1:] for k in ledger.tokens if k.startswith("#"))
            return (f"tokens of quota {name!r}: the pool has no token-rate limit by that name (has {weighted}); "
                    f"declare one: Pool(quotas={{{name!r}: Quota(tokens_per_s=..., token_burst=...)}})")
        b = ledger.q_bucket[key]
        if b is not None and n > b:
            return f"tokens of quota {name!r}: {n} tokens exceed its token burst {b}"
    return None
