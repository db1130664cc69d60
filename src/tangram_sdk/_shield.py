"""Finish cleanup even when the caller is cancelled.

``anyio.CancelScope(shield=True)`` only shields against anyio cancel scopes; a plain asyncio
``Task.cancel()`` (a TaskGroup tearing down, ``wait_for`` timing out) still lands inside it. Work
that must not stop half-way — parking a container, evicting a GPU copy, returning units — runs as
its own task here, and a cancellation of the caller is delivered only after that task is done.
"""

from __future__ import annotations

import asyncio
from collections.abc import Coroutine
from typing import Any, TypeVar

import anyio

__all__ = ["finish", "finish_within"]

T = TypeVar("T")


async def finish(coro: Coroutine[Any, Any, T] | asyncio.Future[T]) -> tuple[asyncio.Future[T], bool]:
    """Run ``coro`` to its end whatever happens to the caller. Returns the finished task (read
    its result or exception) and whether the caller was cancelled meanwhile — in which case the
    caller must raise ``asyncio.CancelledError`` once it has settled its own state."""
    task: asyncio.Future[T] = asyncio.ensure_future(coro)
    cancelled = False
    # an anyio scope re-delivers its cancel at every await until the task leaves it: without its
    # own shield this loop spun (~80,000 wake-ups a second) and swallowed those cancels, so the
    # scope no longer recognised the one it is owed and let a CancelledError escape move_on_after.
    # Shielded, the anyio cancel waits for the caller's next checkpoint (where the scope catches
    # it); a plain Task.cancel() still lands here and is reported.
    with anyio.CancelScope(shield=True):
        while not task.done():
            try:
                await asyncio.shield(task)
            except asyncio.CancelledError:
                if task.done() and task.cancelled():
                    raise
                cancelled = True
            except BaseException:  # the task's own error: read it below
                break
    return task, cancelled


async def finish_within(coro: Coroutine[Any, Any, T], limit: float, grace: float
                        ) -> tuple[asyncio.Future[T], bool, bool]:
    """:func:`finish` with a bound, for work that can hang (a GPU copy, a server's wake): wait
    for ``coro`` at most ``limit`` seconds, and once the caller is cancelled at most ``grace``
    more. Returns ``(task, cancelled, late)``; ``late``: the bound passed with the task still
    running (it is left running: the caller must keep what it touches out of use until it ends)."""
    task: asyncio.Future[T] = asyncio.ensure_future(coro)
    loop = asyncio.get_running_loop()
    end = loop.time() + limit
    cancelled = False
    with anyio.CancelScope(shield=True):  # see finish: anyio's cancel waits for the next checkpoint
        while not task.done():
            left = end - loop.time()
            if left <= 0:
                return task, cancelled, True
            try:
                await asyncio.wait({task}, timeout=left)
            except asyncio.CancelledError:
                if not cancelled:
                    end = min(end, loop.time() + grace)
                cancelled = True
    return task, cancelled, False
