"""The pool of external resources one Tangram manages: concrete cores (with NUMA nodes), GPU indices
(with aligned cells), optional memory, declared counted resources (:mod:`.resources`), and named API
quotas."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence, Set
from typing import Any

import attrs

from ._cpuset import _MAX_CPU, format_cpuset, parse_cpuset
from ._validate import is_finite, show
from .errors import SpecError
from .resources import MEMORY, Counted, ResourceKind, freeze_capacities

__all__ = ["Pool", "Quota"]

# Same bound as cpuset strings (ids < 65536): a pool comes from configs and trace headers, and
# ``Pool(cpus=10**10)`` would otherwise build a ten-billion-entry tuple. GPUs get the same sane cap.
_MAX_GPU = 1 << 16


def _id_list(field: str, what: str, value: Any, bound: int) -> tuple[int, ...]:
    """A list/tuple/range/set of distinct ints in ``[0, bound)``, type-checked before iterating so a
    float, None or a dict is a SpecError (not "not iterable") and the work stays bounded."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, (Sequence, Set)):
        raise SpecError(f"{field} must be a count or a list of {what}, got {show(value)}")
    try:
        n = len(value)
    except OverflowError:  # range(10**30)
        n = bound + 1
    if n > bound:
        raise SpecError(f"{field}: at most {bound} {what}, got {n}")
    ids = tuple(value)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < bound:
            raise SpecError(f"{field}: {what} must be ints in [0, {bound}), got {show(i)}")
    if len(set(ids)) != len(ids):
        raise SpecError(f"{field}: {what} must be unique")
    return ids


@attrs.frozen
class Quota:
    """A named API quota: at most ``concurrency`` units held at once and/or a token bucket refilled
    at ``rate`` units (requests) per second holding up to ``burst`` of them (default
    ``max(1, ceil(rate))``), and/or a second, weighted bucket of ``tokens_per_s`` tokens per second
    holding up to ``token_burst`` (default one minute's worth) that an action draws from by the
    tokens it states (``ActionSpec(tokens={name: n})``): judge and search APIs limit requests
    *and* tokens per minute, and both hold. :meth:`per_minute` builds one from the limits an API
    provider publishes."""

    concurrency: int | None = None
    rate: float | None = None
    burst: int | None = None
    tokens_per_s: float | None = None
    token_burst: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.concurrency is None and self.rate is None and self.tokens_per_s is None:
            raise SpecError("a Quota needs concurrency=, rate=, tokens_per_s= or a combination")
        c = self.concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise SpecError(f"quota concurrency must be an int >= 1, got {show(c)}")
        for field, r in (("rate", self.rate), ("tokens_per_s", self.tokens_per_s)):
            if r is not None and (
                isinstance(r, bool) or not isinstance(r, (int, float)) or not is_finite(r) or r <= 0
            ):
                raise SpecError(f"quota {field} must be a finite number > 0 per second, got {show(r)}")
        for field, b, r in (("burst", self.burst, self.rate), ("token_burst", self.token_burst, self.tokens_per_s)):
            if b is not None:
                if r is None:
                    raise SpecError(f"quota {field} only makes sense with "
                                    f"{'rate' if field == 'burst' else 'tokens_per_s'}")
                if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                    raise SpecError(f"quota {field} must be an int >= 1, got {show(b)}")

    @classmethod
    def per_minute(cls, requests: int | None = None, tokens: int | None = None, *,
                   concurrency: int | None = None) -> Quota:
        """Limits as API providers state them: ``requests`` and ``tokens`` per minute (a bucket
        holding one minute's worth, refilled continuously), plus optional ``concurrency``."""
        for what, v in (("requests", requests), ("tokens", tokens)):
            if v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                raise SpecError(f"per_minute {what} must be an int >= 1, got {show(v)}")
        return cls(concurrency=concurrency,
                   rate=None if requests is None else requests / 60.0, burst=requests,
                   tokens_per_s=None if tokens is None else tokens / 60.0, token_burst=tokens)

    @property
    def bucket(self) -> int | None:
        """Request token-bucket capacity, or None when the quota has no request-rate limit."""
        if self.rate is None:
            return None
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate))

    @property
    def token_bucket(self) -> int | None:
        """Weighted (token) bucket capacity, or None when the quota has no token-rate limit."""
        if self.tokens_per_s is None:
            return None
        return self.token_burst if self.token_burst is not None else max(1, math.ceil(60 * self.tokens_per_s))


def _cpus(value: int | str | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise SpecError("cpus must be a count, a cpuset string or a list of core ids")
    if isinstance(value, int):
        if not 0 <= value <= _MAX_CPU:
            raise SpecError(f"cpus must be a count in [0, {_MAX_CPU}], got {show(value)}")
        return tuple(range(value))
    if isinstance(value, str):
        return parse_cpuset(value)
    return tuple(sorted(_id_list("cpus", "core ids", value, _MAX_CPU)))


def _gpus(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise SpecError("gpus must be a count or a list of device indices")
    if isinstance(value, int):
        if not 0 <= value <= _MAX_GPU:
            raise SpecError(f"gpus must be a count in [0, {_MAX_GPU}], got {show(value)}")
        return tuple(range(value))
    return _id_list("gpus", "GPU indices", value, _MAX_GPU)


def _cells(value: Sequence[int]) -> tuple[int, ...]:
    """Checked element by element before ``set``/``sorted``, which would raise TypeError on an int,
    unhashable or mixed-type input."""
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, (Sequence, Set)):
        raise SpecError(f"gpu_cells must be a list of cell sizes, got {show(value)}")
    if len(value) > _MAX_GPU:
        raise SpecError(f"gpu_cells: at most {_MAX_GPU} cell sizes, got {len(value)}")
    for c in value:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1 or c & (c - 1):
            raise SpecError(f"gpu cell sizes must be powers of two >= 1, got {show(c)}")
    cells = tuple(sorted(set(value)))
    if not cells:
        raise SpecError("gpu_cells must name at least one cell size")
    return cells


def _numa(value: Sequence[Sequence[int] | str] | None) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Sequence):
        raise SpecError(f"numa must be a list of per-node core lists (or cpuset strings), got {show(value)}")
    if len(value) > _MAX_CPU:
        raise SpecError(f"numa: at most {_MAX_CPU} nodes, got {len(value)}")
    nodes: list[tuple[int, ...]] = []
    for node in value:
        n: Any = node  # untrusted: each element is type-checked below
        if isinstance(n, str):
            nodes.append(parse_cpuset(n))
        elif isinstance(n, (Sequence, Set)) and not isinstance(n, (bytes, bytearray)):
            nodes.append(_cpus(list(n)))
        else:
            raise SpecError(f"numa: each node must be a core-id list or a cpuset string, got {show(n)}")
    return tuple(nodes)


def _quotas(
    value: Mapping[str, Quota] | Sequence[tuple[str, Quota]] | None,
) -> tuple[tuple[str, Quota], ...]:
    """A ``{name: Quota}`` mapping; the stored ``(name, Quota)`` pairs are accepted too so that
    ``attrs.evolve(pool, ...)`` round-trips. Anything else is a SpecError, not an AttributeError."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items: list[tuple[Any, Any]] = list(value.items())
    elif isinstance(value, (list, tuple)) and all(isinstance(kv, tuple) and len(kv) == 2 for kv in value):
        items = list(value)
    else:
        raise SpecError(f"quotas must map names to Quota(...), got {show(value)}")
    out = []
    for name, q in items:
        if not isinstance(name, str) or not name:
            raise SpecError(f"quota names must be non-empty strings, got {show(name)}")
        if not isinstance(q, Quota):
            raise SpecError(f"quota {show(name)} must be a Quota(...), got {show(q)}")
        out.append((name, q))
    return tuple(sorted(out, key=lambda kv: kv[0]))


@attrs.frozen
class Pool:
    """Everything one Tangram may hand out.

    ``cpus``: a count, a cpuset string ("0-7,16-23") or core ids. ``numa``: core-id lists per NUMA
    node (None: one node). ``gpus``: a count or device indices; a GPU *cell* of size k is k GPUs at
    positions aligned to k in that list (so cells never straddle 8-GPU nodes). ``memory``: bytes, or
    None to leave memory unaccounted. ``resources``: more counted kinds, name -> capacity (an int,
    or ``Counted(n, unit)``), e.g. ``{"sandbox_slots": 8}``; actions ask for them with
    ``ActionSpec(needs={...})``. ``quotas``: name -> Quota.
    """

    cpus: tuple[int, ...] = attrs.field(default=0, converter=_cpus)
    numa: tuple[tuple[int, ...], ...] | None = attrs.field(default=None, converter=_numa)
    gpus: tuple[int, ...] = attrs.field(default=0, converter=_gpus)
    gpu_cells: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8), converter=_cells)
    memory: int | None = None
    quotas: tuple[tuple[str, Quota], ...] = attrs.field(default=None, converter=_quotas)
    resources: tuple[tuple[str, Counted], ...] = attrs.field(default=None, converter=freeze_capacities)

    def __attrs_post_init__(self) -> None:
        if self.numa is not None:
            nodes = self.numa
            seen: set[int] = set()
            for n in nodes:
                if seen & set(n):
                    raise SpecError("NUMA nodes must not share cores")
                seen |= set(n)
            if seen != set(self.cpus):
                missing = set(self.cpus) - seen
                extra = seen - set(self.cpus)
                raise SpecError(
                    f"NUMA nodes must partition the pool's cores (missing {format_cpuset(missing) or '-'},"
                    f" outside the pool {format_cpuset(extra) or '-'})"
                )
            object.__setattr__(self, "numa", tuple(n for n in nodes if n))
        m = self.memory
        if m is not None and (isinstance(m, bool) or not isinstance(m, int) or m < 0):
            raise SpecError(f"memory must be bytes >= 0 or None, got {show(m)}")
        clash = sorted({n for n, _ in self.resources} & {n for n, _ in self.quotas})
        if clash:
            raise SpecError(f"resources and quotas must not share names (stats and metrics key both by "
                            f"name): {clash}")

    @property
    def numa_nodes(self) -> tuple[tuple[int, ...], ...]:
        """NUMA nodes as core-id tuples (one node holding every core when ``numa`` was not given)."""
        if self.numa is not None:
            return self.numa
        return (self.cpus,) if self.cpus else ()

    def node_cores(self, core: int) -> int:
        """How many cores the NUMA node holding ``core`` has (0 if no node holds it): what a
        malleable action on that core can be grown to at most."""
        return next((len(n) for n in self.numa_nodes if core in n), 0)

    @property
    def quota_map(self) -> dict[str, Quota]:
        return dict(self.quotas)

    @property
    def counted_kinds(self) -> tuple[tuple[ResourceKind, int], ...]:
        """Every counted kind this pool accounts, with its capacity, sorted by name: ``memory``
        when the pool counts it, then the declared ``resources``. What the ledger, feasibility,
        statistics and metrics iterate over."""
        out = [(ResourceKind(n, c.unit), c.capacity) for n, c in self.resources]
        if self.memory is not None:
            out.append((MEMORY, self.memory))
        return tuple(sorted(out, key=lambda kc: kc[0].name))

    @property
    def counted(self) -> dict[str, int]:
        """Capacity per counted kind (``memory`` included when counted), by name."""
        return {k.name: cap for k, cap in self.counted_kinds}

    def describe(self) -> dict[str, Any]:
        return {
            "cpus": format_cpuset(self.cpus),
            "numa_nodes": len(self.numa_nodes),
            "gpus": list(self.gpus),
            "gpu_cells": list(self.gpu_cells),
            "memory": self.memory,
            "quotas": {k: attrs.asdict(q) for k, q in self.quotas},
            "resources": {k: {"capacity": c.capacity, "unit": c.unit} for k, c in self.resources},
        }
