"""What an action asks for: a demand vector plus, optionally, one elastic resource.

Specs are frozen attrs classes validated at construction, so a bad spec fails where it is written,
not deep inside the scheduler. Everything here is pure data; the scheduler reads it, never mutates it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any, Literal, Protocol, Union, runtime_checkable

import attrs

from ._validate import CONTAINER_RE, NAME_RE, is_finite, show, to_float
from .errors import SpecError
from .resources import freeze_needs

__all__ = ["ActionSpec", "Amdahl", "Efficiency", "Elasticity", "Table", "Custom", "ElasticResource",
           "malleable_workers"]


def malleable_workers(held: int, most: int, per_core: int | None = None) -> int:
    """Workers a malleable command starts on ``held`` cores when it may be grown to ``most``:
    ``most`` (``per_core=None``), or ``per_core`` per core held, up to ``most``.

    Workers sized to the grant cannot use cores a grow adds, so the default is every core a grow
    may bring. Each worker beyond the cores held pays its start-up before any grow comes
    (pytest-xdist imports and collects in each): where that is not free, fewer per core cost less
    and leave a straggler less to grow into (docs/evaluation.md has both, measured)."""
    if per_core is None:
        return max(held, most)
    return max(held, min(most, per_core * held))


ElasticResource = Literal["cpu", "gpu"]

@runtime_checkable
class Efficiency(Protocol):
    """An efficiency model: ``speedup(m) = E(m) * m`` with ``0 < E(m) <= 1``."""

    def efficiency(self, m: int) -> float: ...

    def speedup(self, m: int) -> float: ...


def _fraction(value: Any) -> float:
    return to_float("Amdahl parallel fraction", value)


@attrs.frozen(cache_hash=True)
class Amdahl:
    """Amdahl's law: a fraction ``parallel`` of the work scales with units, the rest is serial.

    ``speedup(m) = 1 / ((1 - p) + p / m)``; with p=0.9 even infinite units give at most 10x.
    """

    parallel: float = attrs.field(converter=_fraction)

    @parallel.validator
    def _check(self, _a: Any, p: float) -> None:
        if not (0.0 <= p <= 1.0) or math.isnan(p):
            raise SpecError(f"Amdahl parallel fraction must be in [0, 1], got {show(p)}")

    def speedup(self, m: int) -> float:
        p = self.parallel
        return 1.0 / ((1.0 - p) + p / m)

    def efficiency(self, m: int) -> float:
        return self.speedup(m) / m


@attrs.frozen(cache_hash=True)
class Table:
    """A profiled efficiency table ``{units: E(units)}``; speedup is interpolated linearly between
    points, scaled proportionally below the first one and held flat beyond the last one (no gain
    from units nobody profiled)."""

    points: tuple[tuple[int, float], ...]

    @classmethod
    def from_mapping(cls, table: Mapping[int, float]) -> Table:
        """Validate ``{units: E(units)}``; keys are checked before sorting so mixed key types give a
        SpecError rather than a TypeError from ``sorted``."""
        if not isinstance(table, Mapping):
            raise SpecError(f"efficiency table must be a {{units: E}} mapping, got {show(table)}")
        if not table:
            raise SpecError("efficiency table is empty")
        for m in table:
            if isinstance(m, bool) or not isinstance(m, int) or m < 1:
                raise SpecError(f"efficiency table keys must be unit counts >= 1, got {show(m)}")
        pts: list[tuple[int, float]] = []
        for m, raw in sorted(table.items(), key=lambda kv: kv[0]):
            e = to_float(f"efficiency E({show(m)})", raw)
            if not (0.0 < e <= 1.0):
                raise SpecError(f"efficiency E({show(m)}) must be in (0, 1], got {show(e)}")
            pts.append((m, e))
        return cls(tuple(pts))

    def speedup(self, m: int) -> float:
        pts = self.points
        m0, e0 = pts[0]
        if m <= m0:
            return e0 * m0 * (m / m0)
        for (ma, ea), (mb, eb) in zip(pts, pts[1:]):
            if m <= mb:
                sa, sb = ea * ma, eb * mb
                return sa + (sb - sa) * (m - ma) / (mb - ma)
        ml, el = pts[-1]
        return el * ml

    def efficiency(self, m: int) -> float:
        return self.speedup(m) / m


@attrs.frozen(cache_hash=True)
class Custom:
    """A user function ``E(m)``; validated over the elastic range when the Elasticity is built."""

    fn: Callable[[int], float]

    def efficiency(self, m: int) -> float:
        return float(self.fn(m))

    def speedup(self, m: int) -> float:
        return self.efficiency(m) * m


EfficiencyLike = Union[Amdahl, Table, Custom, Efficiency, Mapping[int, float], Callable[[int], float]]


def _to_efficiency(value: EfficiencyLike) -> Efficiency:
    if isinstance(value, (Amdahl, Table, Custom)):
        return value
    if isinstance(value, Mapping):
        return Table.from_mapping(value)
    if callable(value):
        return Custom(value)
    raise SpecError(f"efficiency must be Amdahl(p), a {{units: E}} table or a callable, got {show(value)}")


# an Elasticity checks its efficiency for m up to this; a larger range is checked by the scheduler
CHECKED_UNITS = 1024


@attrs.frozen(cache_hash=True)  # hashed on every lookup of a spec's per-trajectory copy
class Elasticity:
    """How an action's duration shrinks with units of its one key elastic resource.

    ``T(m) = T1 / (E(m) * m)``. The minimum is the spec's own demand of that resource
    (``cpus`` or ``gpus``); ``max_units`` caps what the scheduler may grant.
    """

    resource: ElasticResource
    max_units: int
    efficiency: Efficiency = attrs.field(default=Amdahl(0.9), converter=_to_efficiency)
    malleable: bool = attrs.field(default=False, kw_only=True)
    """The running work can use cores added (or lose cores taken) mid-run: ``make -j`` over a
    cpuset, a thread pool that follows ``os.sched_getaffinity``. The scheduler then grows a long
    running action into idle cores and shrinks it back when others wait (``Resize``); a
    fixed-worker runner (``pytest -n 16``) is not malleable. CPU only."""
    restartable: bool = attrs.field(default=False, kw_only=True)
    """The work may be killed and run again from the start (it is idempotent: a test suite, a
    build, a linter). The scheduler then restarts an action that has run far past its kind's
    expected length on more cores, once, when cores sit idle (``Resize``): ``lease.run`` and
    ``lease.exec`` kill the command and run it again on the new cores. For fixed-worker runners
    that malleability cannot serve (``pytest -n {units}``). CPU only; not with ``malleable``."""

    def __repr__(self) -> str:  # the flags shown only when set: decision logs of other specs unchanged
        tail = ", malleable=True" if self.malleable else ""
        if self.restartable:
            tail += ", restartable=True"
        return (f"Elasticity(resource={self.resource!r}, max_units={self.max_units!r}, "
                f"efficiency={self.efficiency!r}{tail})")

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.malleable, bool):
            raise SpecError(f"malleable must be True or False, got {show(self.malleable)}")
        if self.malleable and self.resource != "cpu":
            raise SpecError("malleable elasticity is for CPU cores only (a GPU instance's width is fixed)")
        if not isinstance(self.restartable, bool):
            raise SpecError(f"restartable must be True or False, got {show(self.restartable)}")
        if self.restartable and self.resource != "cpu":
            raise SpecError("restartable elasticity is for CPU cores only (a GPU call is not restarted)")
        if self.restartable and self.malleable:
            raise SpecError("malleable and restartable exclude each other: malleable work grows in place, "
                            "restartable work is run again on more cores; choose one")
        if self.resource not in ("cpu", "gpu"):
            raise SpecError(f"elastic resource must be 'cpu' or 'gpu', got {show(self.resource)}")
        if isinstance(self.max_units, bool) or not isinstance(self.max_units, int) or self.max_units < 1:
            raise SpecError(f"max_units must be an int >= 1, got {show(self.max_units)}")
        problem = self.efficiency_problem(1, min(self.max_units, CHECKED_UNITS))
        if problem is not None:
            raise SpecError(problem)

    def efficiency_problem(self, lo: int, hi: int) -> str | None:
        """What is wrong with ``E(m)`` for ``m`` in ``lo..hi`` (None: nothing). Checked here up to
        :data:`CHECKED_UNITS`; the scheduler checks the rest of the range it will use."""
        for m in range(lo, hi + 1):
            try:
                e = self.efficiency.efficiency(m)
            except Exception as exc:  # a user callable may raise anything; say which m
                return f"efficiency model raised at m={m}: {show(exc)}"
            if not (0.0 < e <= 1.0 + 1e-9) or math.isnan(e):
                return f"efficiency E({show(m)}) must be in (0, 1], got {show(e)}"
        return None


def _nonneg_int(name: str) -> Callable[[Any, Any, Any], None]:
    def check(_inst: Any, _a: Any, value: Any) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise SpecError(f"{name} must be an int >= 0, got {show(value)}")

    return check


def _freeze_quotas(value: Mapping[str, int] | tuple[tuple[str, int], ...] | None) -> tuple[tuple[str, int], ...]:
    """Sorted ``(name, amount)`` pairs from a mapping or an iterable of pairs; any other shape (an
    int, a string, ``[1]``, ``[(a, b, c)]``) is a SpecError, not an unpacking TypeError/ValueError."""
    if value is None:
        return ()
    if isinstance(value, Mapping):
        items: Any = value.items()
    elif isinstance(value, (str, bytes, bytearray)) or not isinstance(value, Iterable):
        raise SpecError(f"quotas must be a {{name: amount}} mapping or (name, amount) pairs, got {show(value)}")
    else:
        items = value
    out: dict[str, int] = {}
    for pair in items:
        if not isinstance(pair, (tuple, list)) or len(pair) != 2:
            raise SpecError(f"quotas must be (name, amount) pairs, got {show(pair)}")
        name, amount = pair
        if not isinstance(name, str) or not NAME_RE.fullmatch(name):
            raise SpecError(f"quota name must be a short identifier, got {show(name)}")
        if isinstance(amount, bool) or not isinstance(amount, int) or amount < 1:
            raise SpecError(f"quota {show(name)} amount must be an int >= 1, got {show(amount)}")
        out[name] = amount
    return tuple(sorted(out.items()))


def _freeze_tokens(value: Mapping[str, int] | tuple[tuple[str, int], ...] | None) -> tuple[tuple[str, int], ...]:
    """Tokens an action draws from weighted quotas, frozen like ``quotas`` (same checks)."""
    try:
        return _freeze_quotas(value)
    except SpecError as exc:
        raise SpecError(str(exc).replace("quota", "tokens")) from None


@attrs.frozen(cache_hash=True)
class ActionSpec:
    """One action's demand: minimum CPU cores, GPUs, memory bytes and named quota units, plus an
    optional elastic resource. ``duration`` is seconds at the minimum units (learned per ``kind``
    when omitted). ``quotas`` is stored as sorted ``(name, amount)`` pairs so specs stay hashable.
    ``tokens`` names how many tokens the action draws from weighted quotas (a judge call of ~1200
    tokens: ``quotas={"judge": 1}, tokens={"judge": 1200}``); spent, not returned, and correctable
    after the call with ``lease.report_tokens``. ``needs``: units of the pool's declared counted
    resources (``{"sandbox_slots": 1}``), held for the lease and returned with it; ``memory`` is
    the built-in counted kind, kept as its own field. ``group`` names what this action is one of
    (a trajectory, a task, a repository): actions of one group are alike in length, so the core
    learns an elastic CPU action's length per group, as it does per ``container`` (which it
    replaces for that purpose), without routing anything; specs differing only in ``group`` are
    one market.
    """

    kind: str
    cpus: int = attrs.field(default=0, validator=_nonneg_int("cpus"))
    gpus: int = attrs.field(default=0, validator=_nonneg_int("gpus"))
    memory: int = attrs.field(default=0, validator=_nonneg_int("memory"))
    quotas: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_freeze_quotas)
    elastic: Elasticity | None = None
    duration: float | None = None
    priority: int = 0
    container: str | None = None
    service: str | None = None
    tokens: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=_freeze_tokens)
    needs: tuple[tuple[str, int], ...] = attrs.field(default=(), converter=freeze_needs)
    group: str | None = None

    def __repr__(self) -> str:
        """The attrs repr, leaving ``needs`` out while it is empty and ``group`` while it is None:
        decision logs and their hashes (benchmarks/decision_hash.py) are built from the repr of
        events, which hold specs, so a spec that uses neither prints exactly as before they existed."""
        parts = [f"{f.name}={getattr(self, f.name)!r}" for f in attrs.fields(ActionSpec)
                 if (f.name != "needs" or self.needs) and (f.name != "group" or self.group is not None)]
        return f"{type(self).__qualname__}({', '.join(parts)})"

    def __attrs_post_init__(self) -> None:
        if not isinstance(self.kind, str) or not NAME_RE.fullmatch(self.kind):
            raise SpecError(f"kind must be a short non-empty identifier, got {show(self.kind)}")
        if self.duration is not None:
            d = self.duration
            if isinstance(d, bool) or not isinstance(d, (int, float)) or not is_finite(d) or d <= 0:
                raise SpecError(f"duration must be a finite number of seconds > 0, got {show(d)}")
        if isinstance(self.priority, bool) or not isinstance(self.priority, int):
            raise SpecError(f"priority must be an int, got {show(self.priority)}")
        if self.container is not None and (
            not isinstance(self.container, str) or not CONTAINER_RE.fullmatch(self.container)
        ):
            raise SpecError(f"container must be a Docker id or name, got {show(self.container)}")
        if self.group is not None and (not isinstance(self.group, str) or not NAME_RE.fullmatch(self.group)):
            raise SpecError(f"group must be a short identifier (a trajectory, task or repository), got {show(self.group)}")
        if self.service is not None:
            if not isinstance(self.service, str) or not NAME_RE.fullmatch(self.service):
                raise SpecError(f"service must be a short identifier, got {show(self.service)}")
            if self.gpus < 1:
                raise SpecError(f"service {show(self.service)} needs gpus >= 1")
        el = self.elastic
        if el is not None:
            if not isinstance(el, Elasticity):
                raise SpecError(f"elastic must be an Elasticity, got {show(el)}")
            base = self.cpus if el.resource == "cpu" else self.gpus
            if base < 1:
                raise SpecError(
                    f"elastic on {show(el.resource)} needs {el.resource}s >= 1 as its minimum, got {show(base)}"
                )
            if el.max_units < base:
                raise SpecError(
                    f"elastic range below the minimum: max_units={show(el.max_units)} < {el.resource}s={show(base)}"
                )

    # -- derived views the scheduler uses -------------------------------------------------------
    @property
    def quota_map(self) -> dict[str, int]:
        return dict(self.quotas)

    @property
    def elastic_resource(self) -> ElasticResource | None:
        return None if self.elastic is None else self.elastic.resource

    @property
    def min_units(self) -> int:
        """Minimum units of the elastic resource (or 0 when the spec is not elastic)."""
        if self.elastic is None:
            return 0
        return self.cpus if self.elastic.resource == "cpu" else self.gpus

    @property
    def max_units(self) -> int:
        return 0 if self.elastic is None else self.elastic.max_units

    def speedup(self, m: int) -> float:
        """Speedup at ``m`` units relative to one unit (1.0 when not elastic)."""
        if self.elastic is None or m <= 0:
            return 1.0
        return self.elastic.efficiency.speedup(m)

    def relative_duration(self, m: int) -> float:
        """``T(m) / T(min)``: how much of the minimum-units duration remains at ``m`` units."""
        el = self.elastic
        if el is None:
            return 1.0
        # hot in planning (every size of every plan): speedup(min)/speedup(m) without the wrappers
        lo = self.cpus if el.resource == "cpu" else self.gpus
        sp = el.efficiency.speedup
        return (sp(lo) if lo > 0 else 1.0) / (sp(m) if m > 0 else 1.0)
