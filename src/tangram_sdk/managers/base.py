"""The boundary between the scheduler's decisions and the world: the Manager protocol, and the one
place that drives it.

A manager turns a Grant into a real effect before the action runs (a cpuset write, a module restore)
and undoes it after. The runtime calls ``apply`` in the waiter's task — never in the scheduler task —
so a slow Docker call or GPU restore delays only the action it belongs to.

The contract (every caller — the runtime, the Ray node agent — goes through :class:`Applied`, so
it holds the same way everywhere): managers apply in order; a manager is recorded *before* its
``apply`` is awaited, so one that raises or is cancelled half-way still gets its ``release``;
``release`` runs in reverse order, for every recorded manager, even when another one raises.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import attrs

from ..errors import ManagerError, QuarantineError, TangramError
from ..pool import Pool
from ..spec import ActionSpec

if TYPE_CHECKING:
    from ..lease import Lease
    from ..scheduler.decisions import Grant
    from ..scheduler.events import Event

__all__ = ["Applied", "BaseManager", "Manager", "ManagerContext", "Offer", "offer_of"]

log = logging.getLogger("tangram_sdk")


@attrs.frozen
class ManagerContext:
    """What a running Tangram gives its managers: the pool, and a way to post events to the
    scheduler (e.g. ServiceResidency after an LRU eviction)."""

    pool: Pool
    post: Callable[[Event], None]


def _names(value: object) -> tuple[str, ...]:
    if isinstance(value, str):
        return (value,)
    return tuple(str(x) for x in value)  # type: ignore[attr-defined]


def _opt_names(value: object) -> tuple[str, ...] | None:
    return None if value is None else _names(value)


@attrs.frozen
class Offer:
    """What a manager declares it serves, so a scheduler can route actions to it without guessing.

    ``containers``: container names/ids it can grant cores in (the Ray scheduler routes a spec
    naming one of them to this manager's node). ``services``: the GPU services it can restore;
    ``None`` means it puts no limit on services (it does not manage them, or serves any name)."""

    containers: tuple[str, ...] = attrs.field(default=(), converter=_names)
    services: tuple[str, ...] | None = attrs.field(default=None, converter=_opt_names)


@runtime_checkable
class Manager(Protocol):
    """Applies grants to real resources. Each method ignores specs it is not about (a Docker CPU
    manager ignores specs without ``container``; a GPU manager those without ``service``).
    Subclass :class:`BaseManager` to get no-op defaults for what you do not need.

    Optional, outside the protocol (so older managers still satisfy it): ``async resize(old, new,
    lease)`` applies a running malleable action's new cores (``new.cpus``, was ``old.cpus``) to
    its work (a container's cpuset, a process tree's affinity); the runtime calls it, in apply
    order, on the managers that have it. ``resolve(spec)`` returns an awaitable lookup of what
    the spec names that must succeed before it queues (DockerCpuManager: a container it has not
    met), or None; the acquire awaits it within its timeout, so an unknown name fails at once."""

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
        also when that apply raised or was cancelled half-way, so it must tolerate a partial one.
        Raise :class:`~tangram_sdk.errors.QuarantineError` when the resource could not be restored
        yet: the units stay out of the pool until its ``until`` resolves."""

    async def aclose(self) -> None:
        """Release everything this manager created."""

    def describe(self) -> Offer:
        """What this manager serves (containers, services), once started."""


class BaseManager:
    """A :class:`Manager` whose every method does nothing: override the ones you need.

    ::

        class Audit(BaseManager):
            name = "audit"

            async def apply(self, grant, lease):
                log.info("granted %s", grant.cpus)
    """

    name: str = "manager"

    async def start(self, ctx: ManagerContext) -> None:
        return None

    def check(self, spec: ActionSpec) -> None:
        return None

    async def apply(self, grant: Grant, lease: Lease) -> None:
        return None

    async def release(self, grant: Grant, lease: Lease) -> None:
        return None

    async def resize(self, old: Grant, new: Grant, lease: Lease) -> None:
        return None

    async def aclose(self) -> None:
        return None

    def describe(self) -> Offer:
        return Offer()


def offer_of(manager: object) -> Offer:
    """``manager.describe()``; a manager written before ``describe`` existed offers nothing extra.
    A ``describe`` that raises or returns something else is a ManagerError naming the manager."""
    describe = getattr(manager, "describe", None)
    if describe is None:
        return Offer()
    name = getattr(manager, "name", type(manager).__name__)
    try:
        offer = describe()
    except Exception as exc:
        raise ManagerError(f"manager {name!r}: describe() raised {exc!r}", resource=str(name)) from exc
    if not isinstance(offer, Offer):
        raise ManagerError(f"manager {name!r}: describe() must return an Offer, got {offer!r}",
                           resource=str(name))
    return offer


def _name(m: object) -> str:
    return str(getattr(m, "name", type(m).__name__))


class Applied:
    """One grant made real through a sequence of managers: which ones have begun ``apply``.

    ::

        applied = Applied(grant, lease)
        try:
            await applied.apply(managers)
        except BaseException:
            await applied.release()  # every manager whose apply began, in reverse
            raise
        ...
        held_back = await applied.release()

    :meth:`apply` never undoes by itself: the caller releases (the runtime does it in a task that
    a second cancel cannot stop, and returns the units only after it)."""

    __slots__ = ("grant", "lease", "managers")

    def __init__(self, grant: Grant, lease: Lease) -> None:
        self.grant = grant
        self.lease = lease
        self.managers: list[Manager] = []  # apply begun, in order

    def __bool__(self) -> bool:
        """Something is left to release."""
        return bool(self.managers)

    async def apply(self, managers: Sequence[Manager]) -> None:
        """Apply ``managers`` in order. Each is recorded *before* its ``apply`` is awaited, so one
        that raises or is cancelled half-way is released too. A foreign exception becomes a
        ManagerError naming the action kind and the manager (chained); a TangramError, a cancel
        or any other BaseException passes unchanged."""
        grant, lease = self.grant, self.lease
        for m in managers:
            self.managers.append(m)
            try:
                await m.apply(grant, lease)
            except Exception as exc:
                if isinstance(exc, TangramError):
                    raise
                raise ManagerError(f"{lease.spec.kind}: applying the grant failed in manager {_name(m)!r}: "
                                   f"{exc!r}", resource=_name(m)) from exc

    async def release(self, *, where: str = "") -> list[QuarantineError]:
        """Release every recorded manager once, in reverse order, even when one raises. Returns
        the QuarantineErrors (the resources a manager could not restore yet); any other Exception
        is logged and the next manager is released. A cancel stops the loop where it lands (the
        managers not reached stay recorded): callers run this where a cancel cannot reach."""
        held: list[QuarantineError] = []
        prefix = f"{where}: " if where else ""
        while self.managers:
            m = self.managers.pop()
            try:
                await m.release(self.grant, self.lease)
            except QuarantineError as exc:
                log.error("%smanager %s could not release action %s: %s", prefix, _name(m),
                          self.lease.action_id, exc)
                held.append(exc)
            except Exception:
                log.exception("%smanager %s failed to release action %s", prefix, _name(m), self.lease.action_id)
        return held
