"""The boundary between the scheduler's decisions and the world: the Manager protocol.

A manager turns a Grant into a real effect before the action runs (a cpuset write, a module restore)
and undoes it after. The runtime calls ``apply`` in the waiter's task — never in the scheduler task —
so a slow Docker call or GPU restore delays only the action it belongs to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from ..pool import Pool
from ..spec import ActionSpec

if TYPE_CHECKING:
    from ..lease import Lease
    from ..scheduler.decisions import Grant
    from ..scheduler.events import Event

__all__ = ["Manager", "ManagerContext"]


@attrs.frozen
class ManagerContext:
    """What a running Tangram gives its managers: the pool, and a way to post events to the
    scheduler (e.g. ServiceResidency after an LRU eviction)."""

    pool: Pool
    post: Callable[[Event], None]


@runtime_checkable
class Manager(Protocol):
    """Applies grants to real resources. Each method ignores specs it is not about (a Docker CPU
    manager ignores specs without ``container``; a GPU manager those without ``service``)."""

    name: str

    async def start(self, ctx: ManagerContext) -> None:
        """Connect and check the pool (called once when the Tangram starts)."""

    def check(self, spec: ActionSpec) -> None:
        """Reject a spec at once: SpecError (unknown name) or InfeasibleSpecError (never fits)."""

    async def apply(self, grant: Grant, lease: Lease) -> None:
        """Make the grant real before the action runs; may ``lease.attach(...)`` handles."""

    async def release(self, grant: Grant, lease: Lease) -> None:
        """Undo ``apply`` after the action (park a container, mark a service idle). Runs to the end
        even if the action is cancelled. Called for every manager whose ``apply`` was *started*,
        also when that apply raised or was cancelled half-way, so it must tolerate a partial one."""

    async def aclose(self) -> None:
        """Release everything this manager created."""
