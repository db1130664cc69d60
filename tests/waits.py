"""Polling for tests that wait on another task, process or daemon: ``limit`` is a bound that
fails the test naming what did not happen, never a timing the test relies on."""

from __future__ import annotations

import asyncio
import time
from typing import Any


async def until(cond: Any, what: str, limit: float = 10.0, every: float = 0.01) -> None:
    """Poll ``cond()`` every ``every`` s until it is true; fail naming ``what`` after ``limit`` s."""
    end = time.monotonic() + limit
    while not cond():
        assert time.monotonic() < end, f"{what} did not happen within {limit:g} s"
        await asyncio.sleep(every)
