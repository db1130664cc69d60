"""The managers' lookups of what a spec names, before it queues (a container not met yet).

Its own module because a lookup is the one piece of I/O an acquire waits for before the core sees
it: bounded by the acquire's timeout, ended by the caller's cancel, and ended by ``aclose`` before
the managers close (a lookup in flight would reopen a manager's closed connection). The runtime
holds one :class:`Lookups` and asks it only to resolve a spec and, when closing, to end the rest.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable
from typing import Any

from ._deadline import settle
from .errors import RuntimeClosedError
from .managers.base import Manager
from .spec import ActionSpec

__all__ = ["Lookups"]


class Lookups:
    """The managers that look a spec's named resources up (an unknown container is an error at
    acquire, not after the wait for a grant it could never use), and their lookups in flight."""

    __slots__ = ("inflight", "resolvers")

    def __init__(self, managers: Iterable[Manager]) -> None:
        self.resolvers = tuple(m for m in managers if callable(getattr(m, "resolve", None)))
        self.inflight: set[asyncio.Future[Any]] = set()  # resolves in flight (aclose ends them first)

    async def resolve(self, spec: ActionSpec, timeout: float | None,
                      ensure_open: Callable[[], None]) -> float | None:
        """The managers' lookups of what ``spec`` names (a container not met yet) before it queues;
        returns what is left of ``timeout`` for the queue. A manager's ``resolve(spec)`` returns
        the awaitable lookup, or None when there is nothing to look up. Each runs as a child task: the caller's
        cancel ends it (and wins), the timeout bounds it (TimeoutError), and aclose ends it before
        the managers close (RuntimeClosedError here). ``ensure_open``: the Tangram's, raising when
        it is closed or broken."""
        loop = asyncio.get_running_loop()
        start = loop.time()
        for m in self.resolvers:
            lookup = m.resolve(spec)  # type: ignore[attr-defined]
            if lookup is None:  # nothing to look up (the common case: no task, no wait)
                continue
            left = None if timeout is None else max(0.0, timeout - (loop.time() - start))
            child = asyncio.ensure_future(lookup)
            self.inflight.add(child)
            child.add_done_callback(self.inflight.discard)
            try:
                await asyncio.wait([child], timeout=left)
            except BaseException:  # cancelled: so is the lookup (it holds nothing but a request)
                child.cancel()
                raise
            if not child.done():
                child.cancel()
                raise TimeoutError(f"{spec.kind}: {getattr(m, 'name', m)} did not finish looking up what the spec "
                                   f"names ({spec.container!r}) within {timeout:g} s")
            if child.cancelled():  # aclose ended it
                ensure_open()
                raise RuntimeClosedError("this Tangram has been closed")
            child.result()  # its error (DockerError: no such container), if any
        ensure_open()  # closed while we looked
        return None if timeout is None else max(0.0, timeout - (loop.time() - start))

    async def end(self) -> bool:
        """Closing: cancel the lookups in flight and wait for them; whether the caller was cancelled
        meanwhile."""
        for t in list(self.inflight):
            t.cancel()
        if self.inflight:
            return await settle(asyncio.gather(*self.inflight, return_exceptions=True))
        return False
