"""Resizes of running leases: a malleable action grown or shrunk by the core, made real.

Its own module because a resize has two clocks: the round changes the waiter's grant and its
lease's ``cpus``/``units`` at once (:func:`apply_resize`, on the runtime's stack), while the
managers' ``resize`` and the lease's callbacks run later, in one task per lease, in order, after
its apply (:func:`start_resizing`), retried with back-off when a manager raises. Leaving waits for
that task (bounded, :func:`stop_resizing`) before the managers release, so what they undo is what
the action holds by then.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from .lease import Lease
from .scheduler import Grant, Resize

if TYPE_CHECKING:
    from ._waiters import PendingAcquire

__all__ = ["apply_resize", "start_resizing", "stop_resizing"]

log = logging.getLogger("tangram_sdk")

_RESIZE_WAIT_S = 30.0  # leaving waits this long for a manager's resize in flight, then cancels it
# seconds between retries of a manager's resize that raised, then it gives up (logged): a shrink it
# missed leaves the container on cores the pool has already handed to someone else
_RESIZE_RETRY_S = (0.05, 0.2, 1.0, 2.0, 5.0)


def apply_resize(w: PendingAcquire, d: Resize) -> None:
    """Apply the core's Resize to ``w``'s record at once (the grant its release gives back, the
    lease's ``cpus``/``units``); the managers' part runs in the lease's resize task."""
    if w.left:
        return
    base = w.grant
    if base is None:
        fut = w.fut
        if fut is None or not fut.done() or fut.cancelled() or fut.exception() is not None:
            return  # not granted: nothing to resize
        base = fut.result()
    new = base._replace(cpus=tuple(d.cpus), units=d.units)
    w.grant = new  # granted but not entered yet: __aenter__ builds the lease from this
    lease = w.lease
    if lease is None:
        return
    if w.applied is not None:
        w.applied.grant = new  # what the managers release is what it holds now
    lease._resize(new.cpus, new.units)
    w.resize_queue.append((base, new))
    if w.live and w.resizer is None:
        start_resizing(w)


def start_resizing(w: PendingAcquire) -> None:
    w.resizer = asyncio.get_running_loop().create_task(_resizing(w), name=f"tangram-resize-{w.aid}")


async def _resizing(w: PendingAcquire) -> None:
    """Apply queued resizes in order: each manager that has ``resize`` (in apply order), then
    the lease's own (its ``run`` commands re-pinned, its callbacks). A manager that raises is
    logged and counted, and the action goes on with what it has; that manager's resize is
    retried (``_RESIZE_RETRY_S``) until it applies the latest one, a newer one comes, the
    action leaves, or the retries run out: a shrink it missed leaves the work on cores the
    pool already gave back (the release parks the container on what it holds either way)."""
    rt, lease = w.rt, w.lease
    assert lease is not None
    missed: dict[int, tuple[Any, Grant, Grant]] = {}  # id(manager) -> (it, what it has, the target)
    tries = 0
    try:
        while not w.left and (w.resize_queue or missed):
            if not w.resize_queue:  # only retries left: back off, then try the target again
                if tries == len(_RESIZE_RETRY_S):
                    for m, have, new in missed.values():
                        log.error("manager %s never applied action %s's resize to cpus %s (it has %s); "
                                  "gave up after %d retries", getattr(m, "name", m), w.aid,
                                  list(new.cpus), list(have.cpus), tries)
                    break
                w.retrying = True
                try:
                    await asyncio.sleep(_RESIZE_RETRY_S[tries])
                finally:
                    w.retrying = False
                tries += 1
                for key, (m, have, new) in list(missed.items()):
                    if w.left or w.resize_queue:
                        break
                    if await _resize_one(w, m, have, new, lease):
                        del missed[key]
                continue
            old, new = w.resize_queue.pop(0)
            tries = 0
            for m in list(w.applied.managers) if w.applied is not None else ():
                if getattr(m, "resize", None) is None:
                    continue
                prev = missed.pop(id(m), None)
                have = old if prev is None else prev[1]  # what this manager last applied
                if not await _resize_one(w, m, have, new, lease):
                    missed[id(m)] = (m, have, new)
            if w.left:
                break
            rt._resizes += 1
            lease._resized()
    finally:
        w.resizer = None


async def _resize_one(w: PendingAcquire, m: Any, have: Grant, new: Grant, lease: Lease) -> bool:
    """``m.resize(have, new)``; False (logged, counted) when it raised."""
    try:
        await m.resize(have, new, lease)
        return True
    except Exception:
        w.rt._resize_failures += 1
        log.exception("manager %s failed to resize action %s (%s) from cpus %s to %s",
                      getattr(m, "name", m), w.aid, w.spec.kind, list(have.cpus), list(new.cpus))
        return False


async def stop_resizing(w: PendingAcquire) -> None:
    """Leaving: drop resizes not begun, let one in flight finish (bounded), then cancel it."""
    w.resize_queue.clear()
    task = w.resizer
    if task is None or task.done():
        return
    if w.retrying:  # only backing off before a retry: nothing in flight to wait for
        task.cancel()
    done, _ = await asyncio.wait([task], timeout=_RESIZE_WAIT_S)
    if not done:
        log.error("action %s: a manager's resize did not finish within %g s; cancelled", w.aid,
                  _RESIZE_WAIT_S)
        task.cancel()
        await asyncio.wait([task])
