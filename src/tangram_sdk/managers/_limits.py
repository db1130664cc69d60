"""Sandbox quotas: a cap on live containers and a token bucket on how fast they are created.

Why: an RL step that fans out a thousand tool calls at once would otherwise ask the daemon for a
thousand containers in the same second (dockerd serialises creates; memory and disk run out long
before the cores do). The cap bounds what exists, the rate bounds the burst the daemon sees.

Semantics: :meth:`CreationGate.admit` takes one live slot (FIFO among waiters), then one creation
token (a reservation: the n-th waiter is told its start time at once, so a token wait that would
end past the deadline is refused immediately instead of after sleeping). Every wait is bounded by
the caller's deadline and ends in ``TimeoutError`` naming the limit; a cancel always propagates,
and a slot handed over in the same iteration as the cancel is given back. Slots are returned with
:meth:`CreationGate.release` once the container is gone (or was never made).
"""

from __future__ import annotations

import asyncio
import math
from collections import deque
from typing import Any

from .._deadline import check_timeout, wait_future
from ..errors import SpecError

__all__ = ["CreationGate"]


class CreationGate:
    """``max_live``: containers that may exist at once (None: no cap). ``rate``: creations per
    second (None: unlimited) with ``burst`` tokens (default 1: evenly spaced)."""

    def __init__(self, max_live: int | None = None, rate: float | None = None, burst: int | None = None) -> None:
        if max_live is not None and (isinstance(max_live, bool) or not isinstance(max_live, int) or max_live < 1):
            raise SpecError(f"max_sandboxes must be an int >= 1 or None, got {max_live!r}")
        if rate is not None:
            if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not math.isfinite(rate) or rate <= 0:
                raise SpecError(f"create_rate must be a finite number of containers/s > 0 or None, got {rate!r}")
        if burst is not None and (isinstance(burst, bool) or not isinstance(burst, int) or burst < 1):
            raise SpecError(f"create_burst must be an int >= 1 or None, got {burst!r}")
        self.max_live = max_live
        self.rate = None if rate is None else float(rate)
        self.burst = 1 if burst is None else burst
        self.live = 0
        self._tokens = float(self.burst)
        self._stamp: float | None = None  # loop time of the last refill
        self._slots: deque[asyncio.Future[bool]] = deque()
        self._sleeping = 0
        self._stats = {"admitted": 0, "waited": 0, "wait_s": 0.0, "timeouts": 0}

    def check_fits(self, count: int) -> None:
        """A batch that can never be live at once is refused at once, not after waiting."""
        if self.max_live is not None and count > self.max_live:
            raise SpecError(f"{count} sandboxes can never be live at once: max_sandboxes={self.max_live}")

    async def admit(self, timeout: float | None) -> None:
        """Take a live slot and a creation token within ``timeout`` seconds (None: no limit)."""
        limit = check_timeout(timeout)
        loop = asyncio.get_running_loop()
        t0 = loop.time()
        deadline = None if limit is None else t0 + limit
        waited = await self._slot(deadline)
        try:
            waited = await self._token(deadline) or waited
        except BaseException:
            self.release()
            raise
        self._stats["admitted"] += 1
        if waited:
            self._stats["waited"] += 1
            self._stats["wait_s"] += loop.time() - t0

    def release(self) -> None:
        """A container admitted here is gone (removed, or its create failed): hand its slot on."""
        while self._slots:
            fut = self._slots.popleft()
            if not fut.done():
                fut.set_result(True)  # the slot moves to the first live waiter; ``live`` is unchanged
                return
        self.live = max(0, self.live - 1)

    # -- internals ------------------------------------------------------------------------------
    async def _slot(self, deadline: float | None) -> bool:
        if self.max_live is None or (self.live < self.max_live and not self._slots):
            self.live += 1
            return False
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[bool] = loop.create_future()
        self._slots.append(fut)
        left = None if deadline is None else max(0.0, deadline - loop.time())
        try:
            await wait_future(fut, left, lambda: (
                f"no sandbox slot within {left:g} s: {self.live} of max_sandboxes={self.max_live} live, "
                f"{sum(not f.done() for f in self._slots)} waiting"))
        except BaseException as exc:
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self.release()  # handed over in the same iteration as the cancel: pass it on
            else:
                if fut in self._slots:
                    self._slots.remove(fut)
                if isinstance(exc, TimeoutError):
                    self._stats["timeouts"] += 1
            raise
        return True

    async def _token(self, deadline: float | None) -> bool:
        if self.rate is None:
            return False
        loop = asyncio.get_running_loop()
        now = loop.time()
        if self._stamp is not None:
            self._tokens = min(float(self.burst), self._tokens + (now - self._stamp) * self.rate)
        self._stamp = now
        wait = 0.0 if self._tokens >= 1.0 else (1.0 - self._tokens) / self.rate
        if deadline is not None and now + wait > deadline + 1e-9:
            self._stats["timeouts"] += 1
            raise TimeoutError(
                f"sandbox creation rate {self.rate:g}/s (burst {self.burst}): the next creation may start in "
                f"{wait:.3f} s, past the {max(0.0, deadline - now):g} s left of the timeout")
        self._tokens -= 1.0  # reserved now: later callers queue behind this one
        if wait <= 0:
            return False
        self._sleeping += 1
        try:
            await asyncio.sleep(wait)
        except BaseException:
            self._tokens = min(float(self.burst), self._tokens + 1.0)  # unused: give it back
            raise
        finally:
            self._sleeping -= 1
        return True

    def statistics(self) -> dict[str, Any]:
        return {
            "max_sandboxes": self.max_live,
            "create_rate": self.rate,
            "create_burst": self.burst,
            "live": self.live,
            "waiting": sum(not f.done() for f in self._slots) + self._sleeping,
            **{k: (round(v, 3) if isinstance(v, float) else v) for k, v in self._stats.items()},
        }
