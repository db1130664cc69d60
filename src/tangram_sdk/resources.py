"""Resource kinds, declared once: what a pool hands out, in which unit, and how.

Two families:

* **placed** kinds hand out concrete, named units with a topology the scheduler plans around:
  ``cpus`` (core ids on NUMA nodes) and ``gpus`` (device positions in aligned cells). Their
  placement stays special (:mod:`.scheduler.placement`, :mod:`.scheduler.gpu_sizing`).
* **counted** kinds are divisible: the pool has N units, an action takes n of them, and any n
  units are as good as any other. ``memory`` (bytes) is the built-in one; a pool declares more
  (``Pool(resources={"sandbox_slots": 8, "disk": Counted(100 << 30, "bytes")})``) and an action
  asks for them by name (``ActionSpec(needs={"sandbox_slots": 1})``).

The ledger, feasibility, admission, grants (``Grant.counted``), leases (``lease.counted``),
statistics (``counted`` in the snapshots), metrics and traces iterate over the pool's counted kinds
by name, so a new counted resource is one Pool declaration, plus a manager if something in the
world must enforce it (reading ``lease.counted[name]`` in ``apply``).

Why the kinds travel with the Pool rather than in a process-wide registry: two Tangrams may count
different things, and a pool is what is pickled to a Ray node or written to a trace header.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Literal

import attrs

from ._validate import NAME_RE, show
from .errors import SpecError

__all__ = ["BUILTIN_KINDS", "CPUS", "GPUS", "MEMORY", "Counted", "ResourceKind"]


@attrs.frozen
class ResourceKind:
    """What one resource is: its ``name`` (how specs, grants, stats and metrics key it), its
    ``unit`` (for messages and docs), ``kind`` ("counted": divisible, any unit as good as another;
    "placed": concrete ids placed by a planner) and, for placed kinds, the ``topology`` that
    planner honours."""

    name: str
    unit: str = "units"
    kind: Literal["counted", "placed"] = "counted"
    topology: str | None = None


CPUS = ResourceKind("cpus", "cores", "placed", "NUMA nodes")
GPUS = ResourceKind("gpus", "GPUs", "placed", "aligned cells")
MEMORY = ResourceKind("memory", "bytes")
BUILTIN_KINDS: Mapping[str, ResourceKind] = {k.name: k for k in (CPUS, GPUS, MEMORY)}


def _unit(value: Any) -> str:
    if not isinstance(value, str) or not NAME_RE.fullmatch(value):
        raise SpecError(f"a resource unit must be a short word such as 'bytes' or 'slots', got {show(value)}")
    return value


@attrs.frozen
class Counted:
    """A pool's stock of one declared counted kind: ``capacity`` units of ``unit``. A plain int in
    ``Pool(resources=...)`` means ``Counted(n)`` (unit "units")."""

    capacity: int
    unit: str = attrs.field(default="units", converter=_unit)

    def __attrs_post_init__(self) -> None:
        c = self.capacity
        if isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise SpecError(f"a counted resource's capacity must be an int >= 0, got {show(c)}")


def check_name(what: str, name: Any) -> str:
    """A declared counted kind's name: a short identifier that is not a built-in kind (those have
    their own fields: ``cpus=``, ``gpus=``, ``memory=``)."""
    if not isinstance(name, str) or not NAME_RE.fullmatch(name):
        raise SpecError(f"{what} names must be short identifiers, got {show(name)}")
    if name in BUILTIN_KINDS:
        raise SpecError(f"{what}: {name!r} is a built-in resource; give it as {name}= instead")
    return name


def _pairs(what: str, value: Any) -> list[tuple[Any, Any]]:
    if isinstance(value, Mapping):
        return list(value.items())
    if isinstance(value, (list, tuple)) and all(isinstance(kv, (tuple, list)) and len(kv) == 2 for kv in value):
        return [tuple(kv) for kv in value]  # the stored pairs: attrs.evolve round-trips
    raise SpecError(f"{what} must map resource names to amounts, got {show(value)}")


def freeze_capacities(value: Any) -> tuple[tuple[str, Counted], ...]:
    """``Pool(resources=...)``: ``{name: int | Counted}`` (or the stored pairs) as sorted
    ``(name, Counted)`` pairs."""
    if value is None:
        return ()
    out: dict[str, Counted] = {}
    for name, c in _pairs("resources", value):
        check_name("resources", name)
        if isinstance(c, Counted):
            out[name] = c
        elif isinstance(c, bool) or not isinstance(c, int) or c < 0:
            raise SpecError(f"resource {name!r}: capacity must be an int >= 0 or a Counted(...), got {show(c)}")
        else:
            out[name] = Counted(c)
    return tuple(sorted(out.items()))


def freeze_needs(value: Any) -> tuple[tuple[str, int], ...]:
    """``ActionSpec(needs=...)``: ``{name: units}`` (or pairs) as sorted ``(name, units)`` pairs.
    Units are ints >= 0; a zero is no demand and is dropped, so equal demands compare equal."""
    if value is None:
        return ()
    out: dict[str, int] = {}
    for name, n in _pairs("needs", value):
        check_name("needs", name)
        if isinstance(n, bool) or not isinstance(n, int) or n < 0:
            raise SpecError(f"needs {name!r}: units must be an int >= 0, got {show(n)}")
        if n:
            out[name] = n
    return tuple(sorted(out.items()))
