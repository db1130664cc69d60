"""The wait ``aclose`` makes for the tasks still holding leases before the managers close.

Its own module because it is the one wait in a close that outlives a cancel: the holders of leases
granted while managers run keep their ``lease.exec``/``lease.call`` working to the end, so the
close waits for them (or, past ``cancel_after`` or once the closer is cancelled, cancels them and
waits for their cleanup) instead of closing the managers under them.
"""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._waiters import PendingAcquire

__all__ = ["wait_for_holders"]


async def wait_for_holders(waiters: Mapping[int, PendingAcquire], left_event: asyncio.Event, limit: float | None,
                           cancelled: bool) -> bool:
    """Wait until no other task holds a lease granted while managers run (see aclose); return whether
    the caller was cancelled meanwhile. ``left_event``: set by each such holder's leave."""
    me = asyncio.current_task()
    loop = asyncio.get_running_loop()
    deadline = None if limit is None else loop.time() + limit
    told = cancelled

    def holders() -> list[asyncio.Task[Any]]:
        return [w.task for w in waiters.values()
                if w.task is not None and w.task is not me and not w.task.done()]

    while True:
        waiting = holders()
        if not waiting:
            return cancelled
        if not told and (cancelled or (deadline is not None and loop.time() >= deadline)):
            for t in waiting:
                t.cancel()
            told = True
        left_event.clear()
        ev = loop.create_task(left_event.wait())
        timeout = None if told or deadline is None else max(0.0, deadline - loop.time())
        try:
            await asyncio.wait([ev, *waiting], timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        except asyncio.CancelledError:
            cancelled = True
        finally:
            ev.cancel()
