"""The scheduler's knobs as one typed, frozen value: ``Tangram(pool, options=SchedulerOptions(...))``
and ``deploy(..., options=...)`` take it beside the keyword options they always took.

Why a value and not ``**kwargs``: a typo is an error where the options are written (not deep inside
a Ray actor), the options can be stored, compared, logged (``asdict()``) and shared between a live
Tangram and a simulated one. A field left ``None`` means "the Scheduler's default", so this class
never restates a default (see docs/scheduler.md#knobs for what each knob does). Types are checked
here; ranges (``window >= 1``...) by the Scheduler, both as SpecError.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

import attrs

from ._validate import show
from .errors import SpecError

__all__ = ["SchedulerKeywords", "SchedulerOptions", "merge_options"]


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
    load_target: float
    price_horizon: float
    price_smoothing: float
    max_price: float | None
    objective: str
    start_or_wait: bool
    restart_gain: float
    restore_horizon: float
    gpu_instances: str
    gpu_regime_window: float


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
