"""The per-acquire record: what :meth:`Tangram.acquire` returns, from submit until it leaves.

Its own module because it is the one place an action's state lives on the runtime side (the grant
or refusal decided inline, the future a later round resolves, the lease, the managers applied, the
task holding it) and the one path in and out of a lease (enter: submit, wait, apply; leave: the
managers undone in a shielded task, then the units back). The Tangram keeps the registry of these
records and the core; a record calls back into it to submit and to leave.
"""

from __future__ import annotations

import asyncio
from types import TracebackType
from typing import TYPE_CHECKING, Any

from ._deadline import wait_future
from ._demand import check_spec
from ._resizes import start_resizing, stop_resizing
from ._shield import finish
from .errors import DeadlineError, InfeasibleSpecError, TangramError, UsageError
from .lease import Lease, grow_ceiling
from .managers.base import Applied
from .scheduler import Grant, Reject
from .spec import ActionSpec

if TYPE_CHECKING:
    from .runtime import Tangram

__all__ = ["PendingAcquire", "refusal_error"]


def refusal_error(d: Reject) -> TangramError:
    """The error a waiter gets for a Reject: its code says which."""
    if d.code == "deadline":
        return DeadlineError(d.reason)
    return InfeasibleSpecError(d.reason)


class PendingAcquire:
    """One acquire, from submit until it leaves (the runtime's only per-action record), and the
    async context manager :meth:`Tangram.acquire` returns."""

    __slots__ = ("aid", "applied", "closing", "deadline", "error", "expected", "fut", "grant", "inline", "lease",
                 "left", "live", "resize_queue", "resizer", "retrying", "rt", "spec", "task", "timeout")

    def __init__(self, rt: Tangram, spec: ActionSpec, timeout: float | None, deadline: float | None,
                 expected: float | None = None) -> None:
        self.rt = rt
        self.spec = spec
        self.timeout = timeout
        self.deadline = deadline
        self.expected = expected
        self.aid = 0
        self.inline = False  # on the stack of submit: a decision is stored here, not on a future
        self.fut: asyncio.Future[Grant] | None = None  # queued: the future a later round resolves
        self.grant: Grant | None = None
        self.error: BaseException | None = None  # refused (or the core broke) while inline
        self.lease: Lease | None = None
        self.applied: Applied | None = None  # the managers whose apply began (None: no managers)
        self.task: asyncio.Task[Any] | None = None  # the holder, while managers run (aclose waits)
        self.left = False
        self.closing: asyncio.Task[None] | None = None  # the managers' release in flight (_finish)
        self.live = False  # applied: resizes may run (before that they queue)
        self.resize_queue: list[tuple[Grant, Grant]] = []  # (old, new) not applied yet, in order
        self.resizer: asyncio.Task[None] | None = None  # applies resize_queue (one per lease at a time)
        self.retrying = False  # the resizer is backing off before retrying a manager's failed resize

    async def __aenter__(self) -> Lease:
        rt = self.rt
        if rt._state != "open" or rt._broken is not None:
            rt._ensure_open()
        if self.aid:
            raise UsageError("this acquire() context was entered already: each `async with` needs its own "
                             "tangram.acquire(spec) call")
        if asyncio.get_running_loop() is not rt._loop:
            raise UsageError("Tangram.acquire() awaited on an event loop other than the Tangram's; from "
                             "another thread use tangram_sdk.integrations.SyncTangram")
        queue_timeout = self.timeout
        if rt._lookups.resolvers:
            check_spec(rt._core, rt.managers, rt._checked, self.spec)  # a bad name: SpecError before a lookup
            self.aid = -1  # entered: a second entry of this context is refused while we look up
            queue_timeout = await rt._lookups.resolve(self.spec, self.timeout, rt._ensure_open)
        t0 = rt._clock()
        got = rt._submit(self, t0)
        if isinstance(got, Grant):  # granted inline, at t0: no wait, no second clock read
            grant = got
            now = t0
        else:
            assert isinstance(got, asyncio.Future)
            try:
                # never asyncio.wait_for here: it can return the grant and drop a cancel that
                # lands in the same iteration (3.10/3.11); see _deadline
                grant = await got if queue_timeout is None else await wait_future(got, queue_timeout, self._timed_out)
            except BaseException:
                # a grant that landed with the cancel/timeout is given back: the core treats
                # Cancelled as "drop from the queue" or "release the grant", whichever is true
                rt._leave(self, failed=True, granted=False)
                raise
            now = rt._clock()
            if self.grant is not None:  # resized between the grant and this wake-up
                grant = self.grant
        self.grant = grant
        # positional: keyword arguments cost a third of the lease's construction on the hot path
        lease = Lease(self.aid, self.spec, grant.cpus, grant.gpus, grant.units, grant.memory, grant.quotas,
                      now - t0, now, grant.counted,
                      None if self.spec.elastic is None else grow_ceiling(self.spec, grant.cpus, rt.pool))
        lease._granter = rt
        self.lease = lease
        if rt.managers:
            self.task = asyncio.current_task()  # aclose waits for it to leave (see there)
            self.applied = applied = Applied(grant, lease)
            try:
                await applied.apply(rt.managers)  # the one manager contract (managers/base.py)
            except BaseException:
                await self._finish(failed=True)
                raise
        self.live = True
        if self.resize_queue:  # resized while the managers applied: bring them up to date
            start_resizing(self)
        return lease

    def _timed_out(self) -> str:
        """The TimeoutError message: the action kind, the wait, what it waited for and how full
        the pool was when the time ran out (so a log line alone says what was short)."""
        return f"{self.spec.kind}: not granted within {self.timeout:g} s; {self.rt.shortage(self.spec)}"

    enter = __aenter__  # what Tangram.acquire_lease awaits (no extra coroutine on the hot path)

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.left:  # released already (Tangram.release inside the block)
            await self._released_elsewhere()
        elif self.applied:
            await self._finish(failed=exc_type is not None)
        else:  # no manager to undo: just return the units (the common, fast case)
            self.left = True
            self.rt._leave(self, failed=exc_type is not None, granted=True)

    async def exit(self, *, failed: bool) -> None:
        """``__aexit__`` for Tangram.release: the same, with ``failed`` said directly."""
        if self.left:
            await self._released_elsewhere()
        elif self.applied:
            await self._finish(failed=failed)
        else:
            self.left = True
            self.rt._leave(self, failed=failed, granted=True)

    async def _released_elsewhere(self) -> None:
        """A second release of this lease: it does nothing, but returns only once the first one's
        managers are done (two tasks releasing one lease both see the units back); the first
        release's errors are its caller's."""
        closing = self.closing
        if closing is not None and not closing.done():
            await asyncio.wait([closing])

    def exit_nowait(self, *, failed: bool = False) -> bool:
        """Leave without awaiting when no manager has anything to undo (True; a later exit is a
        no-op); False, with nothing done, when a manager must run first."""
        if self.applied or self.grant is None:
            return False
        if not self.left:
            self.left = True
            self.rt._leave(self, failed=failed, granted=True)
        return True

    leave_now = exit_nowait  # the name this had before Tangram.release_nowait

    async def _finish(self, *, failed: bool) -> None:
        """Undo the managers' work, then return the units — in that order, so cores go back to the
        pool only once the container is parked — and do both even if this task is cancelled
        meanwhile: the cleanup runs as its own task, awaited through ``asyncio.shield`` (a native
        ``Task.cancel()`` is not stopped by an anyio shield) until it is done, and only then does a
        cancellation propagate. It is also tracked so closing the Tangram waits for it."""
        rt = self.rt
        self.left = True
        applied = self.applied
        if not applied:
            rt._leave(self, failed=failed, granted=True)
            return

        async def cleanup() -> None:
            until: list[Any] = []
            try:
                await stop_resizing(self)
                until = [e.until for e in await applied.release() if e.until is not None]
            finally:
                if until:  # a container not parked yet: its cores stay out of the pool until it is
                    rt._hold_back(self, failed, until)
                else:
                    rt._leave(self, failed=failed, granted=True)

        task = self.closing = rt._track(cleanup())
        _done, cancelled = await finish(task)
        if cancelled:
            raise asyncio.CancelledError
