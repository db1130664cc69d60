"""One client process's connection to the scheduler actor, as the actor sees it.

Kept apart from :mod:`.actor` because it is the one place that reads raw frames from a client: the
token check before anything is unpickled, the envelope's decoding, and the connection's end, which
it hands to the actor (``_on_message``, ``_on_conn_lost``) to act on.
"""

from __future__ import annotations

import asyncio
import logging
import pickle
import time
from typing import TYPE_CHECKING, Any

from . import _wire
from ._state import _Held

if TYPE_CHECKING:
    from .actor import SchedulerActor

log = logging.getLogger("tangram_sdk.ray")


class _Conn:
    """One client process's connection (authenticated by its first frame)."""

    def __init__(self, actor: SchedulerActor, cid: int) -> None:
        self.actor = actor
        self.id = cid
        self.proto = _wire.FrameProtocol(self._on_frame, self._on_lost)
        self.proto.max_frame = 256  # the token frame; nothing bigger before authentication
        self.authed = False
        self.info: dict[str, Any] = {}
        self.pending: dict[int, asyncio.Task[None]] = {}
        self.held: dict[int, _Held] = {}
        self.last_seen = time.monotonic()
        self.closed = False

    def send(self, msg: Any) -> None:
        self.proto.send(msg)

    def _on_frame(self, payload: bytes) -> None:
        self.last_seen = time.monotonic()
        if not self.authed:
            import hmac

            if not hmac.compare_digest(payload, self.actor._token):
                log.warning("rejected a connection with a wrong token")
                assert self.proto.transport is not None
                self.proto.transport.abort()
                return
            self.authed = True
            self.proto.max_frame = _wire.MAX_FRAME
            self.actor._unauthed.pop(self.id, None)
            self.actor._conns[self.id] = self
            self.send(("welcome", self.actor._config()))
            return
        try:
            msg = pickle.loads(payload)  # the envelope: builtins only (specs travel as bytes inside)
            if not isinstance(msg, tuple) or not msg:
                raise ValueError(f"not a message tuple: {type(msg).__name__}")
        except Exception as exc:  # noqa: BLE001 - a broken or foreign client: nothing to answer to
            log.error("client %s sent an undecodable frame (%r); dropping its connection", self.id, exc)
            assert self.proto.transport is not None
            self.proto.transport.abort()
            return
        self.actor._on_message(self, msg)

    def _on_lost(self, exc: Exception | None) -> None:
        if self.closed:
            return
        self.closed = True
        self.actor._unauthed.pop(self.id, None)
        self.actor._on_conn_lost(self, exc)
