"""The forms of a submitted spec the core works with, each memoised per distinct spec: the spec
without its container and group, its elastic range capped to what the pool holds, its
:class:`.Shape`.

Why memoised here and by identity: rollouts submit the same few specs millions of times, each
trajectory naming its own container; prices, markets and shapes downstream are keyed by spec, so
every trajectory must map to one object, derived once. Each memo is bounded (cleared past 4096).
"""

from __future__ import annotations

from typing import Any

import attrs

from ..pool import Pool
from ..spec import CHECKED_UNITS, ActionSpec
from .action import Shape, shape_of
from .ledger import Ledger

__all__ = ["SpecForms"]


class SpecForms:
    __slots__ = ("pool", "ledger", "cells", "gpu_slots", "replica", "shapes", "_bare", "_capped", "_unit_cap")

    def __init__(self, pool: Pool, ledger: Ledger, cells: tuple[int, ...], gpu_slots: float | None,
                 replica: bool) -> None:
        self.pool = pool
        self.ledger = ledger
        self.cells = cells
        self.gpu_slots = gpu_slots
        self.replica = replica
        self.shapes: dict[ActionSpec, Shape] = {}  # per distinct spec, see Shape
        self._bare: dict[tuple[Any, ...], ActionSpec] = {}  # a spec's fields but container and group -> that spec
        self._capped: dict[ActionSpec, ActionSpec] = {}
        # the most units of each elastic resource the pool could ever grant one action
        self._unit_cap = {"cpu": len(pool.cpus), "gpu": len(pool.gpus)}

    def form(self, spec: ActionSpec, box: str | None) -> tuple[ActionSpec, Shape] | str:
        """What an arrival of ``spec`` (in sandbox or group ``box``) is sized, priced and queued
        as, and its Shape; or why it is refused (its efficiency beyond the checked range, or it
        can never fit this pool)."""
        if box is not None:
            # the sandbox (or group) is where the action runs or what it belongs to, not what it
            # needs: sized, priced and queued as one spec with every other sandbox's (one spec per
            # trajectory would split the market)
            spec = self.without_container(spec)
        el = spec.elastic
        if el is not None and (el.max_units > self._unit_cap[el.resource] or el.max_units > CHECKED_UNITS):
            capped = self.capped(spec)  # never priced or planned beyond what the pool holds
            if isinstance(capped, str):
                return capped
            spec = capped
        shape = self.shapes.get(spec) or self.shape(spec)  # the memo, inline: the hot path
        if shape.reason is not None:
            return shape.reason
        return spec, shape

    def shape(self, spec: ActionSpec) -> Shape:
        cache = self.shapes
        try:
            return cache[spec]
        except KeyError:
            pass
        if len(cache) > 4096:
            cache.clear()
        shape = cache[spec] = shape_of(spec, self.pool, self.ledger, self.cells, self.gpu_slots, self.replica)
        return shape

    def capped(self, spec: ActionSpec) -> ActionSpec | str:
        """``spec`` (elastic, beyond the pool) with its elastic range cut to what the pool holds of that resource:
        sizes, prices and plans evaluate ``T(m)`` for every ``m`` in the range, so a ``max_units``
        of 10**7 cost seconds per arrival, and a user efficiency was checked only up to 1024 (one
        raising beyond it broke every later round). A reason string: the efficiency fails in the
        range the spec's own check left out (the action is refused)."""
        hit = self._capped.get(spec)
        if hit is not None:
            return hit
        el = spec.elastic
        assert el is not None
        cap = min(el.max_units, max(self._unit_cap[el.resource], spec.cpus if el.resource == "cpu" else spec.gpus, 1))
        capped = spec if cap == el.max_units else attrs.evolve(spec, elastic=attrs.evolve(el, max_units=cap))
        problem = el.efficiency_problem(CHECKED_UNITS + 1, cap)  # what the spec's own check left out
        if problem is not None:
            return f"{spec.kind}: {problem}"
        if len(self._capped) > 4096:
            self._capped.clear()
        self._capped[spec] = capped
        return capped

    def without_container(self, spec: ActionSpec) -> ActionSpec:
        """``spec`` without its container and group, one object per distinct rest: every trajectory
        names its own, and the maps keyed by spec downstream (prices, markets, shapes) must hit by
        identity, not compare a fresh copy field by field on every lookup (that, and an
        ``attrs.evolve`` per trajectory, cost ~25 us an acquire)."""
        key = (spec.kind, spec.cpus, spec.gpus, spec.memory, spec.quotas, spec.elastic, spec.duration,
               spec.priority, spec.service, spec.tokens, spec.needs)
        cache = self._bare
        bare = cache.get(key)
        if bare is None:
            if len(cache) > 4096:
                cache.clear()
            bare = cache[key] = attrs.evolve(spec, container=None, group=None)
        return bare
