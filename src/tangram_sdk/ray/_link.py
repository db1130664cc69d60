"""A :class:`~tangram_sdk.ray.client.RemoteTangram`'s connection to the scheduler actor: the frames
that come back (grants, errors, acks, resizes, lost leases), the heartbeat, and what a lost
connection means for the leases held on it.

Kept apart from :mod:`.client` because it is the one place that reads the actor's frames and holds
the per-connection state; the client's API (connect, acquire, release) builds on it. A forked child
closes its copies of the open links' sockets (see :func:`_close_links_in_child`).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import pickle
import time
import weakref
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from ..errors import SchedulerBrokenError
from ..lease import Lease
from . import _wire
from ._errors import LeaseLostError

if TYPE_CHECKING:
    from .client import RemoteTangram

log = logging.getLogger("tangram_sdk.ray")


class _Held:
    __slots__ = ("cancelled", "lease", "lost", "task")

    def __init__(self, task: asyncio.Task[Any] | None) -> None:
        self.task = task
        self.lease: Lease | None = None  # set once built (resizes are applied to it)
        self.lost: BaseException | None = None
        self.cancelled = False


def _apply_resize(lease: Lease, cpus: Sequence[int], units: int) -> None:
    """A resize the actor reported, applied to the client's lease as the in-process runtime
    applies one: it says the new cores, its ``run`` commands are re-pinned, its callbacks run."""
    lease._resize(tuple(cpus), int(units))
    lease._resized()


_OPEN_LINKS: weakref.WeakSet[_Link] = weakref.WeakSet()


def _close_links_in_child() -> None:
    """A forked child (a ProcessPoolExecutor worker, multiprocessing's default on Linux) inherits
    the links' sockets: close its copies, or the actor sees no end of file when the parent dies
    and keeps the parent's leases until its TTL."""
    for link in list(_OPEN_LINKS):
        transport = link.proto.transport
        sock = None if transport is None else transport.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                os.close(sock.fileno())


os.register_at_fork(after_in_child=_close_links_in_child)


class _Link:
    """One authenticated connection to the scheduler actor."""

    def __init__(self, rt: RemoteTangram) -> None:
        self.rt = rt
        self.proto = _wire.FrameProtocol(self._on_frame, self._on_lost)
        self.waiters: dict[int, asyncio.Future[Any]] = {}
        self.acks: dict[int, asyncio.Future[None]] = {}  # failed/cancelled actions waiting for their units to go back
        self.refused: set[int] = set()  # acquires the actor answered with an error
        self.held: dict[int, _Held] = {}
        # granted, lease not built yet: the resizes that arrived meanwhile (applied once it is)
        self.early: dict[int, list[tuple[tuple[int, ...], int]]] = {}
        self.welcome: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        self.last_recv = time.monotonic()
        self.closed = False
        self.hb: asyncio.Task[None] | None = None
        self.config: dict[str, Any] = {}

    def send(self, msg: Any) -> None:
        self.proto.send(msg)

    def _on_frame(self, payload: bytes) -> None:
        self.last_recv = time.monotonic()
        try:
            msg = pickle.loads(payload)
            op = msg[0]
        except Exception as exc:  # noqa: BLE001 - cannot tell whose answer it was: drop the link
            log.error("undecodable frame from the Tangram scheduler actor (%r); dropping the link", exc)
            self.abort()
            return
        if op in ("grant", "reply"):
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_result(msg[2])
                if op == "grant":
                    self.early[msg[1]] = []
        elif op == "rsz":
            self._resized(msg[1], msg[2], msg[3])
        elif op == "err":
            fut = self.waiters.pop(msg[1], None)
            if fut is not None and not fut.done():
                fut.set_exception(msg[2])
                self.refused.add(msg[1])  # the actor failed it and kept nothing: no give-back needed
        elif op == "ack":
            ack = self.acks.pop(msg[1], None)
            if ack is not None and not ack.done():
                ack.set_result(None)
        elif op == "lost":
            self._lose(msg[1], msg[2])
        elif op == "welcome" and not self.welcome.done():
            self.welcome.set_result(msg[1])

    def _resized(self, key: int, cpus: Sequence[int], units: int) -> None:
        """``("rsz", key, cpus, units)``: the node's scheduler resized a held malleable lease. One
        released (or lost) already is left alone; one granted but not built yet gets it once built."""
        h = self.held.get(key)
        if h is not None:
            if h.lost is None and h.lease is not None:
                _apply_resize(h.lease, cpus, units)
            return
        early = self.early.get(key)
        if early is not None:
            early.append((tuple(cpus), int(units)))

    def _lose(self, key: int, exc: BaseException) -> None:
        h = self.held.get(key)
        if h is None or h.lost is not None:
            return
        h.lost = exc
        if h.task is not None and not h.task.done():
            h.cancelled = True
            h.task.cancel(f"tangram lease lost: {exc}")

    def _on_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        if self.hb is not None:
            self.hb.cancel()
        why = "closed" if exc is None else repr(exc)
        if not self.welcome.done():
            self.welcome.set_exception(SchedulerBrokenError(f"the Tangram scheduler actor hung up ({why})"))
        for fut in self.waiters.values():
            if not fut.done():
                fut.set_exception(LeaseLostError(f"connection to the Tangram scheduler actor lost ({why})"))
        self.waiters.clear()
        for ack in self.acks.values():  # the actor releases all of this connection's units itself
            if not ack.done():
                ack.set_result(None)
        self.acks.clear()
        # the actor releases whatever this connection held: no action may keep running on it
        what = "this RemoteTangram was closed" if self.rt._closing else f"connection to the Tangram scheduler actor lost ({why})"
        for key in list(self.held):
            self._lose(key, LeaseLostError(f"{what}; the scheduler released this lease"))

    async def heartbeat(self, every: float, ttl: float) -> None:
        # give up one heartbeat *before* the actor's TTL: in a partition this side stops its
        # actions before the actor hands their units to someone else
        limit = ttl - every
        while not self.closed:
            await asyncio.sleep(every)
            self.send(("hb",))
            if time.monotonic() - self.last_recv > limit and self.proto.transport is not None:
                log.error("the Tangram scheduler actor was silent for more than %.1f s; dropping the link", limit)
                self.proto.transport.abort()

    def abort(self) -> None:
        if self.proto.transport is not None:
            self.proto.transport.abort()

    async def give_back(self, msg: tuple[Any, ...], key: int) -> bool:
        """Send ``msg`` (a cancel or a failed release asking for an ack) and wait until the actor
        says the units are back, at most one heartbeat (a frozen actor: the link's silence limit
        then drops the connection, which releases them). Returns whether the caller was cancelled
        meanwhile; the wait itself is not cut short, so the cancel propagates after the units."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        if self.closed or not self.proto.send(msg):
            return False  # no link: the actor has released (or will release) everything it held
        self.acks[key] = fut
        def expire() -> None:
            if not fut.done():
                fut.set_result(None)

        handle = loop.call_later(float(self.config.get("heartbeat", 2.0)), expire)
        cancelled = False
        try:
            while not fut.done():
                try:
                    await asyncio.shield(fut)
                except asyncio.CancelledError:
                    cancelled = True
        finally:
            handle.cancel()
            self.acks.pop(key, None)
        return cancelled
