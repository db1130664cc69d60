"""The scheduler task's alarm: one loop timer, kept on the core's next wake-up.

Its own module because it is plumbing between two clocks: the core says when it next wants a round
with nothing else happening (a rate-limited quota's next token), and the event loop can only be
asked to call back at a time. The runtime re-arms the alarm after each round whose wake-up moved;
when it fires it sets ``wake``, which the runtime's task awaits before posting a Tick.
"""

from __future__ import annotations

import asyncio

__all__ = ["Alarm"]


class Alarm:
    """At most one ``loop.call_at`` in flight, at ``at`` (None: none)."""

    __slots__ = ("at", "handle", "loop", "wake")

    def __init__(self) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.wake: asyncio.Event | None = None  # set when the alarm fires (the runtime's task awaits it)
        self.handle: asyncio.TimerHandle | None = None
        self.at: float | None = None

    def start(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.wake = asyncio.Event()

    def arm(self, when: float | None) -> None:
        if when == self.at:  # the common case: no rate-limited waiter, nothing to change
            return
        if self.handle is not None:
            self.handle.cancel()
            self.handle = None
        self.at = when
        if when is not None:
            assert self.loop is not None and self.wake is not None
            wake = self.wake

            def fire() -> None:
                self.handle = None
                self.at = None
                wake.set()

            self.handle = self.loop.call_at(when, fire)

    def cancel(self) -> None:
        if self.handle is not None:
            self.handle.cancel()
