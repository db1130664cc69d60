"""The pool of external resources one Tangram manages: concrete cores (with NUMA nodes), GPU indices
(with aligned cells), optional memory, and named API quotas."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import attrs

from ._cpuset import format_cpuset, parse_cpuset
from .errors import SpecError

__all__ = ["Pool", "Quota"]


@attrs.frozen
class Quota:
    """A named API quota: at most ``concurrency`` units held at once and/or a token bucket refilled
    at ``rate`` units per second holding up to ``burst`` tokens (default ``max(1, ceil(rate))``)."""

    concurrency: int | None = None
    rate: float | None = None
    burst: int | None = None

    def __attrs_post_init__(self) -> None:
        if self.concurrency is None and self.rate is None:
            raise SpecError("a Quota needs concurrency=, rate= or both")
        c = self.concurrency
        if c is not None and (isinstance(c, bool) or not isinstance(c, int) or c < 1):
            raise SpecError(f"quota concurrency must be an int >= 1, got {c!r}")
        r = self.rate
        if r is not None and (
            isinstance(r, bool) or not isinstance(r, (int, float)) or not math.isfinite(r) or r <= 0
        ):
            raise SpecError(f"quota rate must be a finite number > 0 per second, got {r!r}")
        b = self.burst
        if b is not None:
            if r is None:
                raise SpecError("quota burst only makes sense with a rate")
            if isinstance(b, bool) or not isinstance(b, int) or b < 1:
                raise SpecError(f"quota burst must be an int >= 1, got {b!r}")

    @property
    def bucket(self) -> int | None:
        """Token-bucket capacity, or None when the quota has no rate limit."""
        if self.rate is None:
            return None
        return self.burst if self.burst is not None else max(1, math.ceil(self.rate))


def _cpus(value: int | str | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise SpecError("cpus must be a count, a cpuset string or a list of core ids")
    if isinstance(value, int):
        if value < 0:
            raise SpecError(f"cpus must be >= 0, got {value}")
        return tuple(range(value))
    if isinstance(value, str):
        return parse_cpuset(value)
    ids = tuple(value)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise SpecError(f"core ids must be ints >= 0, got {i!r}")
    if len(set(ids)) != len(ids):
        raise SpecError("core ids must be unique")
    return tuple(sorted(ids))


def _gpus(value: int | Sequence[int]) -> tuple[int, ...]:
    if isinstance(value, bool):
        raise SpecError("gpus must be a count or a list of device indices")
    if isinstance(value, int):
        if value < 0:
            raise SpecError(f"gpus must be >= 0, got {value}")
        return tuple(range(value))
    ids = tuple(value)
    for i in ids:
        if isinstance(i, bool) or not isinstance(i, int) or i < 0:
            raise SpecError(f"GPU indices must be ints >= 0, got {i!r}")
    if len(set(ids)) != len(ids):
        raise SpecError("GPU indices must be unique")
    return ids


def _cells(value: Sequence[int]) -> tuple[int, ...]:
    cells = tuple(sorted(set(value)))
    if not cells:
        raise SpecError("gpu_cells must name at least one cell size")
    for c in cells:
        if isinstance(c, bool) or not isinstance(c, int) or c < 1 or c & (c - 1):
            raise SpecError(f"gpu cell sizes must be powers of two >= 1, got {c!r}")
    return cells


def _numa(value: Sequence[Sequence[int] | str] | None) -> tuple[tuple[int, ...], ...] | None:
    if value is None:
        return None
    if isinstance(value, str):
        raise SpecError("numa must be a list of per-node core lists (or cpuset strings)")
    return tuple(parse_cpuset(n) if isinstance(n, str) else _cpus(list(n)) for n in value)


def _quotas(value: Mapping[str, Quota] | None) -> tuple[tuple[str, Quota], ...]:
    if not value:
        return ()
    out = []
    for name, q in value.items():
        if not isinstance(name, str) or not name:
            raise SpecError(f"quota names must be non-empty strings, got {name!r}")
        if not isinstance(q, Quota):
            raise SpecError(f"quota {name!r} must be a Quota(...), got {q!r}")
        out.append((name, q))
    return tuple(sorted(out, key=lambda kv: kv[0]))


@attrs.frozen
class Pool:
    """Everything one Tangram may hand out.

    ``cpus``: a count, a cpuset string ("0-7,16-23") or core ids. ``numa``: core-id lists per NUMA
    node (None: one node). ``gpus``: a count or device indices; a GPU *cell* of size k is k GPUs at
    positions aligned to k in that list (so cells never straddle 8-GPU nodes). ``memory``: bytes, or
    None to leave memory unaccounted. ``quotas``: name -> Quota.
    """

    cpus: tuple[int, ...] = attrs.field(default=0, converter=_cpus)
    numa: tuple[tuple[int, ...], ...] | None = attrs.field(default=None, converter=_numa)
    gpus: tuple[int, ...] = attrs.field(default=0, converter=_gpus)
    gpu_cells: tuple[int, ...] = attrs.field(default=(1, 2, 4, 8), converter=_cells)
    memory: int | None = None
    quotas: tuple[tuple[str, Quota], ...] = attrs.field(default=None, converter=_quotas)

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
            raise SpecError(f"memory must be bytes >= 0 or None, got {m!r}")

    @property
    def numa_nodes(self) -> tuple[tuple[int, ...], ...]:
        """NUMA nodes as core-id tuples (one node holding every core when ``numa`` was not given)."""
        if self.numa is not None:
            return self.numa
        return (self.cpus,) if self.cpus else ()

    @property
    def quota_map(self) -> dict[str, Quota]:
        return dict(self.quotas)

    def describe(self) -> dict[str, Any]:
        return {
            "cpus": format_cpuset(self.cpus),
            "numa_nodes": len(self.numa_nodes),
            "gpus": list(self.gpus),
            "gpu_cells": list(self.gpu_cells),
            "memory": self.memory,
            "quotas": {k: attrs.asdict(q) for k, q in self.quotas},
        }
