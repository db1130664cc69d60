"""Outputs of the scheduling core: what to hand to whom. The runtime and simulator only execute them."""

from __future__ import annotations

from typing import Union

import attrs

__all__ = ["Decision", "Grant", "Reject"]


@attrs.frozen
class Grant:
    """Hand ``action_id`` these concrete cores and GPUs, ``units`` of its elastic resource (0 when
    not elastic), ``memory`` bytes and quota units. ``restore`` is True when the action's GPU service
    is not known to be resident on ``gpus`` (the manager must restore it first)."""

    action_id: int
    cpus: tuple[int, ...] = ()
    gpus: tuple[int, ...] = ()
    units: int = 0
    memory: int = 0
    quotas: tuple[tuple[str, int], ...] = ()
    restore: bool = False


@attrs.frozen
class Reject:
    """``action_id`` can never be granted by this pool; ``reason`` says which demand is too large."""

    action_id: int
    reason: str


Decision = Union[Grant, Reject]
