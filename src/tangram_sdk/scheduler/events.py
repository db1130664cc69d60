"""Inputs of the scheduling core. Every input is an event (frozen, loggable, replayable)."""

from __future__ import annotations

from typing import Union

import attrs

from ..spec import ActionSpec

__all__ = ["Cancelled", "Event", "Released", "ServiceResidency", "Submitted", "Tick", "TokensUsed"]


@attrs.frozen(repr=False)
class Submitted:
    """An action asks for resources. ``action_id`` is unique for the scheduler's lifetime.
    ``deadline`` (same clock as ``now``): refuse it if it cannot start by then, drop it from the
    queue when it passes. ``expected``: the caller's estimate of this one action's seconds at its
    minimum units (a length hint, see ``Scheduler.submit``), or None."""

    action_id: int
    spec: ActionSpec
    deadline: float | None = None
    expected: float | None = None

    def __repr__(self) -> str:
        # without a hint, the repr decision logs have always hashed (benchmarks/decision_hash.py)
        tail = "" if self.expected is None else f", expected={self.expected!r}"
        return f"Submitted(action_id={self.action_id!r}, spec={self.spec!r}, deadline={self.deadline!r}{tail})"


@attrs.frozen
class Released:
    """A granted action finished (or failed: ``failed=True`` keeps its time out of duration learning).

    ``parallelism``: cores' worth of work its commands really got (CPU seconds / wall seconds,
    measured by ``lease.run``), or None: direct evidence of the efficiency it ran at."""

    action_id: int
    failed: bool = False
    parallelism: float | None = None


@attrs.frozen
class Cancelled:
    """The waiter gave up. Removes a queued action; for an already granted one it acts as a release."""

    action_id: int


@attrs.frozen
class Tick:
    """Time passed (a rate-limit token may be ready). Carries nothing; ``now`` comes with handle()."""


@attrs.frozen
class TokensUsed:
    """An action drew ``delta`` more tokens of weighted quota ``quota`` than its spec stated
    (fewer when negative): the bucket is corrected to what was really used."""

    quota: str
    delta: float


@attrs.frozen
class ServiceResidency:
    """A GPU manager reports that ``service`` is (no longer) resident on ``gpus``, and optionally how
    long its last restore took, so placement can prefer warm copies and price cold ones."""

    service: str
    gpus: tuple[int, ...]
    resident: bool
    restore_s: float | None = None


Event = Union[Submitted, Released, Cancelled, Tick, ServiceResidency, TokensUsed]
