"""The scheduler's knobs as one typed, frozen value: ``Tangram(pool, options=SchedulerOptions(...))``
and ``deploy(..., options=...)`` take it beside the keyword options they always took.

Why a value and not ``**kwargs``: a typo is an error where the options are written (not deep inside
a Ray actor), the options can be stored, compared, logged (``asdict()``) and shared between a live
Tangram and a simulated one. A field left ``None`` means "the Scheduler's default", so this class
never restates a default (see docs/scheduler.md#knobs for what each knob does). Types are checked
by this class, ranges (``window >= 1``...) by :func:`check_ranges` once the Scheduler has filled in
its defaults; both raise SpecError.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Mapping
from typing import Any, TypedDict

import attrs

from ._validate import show
from .errors import SpecError

__all__ = ["OBJECTIVE_PRICES", "SUPPLY_LOAD_TARGETS", "SchedulerKeywords", "SchedulerOptions", "check_ranges", "check_scheduler_options",
           "merge_options"]

# objective -> the price bound it implies when max_price is not given (scheduler/moldable.py):
# "step" keeps a floor of cores under any backlog, "act" / "balanced" let the price rise further
OBJECTIVE_PRICES = {"act": 2.0, "balanced": 2.0, "step": 0.75}
# load_target when not given, per ``supply``: the estimates' line counts about half of what is
# released within the window, so expected arrivals count at 2/3 against it; counted by probability
# (supply.py), supply is unbiased and arrivals count in full (docs/scheduler.md, "the clearing price")
SUPPLY_LOAD_TARGETS = {"estimate": 1.5, "expected": 1.0}


def _typed(kind: str) -> Any:
    def check(inst: Any, attr: attrs.Attribute[Any], value: Any) -> None:
        if value is None:
            return
        ok = {
            "int": isinstance(value, int) and not isinstance(value, bool),
            "float": isinstance(value, (int, float)) and not isinstance(value, bool),
            "bool": isinstance(value, bool),
            "str": isinstance(value, str),
        }[kind]
        if not ok:
            raise SpecError(f"SchedulerOptions.{attr.name} must be {kind} (or None for the default), got {show(value)}")
    return check


def _grid(value: Any) -> tuple[float, ...] | None:
    if value is None:
        return None
    if isinstance(value, (str, bytes)) or not isinstance(value, Iterable):
        raise SpecError(f"SchedulerOptions.mu_grid must be a sequence of numbers, got {show(value)}")
    out = tuple(value)
    if not out or any(isinstance(x, bool) or not isinstance(x, (int, float)) for x in out):
        raise SpecError(f"SchedulerOptions.mu_grid must be a non-empty sequence of numbers, got {show(value)}")
    return tuple(float(x) for x in out)


def _opt(kind: str) -> Any:
    return attrs.field(default=None, validator=_typed(kind), kw_only=True)


@attrs.frozen
class SchedulerOptions:
    """Every :class:`~tangram_sdk.scheduler.core.Scheduler` option; ``None`` (the default for each
    field) leaves the Scheduler's own default."""

    window: int | None = _opt("int")
    depth: int | None = _opt("int")
    scan_limit: int | None = _opt("int")
    elastic: bool | None = _opt("bool")
    lookahead: bool | None = _opt("bool")
    default_duration: float | None = _opt("float")
    default_restore_s: float | None = _opt("float")
    alpha: float | None = _opt("float")
    duration_alpha: float | None = _opt("float")
    learn_efficiency: bool | None = _opt("bool")
    mu_grid: tuple[float, ...] | None = attrs.field(default=None, converter=_grid, kw_only=True)
    max_evictions: int | None = _opt("int")
    lookahead_cap: int | None = _opt("int")
    skip_rounds: bool | None = _opt("bool")
    gpu_slots: float | None = _opt("float")
    planner: str | None = _opt("str")
    load_target: float | None = _opt("float")
    price_horizon: float | None = _opt("float")
    price_smoothing: float | None = _opt("float")
    max_price: float | None = _opt("float")
    objective: str | None = _opt("str")
    start_or_wait: bool | None = _opt("bool")
    restart_gain: float | None = _opt("float")
    restore_horizon: float | None = _opt("float")
    gpu_instances: str | None = _opt("str")
    gpu_regime_window: float | None = _opt("float")
    supply: str | None = _opt("str")
    fallback: bool | None = _opt("bool")

    def as_kwargs(self) -> dict[str, Any]:
        """The options that are set, as the Scheduler's keyword arguments."""
        return {k: v for k, v in attrs.asdict(self, recurse=False).items() if v is not None}

    def asdict(self) -> dict[str, Any]:
        """Every field (None: the Scheduler's default), for logs and JSON."""
        return {k: (list(v) if isinstance(v, tuple) else v) for k, v in attrs.asdict(self, recurse=False).items()}

    @classmethod
    def from_mapping(cls, values: Mapping[str, Any]) -> SchedulerOptions:
        """``SchedulerOptions(**values)`` with an unknown name a SpecError that lists the known ones."""
        known = {a.name for a in attrs.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise SpecError(f"unknown scheduler option(s) {unknown}; known: {sorted(known)}")
        return cls(**values)


class SchedulerKeywords(TypedDict, total=False):
    """The same options as keyword arguments (``Scheduler(pool, window=4)``), typed for mypy;
    ``tests/test_options.py`` keeps the three spellings (these keys, the SchedulerOptions fields and
    the Scheduler's defaults) naming the same options."""

    window: int
    depth: int
    scan_limit: int
    elastic: bool
    lookahead: bool
    default_duration: float
    default_restore_s: float
    alpha: float
    duration_alpha: float
    learn_efficiency: bool
    mu_grid: Iterable[float]
    max_evictions: int
    lookahead_cap: int
    skip_rounds: bool
    gpu_slots: float | None
    planner: str
    load_target: float | None
    price_horizon: float
    price_smoothing: float
    max_price: float | None
    objective: str
    start_or_wait: bool
    restart_gain: float
    restore_horizon: float
    gpu_instances: str
    gpu_regime_window: float
    supply: str
    fallback: bool


def merge_options(options: SchedulerOptions | None, keywords: Mapping[str, Any]) -> dict[str, Any]:
    """The Scheduler keyword arguments from ``options=`` and the keyword options together; one
    option given both ways is a SpecError (which one was meant cannot be guessed)."""
    if options is None:
        return dict(keywords)
    if not isinstance(options, SchedulerOptions):
        raise SpecError(f"options must be a SchedulerOptions, got {show(options)}")
    out = options.as_kwargs()
    both = sorted(set(out) & set(keywords))
    if both:
        raise SpecError(f"scheduler option(s) {both} given both in options= and as keywords")
    out.update(keywords)
    return out


def check_scheduler_options(values: Mapping[str, Any]) -> tuple[tuple[float, ...], float, float]:
    """Check every Scheduler option (``values``: each by name, its defaults filled in): the types
    as :class:`SchedulerOptions` checks them (a Scheduler built from keywords took window="8" to a
    bare TypeError, elastic="no" silently), then the ranges. Returns ``mu_grid`` as floats and
    ``max_price`` (the objective's bound when None; an unknown objective is refused by the ranges)
    and ``load_target`` (:data:`SUPPLY_LOAD_TARGETS` for the supply when None)."""
    grid = values["mu_grid"]
    if isinstance(grid, Iterator):  # read once: the type check below would use a generator up
        values = {**values, "mu_grid": tuple(grid)}
    SchedulerOptions(**values)
    mu_grid = tuple(float(x) for x in values["mu_grid"])
    max_price = values["max_price"]
    if max_price is None:
        max_price = OBJECTIVE_PRICES.get(values["objective"], 0.0)
    load_target = values["load_target"]
    if load_target is None:
        load_target = SUPPLY_LOAD_TARGETS.get(values["supply"], 1.5)
    check_ranges({**values, "mu_grid": mu_grid, "max_price": max_price, "load_target": load_target})
    return mu_grid, max_price, load_target


def check_ranges(values: Mapping[str, Any]) -> None:
    """SpecError for the first option out of its range. ``values``: the Scheduler's options with its
    defaults filled in (``max_price`` from the objective when not given; ``gpu_slots`` may be None)."""
    v = values
    for name, ok, want in (
        ("default_duration", 0 < v["default_duration"] < math.inf, "a finite number of seconds > 0"),
        ("default_restore_s", 0 <= v["default_restore_s"] < math.inf, "a finite number of seconds >= 0"),
        ("alpha", 0 < v["alpha"] <= 1, "in (0, 1]"),
        ("duration_alpha", 0 < v["duration_alpha"] <= 1, "in (0, 1]"),
        ("price_smoothing", 0 <= v["price_smoothing"] <= 1, "in [0, 1]"),
        ("mu_grid", bool(v["mu_grid"]) and all(x >= 0 for x in v["mu_grid"]), "non-empty, prices >= 0"),
        ("max_evictions", v["max_evictions"] >= 0, ">= 0"),
        ("lookahead_cap", v["lookahead_cap"] >= 1, ">= 1"),
        ("load_target", 0 < v["load_target"] < math.inf, "finite and > 0"),
        ("price_horizon", 0 <= v["price_horizon"] < math.inf, "a finite number of seconds >= 0"),
    ):
        if not ok:  # NaN fails every comparison above, so it lands here too
            raise SpecError(f"scheduler option {name} must be {want}, got {v[name]!r}")
    if v["window"] < 1 or v["depth"] < 0 or v["scan_limit"] < 1:
        raise SpecError("window and scan_limit must be >= 1, depth >= 0")
    if v["gpu_slots"] is not None and not v["gpu_slots"] > 0:
        raise SpecError(f"gpu_slots must be None or > 0, got {v['gpu_slots']!r}")
    if v["planner"] not in ("priced", "estimate"):
        raise SpecError(f"planner must be 'priced' or 'estimate', got {v['planner']!r}")
    if v["supply"] not in SUPPLY_LOAD_TARGETS:
        raise SpecError(f"supply must be one of {', '.join(SUPPLY_LOAD_TARGETS)}, got {v['supply']!r}")
    if v["objective"] not in OBJECTIVE_PRICES:
        raise SpecError(f"objective must be one of {', '.join(OBJECTIVE_PRICES)}, got {v['objective']!r}")
    if not v["max_price"] >= 0:
        raise SpecError(f"max_price must be None or >= 0, got {v['max_price']!r}")
    if not 0.0 <= v["restart_gain"] <= 1.0:
        raise SpecError(f"restart_gain must be in [0, 1] (0: never restart), got {v['restart_gain']!r}")
