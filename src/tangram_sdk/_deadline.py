"""Bounded waits that can never swallow a cancel, the same on CPython 3.10 through 3.13.

Why not ``asyncio.wait_for``: on 3.10/3.11, when the awaited future completes in the same
event-loop iteration as the caller is cancelled (``fut.set_result(grant); task.cancel()``),
``wait_for`` returns the result and drops the cancel — a cancelled task gets a lease and runs its
action. ``asyncio.timeout`` does not exist on 3.10, and its bookkeeping (``cancelling()`` /
``uncancel()``) differs between 3.11 and 3.12. So neither is used around anything that grants.

The rule here: the caller's only suspension point is a plain ``await`` of a future (a plain
await always delivers a cancel: the future is cancelled, or the task raises CancelledError at its
next step when the future had already finished), and the timer never touches the caller's task:
it settles the awaited future with TimeoutError (:func:`wait_future`) or cancels a *child* task
(:func:`within`). A timeout therefore cannot be mistaken for a cancel, nor a cancel for a timeout,
and when both land together the cancel wins. One code path on every supported version.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

from .errors import SpecError

__all__ = ["check_deadline", "check_timeout", "settle", "wait_future", "within"]

T = TypeVar("T")


def check_timeout(value: Any, name: str = "timeout") -> float | None:
    """``value`` as seconds (None or ``inf``: no limit); SpecError naming ``name`` otherwise.

    Rejects strings, bools, NaN, negatives and numbers too large for a float (``10**400``), so no
    TypeError/OverflowError escapes from deep inside the event loop's timer heap."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{name} must be None or a number of seconds >= 0, got {value!r}")
    try:
        seconds = float(value)
    except OverflowError:
        raise SpecError(f"{name}={value!r} is too large for a number of seconds (use None for no limit)") from None
    if math.isnan(seconds) or seconds < 0:
        raise SpecError(f"{name} must be None or a number of seconds >= 0, got {value!r}")
    return None if math.isinf(seconds) else seconds


async def wait_future(fut: asyncio.Future[T], timeout: float | None, describe: Callable[[], str]) -> T:
    """``await fut``, settling it with ``TimeoutError(describe())`` after ``timeout`` seconds.

    ``fut`` must be the caller's own future (the timer sets its exception; a cancel of the caller
    cancels it). Whoever later wants to resolve it must check ``fut.done()`` first and, if so, give
    back what it would have handed over — the runtime's grant path does exactly that."""
    if timeout is None:
        return await fut
    loop = asyncio.get_running_loop()

    def expire() -> None:
        if not fut.done():
            fut.set_exception(TimeoutError(describe()))

    handle = loop.call_later(timeout, expire)
    try:
        return await fut
    finally:
        handle.cancel()


async def within(aw: Awaitable[T], timeout: float | None, describe: Callable[[], str]) -> T:
    """Run ``aw`` and return its result; after ``timeout`` seconds cancel it, wait for its cleanup
    and raise ``TimeoutError(describe())``.

    With a timeout, ``aw`` runs as a child task (a copy of the caller's context). If the caller is
    cancelled, the child is cancelled and awaited to its end, then CancelledError propagates —
    even when the child had just returned a result in the same iteration (that result is dropped:
    ``aw`` must leave what it acquired where the caller's cleanup finds it)."""
    if timeout is None:
        return await aw
    loop = asyncio.get_running_loop()
    task: asyncio.Future[T] = asyncio.ensure_future(aw)
    settled: asyncio.Future[bool] = loop.create_future()  # True: the child ended, False: time is up

    def ended(_: object) -> None:
        if not settled.done():
            settled.set_result(True)

    def expire() -> None:
        if not settled.done():
            settled.set_result(False)

    task.add_done_callback(ended)
    handle = loop.call_later(timeout, expire)
    try:
        in_time = await settled
    except asyncio.CancelledError:
        task.cancel()
        await settle(task)  # the child's cleanup runs to its end before the cancel propagates
        raise
    finally:
        handle.cancel()
        task.remove_done_callback(ended)
    if not in_time and not task.done():
        message = describe()  # read the state that ran out before the child's cleanup changes it
        task.cancel(message)
        if await settle(task):  # the caller was cancelled while the child cleaned up: the cancel wins
            raise asyncio.CancelledError
        if task.cancelled():
            raise TimeoutError(message)
    return task.result()


async def settle(task: asyncio.Future[Any]) -> bool:
    """Wait until ``task`` has ended, whatever happens to the caller meanwhile; return whether the
    caller was cancelled while waiting (it must then raise CancelledError once it has settled)."""
    cancelled = False
    while not task.done():
        try:
            await asyncio.wait([task])
        except asyncio.CancelledError:
            cancelled = True
    return cancelled


def _finite(value: object, kind_error: str, range_error: str, positive: bool = False) -> float | None:
    """``value`` as a finite float (> 0 when ``positive``), or None; SpecError otherwise, with
    ``kind_error`` for a non-number (bools included) and ``range_error`` for NaN, infinities, a
    number too large for a float, or (``positive``) one <= 0."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{kind_error}, got {value!r}")
    try:
        x = float(value)
    except OverflowError:
        x = float("inf")
    if x != x or x in (float("inf"), float("-inf")) or (positive and x <= 0.0):
        raise SpecError(f"{range_error}, got {value!r}")
    return x


# a deadline this far past the loop's clock is not one: almost surely time.time() given for
# loop.time() (which counts from boot), and it would silently never fire
_FAR_S = 1e6


def check_deadline(deadline: object) -> float | None:
    """A deadline is an absolute time on the loop's clock (a finite number), or None; one more
    than ~11 days past the running loop's ``time()`` is refused as a wall-clock time."""
    d = _finite(deadline, "deadline must be a loop.time() value (a number) or None",
                "deadline must be a finite loop.time() value")
    if d is not None:
        try:
            now = asyncio.get_running_loop().time()
        except RuntimeError:  # no loop here: nothing to compare with
            return d
        if d - now > _FAR_S:
            raise SpecError(f"deadline {deadline!r} is {d - now:.3g} s after the event loop's clock: deadlines "
                            "are loop.time() values (asyncio.get_running_loop().time() + seconds), not "
                            "time.time()")
    return d


def check_expected(value: object) -> float | None:
    """A length hint (``acquire(expected_s=)``) is a finite number of seconds > 0, or None."""
    return _finite(value, "expected_s must be None or a number of seconds > 0",
                   "expected_s must be a finite number of seconds > 0", positive=True)
